"""init() without prefix= survives replacements: survivors and a replacement meet in the next
generation kept on the store, in either arrival order; a peer absent at init raises
ringcomm.TimeoutError naming it within the init timeout (as does an unreachable store server);
the generation rule itself on a store."""
import ast
import time

import pytest

import ringcomm
from ringcomm.core import rendezvous as rdzv
from ringcomm.core.launch import spawn
import init_replacement_cases as cases
from mp_cases import free_port


@pytest.mark.timeout(120)
def test_survivors_and_replacements_meet_without_a_prefix():
    pytest.importorskip("torch")
    out = spawn(cases.replacements, 4, (free_port(),), timeout=110, may_die=[1, 2])
    survivor, proc3 = out[0], out[3]
    assert out[1] is None and out[2] is None                      # killed mid-run
    sums = [(cases.contribution(0) + cases.contribution(p)).tolist() for p in (1, 2, 3)]
    assert survivor["sums"] == sums
    # The peer's death surfaced as PeerFailureError promptly, not after the 60 s timeout.
    assert all(s < 10 for s in survivor["detect_s"]), survivor["detect_s"]
    # Generation 0, then one up per replacement: survivor first (process 2), replacement first (3).
    assert survivor["prefixes"] == ["ringcomm/0", "ringcomm/1", "ringcomm/2"]
    proc2_prefix, proc2_sum = ast.literal_eval(proc3["proc2"])
    assert (proc2_prefix, proc2_sum) == ("ringcomm/1", sums[1])
    assert (proc3["prefix"], proc3["sum"]) == ("ringcomm/2", sums[2])
    # Then ranks 0 and 2 of a 3-rank communicator on the same store, rank 1 never started: both
    # raise ringcomm.TimeoutError naming rank 1 alone, within the init timeout.
    for rank, res in ((0, survivor["absent"]), (2, proc3["absent"])):
        assert res is not None, f"rank {rank}: init returned with rank 1 absent"
        kind, is_ringcomm_timeout, msg, elapsed = res
        assert is_ringcomm_timeout, (rank, kind, msg)
        assert "never arrived" in msg and "[1]" in msg, msg
        assert 1.0 <= elapsed <= cases.ABSENT_TIMEOUT + 3, (rank, elapsed)


@pytest.mark.timeout(60)
def test_a_rank_waiting_in_a_generation_its_peer_can_no_longer_join_moves_on(tmp_path):
    out = spawn(cases.predecessor_died_in_init, 2, (str(tmp_path / "store"),), timeout=50)
    want = (cases.contribution(0) + cases.contribution(1)).tolist()
    for rank, (prefix, got, elapsed) in enumerate(out):
        assert (prefix, got) == ("ringcomm/1", want), rank
        assert elapsed < 15, (rank, elapsed)              # not the 30 s init timeout


def test_an_absent_store_server_raises_ringcomm_timeout():
    pytest.importorskip("torch")
    start = time.monotonic()
    with pytest.raises(ringcomm.TimeoutError, match=r"served by rank 0.*\[0\]"):
        ringcomm.init(rank=1, world_size=2, init_method=f"tcp://127.0.0.1:{free_port()}", timeout=1)
    assert time.monotonic() - start < 15


def _claims(store, *ranks, root="ringcomm"):
    return [rdzv.claim_generation(store, root, r) for r in ranks]


def test_generation_rule_in_every_arrival_order(tmp_path):
    """Ranks 0..2 on ringcomm's FileStore (add/check): a fresh job takes 0; after rank 1 dies, the
    survivors and its replacement take 1 whichever claims first; a survivor that inits twice
    moves up once per call; a new process never takes a generation that was closed or passed."""
    s = rdzv.FileStore(str(tmp_path / "a"))
    assert rdzv.supports_generations(s)
    assert _claims(s, 0, 1, 2) == [0, 0, 0]
    assert _claims(s, 0, 2, 1) == [1, 1, 1]          # survivors first, then the replacement
    assert _claims(s, 1, 2, 0) == [2, 2, 2]          # replacement first
    assert not rdzv.generation_abandoned(s, "ringcomm", 2)
    # Rank 0 inits twice (its first re-init failed): 3 then 4; ranks waiting in 3 see it passed
    # and the others, arriving later, start at the newest opened generation.
    assert _claims(s, 0, 0) == [3, 4]
    assert rdzv.generation_abandoned(s, "ringcomm", 3)
    with pytest.raises(rdzv.GenerationSuperseded):
        rdzv.check_generation(s, "ringcomm", 3, 1)     # a rank waiting in 3 moves to the newest
    assert _claims(s, 1, 2) == [4, 4]
    # A closed generation is skipped by a process that arrives after the close.
    s2 = rdzv.FileStore(str(tmp_path / "b"))
    assert _claims(s2, 0, 1) == [0, 0]
    assert _claims(s2, 0) == [1]                     # a survivor waits in 1 ...
    rdzv.close_generation(s2, "ringcomm", 1, ringcomm.TimeoutError("the ranks that never arrived: [1]"), 0)
    assert rdzv.generation_abandoned(s2, "ringcomm", 1)
    with pytest.raises(ringcomm.TimeoutError, match=r"rank 0 failed during init.*never arrived: \[1\]"):
        rdzv.check_generation(s2, "ringcomm", 1, 2)    # a rank waiting in 1 reports the cause
    assert _claims(s2, 1, 0) == [2, 2]               # ... times out; the late replacement and its retry meet in 2
    # Generations of different roots (elastic attempts) are independent.
    assert _claims(s2, 0, root="ringcomm/a1") == [0]


def test_file_store_add_is_atomic_across_processes(tmp_path):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_add_many, args=(str(tmp_path), 200)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    s = rdzv.FileStore(str(tmp_path))
    assert s.add("n", 0) == 400 and s.check(["n"]) and not s.check(["n", "m"])


def _add_many(path, n):
    s = rdzv.FileStore(path)
    for _ in range(n):
        s.add("n", 1)




@pytest.mark.timeout(90)
def test_a_store_whose_server_exits_during_init_raises_peer_failure():
    """The process serving the tcp:// store exits while rank 2 waits for its peers: rank 2's
    init raises ringcomm.PeerFailureError naming itself, the ranks it waited for and the store,
    at once (not torch's network error, not after its 20 s timeout)."""
    pytest.importorskip("torch")
    host, (kind, msg, elapsed) = spawn(cases.store_host_exits, 2, (free_port(),), timeout=80)
    assert host is None
    assert kind == "ringcomm.core.errors.PeerFailureError", (kind, msg)
    assert "rank 2 of 3" in msg and "the store failed" in msg and "[0, 1]" in msg, msg
    assert elapsed < 10, elapsed
