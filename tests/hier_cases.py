"""Cases that run INSIDE spawned ranks for tests/test_hier.py (module-level so that spawn can pickle
them). One group of ranks per fake topology runs every section in turn; each section returns a
list of failure strings (empty = passed) or measurements, so a failing section names itself.

The flat suite (tests/mp_cases.py: every collective x dtype x op x count, numpy and torch, against
a numpy reference) runs unchanged: with RINGCOMM_NODE_ID set per rank, ``ringcomm.init`` returns
the hierarchical communicator.
"""
import copy
import os
import time
import traceback

import numpy as np

from mp_cases import run_collective_cases


def _section(results, name, fn, *args):
    t0 = time.monotonic()
    try:
        results[name] = fn(*args)
    except Exception:  # noqa: BLE001 - reported by the test
        results[name] = [f"exception\n{traceback.format_exc()}"]
    results.setdefault("_times", {})[name] = round(time.monotonic() - t0, 2)


def run_topology(rank, world, node_ids, store_dir, ddp, libs):
    """Everything for one fake topology. ``node_ids[r]`` = rank r's RINGCOMM_NODE_ID; ``libs``:
    the flat suite's runs, (array library, all-reduce only) pairs."""
    os.environ["RINGCOMM_NODE_ID"] = node_ids[rank]
    os.environ["RC_TEST_STORE"] = os.path.join(store_dir, "rc")
    results = {}
    _section(results, "suite", _suite, rank, world, libs)
    import ringcomm
    init = dict(rank=rank, world_size=world, init_method="file://" + os.path.join(store_dir, "rc"),
                timeout=60)
    with ringcomm.init(**init) as comm:
        _section(results, "topology", _topology, comm, node_ids)
        _section(results, "extra", _extra, comm)
        _section(results, "bytes", _bytes, comm)
    if ddp:
        _section(results, "ddp", _ddp, rank, world, store_dir)
    comm = ringcomm.init(**init)
    _section(results, "fail_fast", _fail_fast, comm)
    comm.close()
    return results


def _suite(rank, world, libs):
    # Tiny slots: the intra-node rings stream through many slots and steps. One communicator per
    # (library, all-reduce only) entry of ``libs``, each on its own store. Every call crosses the
    # inter-node engine: each dtype x op pair takes every other count (every count still runs).
    failures, digests = [], []
    for lib, all_reduce_only in libs:
        f, d = run_collective_cases(rank, world, 256, 2, [lib], all_reduce_only=all_reduce_only, sub=lib,
                                    count_stride=2)
        failures += f
        digests += d
    return {"failures": failures, "digests": digests}


def _topology(comm, node_ids):
    import ringcomm.hier as hier
    f = []
    if not isinstance(comm, hier.HierarchicalCommunicator):
        return [f"rank {comm.rank if hasattr(comm, 'rank') else '?'}: init returned {comm!r}"]
    topo = hier.Topology(comm.rank, tuple(node_ids))
    if (comm.node, comm.local_rank, comm.local_size, comm.num_nodes) != \
            (topo.node, topo.local_rank, topo.local_size, topo.num_nodes):
        f.append(f"rank {comm.rank}: topology {comm!r} != expected {topo}")
    if comm.intra.world_size != comm.local_size or comm.intra.rank != comm.local_rank:
        f.append(f"rank {comm.rank}: node communicator {comm.intra!r}")
    import torch.distributed as dist
    if dist.is_initialized():
        f.append(f"rank {comm.rank}: the inter-node groups created a default process group")
    return f


