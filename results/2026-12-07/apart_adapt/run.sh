#!/bin/bash
# Torch calls apart, 2 ranks, three runs per dtype and placement, the cross-CPU probe before each.
# Usage: PYTHONPATH=src bash run.sh OUTDIR
set -u
D=$1
for dtype in float32 bfloat16; do
  for place in unpinned pinned; do
    pin=""; [ "$place" = pinned ] && pin="--pin"
    for i in 1 2 3; do
      python -c "
from ringcomm import _C; p = _C._cpu_pair(0, 1)
print('probe %.0f ns %.2f GB/s' % (p['round_trip_ns'], p['handoff_gbps']))" > "$D/apart_${dtype}_${place}_$i.probe"
      python benchmarks/probes/torch_apart.py --sizes 1K,64K,1M --omp1 $pin --dtype $dtype \
        --peers ringcomm_fn,ringcomm,null,deepspeed --json "$D/apart_${dtype}_${place}_$i.json" \
        > "$D/apart_${dtype}_${place}_$i.txt" 2>&1
    done
    python benchmarks/probes/apart_summary.py "$D"/apart_${dtype}_${place}_{1,2,3}.json > "$D/apart_${dtype}_${place}_summary.md"
  done
done
