"""RINGCOMM_WAIT=auto for ranks that are not pinned apart (csrc/transport/cpu_facts.h,
shm_wait.h): the facts the decision reads, the decision itself on injected facts, and what it
does in real processes.

- The facts come from files under three roots (proc, sys, the cgroup mount): here they are
  written into a temporary tree, so the mask, the online CPUs, the cgroup quota (v2 ``cpu.max``
  along the cgroup's path, or v1's CFS quota) and the load (runnable threads, one-minute average)
  are whatever the test says.
- Ranks not pinned apart in effect have a CPU each when the node's ranks (plus
  RINGCOMM_UNPINNED_SPARE_CPUS) fit the usable CPUs; then a synchronous call's wait spins
  (``unpinned_spins``) as a pinned rank's does. 8 ranks on 2 CPUs never take that spin.
- The node's load, read while the ranks run (RINGCOMM_LOAD_CHECK_MS): busy processes beside the
  ranks make its runnable threads outnumber the CPUs (``load_over``), and no unpinned spin is taken.

Every result is checked against numpy."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import ringcomm
from ranks import BUSY_LOOP
from ringcomm import _C_test as T
from ringcomm.core.launch import spawn_with_store

ALL_CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(ALL_CPUS) < 2 or (os.cpu_count() or 0) < 2, reason="needs 2 CPUs")


# ---- the facts, from injected files -------------------------------------------------------------
def _tree(tmp_path, cgroup="0::/\n", files=None, online="0-1\n", loadavg="0.50 0.40 0.30 2/300 4242\n"):
    roots = {k: tmp_path / k for k in ("proc", "sys", "cg")}
    (roots["proc"] / "self").mkdir(parents=True)
    (roots["proc"] / "self" / "cgroup").write_text(cgroup)
    (roots["proc"] / "loadavg").write_text(loadavg)
    cpu = roots["sys"] / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    if online is not None:
        (cpu / "online").write_text(online)
    roots["cg"].mkdir()
    for rel, text in (files or {}).items():
        f = roots["cg"] / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return str(roots["proc"]), str(roots["sys"]), str(roots["cg"])


def test_no_quota_the_mask_and_online_cpus_decide(tmp_path):
    f = T.cpu_facts(*_tree(tmp_path, online="0-7\n", files={"cpu.max": "max 100000\n"}), mask_cpus=4)
    assert f == {"mask_cpus": 4, "online": 8, "quota_cpus": 0.0, "usable": 4, "runnable": 2, "load_avg1": 0.5}
    f = T.cpu_facts(*_tree(tmp_path / "b", online="0,2-3\n"), mask_cpus=16)
    assert f["online"] == 3 and f["usable"] == 3


def test_the_smallest_cgroup_v2_quota_on_the_path_binds(tmp_path):
    # A container's cgroup: the mask and the online CPUs show 8, the quota 1.5 CPUs further up.
    files = {"kube/cpu.max": "150000 100000\n", "kube/pod/cpu.max": "max 100000\n",
             "kube/pod/c1/cpu.max": "400000 100000\n", "cpu.max": "max 100000\n"}
    f = T.cpu_facts(*_tree(tmp_path, cgroup="0::/kube/pod/c1\n", online="0-7\n", files=files), mask_cpus=8)
    assert f["quota_cpus"] == pytest.approx(1.5)
    assert f["usable"] == 1            # 1.5 CPUs of quota keep one spinner, not two
    files["kube/cpu.max"] = "200000 100000\n"
    f = T.cpu_facts(*_tree(tmp_path / "b", cgroup="0::/kube/pod/c1\n", online="0-7\n", files=files), mask_cpus=8)
    assert f["quota_cpus"] == pytest.approx(2.0) and f["usable"] == 2


def test_a_cgroup_v1_cfs_quota_counts_too(tmp_path):
    cg = "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {"cpu/docker/abc/cpu.cfs_quota_us": "300000\n", "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
             "cpu/docker/cpu.cfs_quota_us": "-1\n", "cpu/docker/cpu.cfs_period_us": "100000\n"}
    f = T.cpu_facts(*_tree(tmp_path, cgroup=cg, online="0-15\n", files=files), mask_cpus=16)
    assert f["quota_cpus"] == pytest.approx(3.0) and f["usable"] == 3


def test_missing_or_malformed_facts_are_unknown(tmp_path):
    f = T.cpu_facts(*_tree(tmp_path, cgroup="", online=None, loadavg="garbage\n",
                           files={"cpu.max": "lots 0\n"}), mask_cpus=0)
    assert f == {"mask_cpus": 0, "online": 0, "quota_cpus": 0.0, "usable": 0, "runnable": -1, "load_avg1": -1.0}
    f = T.cpu_facts(*_tree(tmp_path / "b", online="3-1\n", loadavg="1.5 1 1 x/3 5\n"), mask_cpus=2)
    assert f["online"] == 0 and f["usable"] == 2 and f["runnable"] == -1 and f["load_avg1"] == 1.5


@pytest.mark.parametrize("mask,online,quota,usable", [
    (2, 2, 0.0, 2), (64, 64, 2.0, 2), (64, 64, 0.5, 1), (4, 2, 0.0, 2), (0, 0, 0.0, 0), (0, 8, 3.9, 3)])
def test_usable_cpus_are_the_fewest_known(mask, online, quota, usable):
    assert T.usable_cpus(mask, online, quota) == usable


@pytest.mark.parametrize("ranks,usable,spare,own", [
    (2, 2, 0, True), (2, 2, 1, False), (2, 3, 1, True), (3, 2, 0, False), (8, 2, 0, False),
    (2, 0, 0, False), (1, 1, 0, True)])
def test_unpinned_ranks_have_a_cpu_each_when_the_usable_cpus_hold_them(ranks, usable, spare, own):
    assert T.unpinned_own_cpus(ranks, usable, spare) is own


@pytest.mark.parametrize("runnable,avg1,usable,slack,avg_slack,over", [
    (2, 1.9, 2, 0, 0.0, False), (3, 1.0, 2, 0, 1.0, True), (3, 2.5, 2, 1, 0.0, False),
    (-1, -1.0, 2, 0, 0.0, False), (9, 0.0, 8, 0, 1.0, True),
    (1, 16.0, 2, 0, 1.0, True),      # busy processes between slices: the instant count missed them
    (2, 2.6, 2, 0, 1.0, False),      # two ranks busy on two CPUs, and a little more: within the slack
    (2, 3.2, 2, 0, 1.0, True), (2, 3.2, 2, 1, 0.0, True), (2, 3.2, 2, 1, 0.5, False),
    (-1, 2.5, 2, 0, 0.0, True), (5, 1.0, 0, 0, 0.0, False)])
def test_the_node_is_oversubscribed_when_its_load_exceeds_the_cpus(runnable, avg1, usable, slack, avg_slack, over):
    assert T.load_oversubscribed(runnable, avg1, usable, slack, avg_slack) is over


# ---- in real processes --------------------------------------------------------------------------
def _late(rank, world, store, late_s, busy_n):
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(os.getpid())]) for _ in range(busy_n if rank == 0 else 0)]
    try:
        comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store)
        with comm:
            desc = comm._c.describe_wait()
            x = np.full(300, float(rank + 1), np.float32)
            comm.all_reduce(x)
            before = comm.wait_stats()
            if busy_n:
                # past the load check's interval, so that the next wait reads the load afresh
                time.sleep(0.005)
            if rank == 1 and late_s:
                time.sleep(late_s)
            x = np.full(300, float(rank + 1), np.float32)
            c0 = time.thread_time()
            comm.all_reduce(x)
            cpu = time.thread_time() - c0
            for i in range(20):
                y = np.full(64, float(rank + i), np.float32)
                comm.all_reduce(y)
                if not np.all(y == float(sum(r + i for r in range(world)))):
                    return {"ok": False}
            after = comm.wait_stats()
        want = float(world * (world + 1) // 2)
        return {"desc": desc, "ok": bool(np.all(x == want)), "cpu": cpu,
                "stats": {k: after[k] - before[k] for k in after}}
    finally:
        for b in busy:
            b.kill()
            b.wait()


def _run(world, env, late_s=0.0, busy_n=0):
    base = {"RINGCOMM_TIMEOUT": "60"}
    base.update(env)
    return spawn_with_store(_late, world, lambda s: (s, late_s, busy_n), timeout=180, env=base)


@needs_two
def test_two_unpinned_ranks_on_two_cpus_spin():
    # Without the load check (other tests' processes share this machine), 2 unpinned ranks on 2
    # CPUs take the spin pinned ranks take. Whether a given wait spins is then up to the run-time
    # checks: a peer that last waited on this CPU (`colocated`), a spin that lost its CPU
    # (`descheduled`) or one that follows such a loss within the back-off (`unpinned_backoffs`, an
    # earlier call's loss) sleeps at once, and a busy machine may do any. So every try either spun
    # (against a peer 300 ms late, most of a 20 ms bound) or counts the check that stopped it.
    env = {"RINGCOMM_SPIN_UNPINNED_US": "20000", "RINGCOMM_LOAD_CHECK_MS": "0"}
    runs = []
    for _ in range(5):
        res = _run(2, env, late_s=0.3)
        r = res[0]
        runs.append(r)
        assert all(x["ok"] for x in res), res
        assert "2 ranks on them: ranks may meet on a CPU; 2 node ranks on 2 usable CPUs: a CPU each in effect" in r["desc"], r["desc"]
        assert "synchronous calls spin up to 20000 us while" in r["desc"], r["desc"]
        assert r["stats"]["slept"] >= 1 and r["cpu"] < 0.15, r
        stopped = r["stats"]["colocated"] + r["stats"]["descheduled"] + r["stats"]["unpinned_backoffs"]
        assert r["stats"]["unpinned_spins"] >= 1 or stopped >= 1, r
        if r["stats"]["unpinned_spins"] >= 1 and stopped == 0:
            assert r["cpu"] >= 0.015, runs
            break


@needs_two
def test_eight_ranks_on_two_cpus_do_not_spin():
    res = _run(8, {"RINGCOMM_LOAD_CHECK_MS": "0"})
    for r in res:
        assert r["ok"], res
        assert "8 ranks on them: ranks outnumber CPUs; 8 node ranks on 2 usable CPUs)" in r["desc"], r["desc"]
        assert "synchronous calls spin" not in r["desc"], r["desc"]
        assert r["stats"]["unpinned_spins"] == 0, r


@needs_two
def test_spare_cpus_asked_for_turn_the_spin_off():
    for r in _run(2, {"RINGCOMM_UNPINNED_SPARE_CPUS": "1"}):
        assert r["ok"] and "2 node ranks on 2 usable CPUs)" in r["desc"], r["desc"]
        assert r["stats"]["unpinned_spins"] == 0, r


@needs_two
def test_runnable_threads_beyond_the_cpus_stop_the_spin():
    # Three busy processes beside two ranks on two CPUs: every load check (each millisecond) finds
    # more runnable threads than CPUs, so no unpinned spin is taken and waits give the CPU up early.
    # The load is read where a wait starts: rank 0 waits for its late peer at least 5 ms after its
    # last check, so it counts one; rank 1 may find every call's data ready and never wait.
    res = _run(2, {"RINGCOMM_LOAD_CHECK_MS": "1"}, late_s=0.05, busy_n=3)
    for r in res:
        assert r["ok"], res
        assert "a CPU each in effect" in r["desc"], r["desc"]
        assert r["stats"]["unpinned_spins"] == 0, r
    assert res[0]["stats"]["load_over"] >= 1, res


@pytest.mark.parametrize("knob,value", [("RINGCOMM_SPIN_UNPINNED_US", "-1"), ("RINGCOMM_UNPINNED_SPARE_CPUS", "-1"),
                                        ("RINGCOMM_LOAD_CHECK_MS", "-1"), ("RINGCOMM_LOAD_SLACK", "-1"),
                                        ("RINGCOMM_LOAD_AVG_SLACK", "-0.5"),
                                        ("RINGCOMM_UNPINNED_BACKOFF_MS", "-1"), ("RINGCOMM_DESCHEDULED_US", "0")])
def test_bad_knob_values_raise(knob, value, monkeypatch):
    monkeypatch.setenv(knob, value)
    with pytest.raises(ringcomm.InvalidArgumentError, match=knob):
        from ringcomm import _C
        _C.Communicator(0, 2, 5.0)
