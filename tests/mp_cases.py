"""The tests' shared harness module: cases that run INSIDE spawned ranks (module-level so that
spawn can pickle them) and the small helpers every test module and case module takes from here
rather than writing again (a communicator on a test store, a free TCP port, the reduction
reference, the largest difference between two sets of tensors).

``run_collective_cases`` runs many cases against a numpy reference computed independently on
every rank and returns a list of failure strings plus digests of the results (compared across
ranks by the test: floating results must be bit-identical on every rank)."""
import hashlib
import os
import socket
import traceback

import numpy as np

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"]
FLOAT = {"float32", "float64", "float16", "bfloat16"}
INTS = {"int8", "uint8", "int32", "int64"}
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]
# Element sizes of DTYPES.
ESIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
         "int32": 4, "int64": 8, "bool": 1}
# Tiny slots: far pieces of 128 bytes, ring pieces of 256, two slots per channel, so that small
# counts span many pieces (and halving_doubling's units) per chunk and every channel runs full.
TINY = {"RINGCOMM_SLOT_BYTES": "256", "RINGCOMM_FAR_SLOT_BYTES": "128", "RINGCOMM_NSLOTS": "2"}



def init_under_env(rank, world, sub="", env=None, timeout=60, init=None, **kwargs):
    """A communicator created under `env` (knobs are read at creation; the process's own values
    are restored afterwards) on its own file store, RC_TEST_STORE/sub (RC_TEST_STORE itself for
    sub ""), unless kwargs name an ``init_method`` or a ``store``. `init` is the constructor
    (``ringcomm.init``; ``ringcomm.cuda.init`` for a device communicator); kwargs go to it."""
    import ringcomm
    env = env or {}
    from ringcomm.core.config import environment
    with environment(env):
        if "init_method" not in kwargs and "store" not in kwargs:
            path = os.path.join(os.environ["RC_TEST_STORE"], sub) if sub else os.environ["RC_TEST_STORE"]
            os.makedirs(path, exist_ok=True)
            kwargs["init_method"] = "file://" + path
        return (init or ringcomm.init)(rank=rank, world_size=world, timeout=timeout, **kwargs)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a tcp:// rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def max_abs_diff(a, b) -> float:
    """The largest |x - y| over paired tensors: `a` and `b` are both modules (their parameters,
    in order), both dicts (same keys), or both sequences (same length). Compared in float32 or
    wider, so half-precision pairs do not round the difference."""
    if hasattr(a, "parameters"):
        a, b = list(a.parameters()), list(b.parameters())
    if isinstance(a, dict):
        assert set(a) == set(b), (sorted(a), sorted(b))
        a, b = [a[k] for k in a], [b[k] for k in a]
    assert len(a) == len(b), (len(a), len(b))
    def wide(t):
        return t.float() if t.dtype.itemsize < 4 else t
    return max(float((wide(x) - wide(y)).abs().max()) for x, y in zip(a, b))


def supported(dt, op):
    if dt == "bool":
        return op in ("MIN", "MAX")
    if op == "AVG":
        return dt in FLOAT
    if op in ("BAND", "BOR", "BXOR"):
        return dt in INTS
    return True


def pairs():
    return [(d, o) for d in DTYPES for o in OPS if supported(d, o)]


def make(dt, count, rank, salt=0, op="SUM"):
    """Deterministic per-rank data whose reductions are exact in every dtype (small integers;
    PRODUCT uses +-1/+-2 so products stay small)."""
    rng = np.random.default_rng(1000 * rank + 7 * salt + count)
    if dt == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if op == "PRODUCT":
        v = rng.choice(np.array([-2, -1, 1, 2]), count) if dt not in ("uint8",) else rng.choice(np.array([1, 2]), count)
    elif dt == "uint8":
        v = rng.integers(0, 40, count)
    else:
        v = rng.integers(-20, 21, count)
    if dt == "bfloat16":
        return v.astype(np.float32)  # carried as float32 on the numpy side, converted for torch
    return v.astype(dt)


