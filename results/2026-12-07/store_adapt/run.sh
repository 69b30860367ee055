#!/bin/bash
# RINGCOMM_STREAM=adapt against off and against on, same processes (knob_ab), 2 ranks pinned,
# each pair between two readings of the cross-CPU probe.
# Usage: bash run.sh OUTDIR PAIRS [COLL SIZES CALLS] (default: all_reduce 16K,64K,256K,1M,4M,16M 40)
set -u
out=$1; n=${2:-10}; coll=${3:-all_reduce}; sizes=${4:-16K,64K,256K,1M,4M,16M}; calls=${5:-40}
mkdir -p "$out"
probe() { python -c "
from ringcomm import _C; p = _C._cpu_pair(0, 1)
print('probe %.0f ns %.2f GB/s' % (p['round_trip_ns'], p['handoff_gbps']))"; }
for i in $(seq 1 "$n"); do
  for other in off on; do
    {
      echo "# $(date -u +%H:%M:%S) A: RINGCOMM_STREAM=$other  B: RINGCOMM_STREAM=adapt"
      probe
      python benchmarks/probes/knob_ab.py --coll "$coll" --sizes "$sizes" \
        --env-a RINGCOMM_STREAM=$other --env-b RINGCOMM_STREAM=adapt --rounds 4 --calls "$calls" --pin \
        2>&1 | grep -E "^\| [0-9]|^# check|^\| size"
      probe
    } >> "$out/$other.txt"
  done
done
