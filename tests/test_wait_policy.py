"""The wait policy (RINGCOMM_WAIT, csrc/transport/shm_config.cpp, shm_wait.h): which one a rank resolves, and that
collectives stay exact under each one.

Resolution is checked against the kernel's own answer (os.sched_getaffinity in the rank): the
INFO line every communicator logs names the mode, the CPUs, the local ranks on them and the
verdict (CPUs of its own, ranks may meet on a CPU, ranks outnumber CPUs); `auto` on CPUs of its
own spins synchronous calls' waits for RINGCOMM_SPIN_OWN_CPU_US (tests/test_wait_own_cpu.py), and
unpinned ranks that the usable CPUs hold one each for RINGCOMM_SPIN_UNPINNED_US (tests/test_wait_unpinned.py). Results are checked against numpy under every policy, on one CPU (ranks
sharing it: every wait needs the other rank to be scheduled) and with ranks arriving at random
times and a 1 us spin (so adaptive waits miss, switch to yielding and back)."""
import os
import random
import re

import numpy as np
import pytest

import ringcomm
from fd2_capture import capture_fd2
from ringcomm.core.launch import spawn_with_store


def _rank(rank, world, store, cpus, arrivals):
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    ncpu = len(os.sched_getaffinity(0))
    # The INFO line goes to fd 2 when the communicator connects.
    comm, text = capture_fd2(lambda: ringcomm.init(rank=rank, world_size=world, init_method="file://" + store))
    rng = random.Random(1000 + rank)
    wrong = 0
    with comm:
        for i in range(60):
            if arrivals:
                t = rng.choice((0.0, 0.0, 2e-5, 2e-4, 2e-3))   # 0..2 ms late
                if t:
                    import time
                    time.sleep(t)
            n = (1, 7, 1000, 70000)[i % 4]
            x = (np.arange(n, dtype=np.float64) + 1) * (rank + 1) + i
            comm.all_reduce(x)
            want = (np.arange(n, dtype=np.float64) + 1) * sum(r + 1 for r in range(world)) + i * world
            wrong += int(np.count_nonzero(x != want))
            y = np.full(n, float(rank * 100 + i), dtype=np.float32)
            comm.broadcast(y, root=i % world)
            wrong += int(np.count_nonzero(y != np.float32((i % world) * 100 + i)))
    return {"ncpu": ncpu, "log": text, "wrong": wrong}


def _wait_line(log):
    m = re.search(r"wait (\w+) \((\d+) ranks, (\d+) CPUs, (\d+) ranks on them: ([^)]*)\)", log)
    assert m, log
    return m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5)


ALL = None


@pytest.mark.parametrize("world,cpus,knob", [
    (2, {0}, "auto"),            # 2 ranks on 1 CPU: they outnumber it
    (2, ALL, "auto"),            # as many CPUs as ranks (this machine has 2), not pinned apart
    (3, ALL, "auto"),
    (2, ALL, "adaptive"),
    (2, {0}, "spin"),
    (2, ALL, "yield"),
])
def test_resolved_policy_and_exact_results(world, cpus, knob):
    env = {"RINGCOMM_WAIT": knob, "RINGCOMM_DEBUG": "INFO", "RINGCOMM_SLOT_BYTES": "4K",
           "RINGCOMM_TIMEOUT": "60"}
    if knob == "adaptive":
        env["RINGCOMM_SPIN_US"] = "1"          # misses: adaptive switches to yielding and back
    res = spawn_with_store(_rank, world, lambda s: (s, cpus, True), timeout=240, env=env)
    for r in res:
        assert r["wrong"] == 0
        mode, ranks, ncpu, sharing, verdict = _wait_line(r["log"])
        assert mode == knob and ranks == world and ncpu == r["ncpu"], r["log"]
        # Every rank runs on the same CPUs here: all of them may meet on this one's. Where the
        # usable CPUs hold a rank each, they in effect have one each and auto's synchronous calls
        # spin as pinned ranks' do (tests/test_wait_unpinned.py); where ranks outnumber them, no wait
        # takes that spin.
        assert sharing == world, r["log"]
        mask_verdict, node = verdict.split("; ")
        fits = world <= r["ncpu"]
        assert mask_verdict == ("ranks may meet on a CPU" if fits else "ranks outnumber CPUs"), r["log"]
        assert node == f"{world} node ranks on {ncpu} usable CPUs" + (": a CPU each in effect" if fits else ""), r["log"]
        assert ("synchronous calls spin up to" in r["log"]) == (fits and knob == "auto"), r["log"]