def reference(arrays, dt, op, world, factor=1.0):
    """The reduction of `arrays` (numpy, one per rank) by `op`, computed in numpy: floats in
    float64, integers in their own type (wrapping as the library does), bool as logic (SUM, MAX,
    BOR: any; PRODUCT, MIN, BAND: all; BXOR: parity); AVG of integers rounds down; PREMUL_SUM
    scales by `factor` before the sum."""
    a = np.stack(arrays)
    if dt == "bool":
        if op == "BXOR":
            return np.bitwise_xor.reduce(a, 0)
        return a.all(0) if op in ("MIN", "PRODUCT", "BAND") else a.any(0)
    if op == "PREMUL_SUM":
        r = (a.astype(np.float64) * factor).sum(0)
    elif op == "SUM":
        r = a.sum(0, dtype=np.float64 if dt in FLOAT else a.dtype)
    elif op == "PRODUCT":
        r = a.prod(0, dtype=np.float64 if dt in FLOAT else a.dtype)
    elif op == "MIN":
        r = a.min(0)
    elif op == "MAX":
        r = a.max(0)
    elif op == "AVG":
        r = a.astype(np.float64).sum(0) / world if dt in FLOAT else a.sum(0, dtype=np.int64) // world
    elif op == "BAND":
        r = np.bitwise_and.reduce(a, 0)
    elif op == "BOR":
        r = np.bitwise_or.reduce(a, 0)
    else:
        r = np.bitwise_xor.reduce(a, 0)
    return r


def to_lib(arr, dt, lib):
    if lib == "numpy":
        if dt == "bfloat16":
            return None
        return arr.copy()
    import torch
    t = torch.from_numpy(np.ascontiguousarray(arr).copy())
    if dt == "bfloat16":
        t = t.to(torch.bfloat16)
    return t


def to_np(x):
    if isinstance(x, np.ndarray):
        return x
    import torch
    if x.dtype == torch.bfloat16:
        return x.float().numpy()
    return x.numpy()


def all_reduce_checked(comm, x_src, op, in_place, dt, lib, check):
    """all_reduce of a copy of x_src in `lib`'s array type, in place or out of place into a
    sentinel buffer (then check(what, cond) that the input is untouched); returns the result's
    bytes and the result."""
    x = to_lib(x_src, dt, lib)
    if in_place:
        comm.all_reduce(x, op=op)
        y = x
    else:
        keep = np.ascontiguousarray(to_np(x)).tobytes()
        y = to_lib(np.full_like(x_src, 3), dt, lib)
        comm.all_reduce(x, op=op, output=y)
        check(f"input untouched {dt} {op} n={x_src.size}", np.ascontiguousarray(to_np(x)).tobytes() == keep)
    return np.ascontiguousarray(to_np(y)).tobytes(), y


def close_enough(got, ref, dt, op):
    got = to_np(got)
    if dt in FLOAT and op == "AVG":
        tol = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}[dt]
        return np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol * 4)
    if dt in FLOAT:
        return np.array_equal(got.astype(np.float64), ref.astype(np.float64))
    return np.array_equal(got, ref.astype(got.dtype))


def digest(x):
    return hashlib.sha1(np.ascontiguousarray(to_np(x)).tobytes()).hexdigest()[:16]


def thinned(counts, pair, stride):
    """``(index, count)`` of every ``stride``-th of ``counts``, starting at an offset set by the
    dtype x op pair's index ``pair``: over all pairs, every count still runs (stride 1: all)."""
    return [(i, c) for i, c in enumerate(counts) if (i + pair) % stride == 0]


def counts_of(world, esize, extra=()):
    """0, 1, 2, 3, 7, below the world size, not divisible by it, and counts whose chunks span
    several TINY far pieces (128 / esize elements each), with the caller's `extra` counts."""
    pe = 128 // esize
    return sorted({0, 1, 2, 3, 7, max(world - 1, 1), 5 * world + 1, world * pe + 1,
                   3 * world * pe + world - 1, *extra})


def counts_for(world):
    # 0, 1, 7, not divisible by the world size, and (with small slots) many slots.
    return [0, 1, 7, 5 * world + 1, 3001]


