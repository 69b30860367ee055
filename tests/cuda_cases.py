"""Cases for tests/test_cuda.py that run INSIDE spawned ranks (module-level for spawn).

- sim_cases: the one algorithm layer (csrc/algo/) driven over a host shared-memory channel
  (ringcomm._C_test.AlgoSim) with the CUDA channel's options (pieces at their offset mod 16, copy out
  before forwarding) or the host's: every collective x dtype x op x count against numpy, with tiny
  slots and misaligned buffers. Needs no GPU and no CUDA build.
- unavailable_cases: a CUDA-like array handed to the host API raises a clear UnsupportedError on
  every rank, and the communicator stays usable. Needs no GPU.
- gpu_*: the real thing (skipped without a GPU by the test module)."""
import os
import time
import traceback

import numpy as np

from mp_cases import close_enough, counts_for, digest, init_under_env, make, pairs, reference

DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5, "int32": 6,
               "int64": 7, "bool": 8}
# Per-collective timeout of the GPU cases (s); benchmarks/device/gpu_check.sh lowers it so that a hang in a short
# device session costs seconds, not minutes.
COMM_TIMEOUT = float(os.environ.get("RC_TEST_GPU_COMM_TIMEOUT", "120"))
OP_CODES = {"SUM": 0, "PRODUCT": 1, "MIN": 2, "MAX": 3, "AVG": 4, "BAND": 5, "BOR": 6, "BXOR": 7}


def _store(rank, world, timeout=60):
    from ringcomm.core.rendezvous import FileStore
    return FileStore(os.environ["RC_TEST_STORE"], timeout)


# ---------------- host simulation of the CUDA algorithms ----------------

def _raw(values, dt):
    """numpy buffer holding `values` in dtype dt (bfloat16 as its uint16 bit patterns)."""
    if dt == "bfloat16":
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(values).astype(dt)


def _val(raw, dt):
    if dt == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw


def _misaligned(n, like, shift):
    """An n-element array of like's dtype whose address is `shift` elements past an aligned one."""
    base = np.zeros(n + shift, dtype=like.dtype)
    return base[shift:]


