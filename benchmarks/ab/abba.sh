#!/usr/bin/env bash
# ABBA pairs of benchmarks/ab/ab_bench.py for two builds, pinned and unpinned, then the paired
# verdict of benchmarks/ab/ab_compare.py for each placement.
# Usage: bash benchmarks/ab/abba.sh OLD_SRC NEW_SRC OUT_DIR [PAIRS [AB_BENCH_ARGS...]]
#   OLD_SRC, NEW_SRC: the src/ folders of two built trees (put first on PYTHONPATH in turn)
#   PAIRS: old/new pairs per placement, taken in ABBA order (default 4)
#   AB_BENCH_ARGS: passed to ab_bench.py (e.g. --colls reduce,all_to_all --sizes 1K,4K)
#   PLACES: the placements to run (default "pinned unpinned")
set -euo pipefail
old=$1 new=$2 out=$3 pairs=${4:-4}
shift $(( $# < 4 ? $# : 4 ))
extra=("$@")
py=${PYTHON:-python}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for place in ${PLACES:-pinned unpinned}; do
  flag=(); [ "$place" = unpinned ] && flag=(--no-pin)
  for ((k = 1; k <= pairs; k++)); do
    if (( k % 2 )); then order="old new"; else order="new old"; fi
    for side in $order; do
      src=$old; [ "$side" = new ] && src=$new
      PYTHONPATH=$src "$py" "$here/ab_bench.py" -np 2 "${flag[@]}" ${extra[@]+"${extra[@]}"} --json "$out/$place-$side$k.json" > /dev/null
    done
  done
  olds=() news=()
  for ((k = 1; k <= pairs; k++)); do olds+=("$out/$place-old$k.json"); news+=("$out/$place-new$k.json"); done
  echo "## $place" | tee -a "$out/verdict.md"
  "$py" "$here/ab_compare.py" --paired "${olds[@]}" -- "${news[@]}" | tee -a "$out/verdict.md" || true
done
