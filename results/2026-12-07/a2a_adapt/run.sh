#!/bin/bash
# all_to_all under RINGCOMM_STREAM=adapt against off and against on, same processes (knob_ab),
# 2 ranks pinned, each pair between two readings of the cross-CPU probe.
# Usage (from the repository root): PYTHONPATH=src bash results/2026-12-07/a2a_adapt/run.sh OUTDIR PAIRS
set -u
out=$1; n=${2:-10}
mkdir -p "$out"
probe() { python -c "
from ringcomm import _C; p = _C._cpu_pair(0, 1)
print('probe %.0f ns %.2f GB/s' % (p['round_trip_ns'], p['handoff_gbps']))"; }
for i in $(seq 1 "$n"); do
  for other in off on; do
    {
      echo "# $(date -u +%H:%M:%S) A: RINGCOMM_STREAM=$other  B: RINGCOMM_STREAM=adapt"
      probe
      python benchmarks/probes/knob_ab.py --coll all_to_all --sizes 16K,64K,256K,1M,4M \
        --env-a RINGCOMM_STREAM=$other --env-b RINGCOMM_STREAM=adapt --rounds 4 --calls 100 --pin \
        2>&1 | grep -E "^\| [0-9]|^# check|^\| size"
      probe
    } >> "$out/$other.txt"
  done
done