def sim_cases(rank, world, slot_bytes, nslots, style="cuda", streaming=False):
    from ringcomm import _C_test
    store = _store(rank, world)
    sim = _C_test.AlgoSim(rank, world, slot_bytes, nslots, 60.0, style, streaming)
    fails = []
    try:
        store.set(f"sim/{rank}", sim.create())
        sim.attach([store.get(f"sim/{r}").decode() for r in range(world)])

        def check(name, cond):
            if not cond:
                fails.append(f"rank {rank}: {name}")

        for dt, op in pairs():
            code, opc = DTYPE_CODES[dt], OP_CODES[op]
            for count in counts_for(world)[:-1] + [301]:
                for shift in (0, 1):
                    tag = f"{dt} {op} n={count} shift={shift}"
                    ins = [make(dt, count, r, 1, op) for r in range(world)]
                    ref = reference(ins, dt, op, world)
                    mine = _raw(ins[rank], dt)
                    # all_reduce in place and out of place
                    x = _misaligned(count, mine, shift)
                    x[:] = mine
                    sim.all_reduce(x.ctypes.data, x.ctypes.data, count, code, opc)
                    check(f"all_reduce inplace {tag}", close_enough(_val(x, dt), ref, dt, op))
                    y = _misaligned(count, mine, shift)
                    sim.all_reduce(mine.ctypes.data, y.ctypes.data, count, code, opc)
                    check(f"all_reduce out-of-place {tag}", close_enough(_val(y, dt), ref, dt, op))
                    # reduce_scatter
                    lo = count // world * rank + min(rank, count % world)
                    n = count // world + (1 if rank < count % world else 0)
                    y = _misaligned(n, mine, shift)
                    sim.reduce_scatter(mine.ctypes.data, y.ctypes.data, count, code, opc)
                    check(f"reduce_scatter {tag}", close_enough(_val(y, dt), ref[lo:lo + n], dt, op))
                    # reduce to every root
                    for root in range(world):
                        y = _misaligned(count, mine, shift)
                        sim.reduce(mine.ctypes.data, y.ctypes.data if rank == root else 0, count, code, opc, root)
                        if rank == root:
                            check(f"reduce root={root} {tag}", close_enough(_val(y, dt), ref, dt, op))
            if op != "SUM" and not (dt == "bool" and op == "MIN"):
                continue
            for count in counts_for(world)[:-1] + [301]:
                tag = f"{dt} n={count}"
                ins = [_raw(make(dt, count, r, 2), dt) for r in range(world)]
                # all_gather: even, in place, uneven
                y = np.zeros(count * world, ins[0].dtype)
                sim.all_gather(ins[rank].ctypes.data, y.ctypes.data, [count] * world, code)
                check(f"all_gather {tag}", np.array_equal(y, np.concatenate(ins)))
                z = np.zeros(count * world, ins[0].dtype)
                z[rank * count:(rank + 1) * count] = ins[rank]
                sim.all_gather(z[rank * count:].ctypes.data, z.ctypes.data, [count] * world, code)
                check(f"all_gather inplace {tag}", np.array_equal(z, np.concatenate(ins)))
                un = [_raw(make(dt, count + r, r, 3), dt) for r in range(world)]
                y = np.zeros(sum(len(u) for u in un), ins[0].dtype)
                sim.all_gather(un[rank].ctypes.data, y.ctypes.data, [len(u) for u in un], code)
                check(f"all_gather uneven {tag}", np.array_equal(y, np.concatenate(un)))
                for root in range(world):
                    x = ins[rank].copy()
                    sim.broadcast(x.ctypes.data, count, code, root)
                    check(f"broadcast root={root} {tag}", np.array_equal(x, ins[root]))
                    y = np.zeros(count * world, ins[0].dtype)
                    sim.gather(ins[rank].ctypes.data, y.ctypes.data, count, code, root)
                    if rank == root:
                        check(f"gather root={root} {tag}", np.array_equal(y, np.concatenate(ins)))
                    full = _raw(make(dt, count * world, root, 4), dt)
                    y = np.zeros(count, ins[0].dtype)
                    sim.scatter(full.ctypes.data, y.ctypes.data, count, code, root)
                    check(f"scatter root={root} {tag}", np.array_equal(y, full[rank * count:(rank + 1) * count]))

                def sz(s, d):
                    return (s + 2 * d + count) % 5 + (60 if count > 100 else 0)
                send = [_raw(make(dt, sum(sz(s, d) for d in range(world)), s, 5), dt) for s in range(world)]
                outn = sum(sz(s, rank) for s in range(world))
                y = np.zeros(outn, ins[0].dtype)
                sim.all_to_all(send[rank].ctypes.data, y.ctypes.data, [sz(rank, d) for d in range(world)],
                               [sz(s, rank) for s in range(world)], code)
                exp = np.concatenate([send[s][sum(sz(s, d) for d in range(rank)):][:sz(s, rank)] for s in range(world)])
                check(f"all_to_all uneven {tag}", np.array_equal(y, exp))
        # The CUDA ring adds in the host ring's order (gloo's): bit for bit against the model.
        from order_ref import ordered_sum
        for dt, code in ((np.float32, 0), (np.float16, 2)):
            for count in (1, 13, 1001, 5003):
                xs = [(np.random.default_rng(9 * count + p).standard_normal(count)
                       * 10.0 ** np.random.default_rng(p).uniform(-3, 3, count)).astype(dt) for p in range(world)]
                x = xs[rank].copy()
                sim.all_reduce(x.ctypes.data, x.ctypes.data, count, code, 0)
                check(f"all_reduce order {np.dtype(dt).name} n={count}", x.tobytes() == ordered_sum(xs).tobytes())
                # The direct all-reduce combines in the same order: bit-identical to the ring.
                y = np.empty_like(xs[rank])
                sim.all_reduce(xs[rank].ctypes.data, y.ctypes.data, count, code, 0, True)
                check(f"direct all_reduce order {np.dtype(dt).name} n={count}", y.tobytes() == ordered_sum(xs).tobytes())
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank}: exception\n{traceback.format_exc()}")
    finally:
        sim.close()
    return fails


# ---------------- CUDA unavailable ----------------

