#!/usr/bin/env bash
# The device ring's second proof step on the host (no GPU; at most 10 minutes): the exhaustive
# preemption-bounded schedule searches, 10,000-schedule seeded samples at 2-4 ranks and 2-3 slots
# (the ring's three collectives; broadcast and reduce at every root),
# a ThreadSanitizer build of the host harness run with free-running threads, and the SASS check of
# every (dtype, op) kernel of the production build when one is there. Exits non-zero on any failure.
# Usage: bash benchmarks/device/host_proof.sh   (from the repository root; python = the test venv's)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
INC=${CUDA_HOME:-/usr/local/cuda}/include
SRC=tests/device_proof/host_harness.cpp
CXXFLAGS=(-std=c++17 -Icsrc -Icsrc/include "-I$INC/cccl" "-I$INC" -pthread)
echo "== build (g++ -O2, and -fsanitize=thread)"
g++ "${CXXFLAGS[@]}" -O2 "$SRC" -o "$OUT/harness" &
g++ "${CXXFLAGS[@]}" -O1 -g -fsanitize=thread "$SRC" -o "$OUT/harness_tsan" &
wait %1 && wait %2
fail=0
inputs() {  # world count -> $OUT/in.bin, and the expected outputs of `run` into $OUT/o.bin
  "$PY" -c "import numpy as np; (np.arange($1*$2) * 7 % 13 + 1).astype(np.float32).tofile('$OUT/in.bin')"
}
expect() {  # harness options -> the outputs of a free-running run into $OUT/o.bin
  "$OUT/harness" run "$@" slot_bytes=16 "in=$OUT/in.bin" "out=$OUT/o.bin" >/dev/null
}
sched() {  # label, then harness options
  local label=$1; shift
  local line
  if line=$("$OUT/harness" sched "$@" "in=$OUT/in.bin" "expect=$OUT/o.bin" slot_bytes=16 timeout_ms=2000); then
    echo "ok   $label: $line"
  else
    echo "FAIL $label: $line"; fail=1
  fi
}
echo "== schedules (each: two calls back to back; every schedule bit-equal, no status record)"
for cfg in "2 2 1 24 ar" "2 3 1 24 ar" "3 2 1 36 ar" "3 3 2 40 ar" "4 2 1 40 ar" "4 3 1 64 ar" \
           "3 2 1 29 rs" "4 2 2 30 rs" "3 2 1 10 ag" "4 3 2 12 ag"; do
  set -- $cfg
  inputs "$1" "$4"
  "$OUT/harness" run world=$1 slots=$2 lanes=$3 count=$4 coll=$5 slot_bytes=16 calls=2 "in=$OUT/in.bin" "out=$OUT/o.bin" >/dev/null
  sched "random 10000 world=$1 slots=$2 lanes=$3 count=$4 $5" world=$1 slots=$2 lanes=$3 count=$4 coll=$5 calls=2 \
    search=random:10000:$RANDOM
done
# broadcast and reduce (the chain along the ring), every root: 10,000 schedules each.
for cfg in "2 2 1 24" "2 3 2 24" "3 2 1 36" "3 3 2 40" "4 2 1 30" "4 3 2 40"; do
  set -- $cfg
  inputs "$1" "$4"
  for coll in bc rd; do
    for root in $(seq 0 $(($1 - 1))); do
      expect world=$1 slots=$2 lanes=$3 count=$4 coll=$coll root=$root calls=2
      sched "random 10000 world=$1 slots=$2 lanes=$3 count=$4 $coll root=$root" world=$1 slots=$2 lanes=$3 count=$4 \
        coll=$coll root=$root calls=2 search=random:10000:$RANDOM
    done
  done
done
# Every schedule with at most B preemptions, exhaustively (up to 4 pieces per chunk).
for cfg in "2 2 16 3" "2 3 16 3" "3 2 12 1"; do
  set -- $cfg
  inputs "$1" "$3"
  "$OUT/harness" run world=$1 slots=$2 count=$3 slot_bytes=16 calls=1 "in=$OUT/in.bin" "out=$OUT/o.bin" >/dev/null
  sched "every schedule, <= $4 preemptions, world=$1 slots=$2 count=$3" world=$1 slots=$2 count=$3 search=bounded:$4
done
# broadcast and reduce, every root: 4 pieces, every schedule with at most B preemptions.
for cfg in "2 2 16 4" "2 3 16 4" "3 2 16 1" "3 3 16 1"; do
  set -- $cfg
  inputs "$1" "$3"
  for coll in bc rd; do
    for root in $(seq 0 $(($1 - 1))); do
      expect world=$1 slots=$2 count=$3 coll=$coll root=$root calls=1
      sched "every schedule, <= $4 preemptions, world=$1 slots=$2 count=$3 $coll root=$root" world=$1 slots=$2 \
        count=$3 coll=$coll root=$root search=bounded:$4
    done
  done
done
echo "== broken variants must fail"
inputs 3 64
for c in "ar 0" "bc 1" "rd 2"; do
  set -- $c
  expect world=3 count=64 coll=$1 root=$2 calls=2
  for b in 1 2 3 4; do
    if line=$("$OUT/harness" sched world=3 count=64 slot_bytes=16 coll=$1 root=$2 calls=2 broken=$b \
              search=random:10000:3 stop_on_fail=1 "in=$OUT/in.bin" "expect=$OUT/o.bin"); then
      echo "FAIL broken=$b $1 was not caught: $line"; fail=1
    else
      echo "ok   broken=$b $1 caught: $line"
    fi
  done
done
echo "== ThreadSanitizer: free-running threads (ranks and lanes), 2-4 ranks x 2 lanes, 50 calls of all_reduce, broadcast, reduce"
inputs 3 200
export TSAN_OPTIONS="halt_on_error=1 exitcode=66"
for w in 2 3 4; do
  inputs $w 200
  for c in "ar 0" "bc $((w - 1))" "rd 1"; do
    set -- $c
    if line=$("$OUT/harness_tsan" run ranks=threads world=$w lanes=2 slots=2 count=200 slot_bytes=32 calls=50 \
              coll=$1 root=$2 timeout_ms=20000 "in=$OUT/in.bin" 2>"$OUT/tsan.log"); then
      echo "ok   tsan world=$w $1: $line"
    else
      echo "FAIL tsan world=$w $1: $line"; head -50 "$OUT/tsan.log"; fail=1
    fi
  done
done
echo "== SASS of the production build (every dtype x op kernel), when it was built"
obj=$(ls build/setup-cmake/CMakeFiles/ringcomm_cuda_kernels.dir/csrc/device/ring_kernel.cu.o 2>/dev/null || true)
if [ -n "$obj" ]; then
  if "$PY" tests/device_proof/sass_check.py "$obj"; then echo "ok   sass $obj"; else echo "FAIL sass $obj"; fail=1; fi
else
  echo "FAIL no production build of ring_kernel.cu under build/setup-cmake (pip install -e . with RINGCOMM_CUDA=auto)"
  fail=1
fi
echo "host proof: $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
