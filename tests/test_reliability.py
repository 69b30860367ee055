"""Reliability of the core: saturating deadlines, counter wrap-around, a small /dev/shm, closed
peers, close() racing a call, attach checks, fork after init. Every case is checked against a
value computed here (numpy sums) or an expected typed error."""

import pytest

from ringcomm.core.launch import spawn
import fault_cases
import ranks
from ranks import run_with_dev_shm


@pytest.mark.timeout(90)
@pytest.mark.parametrize("timeout", [float("inf"), 1e10, 1e300])
def test_huge_timeout_waits_for_a_late_peer(timeout, store_env):
    res = ranks.run(fault_cases.huge_timeout, 2, args=(timeout, 0.5), timeout=80, env=store_env)
    for r, out in enumerate(res):
        assert out[0] == "ok", (r, out)
        assert out[1] == 3.0 and out[2] == [4.0] * 8, (r, out)
    # Rank 0 waited for the late rank 1 instead of raising at once.
    assert res[0][3] >= 0.3, res[0]



def test_nslots_must_be_a_power_of_two(monkeypatch):
    import ringcomm
    for k in [k for k in __import__("os").environ if k.startswith("RINGCOMM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("RINGCOMM_NSLOTS", "6")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_NSLOTS must be .*a power of two.*got 6"):
        ringcomm.init(rank=0, world_size=1)
    monkeypatch.setenv("RINGCOMM_NSLOTS", "16")
    comm = ringcomm.init(rank=0, world_size=1)
    comm.close()


def test_board_word_alternates_entries_across_the_wrap():
    from ringcomm import _C_test
    for start in (1, 2**32 - 6, 2 * (2**32 - 2) - 3, 2**33 + 5, 2**63):
        words = [_C_test.board_seq_of(s) for s in range(start, start + 12)]
        for s, w in zip(range(start, start + 12), words):
            assert 1 <= w <= 2**32 - 1, (s, w)
            assert w & 1 == s & 1, (s, w)  # the entry alternates with the collective
        assert all(a != b for a, b in zip(words, words[1:])), words


@pytest.mark.timeout(90)
@pytest.mark.parametrize("last_seq", [2**32 - 2, 2 * (2**32 - 2) - 1])
def test_collectives_across_the_board_wrap(last_seq, store_env):
    res = ranks.run(fault_cases.board_wrap, 2, args=(last_seq,), timeout=80, env=store_env)
    want = [[3.0 + 2 * i] * (10 + i) for i in range(4)]
    for r, out in enumerate(res):
        assert out[0] == "ok", (r, out)
        assert out[1] == want, (r, out)
        assert out[2] == last_seq + 7, (r, out)


@pytest.mark.timeout(90)
def test_closed_peer_is_closed_not_dead(store_env):
    world = 3
    res = spawn(fault_cases.closed_peer, world, timeout=80, env=store_env)
    assert res[2] == ("closed", [3.0] * 4), res[2]
    for r in (0, 1):
        out = res[r]
        assert out["first"] == [3.0] * 4, (r, out)
        assert out["p2p"] == ("sent" if r == 0 else True), (r, out)
        kind, msg = out["coll"]
        assert kind == "PeerFailureError", (r, out)
        assert "rank 2" in msg and "closed" in msg and "died" not in msg, (r, msg)
        assert out["coll_s"] < 10.0, (r, out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 4])
def test_small_dev_shm_fails_at_init_with_a_clear_error(world, store_env, tmp_path):
    got = run_with_dev_shm("4M", "fault_cases", "small_shm", world, store_env["RC_TEST_STORE"], tmp_path,
                           deadline_s=60, timeout_s=100)
    # Every rank exited normally (no SIGBUS, no hang) and reported.
    assert got["status"] == ["exit 0"] * world, got
    res = got["results"]
    for out in res:
        phase, kind, typed, msg = out
        assert phase == "init" and typed, res
        if "/dev/shm" in msg and "bytes" in msg:
            assert "--shm-size" in msg and "RINGCOMM_SLOT_BYTES" in msg and "RINGCOMM_NSLOTS" in msg, msg
    # At least one rank ran out of space itself and says so; the others may report its failure.
    assert any("--shm-size" in out[3] for out in res), res


CLOSE_MODES = ["barrier", "all_reduce", "async", "recv", "race"]