class FakeCudaArray:
    """Looks like a CUDA array to ringcomm (never dereferenced: CUDA is unavailable)."""

    def __init__(self, n=8, typestr="<f4", strides=None, readonly=False):
        self.__cuda_array_interface__ = dict(shape=(n,), typestr=typestr, data=(0x7f0000000000, readonly),
                                             version=3, strides=strides)


def unavailable_cases(rank, world, mixed):
    import ringcomm
    comm = init_under_env(rank, world, timeout=30)
    out = []
    try:
        x = FakeCudaArray() if (not mixed or rank == 0) else np.ones(8, np.float32)
        try:
            comm.all_reduce(x)
            out.append(("no error", ""))
        except ringcomm.RingcommError as e:
            out.append((type(e).__name__, str(e)))
        y = np.ones(4, np.float32)
        comm.all_reduce(y)  # the communicator is still usable
        out.append(y.tolist())
    finally:
        comm.close()
    return out


# ---------------- GPU cases ----------------

def _gpu_device(rank):
    import torch
    n = torch.cuda.device_count()
    dev = rank % n
    torch.cuda.set_device(dev)
    return dev


def _cuda_tensor(arr, dt, dev):
    import torch
    t = torch.from_numpy(np.ascontiguousarray(arr).copy())
    if dt == "bfloat16":
        t = t.to(torch.bfloat16)
    return t.to(f"cuda:{dev}")


