"""The ring kernel checked bit for bit against the host ring, with busbw (device_check.sh's ring stage).

Each of --world processes (one GPU shared, or one GPU per rank where there are several) makes one
ringcomm communicator (``ringcomm.init``, the host ring forced with RINGCOMM_ALGO=ring); torch CUDA
tensors passed to it take the CUDA path (the device ring under RINGCOMM_CUDA_P2P=device), CPU
tensors the host ring. For every size from -b to -e (factor -f) and collective of --colls, each
rank draws random float32 inputs (seeded by rank and size), runs the collective on the host copy
(the reference) and on the device copy, compares the outputs bit for bit, then times the device
call: busbw = size / time x 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather; size =
the full buffer), nccl-tests' factors. Then every dtype x op of all_reduce at --matrix-size,
bit for bit. --device cpu runs the same program with CPU tensors on both sides (the host ring
against itself: the program's own check, where there is no GPU).

    python benchmarks/device/ring_check.py --world 2 -b 1K -e 256M [--colls all_reduce,reduce_scatter]
        [--json out.json] [--device cuda|cpu]

Last line: ``ring_check: N rows, every output bit-exact`` or ``ring_check: MISMATCH ...``; exit
status 1 on a mismatch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import add_sweep_args, fmt_size, rank_device, size_arg, sizes, sync  # noqa: E402

COLLS = ("all_reduce", "reduce_scatter", "all_gather")
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
       "all_gather": lambda n: (n - 1) / n}
MATRIX_DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8")
MATRIX_OPS = ("SUM", "PROD", "MIN", "MAX")


def inputs(torch, rank: int, nbytes: int, dtype: str = "float32", seed: int = 0):
    """Random values of ``dtype`` filling nbytes (rank- and size-seeded), on the CPU."""
    dt = getattr(torch, dtype)
    count = nbytes // torch.empty((), dtype=dt).element_size()
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + nbytes)
    if dt.is_floating_point:
        return torch.randn(count, generator=g, dtype=torch.float32).to(dt)
    lo, hi = (0, 8) if dtype == "uint8" else (-8, 8)
    return torch.randint(lo, hi, (count,), generator=g, dtype=dt)


def same_bits(torch, a, b) -> bool:
    a, b = a.contiguous().cpu(), b.contiguous().cpu()
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def run_coll(comm, coll: str, x, out=None, op=None):
    import ringcomm
    op = ringcomm.ReduceOp.SUM if op is None else op
    if coll == "all_reduce":
        comm.all_reduce(x, op=op)
        return x
    if coll == "reduce_scatter":
        comm.reduce_scatter(out, x, op=op)
        return out
    comm.all_gather(out, x)
    return out


def _case(torch, comm, coll, world, rank, nbytes, dev, dtype="float32", op=None, seed=0):
    """(bit-exact, device input, device output buffer) of one collective at one size."""
    x = inputs(torch, rank, nbytes, dtype, seed)
    if coll == "all_gather":
        x = x[: max(1, x.numel() // world)].clone()
    n_out = {"all_reduce": 0, "reduce_scatter": max(1, x.numel() // world), "all_gather": x.numel() * world}[coll]
    if coll == "reduce_scatter":
        x = x[: n_out * world].clone()
    ref_out = torch.empty(n_out, dtype=x.dtype) if n_out else None
    ref = run_coll(comm, coll, x.clone(), ref_out, op)
    xd = x.to(dev)
    out_d = torch.empty(n_out, dtype=x.dtype, device=dev) if n_out else None
    got = run_coll(comm, coll, xd, out_d, op)
    sync(torch, dev)
    return same_bits(torch, got, ref), xd, out_d


def _rank_main(rank: int, world: int, a: dict):
    import torch

    import ringcomm
    dev = rank_device(torch, a["device"], rank)
    comm = ringcomm.init(rank=rank, world_size=world, init_method=f"file://{a['store']}", timeout=a["timeout"])
    rows = []
    try:
        for coll in a["colls"]:
            for nbytes in sizes(a["b"], a["e"], a["f"]):
                exact, xd, out_d = _case(torch, comm, coll, world, rank, nbytes, dev)
                sync(torch, dev)
                t = time.perf_counter()
                run_coll(comm, coll, xd, out_d)   # warm-up, and the estimate of one call
                sync(torch, dev)
                one = max(time.perf_counter() - t, 1e-6)
                want = torch.tensor([max(a["min_iters"], min(a["iters"], int(a["time_per_size"] / one)))])
                comm.all_reduce(want, op=ringcomm.ReduceOp.MAX)   # every rank makes as many calls
                iters = int(want.item())
                t = time.perf_counter()
                for _ in range(iters):
                    run_coll(comm, coll, xd, out_d)
                sync(torch, dev)
                spent = time.perf_counter() - t
                rows.append(dict(kind="sweep", coll=coll, bytes=nbytes, world=world, exact=exact, iters=iters,
                                 time_s=spent / iters, busbw_gbps=nbytes / (spent / iters) / 1e9 * BUS[coll](world)))
        for dtype in a["matrix_dtypes"]:
            for op in a["matrix_ops"]:
                exact, _, _ = _case(torch, comm, "all_reduce", world, rank, a["matrix_size"], dev, dtype,
                                    ringcomm.ReduceOp[op], seed=1)
                rows.append(dict(kind="matrix", coll="all_reduce", dtype=dtype, op=op, bytes=a["matrix_size"],
                                 world=world, exact=exact))
        # Every rank's view: a mismatch on any rank is a mismatch.
        flags = torch.tensor([0 if r["exact"] else 1 for r in rows], dtype=torch.int32)
        comm.all_reduce(flags, op=ringcomm.ReduceOp.MAX)
        for r, f in zip(rows, flags.tolist()):
            r["exact_all_ranks"] = f == 0
    finally:
        comm.close()
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="processes (default 2)")
    add_sweep_args(p, iters=50, time_per_size=0.2)
    p.add_argument("--colls", default="all_reduce", help=f"comma-separated, of {','.join(COLLS)}")
    p.add_argument("--matrix-size", type=size_arg, default=size_arg("64K"),
                   help="bytes per rank of the dtype x op check (default 64K)")
    p.add_argument("--matrix-dtypes", default=",".join(MATRIX_DTYPES), help="'' to skip the dtype x op check")
    p.add_argument("--matrix-ops", default=",".join(MATRIX_OPS))
    p.add_argument("--json", default="", help="write the rows here")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    colls = [c for c in args.colls.split(",") if c]
    bad = [c for c in colls if c not in COLLS]
    if bad or args.world < 2 or args.b < 16 or args.b > args.e or args.f < 2:
        print(f"ring_check: bad arguments (colls {bad}, world {args.world}, sizes {args.b}..{args.e} x{args.f})")
        return 2
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("ring_check: torch has no CUDA device (--device cpu runs the check on CPU tensors)")
            return 2
    from ringcomm.core.launch import spawn
    with tempfile.TemporaryDirectory(prefix="rc-ring-check-") as d:
        a = dict(store=os.path.join(d, "store"), device=args.device, colls=colls, b=args.b, e=args.e, f=args.f,
                 iters=args.iters, min_iters=min(args.min_iters, args.iters), time_per_size=args.time_per_size,
                 matrix_size=args.matrix_size, timeout=args.timeout,
                 matrix_dtypes=[t for t in args.matrix_dtypes.split(",") if t],
                 matrix_ops=[o for o in args.matrix_ops.split(",") if o])
        t0 = time.perf_counter()
        res = spawn(_rank_main, args.world, (a,), timeout=args.launch_timeout,
                    env={"RINGCOMM_ALGO": "ring"})
    rows = res[0]
    p2p = os.environ.get("RINGCOMM_CUDA_P2P", "(default)")
    print(f"# {args.world} ranks, {args.device}, RINGCOMM_CUDA_P2P={p2p}, bit-exact against the host ring "
          f"(RINGCOMM_ALGO=ring); busbw in GB/s")
    print(f"{'coll':>14} {'size':>6} {'time us':>10} {'busbw':>8} {'iters':>5} exact")
    for r in rows:
        if r["kind"] == "sweep":
            print(f"{r['coll']:>14} {fmt_size(r['bytes']):>6} {r['time_s'] * 1e6:10.1f} {r['busbw_gbps']:8.2f} "
                  f"{r['iters']:5d} {'yes' if r['exact_all_ranks'] else 'NO'}")
    matrix = [r for r in rows if r["kind"] == "matrix"]
    if matrix:
        bad_m = [f"{r['dtype']}/{r['op']}" for r in matrix if not r["exact_all_ranks"]]
        print(f"# dtype x op all_reduce at {fmt_size(args.matrix_size)}: {len(matrix) - len(bad_m)} of {len(matrix)} "
              f"bit-exact{': NOT ' + ' '.join(bad_m) if bad_m else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(world=args.world, device=args.device, p2p=p2p, rows=rows), f, indent=1)
    wrong = [r for r in rows if not r["exact_all_ranks"]]
    if wrong:
        print(f"ring_check: MISMATCH in {len(wrong)} of {len(rows)} rows: " +
              ", ".join(f"{r['coll']} {fmt_size(r['bytes'])} {r.get('dtype', 'float32')}/{r.get('op', 'SUM')}"
                        for r in wrong[:8]))
        return 1
    print(f"ring_check: {len(rows)} rows, every output bit-exact ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
