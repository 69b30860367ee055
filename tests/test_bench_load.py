"""``python -m ringcomm.bench --load N``: the busy processes run beside the ranks and none is left.

Checked against the kernel's own accounting, never against timings: while the load is up each
busy process is alive in /proc and its CPU time grows; after the bench (normal end, an
exception, SIGTERM, or the bench being SIGKILLed) no process with that pid runs the busy loop,
and the CPU time reaped with wait4 is positive."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ringcomm.bench.load import BusyLoad

from test_bench_cli import SRC, run_bench

MARK = b"sched_setscheduler"        # a word of the busy loop's source, in its /proc cmdline


def _is_busy_process(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return MARK in cmd and state != "Z"


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])          # utime + stime


def _wait_gone(pids, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_is_busy_process(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if _is_busy_process(p)]


def test_busy_processes_run_then_are_reaped():
    with BusyLoad(2) as load:
        assert len(load.pids) == 2 and len(set(load.pids)) == 2
        assert all(_is_busy_process(p) for p in load.pids)
        t0 = [_cpu_ticks(p) for p in load.pids]
        time.sleep(0.5)
        t1 = [_cpu_ticks(p) for p in load.pids]
        assert all(b > a for a, b in zip(t0, t1)), (t0, t1)        # each one is computing
        for p in load.pids:                                          # time-sharing, not real-time
            assert os.sched_getscheduler(p) == os.SCHED_OTHER
    assert _wait_gone(load.pids, 0.0) == []                          # reaped inside __exit__
    assert len(load.cpu_s) == 2 and all(c > 0.05 for c in load.cpu_s), load.cpu_s
    assert load.wall_s >= 0.5
    assert load.summary.startswith("2 busy processes") and "CPU-s" in load.summary


def test_reaped_on_exception_and_zero_is_nothing():
    with pytest.raises(RuntimeError, match="boom"):
        with BusyLoad(1) as load:
            pids = list(load.pids)
            raise RuntimeError("boom")
    assert len(pids) == 1 and _wait_gone(pids, 0.0) == []
    with BusyLoad(0) as none:
        assert none.pids == []
    assert none.summary.startswith("none")
    with pytest.raises(ValueError):
        BusyLoad(-1)


_HOLDER = textwrap.dedent("""
    import sys
    from ringcomm.bench.load import BusyLoad
    with BusyLoad(2) as load:
        print(" ".join(map(str, load.pids)), flush=True)
        for line in sys.stdin:               # answers each line while the load runs
            print(line.strip(), flush=True)
""")

# The racy moment on purpose: every busy process, once forked, is announced and the holder then
# waits inside Popen until a SIGINT is pending (the bench defers it there) or has been taken (an
# exception out of Popen: BusyLoad never recorded that process).
_STARTING = textwrap.dedent("""
    import signal, subprocess, time
    from ringcomm.bench.load import BusyLoad

    class Announced(subprocess.Popen):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            print(self.pid, flush=True)
            deadline = time.monotonic() + 60
            while signal.SIGINT not in signal.sigpending() and time.monotonic() < deadline:
                time.sleep(0.005)

    subprocess.Popen = Announced
    load = BusyLoad(2)
    try:
        with load:
            pass
    except KeyboardInterrupt:
        print("reaped", len(load.cpu_s), *load.pids, flush=True)
        raise
""")

CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _start_holder(script, ignored=()):
    """`script` as a shell would start a bench: SIGINT, SIGTERM and SIGHUP at their default
    actions and none blocked, except `ignored` (what ``nohup`` or a shell's ``cmd &`` sets), no
    matter what this pytest process inherited (a run started as a background job has SIGINT
    ignored, and an exec'd child keeps an ignored disposition)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p]))

    def dispositions():
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        for s in CAUGHT:
            signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)

    return subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=dispositions)


def _stop_holder(holder):
    if holder.poll() is None:
        holder.kill()
    holder.communicate(timeout=30)


