#!/bin/bash
# The runs behind docs/benchmarks.md's all_reduce tables, one bench run each: float32 and
# bfloat16, 2 and 4 ranks, calls back to back and apart (a gloo barrier before every call),
# ringcomm beside gloo, MPICH and DeepSpeed's shared-memory op; then the same 2-rank runs beside
# LOAD busy processes.
# Usage: benchmarks/report/bench_tables.sh OUTDIR [LOAD]   (LOAD default 2; 0 skips the loaded runs)
# Every cell times at least 20 calls and at least 0.5 s of them (the bench's count and spread
# columns say how many and how they spread). Each run writes OUTDIR/<name>.txt (the full report)
# and OUTDIR/<name>.json; python benchmarks/report/bench_readme_tables.py OUTDIR prints the
# tables and python benchmarks/report/check_targets.py --runs OUTDIR checks our targets on them.
set -u
out=${1:?usage: benchmarks/report/bench_tables.sh OUTDIR [LOAD]}
load=${2:-2}
mkdir -p "$out"
common=(--quick --ops all_reduce -d float32,bfloat16 --peers gloo,mpi,deepspeed --time-budget 0.5)
run() {
  local name=$1; shift
  echo "# $(date -u '+%F %T') UTC: $name: python -m ringcomm.bench $*" >&2
  timeout 900 python -m ringcomm.bench "$@" --json "$out/$name.json" > "$out/$name.txt" 2>&1
  echo "#   rc=$? $(grep -m1 'load average' "$out/$name.txt")" >&2
}
for np in 2 4; do
  run "np${np}_b2b" "${common[@]}" -np "$np" --arrival b2b
  run "np${np}_apart" "${common[@]}" -np "$np" --arrival apart
done
if [ "$load" -gt 0 ]; then
  if python -m ringcomm.bench --help | grep -q -- '--load'; then
    run "np2_b2b_load$load" "${common[@]}" -np 2 --arrival b2b --load "$load"
    run "np2_apart_load$load" "${common[@]}" -np 2 --arrival apart --load "$load"
  else
    echo "# this ringcomm.bench has no --load option: loaded runs skipped" >&2
  fi
fi
