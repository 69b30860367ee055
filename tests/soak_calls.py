"""The soak test's calls (tests/soak.py runs them): call ``i`` is drawn from (seed, i, world, the
epoch's size cap) alone and its inputs from (seed, i, position in batch, rank), so every rank draws
the same calls and computes the numpy reference of the whole collective without talking; then
the result is checked exactly (tests/soak.py states the rules)."""
from __future__ import annotations

import math

import numpy as np

from order_ref import ordered_sum  # (the all_reduce order model, written from the rule)


MAX_BYTES = 8 << 20
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int8", "uint8", "int32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
            "int32": 4, "int64": 8, "bool": 1}
# numpy storage of each dtype: bfloat16 lives as its uint16 bit pattern on the numpy side.
NP_STORE = {"bfloat16": np.uint16}
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier",
         "all_to_all", "gather", "scatter", "send_recv")
KIND_WEIGHTS = (4, 2, 2, 1, 2, 0.5, 1.5, 1, 1, 1.5)
REDUCING = ("all_reduce", "reduce_scatter", "reduce")


def ops_for(dt):
    if dt == "bool":
        return ("MIN", "MAX")
    if dt in FLOATS:
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVG")
    return ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def npdt(dt):
    return np.dtype(NP_STORE.get(dt, dt))