@pytest.mark.timeout(150)
def test_close_from_another_thread_during_a_call(store_env):
    res = ranks.run(fault_cases.close_during_call, 2, args=(CLOSE_MODES,), timeout=140,
                    env=store_env)
    for mode in CLOSE_MODES:
        out = res[0][mode]
        assert out["joined"], (mode, out)
        kind, msg = out["call"]
        assert kind == "ClosedError", (mode, out)
        assert out["call_s"] < 5.0 and out["close_s"] < 5.0, (mode, out)
        assert "rank 0" in msg and "closed" in msg, (mode, msg)
        if mode in ("barrier", "all_reduce", "async"):
            # The wait that was interrupted names the operation, the peer and the sequence.
            op = "barrier" if mode == "barrier" else "all_reduce"
            assert op in msg and "seq" in msg and "rank 1" in msg, (mode, msg)
        if mode == "race":
            assert out["waits"] in ([], ["ClosedError"]), (mode, out)
        assert out["after"] == "ClosedError", (mode, out)


@pytest.mark.timeout(90)
def test_calls_from_several_threads_are_serialized(store_env):
    nthreads, ncalls = 3, 40
    res = ranks.run(fault_cases.calls_from_threads, 2, args=(nthreads, ncalls), timeout=80,
                    env=store_env)
    for r, (bad, alive, done, next_seq) in enumerate(res):
        assert bad == [] and alive == 0 and done == nthreads * ncalls, (r, bad, alive, done)
        assert next_seq == nthreads * ncalls + 1, (r, next_seq)


@pytest.mark.timeout(90)
def test_fork_after_init_child_sees_closed_parent_keeps_working(store_env):
    res = spawn(fault_cases.fork_after_init, 2, timeout=80, env=store_env)
    for r, out in enumerate(res):
        assert out["before"] == 3.0 and out["after"] == (3.0, 3.0), (r, out)
    children = res[0]["children"]
    assert [c[0] for c in children] == ["close", "destructor"], children
    for how, code, child in children:
        assert code == 0, (how, code, child)
        assert child["closed"] is True, (how, child)
        kind, msg = child["call"]
        assert kind == "ClosedError" and child["core"] == "ClosedError", (how, child)
        assert "forked child (pid" in msg and "create a new communicator in the child" in msg, (how, msg)
        assert child["call_s"] < 2.0, (how, child)


@pytest.mark.timeout(90)
def test_forged_peer_counts_raise_mismatch_everywhere(store_env):
    world = 2
    res = spawn(fault_cases.forged_counts, world, timeout=80, env=store_env)
    for r, (out, intact, after, gather_intact) in enumerate(res):
        assert [o[:2] for o in out] == [("all_gather", "MismatchError"), ("all_to_all", "MismatchError"),
                                        ("gather", "MismatchError")], (r, out)
        for name, _, msg in out:
            assert "out of range" in msg and name in msg, (r, msg)
        assert intact and gather_intact, r
        assert after == [3.0] * 5, (r, after)


@pytest.mark.timeout(60)
def test_attach_refuses_a_segment_with_the_wrong_mode_or_owner():
    import os
    import uuid
    import ringcomm
    from ringcomm import _C
    core = _C.Communicator(0, 2, 5.0)
    own = core.create()
    fake = "/ringcomm-test-" + uuid.uuid4().hex
    fd = os.open("/dev/shm" + fake, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, os.stat("/dev/shm" + own).st_size)
        os.fchmod(fd, 0o644)
        with pytest.raises(ringcomm.RingcommError, match=r"rank 1's shared memory /dev/shm" + fake +
                           r" is owned by uid \d+ with mode 0644.*mode 0600"):
            core.connect([own, fake])
        if os.geteuid() == 0:  # only root can hand a file to another user
            os.fchmod(fd, 0o600)
            os.fchown(fd, 65534, -1)
            with pytest.raises(ringcomm.RingcommError, match=r"is owned by uid 65534 with mode 0600"):
                core.connect([own, fake])
    finally:
        os.close(fd)
        os.unlink("/dev/shm" + fake)
        core.close()
    assert not os.path.exists("/dev/shm" + own)


def test_launch_checks_its_file_store_directory(tmp_path):
    import os
    import ringcomm
    from ringcomm.core.launch import check_store_dir, launch
    good = tmp_path / "good"
    good.mkdir(mode=0o700)
    check_store_dir(str(good))
    bad = tmp_path / "open"
    bad.mkdir()
    os.chmod(bad, 0o777)
    with pytest.raises(ringcomm.RingcommError, match=r"owned by uid \d+ with mode 0777"):
        check_store_dir(str(bad))
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(ringcomm.RingcommError, match="not a directory"):
        check_store_dir(str(link))
    if os.geteuid() == 0:
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        os.chown(other, 65534, -1)
        with pytest.raises(ringcomm.RingcommError, match="owned by uid 65534"):
            check_store_dir(str(other))
    # launch() makes its own directory, which passes the check in every rank.
    assert launch(_launch_sum, 2, timeout=60) == [3.0, 3.0]


