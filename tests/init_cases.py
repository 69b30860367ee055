"""In-rank functions for tests/test_init.py (module-level for spawn)."""
import os

import numpy as np


def via_env(rank, world, port):
    import ringcomm
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    with ringcomm.init() as comm:           # RANK / WORLD_SIZE set by the launcher
        x = np.full(5, rank + 1.0, np.float32)
        ringcomm.all_reduce(x)               # module level: the default communicator
        return comm.rank, comm.world_size, x.tolist()


def via_tcp(rank, world, port):
    import ringcomm
    with ringcomm.init(rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}") as comm:
        x = np.full(3, rank + 1, np.int64)
        comm.all_reduce(x, op=ringcomm.ReduceOp.MAX)
        return x.tolist()


def via_store(rank, world, path):
    import torch.distributed as dist
    import ringcomm
    store = dist.FileStore(path, world)
    a = ringcomm.init(rank=rank, world_size=world, store=dist.PrefixStore("a", store))
    b = ringcomm.init(rank=rank, world_size=world, store=dist.PrefixStore("b", store))
    x = np.ones(4, np.float32)
    y = np.full(4, 2.0, np.float32)
    ha = a.all_reduce(x, async_op=True)       # two communicators at once do not interfere
    b.all_reduce(y)
    ha.wait()
    a.close()
    b.close()
    return x.tolist(), y.tolist()


def raises_in_rank(rank, world):
    if rank == 1:
        raise KeyError("boom on rank 1")
    return rank


def stale_file_store(rank, world, path, stale):
    """The store directory holds a previous run's keys for this run's default prefix; rank r > 0
    publishes its segment name only after rank r-1 has, so every rank before it meets a stale
    key first."""
    import time
    import ringcomm
    from ringcomm.core.rendezvous import FileStore

    class Ordered(FileStore):
        def set(self, key, value):
            if rank > 0 and key == f"ringcomm/0/shm/{rank}":
                deadline = time.monotonic() + 60
                while self.get(f"ringcomm/0/shm/{rank - 1}").decode() == stale[rank - 1]:
                    assert time.monotonic() < deadline, "previous rank never published"
                    time.sleep(0.01)
            super().set(key, value)

    with ringcomm.init(rank=rank, world_size=world, store=Ordered(path)) as comm:
        x = np.full(7, rank + 1.0, np.float32)
        comm.all_reduce(x)
        return x.tolist()


def sub_communicators(rank, world, store_kind, where):
    """Job rank `rank` of 4 is member `rank % 2` of group `rank // 2` ({0,1} and {2,3}), both
    groups on one store. The default prefix is refused (RANK / WORLD_SIZE say it is a
    sub-communicator); the prefix every member derives from its group's job ranks works."""
    import ringcomm
    if store_kind == "file":
        from ringcomm.core.rendezvous import FileStore
        store = FileStore(where, timeout=60)
    else:
        from datetime import timedelta
        import torch.distributed as dist
        store = dist.TCPStore("127.0.0.1", where, world, rank == 0, timedelta(seconds=60), wait_for_workers=False)
    group, member = divmod(rank, 2)
    try:
        ringcomm.init(rank=member, world_size=2, store=store, timeout=60)
        refused = None
    except ringcomm.InvalidArgumentError as e:
        refused = str(e)
    members = [2 * group, 2 * group + 1]
    with ringcomm.init(rank=member, world_size=2, store=store, timeout=60,
                       prefix="ringcomm/ranks-" + "-".join(map(str, members))) as comm:
        x = np.full(5, rank + 1.0, np.float32)
        comm.all_reduce(x)
        y = np.zeros(2, np.int64)
        comm.all_gather(y, np.array([rank], np.int64))
        out = (x.tolist(), y.tolist())
    if store_kind == "tcp":
        # The master serves the others' keys: it leaves after every rank is done with them.
        store.add("done", 1)
        if rank == 0:
            import time
            deadline = time.monotonic() + 60
            while int(store.add("done", 0)) < world and time.monotonic() < deadline:
                time.sleep(0.01)
    return refused, out


def successive_communicators(rank, world, path):
    """Two communicators over the same ranks open at once on one store with default prefixes,
    then a third after both closed; in between rank 0 alone creates a 1-rank communicator, which
    takes no number, so the third still gets the same prefix on every rank."""
    import ringcomm
    from ringcomm.core.rendezvous import FileStore
    store = FileStore(path, timeout=30)
    a = ringcomm.init(rank=rank, world_size=world, store=store, timeout=30)
    b = ringcomm.init(rank=rank, world_size=world, store=store, timeout=30)
    x = np.full(6, rank + 1.0, np.float64)
    y = np.full(6, 10.0 * (rank + 1), np.float64)
    ha = a.all_reduce(x, async_op=True)
    b.all_reduce(y, op=ringcomm.ReduceOp.MAX)
    ha.wait()
    prefixes = [a.prefix, b.prefix]
    a.close()
    b.close()
    if rank == 0:
        with ringcomm.init(rank=0, world_size=1) as single:
            single.barrier()
    with ringcomm.init(rank=rank, world_size=world, store=store, timeout=30) as c:
        z = np.full(3, rank + 1, np.int32)
        c.all_reduce(z, op=ringcomm.ReduceOp.PRODUCT)
        prefixes.append(c.prefix)
    return x.tolist(), y.tolist(), z.tolist(), prefixes


def environment_seen(rank, world):
    """(the rank's RINGCOMM_TEST_MARK, RANK, its parent's pid, whether torch was imported before fn ran)."""
    import sys
    return os.environ.get("RINGCOMM_TEST_MARK"), os.environ["RANK"], os.getppid(), "torch" in sys.modules


def slow_last_mapper(rank, world, path):
    """The last rank pauses between mapping rank 0's segment and the others' (the test knob
    RINGCOMM_TEST_ATTACH_PAUSE_MS of the test build: tests/hooked_build.py), so rank 0 finishes
    init and closes while the middle ranks still wait for the last rank to map theirs: closing
    after init is no failure of theirs. Then the ranks meet again."""
    import time
    import hooked_build
    hooked_build.use()
    import ringcomm
    if rank == world - 1:
        os.environ["RINGCOMM_TEST_ATTACH_PAUSE_MS"] = "1500"
    t0 = time.monotonic()
    with ringcomm.init(rank=rank, world_size=world, init_method=f"file://{path}", prefix="first"):
        pass
    took = time.monotonic() - t0
    os.environ.pop("RINGCOMM_TEST_ATTACH_PAUSE_MS", None)
    with ringcomm.init(rank=rank, world_size=world, init_method=f"file://{path}", prefix="again") as comm:
        x = np.full(4, rank + 1.0)
        comm.all_reduce(x)
    return took, x.tolist()