def _extra(comm):
    """Hierarchy-specific cases the flat suite does not reach."""
    import torch
    import ringcomm
    f = []
    W, r = comm.world_size, comm.rank

    def check(name, cond):
        if not cond:
            f.append(f"rank {r}: {name}")
    # all_gather with unequal sizes where some ranks hold exactly total/W elements: every rank
    # must still take the same path (sizes are exchanged, not guessed from the output size).
    counts = [3, 5] + [4] * (W - 2)
    ins = [np.arange(c, dtype=np.int32) + 100 * i for i, c in enumerate(counts)]
    y = np.zeros(sum(counts), np.int32)
    comm.all_gather(y, ins[r])
    check(f"all_gather sizes {counts}", np.array_equal(y, np.concatenate(ins)))
    # Large float32 all_reduce (several intra slots, big inter shards), in place and out of place.
    n = 300_001
    x = torch.arange(n, dtype=torch.float32) % 97 + r
    ref = sum(torch.arange(n, dtype=torch.float32) % 97 + i for i in range(W))
    comm.all_reduce(x)
    check("all_reduce 300001", torch.equal(x, ref))
    x = torch.arange(n, dtype=torch.float32) % 97 + r
    out = torch.empty(n)
    comm.all_reduce(x, op=ringcomm.ReduceOp.AVG, output=out)
    check("all_reduce AVG out-of-place 300001", torch.allclose(out, ref / W))
    # Interleaved async operations complete in issue order with the right results.
    xs = [torch.full((1000 + i,), float(r + i)) for i in range(4)]
    hs = [comm.all_reduce(xs[0], async_op=True)]
    ys = torch.zeros(1001 * W)
    hs.append(comm.all_gather(ys, xs[1], async_op=True))
    hs.append(comm.broadcast(xs[2], root=W - 1, async_op=True))
    hs.append(comm.barrier(async_op=True))
    rs = torch.zeros(1003)
    hs.append(comm.reduce_scatter(rs, torch.full((1003 * W,), 1.0), async_op=True))
    for h in hs:
        h.wait(timeout=60)
        check(f"async {h} completed", h.is_completed() and h.exception() is None)
    check("async all_reduce", bool(torch.all(xs[0] == sum(range(W)))))
    check("async all_gather", torch.equal(ys, torch.cat([torch.full((1001,), float(i + 1)) for i in range(W)])))
    check("async broadcast", bool(torch.all(xs[2] == float(W - 1 + 2))))
    check("async reduce_scatter", bool(torch.all(rs == W)))
    # send/recv between rank r and W-1-r (sync on both sides: the lower rank sends first).
    peer = W - 1 - r
    if peer != r:
        a = torch.arange(5000, dtype=torch.int64) + r
        b = torch.zeros(5000, dtype=torch.int64)
        if r < peer:
            comm.send(a, peer, tag=3)
            comm.recv(b, peer, tag=3)
        else:
            comm.recv(b, peer, tag=3)
            comm.send(a, peer, tag=3)
        check(f"send/recv with {peer}", torch.equal(b, torch.arange(5000, dtype=torch.int64) + peer))
    return f


