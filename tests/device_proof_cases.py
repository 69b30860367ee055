"""Cases for tests/test_device_proof.py that run INSIDE spawned ranks: the host's ring and chain
(csrc/algo/ring.cpp, csrc/algo/chain.cpp through ringcomm._C_test.AlgoSim, between processes over a shm
channel), whose outputs the device ring's host harness must equal bit for bit."""
import os

import numpy as np


def cpu_ring_outputs(rank, world, cases, slot_bytes):
    """cases: [(coll, dtype code, op code, count, element size, input bytes of every rank, root)]; returns
    this rank's output bytes for each case, computed by the host ring (ar, rs, ag) or chain (bc: the
    buffer, rd: the root's output, nothing on the other ranks)."""
    from ringcomm import _C_test
    from ringcomm.core.rendezvous import FileStore
    store = FileStore(os.environ["RC_TEST_STORE"], 60)
    sim = _C_test.AlgoSim(rank, world, slot_bytes, 2, 60.0, "host", False)
    outs = []
    try:
        store.set(f"dp/{rank}", sim.create())
        sim.attach([store.get(f"dp/{r}").decode() for r in range(world)])
        for coll, dt, op, count, esize, blob, root in cases:
            x = np.frombuffer(blob, np.uint8).reshape(world, -1)[rank].copy()
            if coll == "ar":
                y = np.zeros(count * esize, np.uint8)
                sim.all_reduce(x.ctypes.data, y.ctypes.data, count, dt, op, False)
            elif coll == "rs":
                n = count // world + (1 if rank < count % world else 0)
                y = np.zeros(n * esize, np.uint8)
                sim.reduce_scatter(x.ctypes.data, y.ctypes.data, count, dt, op)
            elif coll == "bc":
                y = x
                sim.broadcast(y.ctypes.data, count, dt, root)
            elif coll == "rd":
                y = np.zeros(count * esize if rank == root else 0, np.uint8)
                sim.reduce(x.ctypes.data, y.ctypes.data if rank == root else 0, count, dt, op, root)
            else:
                y = np.zeros(world * count * esize, np.uint8)
                sim.all_gather(x.ctypes.data, y.ctypes.data, [count] * world, dt)
            outs.append(y.tobytes())
    finally:
        sim.close()
    return outs
