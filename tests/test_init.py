"""Rendezvous paths (env://, tcp://, file://, store=), the default communicator, the launcher."""
import importlib.util
import tempfile
import os

import numpy as np
import pytest

import ringcomm
from ringcomm.core.launch import LaunchError, spawn
import init_cases
from mp_cases import free_port


@pytest.mark.timeout(60)
def test_init_from_torchrun_env():
    pytest.importorskip("torch")
    res = spawn(init_cases.via_env, 2, (free_port(),), timeout=50)
    assert res == [(0, 2, [3.0] * 5), (1, 2, [3.0] * 5)]


@pytest.mark.timeout(60)
def test_init_tcp():
    pytest.importorskip("torch")
    assert spawn(init_cases.via_tcp, 3, (free_port(),), timeout=50) == [[3, 3, 3]] * 3


@pytest.mark.timeout(60)
def test_init_explicit_store_two_communicators():
    pytest.importorskip("torch")
    with tempfile.TemporaryDirectory() as d:
        res = spawn(init_cases.via_store, 2, (os.path.join(d, "store"),), timeout=50)
    assert res == [([2.0] * 4, [4.0] * 4)] * 2


def test_world_of_one_and_close():
    with ringcomm.init(rank=0, world_size=1) as comm:
        x = np.arange(5, dtype=np.float64)
        comm.all_reduce(x, op=ringcomm.ReduceOp.AVG)
        assert x.tolist() == [0, 1, 2, 3, 4]
        y = np.zeros(5)
        comm.all_gather(y, x)
        assert y.tolist() == x.tolist()
        h = comm.broadcast(x, async_op=True)
        assert h.wait() is x and h.is_completed() and h.exception() is None
    with pytest.raises(ringcomm.ClosedError):
        comm.barrier()


def test_bad_init_arguments():
    with pytest.raises(ValueError):
        ringcomm.init(rank=2, world_size=2)
    with pytest.raises(ValueError):
        ringcomm.init(rank=0, world_size=0)
    with pytest.raises(ValueError):
        ringcomm.init(rank=0, world_size=2, init_method="gopher://x")


@pytest.mark.timeout(60)
def test_launch_reraises_with_rank_and_traceback():
    with pytest.raises(LaunchError) as ei:
        spawn(init_cases.raises_in_rank, 3, timeout=50)
    assert ei.value.rank == 1 and "boom on rank 1" in ei.value.remote_traceback


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [3, 5])
def test_a_peer_that_closes_after_init_fails_no_one_still_waiting(tmp_path, world):
    """A rank waits at init until every peer mapped its segment; a peer that did so, finished
    and closed meanwhile must not fail that wait (a slow last mapper keeps the others waiting)."""
    store = tmp_path / "rdzv"
    store.mkdir(mode=0o700)
    got = spawn(init_cases.slow_last_mapper, world, (str(store),), timeout=100)
    total = float(sum(range(1, world + 1)))
    assert [x for _, x in got] == [[total] * 4] * world
    assert got[1][0] >= 1.4  # rank 1 did wait for the slow rank: the case under test happened


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_launch_ranks_see_the_environment_at_the_call(monkeypatch, method):
    """Either start method: every rank runs with the launching process's environment as it is
    at the call (a forkserver's child would otherwise inherit the server's, fixed when it
    started) plus its RANK. Forked from the server, the ranks are its children and find the
    modules it preloaded (this session's: torch) already imported."""
    monkeypatch.setenv("RINGCOMM_START_METHOD", method)
    for mark in ("first", "second"):
        monkeypatch.setenv("RINGCOMM_TEST_MARK", mark)
        seen = spawn(init_cases.environment_seen, 2, timeout=100)
        assert [(m, r) for m, r, _, _ in seen] == [(mark, "0"), (mark, "1")]
    parents = {p for _, _, p, _ in seen}
    preloaded = {t for _, _, _, t in seen}
    if method == "spawn":
        assert parents == {os.getpid()} and preloaded == {False}
    else:
        assert os.getpid() not in parents and len(parents) == 1
        assert preloaded == {importlib.util.find_spec("torch") is not None}


