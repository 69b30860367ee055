#!/bin/bash
# The slot walk: RINGCOMM_SLOT_WALK_BYTES=0 (A) against the default (B), same processes
# (knob_ab), every collective, the cross-CPU probe before and after each.
# Usage (from the repository root): PYTHONPATH=src bash results/2026-12-07/slot_walk/run.sh OUTDIR NP [--pin]
set -u
out=$1; np=$2; shift 2
mkdir -p "$out"
tag=np${np}$([ "${1:-}" = --pin ] && echo _pinned || echo _unpinned)
probe() { python -c "
from ringcomm import _C; p = _C._cpu_pair(0, 1)
print('probe %.0f ns %.2f GB/s' % (p['round_trip_ns'], p['handoff_gbps']))"; }
for coll in all_reduce reduce_scatter all_gather broadcast reduce all_to_all; do
  {
    echo "# $(date -u +%H:%M:%S) $coll, $np ranks ${1:-unpinned}; A: RINGCOMM_SLOT_WALK_BYTES=0  B: default"
    probe
    python benchmarks/probes/knob_ab.py -np "$np" "$@" --coll $coll --sizes 4K,8K,16K,32K,64K,128K,256K,1M \
      --env-a RINGCOMM_SLOT_WALK_BYTES=0 --env-b "" --rounds 16 --calls 40 2>&1 | grep -E "^\| |^# check"
    probe
  } >> "$out/$tag.txt"
done
