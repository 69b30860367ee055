#!/bin/bash
# ABBA pairs: $1 = out dir, $2 = pairs, $3 = np, $4 = colls; RINGCOMM_BIND from the environment
OUT=$1; PAIRS=$2; NP=$3; COLLS=$4
mkdir -p $OUT
run() { local side=$1 k=$2 dir=$3; local t0=$(date +%s); PYTHONPATH=$dir/src python /work/main/benchmarks/ab/ab_bench.py -np $NP --colls $COLLS --json $OUT/np${NP}_${side}_$k.json > /dev/null 2>> $OUT/errors.log; echo "np$NP $side $k $(( $(date +%s) - t0 ))s $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/run.log; }
for k in $(seq 1 $PAIRS); do
  if [ $((k % 2)) -eq 1 ]; then run old $k ${OLD:-/work/ab_old}; run new $k /work/main; else run new $k /work/main; run old $k /work/ab_old; fi
done
