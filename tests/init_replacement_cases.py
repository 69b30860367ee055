"""In-rank functions for tests/test_init_replacement.py (module-level for spawn).

``replacements``: process 0 is rank 0 of a 2-rank job on a tcp:// store it serves; processes 1,
2 and 3 are successive processes of rank 1. Process 1 is killed mid-run; the survivor catches
PeerFailureError and calls init() again (no prefix) before process 2 calls it for the first time;
process 2 is killed in turn and process 3 calls init() before the survivor does. The test-only
keys ``test/...`` on the same store order those arrivals."""
import os
import signal
import time

import numpy as np

HOST = "127.0.0.1"


def contribution(proc: int) -> np.ndarray:
    """What process ``proc`` puts into every all_reduce (distinct per process)."""
    return np.arange(6, dtype=np.float64) + 100.0 * proc + 1.0


def _coord(port):
    from datetime import timedelta
    import torch.distributed as dist
    return dist.TCPStore(HOST, port, 2, False, timedelta(seconds=60), wait_for_workers=False)


def _reduce(comm, proc):
    x = contribution(proc)
    comm.all_reduce(x)
    return x.tolist()


def _until_peer_fails(comm, proc):
    """all_reduce until the peer's death surfaces; the seconds from the first failing call."""
    import ringcomm
    for _ in range(10_000):
        start = time.monotonic()
        try:
            _reduce(comm, proc)
        except ringcomm.PeerFailureError:
            return time.monotonic() - start
    raise AssertionError("the peer's death never surfaced")


def replacements(proc, nproc, port):
    import ringcomm
    url = f"tcp://{HOST}:{port}"
    rank = 0 if proc == 0 else 1
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")   # this process's place in the 2-rank job
    if proc == 0:
        out = {"sums": [], "prefixes": [], "detect_s": []}
        first = ringcomm.init(rank=0, world_size=2, init_method=url, timeout=60)
        coord = _coord(port)
        out["prefixes"].append(first.prefix)
        out["sums"].append(_reduce(first, proc))
        out["detect_s"].append(_until_peer_fails(first, proc))
        # Survivor first: the old communicator stays open (its segments held) during the re-init.
        coord.set("test/survivor-reinit", "1")
        second = ringcomm.init(rank=0, world_size=2, init_method=url, timeout=60)
        first.close()
        out["prefixes"].append(second.prefix)
        out["sums"].append(_reduce(second, proc))
        out["detect_s"].append(_until_peer_fails(second, proc))
        # Replacement first: wait until process 3 has entered init.
        coord.get("test/proc3-entering")
        time.sleep(0.5)
        third = ringcomm.init(rank=0, world_size=2, init_method=url, timeout=60)
        second.close()
        out["prefixes"].append(third.prefix)
        out["sums"].append(_reduce(third, proc))
        third.close()
        out["absent"] = absent_peer(0, port)
        # This process serves the store: it must outlive process 3's wait for the absent rank,
        # which would otherwise end with the store's connection reset instead of the timeout.
        coord.get("test/absent-done")
        return out
    coord = _coord(port)
    if proc == 1:
        comm = ringcomm.init(rank=1, world_size=2, init_method=url, timeout=60)
        _reduce(comm, proc)
        for _ in range(3):
            _reduce(comm, proc)
        os.kill(os.getpid(), signal.SIGKILL)
    if proc == 2:
        coord.get("test/survivor-reinit")
        time.sleep(0.3)                      # the survivor is waiting in init by now
        comm = ringcomm.init(rank=1, world_size=2, init_method=url, timeout=60)
        got = (comm.prefix, _reduce(comm, proc))
        coord.set("test/proc2-done", repr(got))
        for _ in range(3):
            _reduce(comm, proc)
        os.kill(os.getpid(), signal.SIGKILL)
    coord.get("test/proc2-done")
    coord.set("test/proc3-entering", "1")
    with ringcomm.init(rank=1, world_size=2, init_method=url, timeout=60) as comm:
        out = {"proc2": coord.get("test/proc2-done").decode(), "prefix": comm.prefix,
               "sum": _reduce(comm, proc)}
    out["absent"] = absent_peer(2, port)
    coord.set("test/absent-done", "1")
    return out


ABSENT_TIMEOUT = 2.0


def absent_peer(rank, port):
    """Rank ``rank`` of a 3-rank communicator whose rank 1 never starts: what init raised, and
    the seconds it took."""
    import ringcomm
    start = time.monotonic()
    try:
        ringcomm.init(rank=rank, world_size=3, init_method=f"tcp://{HOST}:{port}",
                      timeout=ABSENT_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - the test checks the type
        return (type(e).__module__ + "." + type(e).__qualname__,
                isinstance(e, ringcomm.TimeoutError), str(e), time.monotonic() - start)
    return None


def predecessor_died_in_init(rank, world, path):
    """Rank 0 waits in generation 0; rank 1's predecessor claimed its place in 0 and died before
    publishing anything; rank 1's replacement calls init: it opens generation 1, and rank 0,
    still waiting in 0, moves there instead of waiting out its timeout."""
    import ringcomm
    from ringcomm.core import rendezvous as rdzv
    store = rdzv.FileStore(path, timeout=30)
    if rank == 1:
        deadline = time.monotonic() + 30
        while not store.check(["ringcomm/0/arrived/0"]):      # rank 0 is waiting in 0
            assert time.monotonic() < deadline, "rank 0 never arrived"
            time.sleep(0.01)
        assert rdzv.claim_generation(store, "ringcomm", 1) == 0     # the predecessor's claim
    start = time.monotonic()
    with ringcomm.init(rank=rank, world_size=world, init_method="file://" + path, timeout=30) as comm:
        return comm.prefix, _reduce(comm, rank), time.monotonic() - start


def store_host_exits(proc, nproc, port):
    """Process 0 serves a tcp:// store and exits once rank 2 has published its arrival (the last
    store write before init waits for its peers); process 1 is that rank 2 of a 3-rank init
    (ranks 0 and 1 never come): what its init raised, and the seconds it took."""
    import ringcomm
    if proc == 0:
        from datetime import timedelta
        import torch.distributed as dist
        store = dist.TCPStore(HOST, port, 2, True, timedelta(seconds=30), wait_for_workers=False)
        arrived = "ringcomm/0/arrived/2"   # generation 0 of a fresh store (rendezvous.await_arrivals)
        deadline = time.monotonic() + 30
        while not store.check([arrived]) and time.monotonic() < deadline:
            time.sleep(0.01)
        return None
    start = time.monotonic()
    try:
        ringcomm.init(rank=2, world_size=3, init_method=f"tcp://{HOST}:{port}", timeout=20)
    except Exception as e:  # noqa: BLE001 - the test checks the type
        return (type(e).__module__ + "." + type(e).__qualname__, str(e), time.monotonic() - start)
    return None
