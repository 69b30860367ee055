#!/bin/bash
# ABBA pairs: $1 out dir, $2 pairs, $3 np, $4 colls, $5 extra flags; old = /tmp/h9/base, new = the worktree
OUT=$1; PAIRS=$2; NP=$3; COLLS=$4; EXTRA=$5
NEW=/work/wt/h9-cpuwait; OLD=/tmp/h9/base
mkdir -p $OUT
run() { local side=$1 k=$2 dir=$3; local t0=$(date +%s); PYTHONPATH=$dir/src timeout 300 /work/venv/bin/python $NEW/benchmarks/ab/ab_bench.py -np $NP --colls $COLLS $EXTRA --json $OUT/np${NP}_${side}_$k.json > /dev/null 2>> $OUT/errors.log; echo "np$NP $side $k $(( $(date +%s) - t0 ))s $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/run.log; }
for k in $(seq 1 $PAIRS); do
  if [ $((k % 2)) -eq 1 ]; then run old $k $OLD; run new $k $NEW; else run new $k $NEW; run old $k $OLD; fi
done
