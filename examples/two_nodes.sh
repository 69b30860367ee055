#!/usr/bin/env bash
# Two nodes x 2 ranks with torchrun.
#
# On two hosts (run on each; NODE_RANK=0 on the host named in MASTER_ADDR, 1 on the other):
#   MASTER_ADDR=hostA NODE_RANK=0 examples/two_nodes.sh
#   MASTER_ADDR=hostA NODE_RANK=1 examples/two_nodes.sh
# Optional: GLOO_SOCKET_IFNAME=eth0 (the interface gloo uses between the nodes),
#           RINGCOMM_INTER=gloo (the default, auto, picks gloo for CPU tensors), --torch (run the
#           collective through torch.distributed's "ringcomm" backend instead of ringcomm.init).
#
# On one machine, two fake nodes (two torchrun agents, RINGCOMM_NODE_ID tells them apart):
#   examples/two_nodes.sh --fake [--torch]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
script="$here/hier_allreduce.py"
port="${MASTER_PORT:-29517}"
args=()
fake=0
for a in "$@"; do
  if [[ "$a" == "--fake" ]]; then fake=1; else args+=("$a"); fi
done

if [[ $fake == 1 ]]; then
  pids=()
  for node in 0 1; do
    RINGCOMM_NODE_ID="fake-node$node" torchrun --nnodes 2 --nproc-per-node 2 --node-rank "$node" \
      --master-addr 127.0.0.1 --master-port "$port" "$script" ${args[@]+"${args[@]}"} &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  exit $rc
fi

: "${MASTER_ADDR:?set MASTER_ADDR to the first host}"
: "${NODE_RANK:?set NODE_RANK to 0 on MASTER_ADDR, 1 on the other host}"
exec torchrun --nnodes 2 --nproc-per-node 2 --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" --master-port "$port" "$script" ${args[@]+"${args[@]}"}
