"""The wait's defences against sharing a CPU (csrc/transport/shm_wait.h, ShmWaits::until):

- a sched_yield that kept the CPU away for RINGCOMM_YIELD_LOST_US with the awaited word still
  unset (another process's task ran a scheduler slice) ends the spin and stops yielding for
  RINGCOMM_YIELD_BACKOFF_MS;
- a wait whose peer last waited on the same CPU (ranks outnumber CPUs, or during the back-off)
  gives the CPU up at once instead of spinning.

Each is observed through ``comm.wait_stats()`` in real processes, with the scheduler placing
them as pinned here: the counters must move where the condition is certain (ranks pinned to one
CPU beside a busy process), stay at zero where it is impossible (a CPU per rank, no competing
process pinned there), and every result is checked against numpy. The knobs are validated."""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import ringcomm
from fd2_capture import capture_fd2
from ranks import BUSY_LOOP
from ringcomm.core.launch import spawn_with_store



def _rank(rank, world, store, cpus, hog, calls):
    os.sched_setaffinity(0, cpus[rank % len(cpus)])
    busy = None
    if hog and rank == 0:
        busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(os.getpid())],
                                preexec_fn=lambda: os.sched_setaffinity(0, cpus[0]))
    try:
        comm, text = capture_fd2(lambda: ringcomm.init(rank=rank, world_size=world, init_method="file://" + store))
        wrong = 0
        with comm:
            before = comm.wait_stats()
            for i in range(calls):
                if hog and rank == world - 1 and i % 10 == 0:
                    time.sleep(0.003)   # the others wait, yielding, while only the busy process can run
                n = (1, 300, 5000)[i % 3]
                x = np.arange(n, dtype=np.float32) * (rank + 1) + i
                comm.all_reduce(x)
                want = np.arange(n, dtype=np.float32) * sum(r + 1 for r in range(world)) + i * world
                wrong += int(np.count_nonzero(x != want))
            after = comm.wait_stats()
        return {"before": before, "after": after, "wrong": wrong, "log": text}
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def _run(world, cpus, hog, calls, env):
    base = {"RINGCOMM_DEBUG": "INFO", "RINGCOMM_TIMEOUT": "60"}
    base.update(env)
    return spawn_with_store(_rank, world, lambda s: (s, cpus, hog, calls), timeout=240, env=base)


def _sum(res, key):
    # Totals since the communicators were created (a lost yield during the connect counts: its
    # back-off covers the calls that follow).
    return sum(r["after"][key] for r in res)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_sharing_a_cpu_with_a_busy_process(world):
    # Every rank and a busy process on CPU 0; every 10th call the last rank sleeps 3 ms first, so
    # the others' waits yield while the busy process is the only other runnable task on the CPU.
    # RINGCOMM_YIELD_LOST_US=1: any yield that ran it while the word stayed unset counts.
    res = _run(world, [{0}], True, 120, {"RINGCOMM_WAIT": "yield", "RINGCOMM_YIELD_LOST_US": "1"})
    for r in res:
        assert r["wrong"] == 0
        assert set(r["after"]) == {"slept", "yields_lost", "colocated", "descheduled", "unpinned_spins", "load_over",
                                   "unpinned_backoffs"}
        assert all(r["after"][k] >= r["before"][k] for k in r["after"])
        assert re.search(r"none for 50 ms after a yield lost the CPU 1 us", r["log"]), r["log"]
    assert _sum(res, "yields_lost") >= 1, [r["after"] for r in res]
    # Ranks outnumber the CPU: waits on a co-located peer skip the spin.
    assert _sum(res, "colocated") >= 1, [r["after"] for r in res]


def test_backoff_disabled_still_exact():
    res = _run(2, [{0}], True, 60, {"RINGCOMM_WAIT": "yield", "RINGCOMM_YIELD_LOST_US": "1",
                                    "RINGCOMM_YIELD_BACKOFF_MS": "0"})
    for r in res:
        assert r["wrong"] == 0
        assert "none for 0 ms" in r["log"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_cpu_per_rank_is_never_colocated():
    # Ranks pinned to different CPUs and no more ranks than CPUs: the placement hint is not
    # consulted (it could only keep two ranks that met on one CPU there), and nothing is co-located.
    cpus = sorted(os.sched_getaffinity(0))[:2]
    res = _run(2, [{cpus[0]}, {cpus[1]}], False, 60, {"RINGCOMM_WAIT": "spin"})
    for r in res:
        assert r["wrong"] == 0
        assert r["after"]["colocated"] == 0, r["after"]
        assert r["after"]["yields_lost"] == 0, r["after"]   # spin never yields


@pytest.mark.parametrize("knob,value", [("RINGCOMM_YIELD_LOST_US", "0"),
                                        ("RINGCOMM_YIELD_BACKOFF_MS", "-1")])
def test_bad_knob_values_raise(knob, value, monkeypatch):
    monkeypatch.setenv(knob, value)
    with pytest.raises(ringcomm.InvalidArgumentError, match=knob):
        from ringcomm import _C
        _C.Communicator(0, 2, 5.0)


def test_world_of_one_has_counters():
    comm = ringcomm.init(rank=0, world_size=1)
    with comm:
        x = np.ones(10, np.float32)
        comm.all_reduce(x)
        st = comm.wait_stats()
    assert st == {"slept": 0, "yields_lost": 0, "colocated": 0, "descheduled": 0, "unpinned_spins": 0,
                  "load_over": 0, "unpinned_backoffs": 0}
    np.testing.assert_array_equal(x, np.ones(10, np.float32))