def _host(t):
    import torch
    t = t.cpu()
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def gpu_collective_cases(rank, world, mode, slot_bytes, nslots, route):
    """Every collective x dtype x op x count on torch CUDA tensors against numpy. route: "api"
    (ringcomm.init + the host API's CUDA dispatch) or "cuda" (ringcomm.cuda.init)."""
    os.environ["RINGCOMM_CUDA_P2P"] = mode
    os.environ["RINGCOMM_CUDA_SLOT_BYTES"] = str(slot_bytes)
    os.environ["RINGCOMM_CUDA_NSLOTS"] = str(nslots)
    import torch

    import ringcomm
    import ringcomm.cuda
    dev = _gpu_device(rank)
    init = "file://" + os.environ["RC_TEST_STORE"]
    if route == "api":
        comm = ringcomm.init(rank=rank, world_size=world, init_method=init, timeout=COMM_TIMEOUT)
    else:
        comm = ringcomm.cuda.init(rank=rank, world_size=world, init_method=init, timeout=COMM_TIMEOUT, device=dev)
    fails, digests = [], []

    def check(name, cond):
        if not cond:
            fails.append(f"rank {rank}: {name}")

    T = lambda a, dt: _cuda_tensor(a, dt, dev)  # noqa: E731
    try:
        for dt, op in pairs():
            for count in counts_for(world):
                tag = f"{mode} {dt} {op} n={count}"
                ins = [make(dt, count, r, 1, op) for r in range(world)]
                ref = reference(ins, dt, op, world)
                x = T(ins[rank], dt)
                comm.all_reduce(x, op=getattr(ringcomm.ReduceOp, op))
                check(f"all_reduce inplace {tag}", close_enough(_host(x), ref, dt, op))
                digests.append(("all_reduce", tag, digest(_host(x))))
                x = T(ins[rank], dt)
                y = T(np.zeros_like(ins[rank]), dt)
                comm.all_reduce(x, op=op, output=y)
                check(f"all_reduce out-of-place {tag}", close_enough(_host(y), ref, dt, op))
                check(f"all_reduce input untouched {tag}", np.array_equal(_host(x), _host(T(ins[rank], dt))))
                # misaligned views (element offset 1): the kernels' scalar path
                big = T(np.concatenate([ins[rank][:1], ins[rank]]) if count else ins[rank], dt)
                v = big[1:] if count else big
                comm.all_reduce(v, op=op)
                check(f"all_reduce misaligned {tag}", close_enough(_host(v), ref, dt, op))
                lo = count // world * rank + min(rank, count % world)
                n = count // world + (1 if rank < count % world else 0)
                y = T(np.zeros(n, dtype=ins[rank].dtype), dt)
                comm.reduce_scatter(y, T(ins[rank], dt), op=op)
                check(f"reduce_scatter {tag}", close_enough(_host(y), ref[lo:lo + n], dt, op))
                if count in (7, 3001) or world <= 2:
                    for root in range(world):
                        x = T(ins[rank], dt)
                        comm.reduce(x, root=root, op=op)
                        if rank == root:
                            check(f"reduce root={root} {tag}", close_enough(_host(x), ref, dt, op))
            if op != "SUM" and not (dt == "bool" and op == "MIN"):
                continue
            for count in counts_for(world):
                tag = f"{mode} {dt} n={count}"
                ins = [make(dt, count, r, 2) for r in range(world)]
                y = T(np.zeros(count * world, dtype=ins[0].dtype), dt)
                comm.all_gather(y, T(ins[rank], dt))
                check(f"all_gather {tag}", close_enough(_host(y), np.concatenate(ins), dt, "SUM"))
                z = T(np.zeros(count * world, dtype=ins[0].dtype), dt)
                z[rank * count:(rank + 1) * count] = T(ins[rank], dt)
                comm.all_gather(z, z[rank * count:(rank + 1) * count])
                check(f"all_gather inplace {tag}", close_enough(_host(z), np.concatenate(ins), dt, "SUM"))
                un = [make(dt, count + r, r, 3) for r in range(world)]
                y = T(np.zeros(sum(len(u) for u in un), dtype=ins[0].dtype), dt)
                comm.all_gather(y, T(un[rank], dt))
                check(f"all_gather uneven {tag}", close_enough(_host(y), np.concatenate(un), dt, "SUM"))
                for root in range(world):
                    x = T(ins[rank], dt)
                    comm.broadcast(x, root=root)
                    check(f"broadcast root={root} {tag}", close_enough(_host(x), ins[root], dt, "SUM"))
                full = [make(dt, count * world, r, 4) for r in range(world)]
                y = T(np.zeros(count * world, dtype=ins[0].dtype), dt)
                comm.all_to_all(y, T(full[rank], dt))
                exp = np.concatenate([full[s][rank * count:(rank + 1) * count] for s in range(world)])
                check(f"all_to_all {tag}", close_enough(_host(y), exp, dt, "SUM"))
                for root in range(world):
                    y = T(np.zeros(count * world, dtype=ins[0].dtype), dt) if rank == root else None
                    comm.gather(y, T(ins[rank], dt), root=root)
                    if rank == root:
                        check(f"gather root={root} {tag}", close_enough(_host(y), np.concatenate(ins), dt, "SUM"))
                    src = T(full[root], dt) if rank == root else None
                    y = T(np.zeros(count, dtype=ins[0].dtype), dt)
                    comm.scatter(y, src, root=root)
                    check(f"scatter root={root} {tag}",
                          close_enough(_host(y), full[root][rank * count:(rank + 1) * count], dt, "SUM"))
                if world > 1:
                    x = T(ins[rank], dt)
                    y = T(np.zeros(count, dtype=ins[0].dtype), dt)
                    right, left = (rank + 1) % world, (rank - 1) % world
                    hs = comm.send(x, right, async_op=True)
                    hr = comm.recv(y, left, async_op=True)
                    hs.wait(30)
                    hr.wait(30)
                    check(f"send/recv ring {tag}", close_enough(_host(y), ins[left], dt, "SUM"))
                comm.barrier()
        # async collectives on a side stream: enqueue, return, complete in order
        s = torch.cuda.Stream()
        xs = [torch.full((100000,), float(rank + i), device=f"cuda:{dev}") for i in range(5)]
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            hs = [comm.all_reduce(x, async_op=True) for x in xs]
        for i, h in enumerate(hs):
            h.wait(timeout=60)
            check(f"async all_reduce {i}", h.is_completed() and h.exception() is None
                  and bool((xs[i] == sum(r + i for r in range(world))).all()))
        # stream order: work enqueued after the call sees the result without a host sync
        x = torch.full((1 << 20,), float(rank + 1), device=f"cuda:{dev}")
        comm.all_reduce(x)
        y = x * 2
        check("stream order", float(y[0].item()) == 2.0 * sum(r + 1 for r in range(world)))
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank}: exception\n{traceback.format_exc()}")
    finally:
        comm.close()
    return fails, digests