def run_collective_configs(rank, world, configs):
    """``run_collective_cases`` once per entry of `configs` ({name: its argument tuple after
    rank and world}), each on its own store (RC_TEST_STORE/name) and with the process's
    environment put back after it: ``{name: (failures, digests)}``."""
    out = {}
    for name, args in configs.items():
        saved = dict(os.environ)
        try:
            out[name] = run_collective_cases(rank, world, *args, sub=name)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return out


def run_collective_cases(rank, world, slot_bytes, nslots, libs, algo="auto", all_reduce_only=False, env=None,
                         sub="", count_stride=1):
    """All collectives x dtypes x ops x counts on one communicator (on RC_TEST_STORE/sub). With
    ``count_stride`` k > 1, each dtype x op pair takes every k-th count, starting at its own offset:
    every pair and every count still runs, each count under 1/k of the pairs."""
    import ringcomm
    os.environ.update(env or {})
    os.environ["RINGCOMM_SLOT_BYTES"] = str(slot_bytes)
    os.environ["RINGCOMM_NSLOTS"] = str(nslots)
    os.environ["RINGCOMM_ALGO"] = algo
    failures, digests = [], []
    comm = init_under_env(rank, world, sub)

    def check(name, cond):
        if not cond:
            failures.append(f"rank {rank}: {name}")

    try:
        for lib in libs:
            for p, (dt, op) in enumerate(pairs()):
                if lib == "numpy" and dt == "bfloat16":
                    continue
                counts = [c for _, c in thinned(counts_for(world), p, count_stride)]
                for count in counts:
                    tag = f"{lib} {dt} {op} n={count}"
                    ins = [make(dt, count, r, 1, op) for r in range(world)]
                    ref = reference(ins, dt, op, world)
                    # all_reduce in place
                    x = to_lib(ins[rank], dt, lib)
                    comm.all_reduce(x, op=getattr(ringcomm.ReduceOp, op))
                    check(f"all_reduce inplace {tag}", close_enough(x, ref, dt, op))
                    digests.append(("all_reduce", tag, digest(x)))
                    if all_reduce_only:
                        continue
                    # all_reduce out of place (input untouched)
                    x = to_lib(ins[rank], dt, lib)
                    y = to_lib(np.zeros_like(ins[rank]), dt, lib)
                    comm.all_reduce(x, op=op, output=y)
                    check(f"all_reduce out-of-place {tag}", close_enough(y, ref, dt, op))
                    check(f"all_reduce input untouched {tag}", np.array_equal(to_np(x), to_np(to_lib(ins[rank], dt, lib))))
                    # reduce_scatter (balanced chunks)
                    lo = count // world * rank + min(rank, count % world)
                    n = count // world + (1 if rank < count % world else 0)
                    x = to_lib(ins[rank], dt, lib)
                    y = to_lib(np.zeros(n, dtype=ins[rank].dtype), dt, lib)
                    comm.reduce_scatter(y, x, op=op)
                    check(f"reduce_scatter {tag}", close_enough(y, ref[lo:lo + n], dt, op))
                    # reduce to every root (in place on the root)
                    if count in (7, 3001) or world <= 2:
                        for root in range(world):
                            x = to_lib(ins[rank], dt, lib)
                            comm.reduce(x, root=root, op=op)
                            if rank == root:
                                check(f"reduce root={root} {tag}", close_enough(x, ref, dt, op))
                # data-movement collectives, once per dtype
                if all_reduce_only or op != "SUM" and not (dt == "bool" and op == "MIN"):
                    continue
                for count in counts:
                    tag = f"{lib} {dt} n={count}"
                    ins = [make(dt, count, r, 2) for r in range(world)]
                    # all_gather: equal contributions, out of place and in place
                    x = to_lib(ins[rank], dt, lib)
                    y = to_lib(np.zeros(count * world, dtype=ins[0].dtype), dt, lib)
                    comm.all_gather(y, x)
                    check(f"all_gather {tag}", close_enough(y, np.concatenate(ins), dt, "SUM"))
                    z = to_lib(np.zeros(count * world, dtype=ins[0].dtype), dt, lib)
                    z[rank * count:(rank + 1) * count] = x
                    comm.all_gather(z, z[rank * count:(rank + 1) * count])
                    check(f"all_gather inplace {tag}", close_enough(z, np.concatenate(ins), dt, "SUM"))
                    # all_gather, uneven contributions: rank r gives count + r elements
                    un = [make(dt, count + r, r, 3) for r in range(world)]
                    x = to_lib(un[rank], dt, lib)
                    y = to_lib(np.zeros(sum(len(u) for u in un), dtype=ins[0].dtype), dt, lib)
                    comm.all_gather(y, x)
                    check(f"all_gather uneven {tag}", close_enough(y, np.concatenate(un), dt, "SUM"))
                    # broadcast from every root
                    for root in range(world):
                        x = to_lib(ins[rank], dt, lib)
                        comm.broadcast(x, root=root)
                        check(f"broadcast root={root} {tag}", close_enough(x, ins[root], dt, "SUM"))
                    # all_to_all even
                    full = [make(dt, count * world, r, 4) for r in range(world)]
                    x = to_lib(full[rank], dt, lib)
                    y = to_lib(np.zeros(count * world, dtype=ins[0].dtype), dt, lib)
                    comm.all_to_all(y, x)
                    exp = np.concatenate([full[s][rank * count:(rank + 1) * count] for s in range(world)])
                    check(f"all_to_all {tag}", close_enough(y, exp, dt, "SUM"))
                    # all_to_all uneven: rank s sends (s + d + count) % 5 + (count > 100) * 600 to d
                    def sz(s, d):
                        return (s + 2 * d + count) % 5 + (600 if count > 100 else 0)
                    send = [make(dt, sum(sz(s, d) for d in range(world)), s, 5) for s in range(world)]
                    x = to_lib(send[rank], dt, lib)
                    outn = sum(sz(s, rank) for s in range(world))
                    y = to_lib(np.zeros(outn, dtype=ins[0].dtype), dt, lib)
                    comm.all_to_all(y, x, output_splits=[sz(s, rank) for s in range(world)],
                                    input_splits=[sz(rank, d) for d in range(world)])
                    exp = np.concatenate([send[s][sum(sz(s, d) for d in range(rank)):][:sz(s, rank)]
                                          for s in range(world)])
                    check(f"all_to_all uneven {tag}", close_enough(y, exp, dt, "SUM"))
                    # gather / scatter for every root
                    for root in range(world):
                        x = to_lib(ins[rank], dt, lib)
                        y = to_lib(np.zeros(count * world, dtype=ins[0].dtype), dt, lib) if rank == root else None
                        comm.gather(y, x, root=root)
                        if rank == root:
                            check(f"gather root={root} {tag}", close_enough(y, np.concatenate(ins), dt, "SUM"))
                        src = to_lib(full[root], dt, lib) if rank == root else None
                        y = to_lib(np.zeros(count, dtype=ins[0].dtype), dt, lib)
                        comm.scatter(y, src, root=root)
                        check(f"scatter root={root} {tag}",
                              close_enough(y, full[root][rank * count:(rank + 1) * count], dt, "SUM"))
                    # send/recv ring exchange, posted async in both orders (must not deadlock)
                    if world > 1:
                        x = to_lib(ins[rank], dt, lib)
                        y = to_lib(np.zeros(count, dtype=ins[0].dtype), dt, lib)
                        right, left = (rank + 1) % world, (rank - 1) % world
                        hs = comm.send(x, right, async_op=True)
                        hr = comm.recv(y, left, async_op=True)
                        hs.wait(); hr.wait()
                        check(f"send/recv ring {tag}", close_enough(y, ins[left], dt, "SUM"))
                    comm.barrier()
        # async collectives queue in order and complete
        xs = [np.full(1000, float(rank + i), np.float32) for i in range(5)]
        hs = [comm.all_reduce(x, async_op=True) for x in xs]
        for i, h in enumerate(hs):
            h.wait(timeout=30)
            check(f"async all_reduce {i}", h.is_completed() and h.exception() is None
                  and np.all(xs[i] == sum(r + i for r in range(world))))
    except Exception:
        failures.append(f"rank {rank}: exception\n{traceback.format_exc()}")
    finally:
        comm.close()
    return failures, digests