def test_launch_refuses_an_unknown_start_method(monkeypatch):
    monkeypatch.setenv("RINGCOMM_START_METHOD", "fork")
    with pytest.raises(ValueError, match="RINGCOMM_START_METHOD"):
        spawn(init_cases.environment_seen, 1, timeout=30)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_a_reused_file_store_with_stale_keys_still_connects(tmp_path, world):
    """Keys left by an earlier run name segments that no longer exist: each rank waits for the
    peer's own name instead of failing to open the stale one, and removes its key once mapped."""
    import urllib.parse
    from init_cases import stale_file_store
    d = tmp_path / "store"
    d.mkdir()
    stale = [f"/rc-stale-{r}" for r in range(world)]
    for r in range(world):
        (d / urllib.parse.quote(f"ringcomm/0/shm/{r}", safe="")).write_text(stale[r])
    out = spawn(stale_file_store, world, (str(d), stale), timeout=90)
    want = float(world * (world + 1) // 2)
    for x in out:
        assert x == [want] * 7
    assert not [k for k in os.listdir(d) if "shm" in urllib.parse.unquote(k)], os.listdir(d)


def test_default_prefix_names_the_elastic_attempt(monkeypatch):
    from ringcomm.core.rendezvous import default_prefix
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert default_prefix(3) == "ringcomm/3"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert default_prefix(3) == "ringcomm/a2/3"
    assert default_prefix(3) != "ringcomm/a1/3"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("store_kind", ["file", "tcp"])
def test_sub_communicators_sharing_a_store_refuse_the_default_prefix(tmp_path, store_kind):
    """4 processes of one job, two 2-rank communicators ({0,1} and {2,3}) on one store: with the
    default prefix both would take the same keys, so every rank gets InvalidArgumentError telling
    it to pass prefix=; with a prefix from the group's job ranks both groups connect and compute
    their own sums (checked against numpy)."""
    if store_kind == "tcp":
        pytest.importorskip("torch")
    where = str(tmp_path / "store") if store_kind == "file" else free_port()
    out = spawn(init_cases.sub_communicators, 4, (store_kind, where), timeout=170)
    inputs = [np.full(5, r + 1.0, np.float32) for r in range(4)]
    for r, (refused, (x, y)) in enumerate(out):
        assert refused is not None, f"rank {r}: the default prefix was accepted for a sub-communicator"
        assert "sub-communicator" in refused and "prefix=" in refused and f"rank {r} of a 4-process job" in refused
        g = r // 2
        assert x == (inputs[2 * g] + inputs[2 * g + 1]).tolist(), (r, x)
        assert y == [2 * g, 2 * g + 1], (r, y)
    if store_kind == "file":
        assert not [k for k in os.listdir(where) if "shm" in k], os.listdir(where)  # keys removed once read


@pytest.mark.timeout(120)
def test_successive_communicators_over_the_same_ranks_on_one_store(tmp_path):
    """Two default-prefix communicators over the same 2 ranks open at once on one store, then a
    third after a 1-rank communicator that only rank 0 created: each pair reads its own keys
    (results against numpy) and every rank derives the same prefixes."""
    out = spawn(init_cases.successive_communicators, 2, (str(tmp_path / "store"),), timeout=110)
    sums = (np.full(6, 1.0) + np.full(6, 2.0)).tolist()
    maxes = np.maximum(np.full(6, 10.0), np.full(6, 20.0)).tolist()
    prods = (np.full(3, 1, np.int32) * np.full(3, 2, np.int32)).tolist()
    for x, y, z, prefixes in out:
        assert (x, y, z) == (sums, maxes, prods)
        assert len(set(prefixes)) == 3, prefixes
    assert out[0][3] == out[1][3]


def test_default_prefix_refuses_a_sub_communicator_of_a_launched_job(monkeypatch):
    from ringcomm.core.rendezvous import default_prefix
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ringcomm.InvalidArgumentError, match=r"rank 3 of a 4-process job.*prefix="):
        default_prefix(0, 1, 2)
    assert default_prefix(0, 3, 4) == "ringcomm/0"      # the whole job: the counter suffices
    assert default_prefix(5, 0, 1) == "ringcomm/5"      # one rank meets nobody through the store
    # ringcomm.cuda.init's default prefix: the same refusal, its own namespace
    with pytest.raises(ringcomm.InvalidArgumentError, match=r"rank 3 of a 4-process job"):
        default_prefix(0, 1, 2, root="ringcomm-cuda")
    assert default_prefix(1, 3, 4, root="ringcomm-cuda") == "ringcomm-cuda/1"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert default_prefix(1, 3, 4, root="ringcomm-cuda") == "ringcomm-cuda/a2/1"
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    monkeypatch.delenv("WORLD_SIZE")
    assert default_prefix(2, 1, 2) == "ringcomm/2"      # no launcher environment to tell by
