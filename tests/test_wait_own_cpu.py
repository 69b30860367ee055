"""RINGCOMM_WAIT=auto where no other local rank may run on a rank's CPUs (csrc/transport/shm_wait.h):
the facts it decides from and what each decision does, in real processes.

- The facts: each rank's affinity mask travels in its segment header, so the count of local ranks
  on a rank's CPUs is the kernel's (ranks pinned apart: one each; pinned together: both), whoever
  pinned them. Only ranks pinned apart take the long spin: unpinned ranks may meet on a CPU, and
  a spinner there can keep a late peer off the CPU it needs.
- A synchronous call's wait spins for RINGCOMM_SPIN_OWN_CPU_US and then sleeps: a peer that comes
  late by far more costs the waiter about that bound of CPU time, never the whole wait
  (``time.thread_time`` around the call; the wait sleeps, ``wait_stats()['slept']``).
- A call run on the progress thread (async) does not take that spin: its caller may compute.
- A spin that loses its CPU to another task (a busy process pinned on it) sleeps at once
  (``descheduled``) instead of spinning on.

Every result is checked against numpy."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import ringcomm
from ranks import BUSY_LOOP
from ringcomm.core.launch import spawn_with_store

TWO_CPUS = sorted(os.sched_getaffinity(0))[:2]
needs_two = pytest.mark.skipif(len(TWO_CPUS) < 2, reason="needs 2 CPUs")


def _late_peer(rank, world, store, pins, late_s, async_op, hog):
    """Rank 0 calls first; rank 1 sleeps late_s before its call. Returns rank 0's wait figures."""
    if pins is not None:
        os.sched_setaffinity(0, pins[rank])
    busy = None
    if hog and rank == 0:
        busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(os.getpid())],
                                preexec_fn=lambda: os.sched_setaffinity(0, pins[0]))
    try:
        comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store)
        with comm:
            desc = comm._c.describe_wait()
            x = np.full(300, float(rank + 1), np.float32)
            comm.all_reduce(x)    # connected and warm
            before = comm.wait_stats()
            if rank == 1:
                time.sleep(late_s)
            x = np.full(300, float(rank + 1), np.float32)
            c0, w0, p0 = time.thread_time(), time.perf_counter(), time.process_time()
            if async_op:
                comm.all_reduce(x, async_op=True).wait()
            else:
                comm.all_reduce(x)
            cpu, wall, proc = time.thread_time() - c0, time.perf_counter() - w0, time.process_time() - p0
            after = comm.wait_stats()
        ok = bool(np.all(x == 3.0))
        return {"desc": desc, "ok": ok, "cpu": cpu, "proc": proc, "wall": wall,
                "stats": {k: after[k] - before[k] for k in after}}
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def _run(env, pins=None, late_s=0.3, async_op=False, hog=False):
    base = {"RINGCOMM_TIMEOUT": "60"}
    base.update(env)
    return spawn_with_store(_late_peer, 2, lambda s: (s, pins, late_s, async_op, hog), timeout=120, env=base)


@needs_two
@pytest.mark.parametrize("pins,verdict", [
    ([{TWO_CPUS[0]}, {TWO_CPUS[1]}], "1 ranks on them: CPUs of its own"),
    ([{TWO_CPUS[0]}, {TWO_CPUS[0]}], "2 ranks on them: ranks outnumber CPUs"),
    ([set(TWO_CPUS), {TWO_CPUS[1]}], None),   # rank 0 meets rank 1 on its CPUs; rank 1 meets 0
])
def test_ranks_on_own_cpus_come_from_every_ranks_mask(pins, verdict):
    res = _run({}, pins=pins, late_s=0.0)
    for r in res:
        assert r["ok"]
    if verdict is None:
        assert "(2 ranks, 2 CPUs, 2 ranks on them: ranks may meet on a CPU; " in res[0]["desc"], res[0]["desc"]
        assert "(2 ranks, 1 CPUs, 2 ranks on them: ranks outnumber CPUs; " in res[1]["desc"], res[1]["desc"]
    else:
        for r in res:
            assert verdict in r["desc"], r["desc"]


