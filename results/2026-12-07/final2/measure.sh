#!/usr/bin/env bash
# Final quiet-machine measurements for the CPU issue. Usage: measure46.sh NEW_SRC OLD_SRC OUT SECTIONS...
# sections: torch load b2b abba8 abba2
set -uo pipefail
new=$1 old=$2 out=$3; shift 3
mkdir -p "$out"
PY=/work/venv/bin/python PYP=/work/venv-peers/bin/python
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/run.log"; }
ld() { uptime >> "$out/$1.load"; }
for s in "$@"; do case $s in
torch)
  dts=${DTYPES:-float32 bfloat16}
  for k in 1 2 3; do for dt in $dts; do for pl in unpinned pinned; do
    f=$out/apart_${dt}_${pl}_$k; p=(); [ $pl = pinned ] && p=(--pin)
    dto=(); [ $dt != float32 ] || [ -n "${DTYPE_OPT:-}" ] && dto=(--dtype $dt)
    ld $(basename $f); log "torch $dt $pl $k"
    PYTHONPATH=$new timeout 600 $PY $new/../benchmarks/probes/torch_apart.py --sizes 1K,64K,1M --omp1 "${p[@]}" "${dto[@]}" \
      --peers ringcomm_fn,ringcomm,null,deepspeed --json $f.json > $f.txt 2>&1; ld $(basename $f)
  done; done; done ;;
load)
  for k in 1 2 3; do for pl in unpinned pinned; do for side in old new; do
    src=$new; [ $side = old ] && src=$old
    f=$out/load1_${pl}_${side}_$k; p=(); [ $pl = pinned ] && p=(--pin)
    ld $(basename $f); log "load $pl $side $k"
    PYTHONPATH=$src timeout 600 $PY $new/../benchmarks/probes/torch_apart.py --sizes 1K,64K,1M --omp1 "${p[@]}" --load 1 \
      --peers ringcomm_fn,ringcomm,deepspeed --json $f.json > $f.txt 2>&1; ld $(basename $f)
  done; done; done ;;
b2b)
  for k in 1 2 3; do for pl in pinned unpinned; do
    b=core; [ $pl = unpinned ] && b=none
    f=$out/b2b_${pl}_$k; ld $(basename $f); log "b2b $pl $k"
    ( cd $new/.. && PYTHONPATH=$new timeout 900 $PYP -m ringcomm.bench -np 2 -b 1K -e 64M -f 4 --ops all --time-budget 0.02 \
      --peers gloo,mpi,deepspeed,oneccl,impi --tune --arrival b2b --bind $b --json $f.json > $f.txt 2>&1 ); ld $(basename $f)
  done; done ;;
abba8)
  log abba8; PYTHON=$PY bash $new/../benchmarks/ab/abba.sh $old $new $out/abba8 4 -np 8 > $out/abba8.log 2>&1 ;;
abba2)
  log abba2; PLACES=pinned PYTHON=$PY bash $new/../benchmarks/ab/abba.sh $old $new $out/abba2 4 > $out/abba2.log 2>&1 ;;
esac; done
log done
