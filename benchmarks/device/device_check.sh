#!/usr/bin/env bash
# The one prepared script for a lent accelerator machine (16 CPU cores beside its GPU): runs
# handoff_probe.sh (the cross-process hand-off probe that chooses the device-driven design), then
# gpu_check.sh, then cpu_scale_check.sh (all beside this script), each into a folder of its own,
# and packs the folders and their consoles into one archive. The scripts write 3, 8 and 7 files; a runner
# that returns at most 8 files gets all of them this way. Run from the repository root:
#
#     OUT=/some/dir benchmarks/device/device_check.sh
#
# Output in $OUT (5 files):
#   device_check.tgz  (handoff/, gpu/ and cpu/: every file the scripts wrote; their consoles)
#   handoff_no_mps.txt  handoff_mps.txt  gpu_summary.txt  cpu_summary.txt  (also inside the archive)
# Time: each script under its own limit, HANDOFF_TIMEOUT (s, default 100), GPU_CHECK_TIMEOUT (s,
# default 250) and CPU_SCALE_TIMEOUT (s, default 190), which with their kill grace stay under 10
# minutes; cpu_scale_check.sh's TOTAL_BUDGET defaults
# to 20 s under its limit, and the scripts' other knobs (STAGE_A_TIMEOUT, ...) pass through. The archive is written even when a script fails or is stopped.
# Exit status: 0 when gpu_check.sh and cpu_scale_check.sh exited 0 (the probe's status is in its files).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/device_check_out}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"

pack() {
  tar czf "$OUT/device_check.tgz" -C "$WORK" . 2>/dev/null
  for part in gpu cpu; do
    if [ -f "$WORK/$part/summary.txt" ]; then cp "$WORK/$part/summary.txt" "$OUT/${part}_summary.txt"
    else echo "no summary: see ${part}_console.txt in device_check.tgz" > "$OUT/${part}_summary.txt"; fi
  done
  for f in handoff_no_mps.txt handoff_mps.txt; do
    cp "$WORK/handoff/$f" "$OUT/$f" 2>/dev/null || echo "not written: see handoff_console.txt" > "$OUT/$f"
  done
}
trap 'pack; rm -rf "$WORK"' EXIT

echo "[device_check $(date +%H:%M:%S)] handoff_probe.sh (limit ${HANDOFF_TIMEOUT:-100} s)"
OUT="$WORK/handoff" PROBE_TIMEOUT="${PROBE_TIMEOUT:-30}" TIMEOUT_MS="${TIMEOUT_MS:-500}" timeout -k 10 "${HANDOFF_TIMEOUT:-100}" \
    bash benchmarks/device/handoff_probe.sh > "$WORK/handoff_console.txt" 2>&1
echo "[device_check $(date +%H:%M:%S)] handoff_probe.sh: exit $?"
echo "[device_check $(date +%H:%M:%S)] gpu_check.sh (limit ${GPU_CHECK_TIMEOUT:-250} s)"
OUT="$WORK/gpu" timeout -k 10 "${GPU_CHECK_TIMEOUT:-250}" bash benchmarks/device/gpu_check.sh > "$WORK/gpu_console.txt" 2>&1
gpu=$?
echo "[device_check $(date +%H:%M:%S)] gpu_check.sh: exit $gpu"
echo "[device_check $(date +%H:%M:%S)] cpu_scale_check.sh (limit ${CPU_SCALE_TIMEOUT:-190} s)"
# cpu_scale_check.sh plans its sections within TOTAL_BUDGET: 20 s under its limit here.
OUT="$WORK/cpu" TOTAL_BUDGET="${TOTAL_BUDGET:-$(( ${CPU_SCALE_TIMEOUT:-190} - 20 ))}" \
    timeout -k 10 "${CPU_SCALE_TIMEOUT:-190}" bash benchmarks/device/cpu_scale_check.sh > "$WORK/cpu_console.txt" 2>&1
cpu=$?
echo "[device_check $(date +%H:%M:%S)] cpu_scale_check.sh: exit $cpu"
echo "---- handoff"
cat "$WORK/handoff/handoff_no_mps.txt" "$WORK/handoff/handoff_mps.txt" 2>/dev/null || tail -20 "$WORK/handoff_console.txt"
for part in gpu cpu; do
  echo "---- $part summary"
  cat "$WORK/$part/summary.txt" 2>/dev/null || tail -20 "$WORK/${part}_console.txt"
done
[ "$gpu" = 0 ] && [ "$cpu" = 0 ]
