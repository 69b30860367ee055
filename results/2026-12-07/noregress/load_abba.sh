#!/bin/bash
# p99 beside a busy process (--load 1), old and new builds in ABBA order, 2 ranks pinned:
# bash results/2026-12-07/noregress/load_abba.sh OLD_SRC NEW_SRC OUT PAIRS [--pin]
set -u
old=$1 new=$2 out=$3 pairs=${4:-6}; shift 4
mkdir -p "$out"
here=$(cd "$(dirname "$0")/../../.." && pwd)
for k in $(seq 1 "$pairs"); do
  if (( k % 2 )); then order="old new"; else order="new old"; fi
  for side in $order; do
    src=$old; [ "$side" = new ] && src=$new
    PYTHONPATH=$src timeout 600 ${PYTHON:-python} "$here/benchmarks/probes/torch_apart.py" --sizes 1K,64K,1M --omp1 "$@" \
      --load 1 --peers ringcomm_fn,ringcomm,deepspeed --json "$out/${side}_$k.json" > "$out/${side}_$k.txt" 2>&1
  done
done
