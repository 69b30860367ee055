#!/usr/bin/env bash
# 8 ranks on the 2 CPUs (not pinned): ABBA pairs of benchmarks/ab/ab_bench.py, old (57eb544) and new.
D=results/2026-12-07/smallcells/abba_np8_b
OLD=/work/wt/old-smallcells/src NEW=src
for k in 1 2 3 4 5 6 7 8; do
  if (( k % 2 )); then order="old new"; else order="new old"; fi
  for side in $order; do
    src=$OLD; [ $side = new ] && src=$NEW
    PYTHONPATH=$src timeout 600 /work/venv/bin/python benchmarks/ab/ab_bench.py -np 8 --no-pin \
      --colls all_gather,all_reduce --sizes 256K,1M,4M --json $D/np8-$side$k.json > /dev/null
  done
done
PYTHONPATH=$NEW /work/venv/bin/python benchmarks/ab/ab_compare.py --paired $D/np8-old{1..8}.json -- $D/np8-new{1..8}.json > $D/verdict.md