# ---- bfloat16 bit patterns <-> float32 ------------------------------------------------------------
def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    """Round float32 to bfloat16 (nearest, ties to even); the values here are finite."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


# ---- the epoch's knobs and the call sequence (functions of the seed only) -------------------------
def epoch_knobs(seed, epoch):
    rng = np.random.default_rng([seed, 1, epoch])
    slot = int(round(math.exp(rng.uniform(math.log(64), math.log(2 << 20)))))
    if rng.random() < 0.3:
        slot = int(rng.choice([64, 256, 4096, 65536, 256 << 10, 1 << 20]))
    max_nslots = max(2, min(1024, (8 << 20) // slot))        # at most 8 MiB of slots per channel
    nslots = int(round(math.exp(rng.uniform(math.log(2), math.log(min(64, max_nslots) + 0.49)))))
    if rng.random() < 0.1:
        nslots = int(rng.integers(2, max_nslots + 1))
    nslots = max(2, min(nslots, max_nslots))
    nslots = 1 << (nslots.bit_length() - 1)                   # RINGCOMM_NSLOTS must be a power of two
    return {
        "RINGCOMM_SLOT_BYTES": str(slot),
        "RINGCOMM_NSLOTS": str(nslots),
        "RINGCOMM_ALGO": str(rng.choice(["auto", "ring", "direct"])),
        "RINGCOMM_STREAM": str(rng.choice(["auto", "on", "off"])),
    }


def epoch_seconds(seed, epoch, lo, hi):
    return float(np.random.default_rng([seed, 2, epoch]).uniform(lo, hi))


def size_cap(knobs):
    return min(MAX_BYTES, 2048 * int(knobs["RINGCOMM_SLOT_BYTES"]))


def draw_count(rng, itemsize, max_bytes, world):
    """Element count: 0, 1, small, or log-uniform bytes up to max_bytes, often not divisible by
    the world size."""
    r = rng.random()
    if r < 0.04:
        return 0
    if r < 0.08:
        return 1
    if r < 0.14:
        return int(rng.integers(2, 4 * world + 2))
    nbytes = math.exp(rng.uniform(0.0, math.log(max_bytes)))
    count = max(1, int(nbytes) // itemsize)
    if rng.random() < 0.5:
        count += int(rng.integers(1, world))
    return max(0, min(count, max_bytes // itemsize))


def split_count(rng, total, world):
    """`world` non-negative sizes summing to total."""
    if total == 0:
        return [0] * world
    cuts = np.sort(rng.integers(0, total + 1, world - 1))
    return [int(v) for v in np.diff(np.concatenate([[0], cuts, [total]]))]


def draw_op(rng, world, max_bytes, use_torch, kind=None):
    if kind is None:
        p = np.array(KIND_WEIGHTS) / sum(KIND_WEIGHTS)
        kind = str(rng.choice(KINDS, p=p))
    dts = DTYPES if use_torch else tuple(d for d in DTYPES if d != "bfloat16")
    dt = str(rng.choice(dts))
    s = {"kind": kind, "dtype": dt,
         "lib": "torch" if use_torch and (dt == "bfloat16" or rng.random() < 0.1) else "numpy"}
    if kind == "barrier":
        s.update(dtype=None, lib=None)
        return s
    isz = ITEMSIZE[dt]
    if kind in REDUCING:
        s["op"] = str(rng.choice(ops_for(dt)))
        # SUM of floats (not bfloat16: numpy has no such type) also on order-revealing values.
        s["ordered"] = bool(kind == "all_reduce" and s["op"] == "SUM" and dt in ("float16", "float32", "float64")
                            and rng.random() < 0.5)
    if kind == "all_reduce":
        s["count"] = draw_count(rng, isz, max_bytes, world)
        s["out_of_place"] = bool(rng.random() < 0.3)
    elif kind == "reduce_scatter":
        s["count"] = draw_count(rng, isz, max_bytes, world)
    elif kind == "all_gather":
        total = draw_count(rng, isz, max_bytes, world)
        s["counts"] = ([total // world] * world if rng.random() < 0.5
                       else [int(rng.integers(0, total // world + 2)) for _ in range(world)])
    elif kind in ("broadcast", "reduce"):
        s["count"] = draw_count(rng, isz, max_bytes, world)
        s["root"] = int(rng.integers(0, world))
        if kind == "reduce":
            s["out_of_place"] = bool(rng.random() < 0.3)
    elif kind == "all_to_all":
        total = draw_count(rng, isz, max_bytes, world)
        if rng.random() < 0.3:
            b = total // world // world
            s["splits"] = None
            s["send"] = [[b] * world for _ in range(world)]
        else:
            s["splits"] = True
            s["send"] = [split_count(rng, int(rng.integers(0, total // world + 2)), world) for _ in range(world)]
    elif kind in ("gather", "scatter"):
        s["block"] = draw_count(rng, isz, max_bytes, world) // world
        s["root"] = int(rng.integers(0, world))
    elif kind == "send_recv":
        s["count"] = draw_count(rng, isz, max_bytes, world)
        s["pattern"] = "ring" if rng.random() < 0.5 else "pair"
        src = int(rng.integers(0, world))
        s["src"], s["dst"] = src, int((src + rng.integers(1, world)) % world)
        s["shift"] = int(rng.integers(1, world))
    return s


def draw_call(seed, idx, world, max_bytes, use_torch):
    """Call `idx`: one collective (sync or async) or a batch of async ones waited in random order."""
    rng = np.random.default_rng([seed, 3, idx])
    r = rng.random()
    if r < 0.25:
        n = int(rng.integers(2, 5))
        ops = [draw_op(rng, world, max_bytes // n, use_torch) for _ in range(n)]
        return {"mode": "batch", "ops": ops, "wait_order": [int(v) for v in rng.permutation(n)]}
    op = draw_op(rng, world, max_bytes, use_torch)
    mode = "async" if r < 0.45 or (op["kind"] == "send_recv" and op["pattern"] == "ring") else "sync"
    return {"mode": mode, "ops": [op], "wait_order": [0]}


# ---- inputs (functions of seed, call, position, rank) ---------------------------------------------
def data(seed, idx, j, rank, dt, count, purpose):
    """purpose: 'bits' (random bit patterns), 'exact' (values whose reduction is exact in any
    order for the op), 'ordered' (floats whose sums show the order), 'product', 'minmax'."""
    rng = np.random.default_rng([seed, 4, idx, j, rank])
    st = npdt(dt)
    if count == 0:
        return np.empty(0, st)
    if dt == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if dt in INTS or purpose == "bits":
        return np.frombuffer(rng.bytes(count * st.itemsize), dtype=st).copy()
    if purpose == "ordered":
        v = rng.standard_normal(count) * 10.0 ** rng.uniform(-3, 3, count)
    elif purpose == "minmax":
        v = rng.standard_normal(count) * 10.0 ** rng.uniform(-3, 3, count)
        if dt == "float16":
            v = np.clip(v, -6e4, 6e4)
    elif purpose == "product":
        v = rng.choice(np.array([-2.0, -1.0, 1.0, 2.0]), count)
    else:
        v = rng.integers(-20, 21, count).astype(np.float64)
    if dt == "bfloat16":
        return f32_to_bf16(v.astype(np.float32))
    return v.astype(dt)


def purpose_of(op):
    if op["kind"] not in REDUCING:
        return "bits"
    if op.get("ordered"):
        return "ordered"
    return {"PRODUCT": "product", "MIN": "minmax", "MAX": "minmax"}.get(op["op"], "exact")


def reference(xs, dt, op, world):
    """Reduction of the per-rank arrays xs (numpy storage of dt) with op."""
    a = np.stack(xs) if xs[0].size else np.empty((world, 0), xs[0].dtype)
    if dt == "bool":
        return a.all(0) if op == "MIN" else a.any(0)
    if dt in INTS:
        t = a.dtype
        f = {"SUM": lambda: a.sum(0, dtype=t), "PRODUCT": lambda: a.prod(0, dtype=t),
             "MIN": lambda: a.min(0), "MAX": lambda: a.max(0),
             "BAND": lambda: np.bitwise_and.reduce(a, 0), "BOR": lambda: np.bitwise_or.reduce(a, 0),
             "BXOR": lambda: np.bitwise_xor.reduce(a, 0)}[op]
        return f().astype(t)
    v = bf16_to_f32(a) if dt == "bfloat16" else a
    if op in ("MIN", "MAX"):
        r = v.min(0) if op == "MIN" else v.max(0)
        return f32_to_bf16(r) if dt == "bfloat16" else r
    w = v.astype(np.float64)
    r = w.sum(0) if op in ("SUM", "AVG") else w.prod(0)      # exact: small integers
    if op == "AVG":
        # The last combination computes (a + b) * (1/n) in the kernel's type: float64 for float64,
        # float32 otherwise (half types are widened), rounded once to the dtype.
        r = r * (1.0 / world) if dt == "float64" else np.float32(1.0 / world) * r.astype(np.float32)
    if dt == "bfloat16":
        return f32_to_bf16(np.asarray(r, np.float32))
    return np.asarray(r).astype(dt)


def chunk_bounds(count, world, r):
    base, extra = divmod(count, world)
    lo = r * base + min(r, extra)
    return lo, lo + base + (1 if r < extra else 0)


# ---- one rank -------------------------------------------------------------------------------------
class Prepared:
    """One collective of a call on this rank: launch(async_op) issues it (returns its Work, a
    list of them, or None); once it completed, every (name, array, expected) in bufs must match
    byte for byte."""

    def __init__(self):
        self.bufs = []          # (name, numpy array, expected numpy array)
        self.launch = None
        self.nbytes = 0         # sum over ranks of the input bytes


def first_diff(got, want):
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    if got.size == 0:
        return None
    g = got.view(np.uint8).reshape(got.size, -1)
    w = want.view(np.uint8).reshape(want.size, -1)
    if np.array_equal(g, w):
        return None
    bad = int(np.flatnonzero((g != w).any(1))[0])
    return f"element {bad} of {got.size}: got {got[bad]!r}, want {want[bad]!r}"


def prepare(comm, seed, idx, j, op, rank, world, lib_of):
    import ringcomm
    p = Prepared()
    kind, dt = op["kind"], op["dtype"]
    if kind == "barrier":
        p.launch = lambda a: comm.barrier(async_op=a)
        return p
    st = npdt(dt)
    isz = st.itemsize
    wrap = lib_of(dt, op["lib"])
    purpose = purpose_of(op)

    def x_of(r, count, salt=0):
        return data(seed, idx, j * 16 + salt, r, dt, count, purpose)

    def expect(name, arr, want):
        p.bufs.append((name, arr, want))

    if kind in ("all_reduce", "reduce_scatter", "reduce"):
        count = op["count"]
        xs = [x_of(r, count) for r in range(world)]
        p.nbytes = world * count * isz
        if op.get("ordered"):
            want = ordered_sum(xs) if count else xs[0].copy()
        else:
            want = reference(xs, dt, op["op"], world)
        x = xs[rank].copy()
        rop = getattr(ringcomm.ReduceOp, op["op"])
        if kind == "all_reduce":
            if op["out_of_place"]:
                out = np.zeros(count, st)
                p.launch = lambda a: comm.all_reduce(wrap(x), op=rop, async_op=a, output=wrap(out))
                expect("output", out, want)
                expect("input (unchanged)", x, xs[rank])
            else:
                p.launch = lambda a: comm.all_reduce(wrap(x), op=rop, async_op=a)
                expect("buffer", x, want)
        elif kind == "reduce_scatter":
            lo, hi = chunk_bounds(count, world, rank)
            out = np.zeros(hi - lo, st)
            p.launch = lambda a: comm.reduce_scatter(wrap(out), wrap(x), op=rop, async_op=a)
            expect("output", out, want[lo:hi])
            expect("input (unchanged)", x, xs[rank])
        else:
            root = op["root"]
            if op["out_of_place"] and rank == root:
                out = np.zeros(count, st)
                p.launch = lambda a: comm.reduce(wrap(x), root=root, op=rop, async_op=a, output=wrap(out))
                expect("output", out, want)
                expect("input (unchanged)", x, xs[rank])
            else:
                p.launch = lambda a: comm.reduce(wrap(x), root=root, op=rop, async_op=a)
                expect("buffer" if rank == root else "non-root input (unchanged)", x,
                       want if rank == root else xs[rank])
    elif kind == "all_gather":
        counts = op["counts"]
        xs = [x_of(r, counts[r]) for r in range(world)]
        p.nbytes = sum(counts) * isz
        x = xs[rank].copy()
        out = np.zeros(sum(counts), st)
        p.launch = lambda a: comm.all_gather(wrap(out), wrap(x), async_op=a)
        expect("output", out, np.concatenate(xs))
        expect("input (unchanged)", x, xs[rank])
    elif kind == "broadcast":
        count, root = op["count"], op["root"]
        want = x_of(root, count)
        p.nbytes = count * isz
        x = want.copy() if rank == root else x_of(rank, count, salt=1)
        p.launch = lambda a: comm.broadcast(wrap(x), root=root, async_op=a)
        expect("buffer", x, want)
    elif kind == "all_to_all":
        send = op["send"]                           # send[i][k]: elements rank i sends to rank k
        xs = [x_of(r, sum(send[r])) for r in range(world)]
        p.nbytes = sum(map(sum, send)) * isz
        pieces = []
        for i in range(world):
            lo = sum(send[i][:rank])
            pieces.append(xs[i][lo:lo + send[i][rank]])
        want = np.concatenate(pieces)
        x = xs[rank].copy()
        out = np.zeros(want.size, st)
        if op["splits"]:
            osp, isp = [send[i][rank] for i in range(world)], list(send[rank])
            p.launch = lambda a: comm.all_to_all(wrap(out), wrap(x), output_splits=osp, input_splits=isp,
                                                 async_op=a)
        else:
            p.launch = lambda a: comm.all_to_all(wrap(out), wrap(x), async_op=a)
        expect("output", out, want)
        expect("input (unchanged)", x, xs[rank])
    elif kind == "gather":
        b, root = op["block"], op["root"]
        xs = [x_of(r, b) for r in range(world)]
        p.nbytes = world * b * isz
        x = xs[rank].copy()
        if rank == root:
            out = np.zeros(world * b, st)
            p.launch = lambda a: comm.gather(wrap(out), wrap(x), root=root, async_op=a)
            expect("output", out, np.concatenate(xs))
        else:
            p.launch = lambda a: comm.gather(None, wrap(x), root=root, async_op=a)
        expect("input (unchanged)", x, xs[rank])
    elif kind == "scatter":
        b, root = op["block"], op["root"]
        full = x_of(root, world * b)
        p.nbytes = world * b * isz
        out = np.zeros(b, st)
        if rank == root:
            x = full.copy()
            p.launch = lambda a: comm.scatter(wrap(out), wrap(x), root=root, async_op=a)
            expect("input (unchanged)", x, full)
        else:
            p.launch = lambda a: comm.scatter(wrap(out), None, root=root, async_op=a)
        expect("output", out, full[rank * b:(rank + 1) * b])
    elif kind == "send_recv":
        count = op["count"]
        if op["pattern"] == "ring":
            k = op["shift"]
            dst, src = (rank + k) % world, (rank - k) % world
            p.nbytes = world * count * isz
            x = x_of(rank, count)
            want_in = x_of(src, count)
            got = np.zeros(count, st)

            # Always posted async (a ring of blocking sends could wait on each other); run_call
            # waits for both handles.
            p.launch = lambda a: [comm.send(wrap(x), dst, async_op=True), comm.recv(wrap(got), src, async_op=True)]
            expect("received", got, want_in)
            expect("sent (unchanged)", x, x_of(rank, count))
        else:
            src, dst = op["src"], op["dst"]
            p.nbytes = count * isz
            if rank == src:
                x = x_of(src, count)
                p.launch = lambda a: comm.send(wrap(x), dst, async_op=a)
                expect("sent (unchanged)", x, x_of(src, count))
            elif rank == dst:
                got = np.zeros(count, st)
                p.launch = lambda a: comm.recv(wrap(got), src, async_op=a)
                expect("received", got, x_of(src, count))
            else:
                p.launch = lambda a: None
    return p


def describe(call):
    parts = []
    for op in call["ops"]:
        d = {k: v for k, v in op.items() if k not in ("send",)}
        if "send" in op:
            d["send_totals"] = [sum(s) for s in op["send"]]
        parts.append(d)
    return f"mode={call['mode']} ops={parts}"


def run_call(comm, seed, idx, call, rank, world, lib_of, stats, corrupt=False):
    """Issue call `idx`, wait, check. Returns the first mismatch (a string) or None. `corrupt`
    (the checker's own test) flips one bit of the first non-empty result before checking; whether
    one was flipped is stats["corrupted"]."""
    preps = [prepare(comm, seed, idx, j, op, rank, world, lib_of) for j, op in enumerate(call["ops"])]
    if call["mode"] == "sync":
        preps[0].launch(False)
    else:
        works = [p.launch(True) for p in preps]
        for j in call["wait_order"]:
            w = works[j]
            for h in (w if isinstance(w, list) else [w] if w is not None else []):
                h.wait()
    if corrupt:
        for p in preps:
            for _, got, _ in p.bufs:
                if got.size and not stats["corrupted"]:
                    got.view(np.uint8)[0] ^= 1
                    stats["corrupted"] = True
    first = None
    for op, p in zip(call["ops"], preps):
        stats["calls"][op["kind"]] = stats["calls"].get(op["kind"], 0) + 1
        stats["bytes"] += p.nbytes
        stats["ordered"] += bool(op.get("ordered"))
        for name, got, want in p.bufs:
            d = first_diff(got, want) if first is None else None
            if d is not None:
                first = f"{op['kind']} {name}: {d}"
    return first


def make_lib_of(use_torch):
    if not use_torch:
        return lambda dt, lib: (lambda a: a)
    import torch

    def lib_of(dt, lib):
        if dt == "bfloat16":
            return lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        if lib == "torch":
            return torch.from_numpy
        return lambda a: a
    return lib_of