def _spun(env, need_cpu, **kw):
    """Up to 3 runs, until one whose rank 0 kept its CPU through the spin (descheduled == 0), and
    on that one the CPU the spin took (it was spun, not cut short). A busy machine (another test
    file's ranks on these CPUs) can take the CPU in every run; the wait then says so
    (descheduled), and the other checks still hold. Every run's figures."""
    runs = []
    for _ in range(3):
        r = _run(env, pins=[{TWO_CPUS[0]}, {TWO_CPUS[1]}], **kw)[0]
        runs.append(r)
        if r["stats"]["descheduled"] == 0:
            assert r[need_cpu[0]] >= need_cpu[1], runs
            break
    return runs


@needs_two
def test_a_late_peer_costs_the_spin_bound_not_the_wait():
    # A 20 ms spin bound against a peer 300 ms late: the wait spins most of 20 ms of CPU, then
    # sleeps: far less CPU than the wait's length.
    for r in _spun({"RINGCOMM_SPIN_OWN_CPU_US": "20000"}, ("cpu", 0.015)):
        assert r["ok"], r
        assert r["wall"] >= 0.25, r
        assert r["stats"]["slept"] >= 1, r
        assert r["cpu"] < 0.1, r


@needs_two
def test_default_bound_is_five_milliseconds():
    for r in _spun({}, ("cpu", 0.004)):
        assert "synchronous calls spin up to 5000 us" in r["desc"], r["desc"]
        assert r["ok"] and r["stats"]["slept"] >= 1 and r["cpu"] < 0.05, r


@needs_two
def test_async_calls_do_not_take_the_long_spin():
    # The same late peer with a 200 ms bound: a synchronous call spins (most of) it, an async
    # call, run on the progress thread beside a caller that may compute, yields and sleeps early.
    env = {"RINGCOMM_SPIN_OWN_CPU_US": "200000"}
    pins = [{TWO_CPUS[0]}, {TWO_CPUS[1]}]
    sync = _spun(env, ("proc", 0.1), late_s=0.4)[-1]
    asyn = _run(env, pins=pins, late_s=0.4, async_op=True)[0]
    assert sync["ok"] and asyn["ok"]
    assert asyn["proc"] < 0.05, asyn
    assert asyn["stats"]["slept"] >= 1, asyn


@needs_two
def test_unpinned_ranks_do_not_take_the_pinned_spin():
    # Two unpinned ranks on two CPUs may meet on one: RINGCOMM_SPIN_OWN_CPU_US does not apply to
    # them, and with their own bound at 0 a synchronous call's wait against a peer 400 ms late
    # yields and sleeps early (their spin: tests/test_wait_unpinned.py).
    res = _run({"RINGCOMM_SPIN_OWN_CPU_US": "200000", "RINGCOMM_SPIN_UNPINNED_US": "0"},
               pins=[set(TWO_CPUS), set(TWO_CPUS)], late_s=0.4)
    r = res[0]
    assert "ranks may meet on a CPU" in r["desc"] and "synchronous calls spin" not in r["desc"], r["desc"]
    assert r["ok"] and r["stats"]["slept"] >= 1 and r["proc"] < 0.05, r
    assert r["stats"]["unpinned_spins"] == 0, r


@needs_two
def test_a_spin_that_loses_its_cpu_sleeps_at_once():
    # Rank 0 shares its CPU with a busy process; a 1 s bound against a peer 400 ms late: the
    # scheduler runs the busy process within a slice, the spin sees the gap and sleeps.
    res = _run({"RINGCOMM_SPIN_OWN_CPU_US": "1000000"}, pins=[{TWO_CPUS[0]}, {TWO_CPUS[1]}],
               late_s=0.4, hog=True)
    r = res[0]
    assert r["ok"] and res[1]["ok"]
    assert r["stats"]["descheduled"] >= 1, r
    assert r["stats"]["slept"] >= 1, r
    assert r["cpu"] < 0.3, r


def _facts(rank, world, store, pins, node_world):
    os.sched_setaffinity(0, pins[rank])
    if node_world:
        os.environ["LOCAL_WORLD_SIZE"] = str(node_world)   # more ranks on this node, in other groups
    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store)
    with comm:
        return comm._c.describe_wait()


