"""Rendezvous paths (env://, tcp://, file://, store=), the default communicator, the launcher."""
import socket
import tempfile
import os

import numpy as np
import pytest

import ringcomm
from ringcomm.launch import LaunchError, spawn
import init_cases


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def test_init_from_torchrun_env():
    pytest.importorskip("torch")
    res = spawn(init_cases.via_env, 2, (_free_port(),), timeout=50)
    assert res == [(0, 2, [3.0] * 5), (1, 2, [3.0] * 5)]


@pytest.mark.timeout(60)
def test_init_tcp():
    pytest.importorskip("torch")
    assert spawn(init_cases.via_tcp, 3, (_free_port(),), timeout=50) == [[3, 3, 3]] * 3


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
    from ringcomm.rendezvous import default_prefix
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert default_prefix(3) == "ringcomm/3"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert default_prefix(3) == "ringcomm/a2/3"
    assert default_prefix(3) != "ringcomm/a1/3"