def gpu_cupy_cases(rank, world):
    """CuPy arrays through ringcomm.cuda.init on CuPy's current stream."""
    import cupy

    import ringcomm.cuda
    n = cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(rank % n).use()
    comm = init_under_env(rank, world, timeout=60, init=ringcomm.cuda.init, device=rank % n)
    try:
        x = cupy.arange(1000, dtype=cupy.float32) * (rank + 1)
        comm.all_reduce(x)
        exp = np.arange(1000, dtype=np.float32) * sum(r + 1 for r in range(world))
        return bool(np.array_equal(cupy.asnumpy(x), exp))
    finally:
        comm.close()


def gpu_killed_rank(rank, world):
    """Rank 1 dies (SIGKILL) while the others run large all_reduces: they must raise, not hang."""
    import signal

    import torch

    import ringcomm
    import ringcomm.cuda
    dev = _gpu_device(rank)
    comm = init_under_env(rank, world, timeout=60, init=ringcomm.cuda.init, device=dev)
    x = torch.ones(16 << 20, device=f"cuda:{dev}")
    comm.all_reduce(x[:10])
    torch.cuda.synchronize()
    if rank == 1:
        comm.all_reduce(x)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(50):
            comm.all_reduce(x, async_op=True).wait()
        return ("no error", 0.0, "")
    except ringcomm.RingcommError as e:
        return (type(e).__name__, time.monotonic() - t0, str(e))
    finally:
        comm.close()


