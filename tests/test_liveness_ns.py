"""Liveness across PID namespaces (csrc/transport/heartbeat.h, ShmControl::check_peers).

A peer in this rank's PID namespace is probed by pid; a peer in another one (containers sharing
/dev/shm but not PIDs) by the heartbeat word its background thread bumps in its segment header.
`RINGCOMM_TEST_PIDNS`, a test knob of the test build (a rank given one runs over ringcomm._C_test:
tests/hooked_build.py), replaces a process's namespace identity, so ranks on one machine can be
told they live in different namespaces; where `unshare --pid` is permitted a rank also runs in a
real separate PID namespace. Every rank is a separate process (subprocess, not fork) with its own
deadline; the independent reference for the data is numpy (a sum of the ranks' inputs), for the
detection bound the test's own clock around the SIGKILL.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Generous against this 2-core machine's load: rank start-up and a liveness slice come on top.
SLACK_S = 4.0

# One rank: connect over a file store, then run a plan of steps (comma separated):
#   allreduce     all_reduce of full(4, rank + 1) (float64), reported for the test to check
#   barrier       a barrier, reported with its start and end times
#   sleep:K       time.sleep(K x the heartbeat bound) in Python: no ringcomm call
#   ready         create the marker file ready<rank>
#   hang          sleep until killed
#   close         comm.close(), reported
#   send:P/recv:P a 4-element float64 message to / from rank P (the value rank P+1 sends: full(4, 10 * (sender + 1)))
# The first step that raises is reported (type, message, times) and ends the plan.
_RANK = r'''
import json, os, sys, time
import numpy as np
if "RINGCOMM_TEST_PIDNS" in os.environ:
    import hooked_build
    hooked_build.use()
import ringcomm

rank, world, store, marks, plan = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
bound = float(os.environ["RINGCOMM_HEARTBEAT_TIMEOUT_MS"]) / 1000.0

def emit(**kw):
    print(json.dumps(kw), flush=True)

comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store, timeout=90)
emit(ev="threads", n=len(os.listdir("/proc/self/task")))
for step in plan.split(","):
    name, _, arg = step.partition(":")
    t0 = time.time()
    try:
        if name == "allreduce":
            x = np.full(4, rank + 1.0)
            comm.all_reduce(x)
            emit(ev="allreduce", value=x.tolist())
        elif name == "barrier":
            comm.barrier()
            emit(ev="barrier", t0=t0, t1=time.time())
        elif name == "sleep":
            time.sleep(float(arg) * bound)
        elif name == "ready":
            open(os.path.join(marks, "ready%d" % rank), "w").close()
        elif name == "hang":
            time.sleep(600)
        elif name == "close":
            comm.close()
            emit(ev="closed")
        elif name == "send":
            comm.send(np.full(4, 10.0 * (rank + 1)), int(arg))
        elif name == "recv":
            y = np.zeros(4)
            comm.recv(y, int(arg))
            emit(ev="recv", value=y.tolist(), t0=t0, t1=time.time())
        else:
            raise SystemExit("unknown step " + step)
    except ringcomm.RingcommError as e:
        emit(ev="error", step=name, kind=type(e).__name__, msg=str(e), t0=t0, t1=time.time())
        break
comm.close()
'''


def _env(pidns, bound_ms, debug="INFO"):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RINGCOMM_") and k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env["RINGCOMM_HEARTBEAT_TIMEOUT_MS"] = str(bound_ms)
    env["RINGCOMM_DEBUG"] = debug
    if pidns is not None:
        env["RINGCOMM_TEST_PIDNS"] = pidns
    return env


class Ranks:
    """The rank processes of one test; every one is killed and reaped at the end."""

    def __init__(self, tmp_path, plans, pidns, bound_ms, wrap=None):
        self.tmp = tmp_path
        (tmp_path / "store").mkdir()
        (tmp_path / "marks").mkdir()
        script = tmp_path / "rank.py"
        script.write_text(_RANK)
        self.procs = []
        for r, plan in enumerate(plans):
            cmd = [sys.executable, str(script), str(r), str(len(plans)), str(tmp_path / "store"),
                   str(tmp_path / "marks"), plan]
            if wrap and wrap[r]:
                cmd = wrap[r] + cmd
            out = open(tmp_path / f"out{r}", "w")
            err = open(tmp_path / f"err{r}", "w")
            self.procs.append(subprocess.Popen(cmd, env=_env(pidns[r], bound_ms), stdout=out, stderr=err))
            out.close()
            err.close()

    def wait_marker(self, name, timeout):
        deadline = time.monotonic() + timeout
        while not (self.tmp / "marks" / name).exists():
            assert time.monotonic() < deadline, f"marker {name} never appeared: {self.report()}"
            assert all(p.poll() is None for p in self.procs), f"a rank exited early: {self.report()}"
            time.sleep(0.02)

    def join(self, timeout, may_die=()):
        deadline = time.monotonic() + timeout
        for r, p in enumerate(self.procs):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {r} still running after {timeout} s: {self.report()}")
            if r not in may_die:
                assert p.returncode == 0, f"rank {r} exit {p.returncode}: {self.report()}"

    def events(self, r):
        return [json.loads(ln) for ln in (self.tmp / f"out{r}").read_text().splitlines() if ln.startswith("{")]

    def event(self, r, ev):
        got = [e for e in self.events(r) if e["ev"] == ev]
        assert len(got) == 1, f"rank {r}: {ev}: {got}; {self.report()}"
        return got[0]

    def info_line(self, r):
        lines = [ln for ln in (self.tmp / f"err{r}").read_text().splitlines()
                 if ln.startswith("ringcomm[") and "transport shm" in ln]
        assert len(lines) == 1, self.report()
        return lines[0]

    def report(self):
        return "\n".join(f"--- rank {r}: {(self.tmp / f'out{r}').read_text()}{(self.tmp / f'err{r}').read_text()[-3000:]}"
                         for r in range(len(self.procs)))

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(30)


@pytest.fixture
def ranks(tmp_path):
    made = []

    def start(*a, **kw):
        made.append(Ranks(tmp_path, *a, **kw))
        return made[-1]

    yield start
    for r in made:
        r.kill_all()


def _sum(world):
    return [float(world * (world + 1) // 2)] * 4


@pytest.mark.timeout(120)
def test_kill9_of_a_peer_in_another_namespace_is_detected_within_the_bound(ranks):
    """(a) The victim's pid means nothing in the observer's namespace, so only its heartbeat tells:
    after SIGKILL the observer's barrier raises PeerFailureError naming the rank, the operation and
    the heartbeat, no sooner than the heartbeat could have gone still and within the bound."""
    bound_ms = 1000
    rk = ranks(["allreduce,ready,barrier", "allreduce,ready,hang"], ["ns-A", "ns-B"], bound_ms)
    rk.wait_marker("ready0", 60)
    rk.wait_marker("ready1", 60)
    t_kill = time.time()
    rk.procs[1].send_signal(signal.SIGKILL)
    rk.join(bound_ms / 1000 + 60, may_die=(1,))
    assert rk.procs[1].returncode == -signal.SIGKILL
    assert rk.event(0, "allreduce")["value"] == _sum(2)
    err = rk.event(0, "error")
    assert err["step"] == "barrier" and err["kind"] == "PeerFailureError", err
    assert "barrier" in err["msg"] and "rank 1" in err["msg"] and "heartbeat" in err["msg"], err
    assert "test:ns-B" in err["msg"] and "RINGCOMM_HEARTBEAT_TIMEOUT_MS" in err["msg"], err
    dt = err["t1"] - t_kill
    assert 0.5 * bound_ms / 1000 <= dt <= bound_ms / 1000 + SLACK_S, (dt, err)
    assert "rank 1 heartbeat (PID namespace test:ns-B, ours test:ns-A" in rk.info_line(0)


@pytest.mark.timeout(120)
def test_a_live_peer_in_another_namespace_that_computes_longer_than_the_bound_is_alive(ranks):
    """(b) The sleeper makes no ringcomm call for 3x the bound (time.sleep in Python): its
    heartbeat thread keeps beating, so the waiter's barrier waits it out and succeeds, and the
    collectives after it are right. Both ranks say so at RINGCOMM_DEBUG=INFO."""
    bound_ms = 1000
    rk = ranks(["allreduce,barrier,allreduce", "allreduce,sleep:3,barrier,allreduce"], ["ns-A", "ns-B"], bound_ms)
    rk.join(90)
    for r in range(2):
        assert [e["value"] for e in rk.events(r) if e["ev"] == "allreduce"] == [_sum(2)] * 2, rk.report()
        assert not [e for e in rk.events(r) if e["ev"] == "error"], rk.report()
    b = rk.event(0, "barrier")
    assert b["t1"] - b["t0"] >= 2.5 * bound_ms / 1000, b   # it waited across several bounds
    assert f"liveness: rank 1 heartbeat (PID namespace test:ns-B, ours test:ns-A; dead after {bound_ms} ms still)" in rk.info_line(0)
    assert f"liveness: rank 0 heartbeat (PID namespace test:ns-A, ours test:ns-B; dead after {bound_ms} ms still)" in rk.info_line(1)


@pytest.mark.timeout(150)
def test_a_peer_in_another_namespace_that_closed_is_closed_never_dead(ranks):
    """(c) World 3: rank 2 (another namespace) closes cleanly and exits; its heartbeat stops.
    Ranks 0 and 1 then exchange a message that takes 2x the bound to arrive (rank 0 checks its
    peers' liveness all along): no PeerFailureError for rank 2. A barrier, which needs rank 2,
    then raises the "closed" error, not a death."""
    bound_ms = 1000
    rk = ranks(["allreduce,recv:1,barrier", "allreduce,sleep:2,send:0,barrier", "allreduce,close"],
               ["ns-A", "ns-A", "ns-B"], bound_ms)
    rk.join(120)
    for r in range(3):
        assert rk.event(r, "allreduce")["value"] == _sum(3), rk.report()
    rk.event(2, "closed")
    got = rk.event(0, "recv")
    assert got["value"] == [20.0] * 4, got
    assert got["t1"] - got["t0"] >= 1.5 * bound_ms / 1000, got  # waited past the bound
    for r in (0, 1):
        err = rk.event(r, "error")
        assert err["step"] == "barrier" and err["kind"] == "PeerFailureError", err
        assert "rank 2 closed" in err["msg"] and "died" not in err["msg"] and "heartbeat" not in err["msg"], err
    assert "rank 1 pid probe (same PID namespace), rank 2 heartbeat (PID namespace test:ns-B" in rk.info_line(0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pidns", [None, "ns-A"])
def test_same_namespace_keeps_the_pid_probe_and_no_heartbeat_thread(ranks, pidns):
    """(d) Ranks in one namespace (the real one, or one fake name on both) probe each other by
    pid: a SIGKILL is found within liveness slices, long before a 30 s heartbeat bound, the
    message is the pid one, and no heartbeat thread runs (one thread fewer than across
    namespaces, where the same plan runs with one more)."""
    rk = ranks(["allreduce,ready,barrier", "allreduce,ready,hang"], [pidns, pidns], 30000)
    rk.wait_marker("ready0", 60)
    rk.wait_marker("ready1", 60)
    t_kill = time.time()
    rk.procs[1].send_signal(signal.SIGKILL)
    rk.join(60, may_die=(1,))
    err = rk.event(0, "error")
    assert err["kind"] == "PeerFailureError" and "rank 1 (pid" in err["msg"] and "died" in err["msg"], err
    assert "heartbeat" not in err["msg"], err
    assert err["t1"] - t_kill < SLACK_S, err
    assert "liveness: rank 1 pid probe (same PID namespace)" in rk.info_line(0)
    same_threads = rk.event(0, "threads")["n"]

    # The same plan across two fake namespaces: exactly the heartbeat thread more, on each rank.
    rk2_dir = rk.tmp / "cross"
    rk2_dir.mkdir()
    rk2 = Ranks(rk2_dir, ["allreduce", "allreduce"], ["ns-A", "ns-B"], 30000)
    try:
        rk2.join(60)
        assert rk2.event(0, "threads")["n"] == same_threads + 1, rk2.report()
    finally:
        rk2.kill_all()


def _unshare_pid_works():
    try:
        r = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=20)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _children(pid):
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.timeout(150)
@pytest.mark.skipif(not _unshare_pid_works(), reason="unshare --pid is not permitted here")
def test_a_real_pid_namespace_heartbeat_keeps_a_sleeper_alive_and_finds_a_kill(ranks):
    """Rank 1 runs in a new PID namespace (unshare --pid --fork: it is pid 1 there, which exists in
    ours too, so a pid probe would call it alive forever). It sleeps past the bound (alive), then
    is killed: rank 0 reports the death through the heartbeat within the bound."""
    bound_ms = 1000
    rk = ranks(["allreduce,barrier,allreduce,ready,barrier", "allreduce,sleep:2,barrier,allreduce,ready,hang"],
               [None, None], bound_ms, wrap=[None, ["unshare", "--pid", "--fork"]])
    rk.wait_marker("ready1", 90)
    rk.wait_marker("ready0", 90)
    python = _children(rk.procs[1].pid)
    assert len(python) == 1, python
    t_kill = time.time()
    os.kill(python[0], signal.SIGKILL)
    rk.join(bound_ms / 1000 + 60, may_die=(1,))
    assert [e["value"] for e in rk.events(0) if e["ev"] == "allreduce"] == [_sum(2)] * 2, rk.report()
    b = rk.event(0, "barrier")
    assert b["t1"] - b["t0"] >= 1.5 * bound_ms / 1000, b
    err = rk.event(0, "error")
    assert err["kind"] == "PeerFailureError" and "heartbeat" in err["msg"] and "rank 1 (pid 1 in PID namespace pid:[" in err["msg"], err
    assert 0.5 * bound_ms / 1000 <= err["t1"] - t_kill <= bound_ms / 1000 + SLACK_S, err
    info = rk.info_line(0)
    assert "liveness: rank 1 heartbeat (PID namespace pid:[" in info, info
