#!/bin/bash
# Every 15 s read the cross-CPU probe; while the two vCPUs are far apart (round trip over 300 ns),
# compare all_to_all under cached stores (A) and streaming stores (B) in the same processes, up to
# three times. Usage (from the repository root): PYTHONPATH=src bash results/2026-12-07/a2a_adapt/far_watch.sh OUTDIR SECONDS
set -u
out=$1; end=$((SECONDS + ${2:-1200})); n=0
mkdir -p "$out"
probe() { python -c "import ringcomm._C as c; print(round(c._cpu_pair(0, 1)['round_trip_ns']))"; }
while [ $SECONDS -lt $end ] && [ $n -lt 3 ]; do
  p=$(probe)
  echo "$(date -u +%T) probe $p" >> "$out/far_watch.log"
  if [ "$p" -gt 300 ]; then
    n=$((n + 1))
    python benchmarks/probes/knob_ab.py -np 2 --pin --coll all_to_all --sizes 16K,64K,256K,1M \
      --env-a RINGCOMM_STREAM=off --env-b RINGCOMM_STREAM=on --rounds 4 > "$out/far_$n.txt" 2>&1
    echo "$(date -u +%T) far_$n done, probe after $(probe)" >> "$out/far_watch.log"
  fi
  sleep 15
done