def gpu_ddp(rank, world, backend, steps):
    """A small model trained with DDP on CUDA tensors over `backend`; returns the final weights."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    if backend == "ringcomm":
        import ringcomm.torch  # noqa: F401 - registers the backend
    dev = _gpu_device(rank)
    dist.init_process_group(backend, init_method="file://" + os.environ["RC_TEST_STORE"] + f"/{backend}-pg",
                            rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
        ddp = DDP(model, device_ids=[dev], bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(steps):
            xb = torch.randn(16, 32, generator=g).to(dev)
            yb = torch.randn(16, 4, generator=g).to(dev)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(xb), yb).backward()
            opt.step()
        torch.cuda.synchronize()
        return [p.detach().cpu().numpy() for p in model.parameters()]
    finally:
        dist.destroy_process_group()


def backend_ops(rank, world, device):
    """Every torch.distributed op the "ringcomm" backend maps, on tensors on `device` ("cuda" on a
    GPU machine; "cpu" checks the case itself here), against values computed from the inputs.
    Includes the staging paths (list outputs that are not one flat buffer) and async + futures.
    Returns a list of failures."""
    import torch
    import torch.distributed as dist

    import ringcomm.torch  # noqa: F401 - registers the backend
    if device == "cuda":
        dev = torch.device("cuda", _gpu_device(rank))
    else:
        dev = torch.device("cpu")
    dist.init_process_group("ringcomm", init_method="file://" + os.environ["RC_TEST_STORE"] + f"/ops-{device}",
                            rank=rank, world_size=world)
    fails = []

    def check(name, got, want):
        got = got.cpu() if isinstance(got, torch.Tensor) else got
        if not torch.equal(got, want):
            fails.append(f"rank {rank} {device}: {name}: got {got.tolist()[:8]}, want {want.tolist()[:8]}")

    def inp(r, n=5, dtype=torch.float32):  # rank r's input, known to every rank
        return (torch.arange(n, dtype=torch.float64) * (r + 1) + r).to(dtype)

    try:
        for op, fold in ((dist.ReduceOp.SUM, sum), (dist.ReduceOp.MAX, lambda v: torch.stack(v).amax(0)),
                         (dist.ReduceOp.MIN, lambda v: torch.stack(v).amin(0))):
            x = inp(rank).to(dev)
            dist.all_reduce(x, op=op)
            check(f"all_reduce {op}", x, fold([inp(r) for r in range(world)]))
        x = inp(rank).to(dev)
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        check("all_reduce AVG", x, sum(inp(r) for r in range(world)) / world)
        x = inp(rank, dtype=torch.int64).to(dev)
        w = dist.all_reduce(x, async_op=True)
        fut = w.get_future()
        w.wait()
        check("all_reduce async int64", x, sum(inp(r, dtype=torch.int64) for r in range(world)))
        check("future value", fut.wait()[0], sum(inp(r, dtype=torch.int64) for r in range(world)))
        root = world - 1
        x = inp(rank).to(dev)
        dist.broadcast(x, src=root)
        check("broadcast", x, inp(root))
        x = inp(rank).to(dev)
        dist.reduce(x, dst=0)
        if rank == 0:
            check("reduce", x, sum(inp(r) for r in range(world)))
        outs = [torch.full((5,), -1.0, device=dev) for _ in range(world)]  # not one flat buffer: staged
        dist.all_gather(outs, inp(rank).to(dev))
        for r in range(world):
            check(f"all_gather[{r}]", outs[r], inp(r))
        out = torch.empty(5 * world, device=dev)
        dist.all_gather_into_tensor(out, inp(rank).to(dev))
        check("all_gather_into_tensor", out, torch.cat([inp(r) for r in range(world)]))
        full = [inp(r, 3 * world) for r in range(world)]
        out = torch.empty(3, device=dev)
        dist.reduce_scatter_tensor(out, full[rank].to(dev))
        check("reduce_scatter_tensor", out, sum(full)[3 * rank:3 * rank + 3])
        out = torch.empty(3, device=dev)
        dist.reduce_scatter(out, [c.to(dev) for c in full[rank].split(3)])
        check("reduce_scatter list", out, sum(full)[3 * rank:3 * rank + 3])
        src = torch.arange(world * 2, dtype=torch.float32) + 100 * rank
        out = torch.empty(world * 2, device=dev)
        dist.all_to_all_single(out, src.to(dev))
        check("all_to_all_single", out,
              torch.cat([torch.arange(world * 2, dtype=torch.float32)[2 * rank:2 * rank + 2] + 100 * r
                         for r in range(world)]))
        outs = [torch.empty(2, device=dev) for _ in range(world)]
        dist.all_to_all(outs, [c.to(dev) for c in src.split(2)])
        for r in range(world):
            check(f"all_to_all[{r}]", outs[r], torch.arange(world * 2, dtype=torch.float32)[2 * rank:2 * rank + 2]
                  + 100 * r)
        outs = [torch.empty(5, device=dev) for _ in range(world)] if rank == 0 else None
        dist.gather(inp(rank).to(dev), outs, dst=0)
        if rank == 0:
            for r in range(world):
                check(f"gather[{r}]", outs[r], inp(r))
        out = torch.empty(5, device=dev)
        dist.scatter(out, [inp(r).to(dev) for r in range(world)] if rank == 0 else None, src=0)
        check("scatter", out, inp(rank))
        dist.barrier()
        if world > 1:
            right, left = (rank + 1) % world, (rank - 1) % world
            y = torch.empty(5, device=dev)
            ws = [dist.isend(inp(rank).to(dev), right), dist.irecv(y, left)]
            for w in ws:
                w.wait()
            check("isend/irecv", y, inp(left))
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank} {device}: exception\n{traceback.format_exc()}")
    finally:
        dist.destroy_process_group()
    return fails


def gpu_order_cases(rank, world):
    """all_reduce of CUDA tensors adds in the host's (and gloo's) order: bit for bit against the
    numpy model (order_ref.py), on order-sensitive float32 and float16 data."""
    import torch

    import ringcomm.cuda
    from order_ref import ordered_sum
    dev = _gpu_device(rank)
    comm = init_under_env(rank, world, timeout=COMM_TIMEOUT, init=ringcomm.cuda.init, device=dev)
    fails = []
    try:
        for dt in (np.float32, np.float16):
            for count in (1, 13, 1001, 300007):
                xs = [(np.random.default_rng(9 * count + p).standard_normal(count)
                       * 10.0 ** np.random.default_rng(p).uniform(-3, 3, count)).astype(dt) for p in range(world)]
                x = torch.from_numpy(xs[rank].copy()).to(f"cuda:{dev}")
                comm.all_reduce(x)
                got = x.cpu().numpy()
                if got.tobytes() != ordered_sum(xs).tobytes():
                    fails.append(f"rank {rank}: order {np.dtype(dt).name} n={count}")
    except Exception:  # noqa: BLE001
        fails.append(f"rank {rank}: exception\n{traceback.format_exc()}")
    finally:
        comm.close()
    return fails
