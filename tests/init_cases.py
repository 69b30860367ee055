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
    from ringcomm.rendezvous import FileStore

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