def _launch_sum(comm):
    import numpy as np
    x = np.full(4, comm.rank + 1.0, np.float32)
    comm.all_reduce(x)
    return float(x[0])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_all_to_all_self_split_mismatch_raises_everywhere_and_recovers(world, store_env):
    res = ranks.run(fault_cases.self_split_mismatch, world, timeout=80, env=store_env)
    for r, (err, y) in enumerate(res):
        assert err[0] == "MismatchError", (r, err)
        if r == 0:
            assert "to itself" in err[1], err
        # A correct all_to_all afterwards: block r of every rank's arange(2*world) + 100*rank.
        want = [float(100 * p + 2 * r + k) for p in range(world) for k in range(2)]
        assert y == want, (r, y)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_abort_fails_pending_and_later_calls_everywhere_then_a_new_communicator_works(world, store_env):
    res = ranks.run(fault_cases.abort_and_recover, world, timeout=110, env=store_env)
    for r, out in enumerate(res):
        assert out["a_sum"] == world * (world + 1) / 2 and out["errored_before"] is None, (r, out)
        kind, msg = out["recv"] if r == 0 else out["pending"]
        assert kind != "no error" and "aborted (abort())" in msg, (r, out)
        assert (out["recv_s"] if r == 0 else out["pending_s"]) < 5.0, (r, out)
        if r != 0:
            assert kind == "PeerFailureError" and "rank 0" in msg, (r, msg)
        # The reason arrives whole: one of the four, never an interleaving of two.
        reasons = [c * 600 for c in "WXYZ"]
        assert sum(reason in msg for reason in reasons) == 1, (r, msg)
        letter = next(c for c in "WXYZ" if c * 600 in msg)
        assert all(c not in msg.replace(letter * 600, "") for c in "WXYZ" if c != letter), (r, msg)
        later_kind, later_msg = out["later"]
        assert later_kind in ("RingcommError", "PeerFailureError") and out["later_s"] < 1.0, (r, out)
        assert out["errored"] is not None and "aborted (abort())" in out["errored"][1], (r, out)
        # The new attempt on the same store: fresh keys, correct sums, no error.
        assert out["b_sum"] == (world * (world + 1) / 2,) * 2 and out["b_errored"] is None, (r, out)
    assert res[0]["b_timeout"] == 0.5
    kind, msg = res[0]["late"]
    assert kind == "TimeoutError" and "0.5 s" in msg, res[0]
    assert res[0]["late_s"] < 3.0, res[0]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_failing_during_init_fails_its_peers_promptly(world, store_env):
    res = spawn(fault_cases.init_failure, world, timeout=80, env=store_env)
    kind, msg, _ = res[world - 1]
    assert kind == "InvalidArgumentError" and "RINGCOMM_NSLOTS" in msg, res[world - 1]
    for r in range(world - 1):
        kind, msg, dt = res[r]
        assert kind == "PeerFailureError", (r, res[r])
        assert f"rank {world - 1} failed during init" in msg and "RINGCOMM_NSLOTS" in msg, (r, msg)
        assert dt < 10.0, (r, res[r])


@pytest.mark.timeout(60)
def test_p2p_deadline_counts_from_the_last_progress(store_env):
    res = ranks.run(fault_cases.p2p_deadline_from_progress, 2, timeout=50, env=store_env)
    for r, out in enumerate(res):
        assert out[0] == "ok" and out[3] is True, (r, out)
    assert 2.0 < res[1][2] < 3.4, res[1]


@pytest.mark.timeout(90)
def test_p2p_tags_match_per_peer_and_tag_in_order(store_env):
    res = ranks.run(fault_cases.tagged_p2p, 2, args=(1 << 20,), timeout=80, env=store_env)
    assert res[0] == ("sent", [2.0] * 4), res[0]
    assert res[1] == ([True] * 5, [2.0] * 4), res[1]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("set_after", [False, True], ids=["at_init", "set_timeout"])
def test_torch_work_wait_honours_the_group_timeout(set_after, store_env):
    group_timeout = 2.0
    res = ranks.run(fault_cases.torch_work_group_timeout, 2, args=(group_timeout, set_after),
                    timeout=80, env=store_env)
    kind, msg, dt = res[0]
    assert kind != "no error", res[0]
    assert kind == "TimeoutError", res[0]
    assert "all_reduce" in msg, res[0]
    assert dt < group_timeout + 1.5, f"work.wait() took {dt:.1f} s under a {group_timeout} s group timeout"
    assert dt >= group_timeout * 0.5, res[0]
    assert res[1] == "idle", res[1]