def _ask(holder, word):
    """The holder's answer to one line: "" once it has exited (EOF)."""
    holder.stdin.write(word + "\n")
    holder.stdin.flush()
    return holder.stdout.readline().strip()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGHUP])
def test_no_busy_process_outlives_its_bench(sig):
    """SIGTERM / Ctrl-C / a closed terminal: the bench reaps them; SIGKILL of the bench: they
    notice and exit."""
    holder = _start_holder(_HOLDER)
    try:
        pids = [int(x) for x in holder.stdout.readline().split()]
        assert len(pids) == 2, holder.stderr.read()
        assert all(_is_busy_process(p) for p in pids)
        assert _ask(holder, "up") == "up"
        holder.send_signal(sig)
        holder.wait(timeout=30)
        assert holder.returncode != 0
        assert _wait_gone(pids, 5.0) == []
    finally:
        _stop_holder(holder)


def test_ignored_signals_stay_ignored_and_the_load_is_reaped_at_the_end():
    """A bench started with SIGINT and SIGHUP ignored (``nohup cmd &``) runs on through both
    with its load; SIGTERM then reaps it. The holder is blocked reading when the signals come,
    so one turned into an exception would end it before it could answer."""
    holder = _start_holder(_HOLDER, ignored=(signal.SIGINT, signal.SIGHUP))
    try:
        pids = [int(x) for x in holder.stdout.readline().split()]
        assert len(pids) == 2, holder.stderr.read()
        holder.send_signal(signal.SIGINT)
        holder.send_signal(signal.SIGHUP)
        assert _ask(holder, "still here") == "still here", holder.stderr.read()
        assert all(_is_busy_process(p) for p in pids)
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)
        assert _wait_gone(pids, 5.0) == []
    finally:
        _stop_holder(holder)


def test_ctrl_c_while_the_load_starts_reaps_every_started_process():
    """SIGINT between a busy process's fork and BusyLoad recording it: taken only once the
    process is in ``pids``, so ``__enter__``'s cleanup kills and reaps it."""
    holder = _start_holder(_STARTING)
    try:
        first = int(holder.stdout.readline())
        holder.send_signal(signal.SIGINT)
        holder.wait(timeout=30)
        out, err = holder.communicate(timeout=30)
        assert holder.returncode != 0 and "KeyboardInterrupt" in err, err
        reaped = out.split()
        assert reaped[0] == "reaped", (out, err)
        n, pids = int(reaped[1]), [int(p) for p in reaped[2:]]
        assert first in pids and n == len(pids) >= 1, (first, out)
        assert _wait_gone(pids + [first], 5.0) == []
    finally:
        _stop_holder(holder)


def test_cli_load_header_and_json(tmp_path):
    jpath = tmp_path / "load.json"
    r = run_bench("-np", "2", "-b", "1K", "-e", "4K", "-w", "1", "-n", "3", "--time-budget", "0.01",
                  "--ops", "all_reduce", "--peers", "none", "--load", "2", "--json", str(jpath),
                  timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    head = [line for line in r.stdout.splitlines() if line.startswith("# load: ")]
    assert len(head) == 1 and head[0].startswith("# load: 2 busy processes"), r.stdout
    doc = json.loads(jpath.read_text())
    load = doc["meta"]["load"]
    assert load["n"] == 2 and len(load["pids"]) == 2 and all(c > 0 for c in load["cpu_s"]), load
    assert doc["meta"]["config"]["load"] == 2 and doc["wrong"] == 0
    assert _wait_gone(load["pids"], 0.0) == []
    r0 = run_bench("-np", "2", "-b", "1K", "-e", "1K", "-w", "1", "-n", "2", "--time-budget", "0.01",
                   "--ops", "all_reduce", "--peers", "none", timeout=240)
    assert r0.returncode == 0 and "# load: none" in r0.stdout, r0.stdout + r0.stderr
    bad = run_bench("--load", "-1", timeout=60)
    assert bad.returncode == 2 and "--load must be >= 0" in bad.stderr
