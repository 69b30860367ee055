#!/usr/bin/env bash
# 4 ranks on the 2 CPUs (not pinned): ABBA pairs of benchmarks/ab/ab_bench.py, old (57eb544) and new.
D=results/2026-12-07/smallcells/abba_np4
OLD=/work/wt/old-smallcells/src NEW=src
for k in 1 2 3 4; do
  if (( k % 2 )); then order="old new"; else order="new old"; fi
  for side in $order; do
    src=$OLD; [ $side = new ] && src=$NEW
    PYTHONPATH=$src timeout 600 /work/venv/bin/python benchmarks/ab/ab_bench.py -np 4 --no-pin \
      --colls all_reduce,reduce_scatter,all_gather,reduce,all_to_all,broadcast --sizes 16K,256K,1M --json $D/np4-$side$k.json > /dev/null
  done
done
PYTHONPATH=$NEW /work/venv/bin/python benchmarks/ab/ab_compare.py --paired $D/np4-old{1,2,3,4}.json -- $D/np4-new{1,2,3,4}.json > $D/verdict.md