@needs_two
def test_a_node_with_more_ranks_than_cpus_never_takes_the_long_spin():
    # This group's two ranks are pinned apart, but the node runs 8 ranks (LOCAL_WORLD_SIZE) on
    # fewer CPUs: other groups' ranks share these CPUs, which this group's masks cannot show.
    pins = [{TWO_CPUS[0]}, {TWO_CPUS[1]}]
    if os.cpu_count() >= 8:
        pytest.skip("needs a node with fewer than 8 online CPUs")
    for desc in spawn_with_store(_facts, 2, lambda s: (s, pins, 8), timeout=60):
        assert "(2 ranks, 1 CPUs, 8 ranks on them: ranks outnumber CPUs; 8 node ranks on 1 usable CPUs)" in desc, desc
    for desc in spawn_with_store(_facts, 2, lambda s: (s, pins, 2), timeout=60):
        assert "(2 ranks, 1 CPUs, 1 ranks on them: CPUs of its own)" in desc, desc


def _aborts(rank, world, store, pins):
    os.sched_setaffinity(0, pins[rank])
    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store)
    comm.all_reduce(np.ones(4, np.float32))
    if rank == 1:
        time.sleep(0.3)
        comm.abort("rank 1 gives up")   # while rank 0 spins for its part
        return ("aborted", 0.0)
    t0 = time.perf_counter()
    try:
        comm.all_reduce(np.ones(4, np.float32))
        return ("no error", time.perf_counter() - t0)
    except ringcomm.RingcommError as e:
        return (type(e).__name__, time.perf_counter() - t0)
    finally:
        comm.close()


@needs_two
def test_a_long_spin_still_notices_a_peer_that_gave_up():
    # A 30 s spin bound: the spin checks the peers as a sleeping waiter does (every
    # RINGCOMM_LIVENESS_MS), so rank 1's abort is raised on rank 0 within a second, not after 30 s.
    pins = [{TWO_CPUS[0]}, {TWO_CPUS[1]}]
    res = spawn_with_store(_aborts, 2, lambda s: (s, pins), timeout=90,
                           env={"RINGCOMM_SPIN_OWN_CPU_US": "30000000", "RINGCOMM_TIMEOUT": "60"})
    kind, took = res[0]
    assert kind == "PeerFailureError", res
    assert took < 3.0, res


def test_bad_bound_raises(monkeypatch):
    monkeypatch.setenv("RINGCOMM_SPIN_OWN_CPU_US", "-1")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_SPIN_OWN_CPU_US"):
        from ringcomm import _C
        _C.Communicator(0, 2, 5.0)


def _pool_spin(rank, world, store, pins):
    os.sched_setaffinity(0, pins[rank])
    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store)
    with comm:
        x = np.full(70_000, float(rank + 1), np.float32)
        comm.all_reduce(x)
        return {"pool": comm._c.pool_spin_us, "threads": comm._c.cpu_threads,
                "desc": comm._c.describe_wait(), "ok": bool(np.all(x == 3.0))}


@needs_two
@pytest.mark.parametrize("together", [False, True])
def test_the_split_pool_spins_as_the_settled_waits(together):
    # The pool is built once attach() has counted the ranks on each rank's CPUs from their masks,
    # so its idle workers spin as the rank's waits do: 50 us for ranks pinned apart, the
    # oversubscribed 2 us for two ranks pinned on one CPU (before attach a rank knows only that
    # it has one CPU and two local ranks).
    pins = [{TWO_CPUS[0]}, {TWO_CPUS[0]}] if together else [{TWO_CPUS[0]}, {TWO_CPUS[1]}]
    env = {"RINGCOMM_TIMEOUT": "60", "RINGCOMM_THREADS": "2", "RINGCOMM_THREADS_MIN_BYTES": "4K"}
    res = spawn_with_store(_pool_spin, 2, lambda s: (s, pins), timeout=120, env=env)
    for r in res:
        assert r["ok"] and r["threads"] == 2, r
        assert f"spin {r['pool']} us" in r["desc"], r
        assert r["pool"] == (2 if together else 50), r