def _bytes(comm):
    """Bytes handed to the inter-node engine by one all_reduce / reduce_scatter / all_gather of
    M bytes (float32). Returned for the test to compare with the formulas."""
    import torch
    W = comm.world_size
    M = 1 << 20                            # bytes
    n = M // 4
    out = {}
    comm.barrier()
    comm.reset_inter_stats()
    x = torch.ones(n)
    comm.all_reduce(x)
    out["all_reduce"] = comm.inter_stats()
    ok = bool(torch.all(x == W))
    comm.reset_inter_stats()
    n -= n % W                             # equal chunks for reduce_scatter / all_gather
    y = torch.empty(n // W)
    comm.reduce_scatter(y, torch.ones(n))
    out["reduce_scatter"] = comm.inter_stats()
    ok = ok and bool(torch.all(y == W))
    comm.reset_inter_stats()
    z = torch.empty(n)
    comm.all_gather(z, torch.ones(n // W))
    out["all_gather"] = comm.inter_stats()
    ok = ok and bool(torch.all(z == 1))
    comm.reset_inter_stats()
    return {"M": M, "rank": comm.rank, "local_rank": comm.local_rank, "local_size": comm.local_size,
            "num_nodes": comm.num_nodes, "stats": out, "results_ok": ok}


def _ddp(rank, world, store_dir):
    """DDP over the "ringcomm" backend (hierarchical here) matches DDP over gloo; sub-groups on
    one node are plain shared-memory communicators, sub-groups across nodes hierarchical."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ringcomm
    import ringcomm.hier
    import ringcomm.torch  # noqa: F401 - registers the backend
    f = []
    dist.init_process_group("ringcomm", init_method="file://" + os.path.join(store_dir, "ddp"),
                            rank=rank, world_size=world)
    try:
        gloo = dist.new_group(backend="gloo")
        local = dist.new_group([0, 1], backend="ringcomm")
        cross = dist.new_group([0, world - 1], backend="ringcomm")

        def comm_of(group):
            # The backend's ProcessGroup subclass is the group itself (or its cpu backend).
            c = getattr(group, "communicator", None)
            if c is None:
                c = getattr(group._get_backend(torch.device("cpu")), "communicator", None)
            return c

        world_comm = comm_of(dist.group.WORLD)
        if not isinstance(world_comm, ringcomm.hier.HierarchicalCommunicator):
            f.append(f"rank {rank}: the ringcomm world group runs on {world_comm!r}")
        if rank in (0, 1):
            c = comm_of(local)
            if type(c) is not ringcomm.Communicator:
                f.append(f"rank {rank}: sub-group [0, 1] (one node) runs on {c!r}")
            t = torch.full((5,), float(rank))
            dist.all_reduce(t, group=local)
            if not torch.all(t == 1.0):
                f.append(f"rank {rank}: all_reduce on sub-group [0, 1] gave {t}")
        if rank in (0, world - 1):
            c = comm_of(cross)
            if not isinstance(c, ringcomm.hier.HierarchicalCommunicator) or c.local_size != 1:
                f.append(f"rank {rank}: sub-group [0, {world - 1}] (two nodes) runs on {c!r}")
            t = torch.full((5,), float(rank))
            dist.all_reduce(t, group=cross)
            if not torch.all(t == float(world - 1)):
                f.append(f"rank {rank}: all_reduce on sub-group [0, {world - 1}] gave {t}")

        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        models = {"ringcomm": copy.deepcopy(net), "gloo": copy.deepcopy(net)}
        ddps = {"ringcomm": DDP(models["ringcomm"], bucket_cap_mb=0.001),
                "gloo": DDP(models["gloo"], process_group=gloo, bucket_cap_mb=0.001)}
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in ddps.items()}
        for step in range(4):
            g = torch.Generator().manual_seed(100 * rank + step)
            data, target = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            for k in ("ringcomm", "gloo"):
                opts[k].zero_grad()
                torch.nn.functional.mse_loss(ddps[k](data), target).backward()
                opts[k].step()
        for (na, pa), (_, pb) in zip(models["ringcomm"].named_parameters(),
                                     models["gloo"].named_parameters()):
            d = (pa - pb).abs().max().item()
            if d > 1e-5:
                f.append(f"rank {rank}: DDP parameter {na} differs from gloo's by {d}")
        # Every rank holds the same parameters.
        flat = torch.cat([p.detach().reshape(-1) for p in models["ringcomm"].parameters()])
        allp = torch.zeros(flat.numel() * world)
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(allp, flat)
        for i in range(world):
            if not torch.equal(allp[i * flat.numel():(i + 1) * flat.numel()], flat):
                f.append(f"rank {rank}: DDP parameters differ from rank {i}'s")
    finally:
        dist.destroy_process_group()
    return f


def _fail_fast(comm):
    """The last rank passes arguments the op rejects (AVG on int32); every rank must raise
    promptly (well before the 60 s timeout), not hang."""
    import ringcomm
    W = comm.world_size
    comm.barrier()
    x = np.ones(100, np.int32)
    t0 = time.monotonic()
    try:
        if comm.rank == W - 1:
            comm.all_reduce(x, op="AVG")
        else:
            comm.all_reduce(x)
        err = None
    except ringcomm.RingcommError as e:
        err = type(e).__name__
    dt = time.monotonic() - t0
    # Afterwards the communicator refuses work with a clear error.
    try:
        comm.barrier()
        after = None
    except ringcomm.RingcommError as e:
        after = type(e).__name__
    return {"rank": comm.rank, "error": err, "seconds": round(dt, 2), "after": after}


# ---- single node: the inter-node engine is never created ----------------------------------------
def single_node(rank, world, store_dir, node_id):
    import sys
    if node_id is not None:
        os.environ["RINGCOMM_NODE_ID"] = node_id
    else:
        os.environ.pop("RINGCOMM_NODE_ID", None)
    import ringcomm
    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store_dir, timeout=30)
    try:
        x = np.full(10, rank, np.float32)
        comm.all_reduce(x)
        return {"type": type(comm).__name__, "torch_imported": "torch" in sys.modules,
                "ok": bool(np.all(x == sum(range(world)))),
                "node_key": os.path.exists(os.path.join(store_dir, "ringcomm%2F0%2Fnode%2F0"))}
    finally:
        comm.close()


# ---- two fake nodes in separate network namespaces (tests/test_hier_netns.py) ---------------------
def _link_bytes(ifname):
    base = f"/sys/class/net/{ifname}/statistics/"
    with open(base + "tx_bytes") as f:
        tx = int(f.read())
    with open(base + "rx_bytes") as f:
        rx = int(f.read())
    return tx, rx


def netns_rank(local, local_size, node, world, store_dir, ifname, nbytes):
    """One rank of a node whose namespace reaches the other node only through veth ``ifname``.
    Measures the bytes that cross the link during one hierarchical all_reduce of ``nbytes`` and
    during one flat gloo all_reduce over the same four processes."""
    import datetime

    import torch
    import torch.distributed as dist

    import ringcomm
    import ringcomm.hier as hier
    from ringcomm.core.rendezvous import FileStore
    rank = node * local_size + local
    comm = ringcomm.init(rank=rank, world_size=world, init_method="file://" + store_dir, timeout=60)
    base = hier.c10d_store(FileStore(store_dir, timeout=60))
    flat = dist.ProcessGroupGloo(dist.PrefixStore("flat-gloo", base), rank, world,
                                 datetime.timedelta(seconds=60))
    out = {"rank": rank, "type": type(comm).__name__, "node": getattr(comm, "node", None),
           "local_size": getattr(comm, "local_size", None)}
    try:
        x = torch.full((1000,), float(rank))
        comm.all_reduce(x)
        out["small_ok"] = bool(torch.all(x == sum(range(world))))
        n = nbytes // 4
        for name in ("hier", "flat"):
            x = torch.full((n,), float(rank + 1))
            comm.barrier()
            before = _link_bytes(ifname)         # before the barrier: no payload can precede it
            flat.barrier().wait()
            t0 = time.perf_counter()
            if name == "hier":
                comm.all_reduce(x)
            else:
                flat.allreduce([x]).wait()
            dt = time.perf_counter() - t0
            comm.barrier()
            after = _link_bytes(ifname)
            out[name] = {"tx": after[0] - before[0], "rx": after[1] - before[1], "seconds": dt,
                         "ok": bool(torch.all(x == sum(range(1, world + 1))))}
        out["stats"] = comm.inter_stats()
    finally:
        flat.shutdown()
        comm.close()
    return out


# ---- RINGCOMM_INTER=mpi: ranks started by mpiexec (tests/test_hier.py::test_mpi_engine) ----------
def mpi_main(store_dir, out_dir, nodes):
    """Entry point of each mpiexec rank: fake ``nodes`` nodes, inter-node engine MPI."""
    import json

    from mpi4py import MPI

    import ringcomm.hier as hier
    rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    os.environ.update(hier.fake_nodes_env(rank, world, nodes))
    os.environ["RINGCOMM_INTER"] = "mpi"
    os.environ["RC_TEST_STORE"] = store_dir
    results = {}
    try:
        failures, digests = run_collective_cases(rank, world, 256, 2, ["torch"])
        results["suite"] = {"failures": failures, "digests": digests}
        import ringcomm
        with ringcomm.init(rank=rank, world_size=world, init_method="file://" + store_dir,
                           timeout=60) as comm:
            results["engine"] = getattr(comm, "inter_backend", None)
            _section(results, "extra", _extra, comm)
            _section(results, "bytes", _bytes, comm)
    except Exception:  # noqa: BLE001
        results["error"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
