#!/usr/bin/env bash
# The measurements of this folder (README.md): run from the repository root of the new tree, with
# the old build (57eb544) in place at /work/wt/old-smallcells.
set -u
D=results/2026-12-07/smallcells
OLD=/work/wt/old-smallcells/src NEW=src
PEERPY=/work/venv-peers/bin/python
OPS=all_reduce,reduce_scatter,all_gather,reduce,all_to_all,broadcast
# 1. per-phase traces of both builds, 2 ranks pinned
for side in old new; do
  src=$OLD; [ $side = new ] && src=$NEW
  { uptime; PYTHONPATH=$src $PEERPY -m ringcomm.bench --trace -np 2 --bind core --ops $OPS -b 16K -e 1M -f 4 -n 300; uptime; } \
    > $D/trace_$side.txt 2>&1
done
# 2. ringcomm old against new, ABBA pairs, 2 ranks pinned, through the public API
PLACES=pinned PYTHON=/work/venv/bin/python bash benchmarks/ab/abba.sh $OLD $NEW $D/abba 6 --colls $OPS \
  --sizes 16K,64K,256K,1M,16M > /dev/null 2>&1
# 3. each build beside Intel MPI and MPICH in the same run, alternated, 3 pairs
for k in 1 2 3; do
  for side in old new; do
    src=$OLD; [ $side = new ] && src=$NEW
    uptime > $D/peers_${side}_$k.load
    PYTHONPATH=$src $PEERPY -m ringcomm.bench -np 2 -b 16K -e 1M -f 4 --ops $OPS --time-budget 0.05 \
      --peers impi,mpi --arrival b2b --bind core --json $D/peers_${side}_$k.json > $D/peers_${side}_$k.txt 2>&1
    uptime >> $D/peers_${side}_$k.load
  done
done
echo MEASURED
