# Helpers sourced by the device scripts (handoff_probe.sh, device_check.sh).
#
# Bounded commands. `timeout` puts its command in a process group of its own, so a signal to the
# calling script's group does not reach it, and bash runs a trap only once a foreground command
# has ended; `bounded` therefore runs `timeout` in the background and waits for it (a wait that a
# trapped signal interrupts), and `stop_bounded`, called from the script's TERM trap, ends every
# running one's whole group at once.
#
#   bounded LIMIT CMD ...   CMD under `timeout -k 2 LIMIT`; its exit status (124/137: it ran out)
#   stop_bounded            TERM, then KILL 1 s later, to the groups of the running bounded commands
#
# MPS daemons of a script's own. A daemon is started with private pipe and log folders under DIR
# (DIR/pipe, DIR/log), so it is found again by its environment (CUDA_MPS_PIPE_DIRECTORY=DIR/pipe
# in /proc/PID/environ) and never mistaken for a daemon someone else runs. Never changes the
# GPU's compute mode.
#
#   mps_start DIR   start a daemon (exports CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY); 1 when
#                   nvidia-cuda-mps-control is missing or the daemon did not start (the reason on stdout)
#   mps_stop DIR    quit the daemon of DIR (control and servers), kill what is left after 5 s; prints
#                   the pids it had to stop; safe to call when none runs
#   mps_pids DIR    the pids of DIR's daemon processes (control and servers)

BOUNDED_PIDS=""
bounded() {
  local limit=$1 pid rc
  shift
  timeout -k 2 "$limit" "$@" &
  pid=$!
  BOUNDED_PIDS="$BOUNDED_PIDS $pid"
  wait "$pid"
  rc=$?
  BOUNDED_PIDS=${BOUNDED_PIDS/ $pid/}
  return $rc
}

stop_bounded() {
  local p
  [ -n "${BOUNDED_PIDS// /}" ] || return 0
  for p in $BOUNDED_PIDS; do kill -TERM -- "-$p" 2> /dev/null || kill -TERM "$p" 2> /dev/null; done
  sleep 1
  for p in $BOUNDED_PIDS; do kill -KILL -- "-$p" 2> /dev/null; done
  BOUNDED_PIDS=""
}

mps_pids() {
  local pipe="$1/pipe" pid
  for pid in $(pgrep -f nvidia-cuda-mps 2>/dev/null); do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qxF "CUDA_MPS_PIPE_DIRECTORY=$pipe" && echo "$pid"
  done
  return 0
}

mps_start() {
  local dir="$1"
  if ! command -v nvidia-cuda-mps-control > /dev/null 2>&1; then
    echo "nvidia-cuda-mps-control not found"; return 1
  fi
  mkdir -p "$dir/pipe" "$dir/log"
  export CUDA_MPS_PIPE_DIRECTORY="$dir/pipe" CUDA_MPS_LOG_DIRECTORY="$dir/log"
  if ! timeout 20 nvidia-cuda-mps-control -d; then
    echo "MPS daemon did not start"; tail -20 "$dir"/log/*.log 2>/dev/null
    mps_stop "$dir" > /dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
  fi
  local _
  for _ in $(seq 20); do [ -n "$(mps_pids "$dir")" ] && break; sleep 0.1; done
  echo "MPS daemon started (pipe $dir/pipe, pids $(mps_pids "$dir" | tr '\n' ' '))"
}

mps_stop() {
  local dir="$1" pids _
  pids=$(mps_pids "$dir")
  [ -n "$pids" ] || return 0
  echo quit | CUDA_MPS_PIPE_DIRECTORY="$dir/pipe" timeout 5 nvidia-cuda-mps-control > /dev/null 2>&1
  for _ in $(seq 50); do
    [ -n "$(mps_pids "$dir")" ] || break
    sleep 0.1
  done
  pids="$pids $(mps_pids "$dir")"
  # shellcheck disable=SC2086
  kill -9 $pids 2> /dev/null
  echo "stopped MPS daemon processes:" $pids
  return 0
}
