"""all_reduce on CUDA tensors: ringcomm beside gloo, against the same-process floor and the roof
(device_check.sh's bench stage).

-np processes share the GPU (or take one each where there are several). Each makes one ringcomm
communicator (``ringcomm.init``: CUDA tensors take the CUDA path, the device ring under
RINGCOMM_CUDA_P2P=device) and a torch.distributed gloo group, and times float32 all_reduce of each
size on CUDA tensors through both (gloo up to --gloo-max), after checking the sums. Beside them,
measured in this one process before the ranks start:

  floor  one device copy of S bytes and one reduce kernel (``torch.add(a, b, out=c)``) on S bytes,
         back to back: what one rank's share of an all_reduce costs with no hand-off at all;
  roof   2 n S bytes at the device-to-device copy rate R measured for S (copies rotated over
         buffers of at least 4 x the L2 cache, so no copy reads from L2): time 2 n S / R.

busbw = S / time x 2(n-1)/n. The columns: ringcomm's and gloo's time and busbw, ringcomm's
speedup over gloo, the floor and roof times, and the roof's time over ringcomm's (the fraction of
the roof reached). --device cpu runs it all on CPU tensors (the host ring, gloo on CPU, a memcpy
floor and roof with the last-level cache for L2): the program's own check where there is no GPU.

    python benchmarks/device/device_bench.py -np 2 [-b 1K] [-e 256M] [-f 4] [--gloo-max 64M]
        [--json out.json] [--device cuda|cpu]
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


def cache_bytes(torch, dev) -> int:
    """The L2 cache of a GPU; on the CPU the largest cache level of CPU 0 (4 MiB when unknown)."""
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).L2_cache_size)
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    for idx in os.listdir(base) if os.path.isdir(base) else []:
        try:
            best = max(best, size_arg(open(os.path.join(base, idx, "size")).read().strip()))
        except (OSError, ValueError):
            pass
    return best or 4 << 20


def _timed(torch, dev, fn, iters: int) -> float:
    fn(0)
    sync(torch, dev)
    t = time.perf_counter()
    for i in range(iters):
        fn(i)
    sync(torch, dev)
    return (time.perf_counter() - t) / iters


def floor_and_roof(torch, dev, nbytes: int, world: int, iters: int) -> dict:
    """Per size: the copy rate, the floor and the roof. Sources and destinations are slices of two
    pools of at least 4 x the cache, taken at rotating offsets, so a copy never finds its lines in
    the cache from the copies before it."""
    count = max(1, nbytes // 4)
    pool = max(4 * cache_bytes(torch, dev) // 4, 3 * count)
    src, dst = torch.ones(pool, device=dev), torch.empty(pool, device=dev)
    slots = pool // count

    def part(buf, i):
        j = i % slots
        return buf[j * count:(j + 1) * count]
    copy_s = _timed(torch, dev, lambda i: part(dst, i).copy_(part(src, i + 1)), iters)
    rate = nbytes / copy_s
    floor_s = _timed(torch, dev, lambda i: (part(dst, i).copy_(part(src, i + 1)),
                                            torch.add(part(dst, i), part(src, i + 2), out=part(dst, i + 1))), iters)
    return dict(copy_gbps=rate / 1e9, floor_s=floor_s, roof_s=2 * world * nbytes / rate,
                pool_bytes=4 * pool)


def _rank_main(rank: int, world: int, a: dict) -> list:
    import torch
    import torch.distributed as dist

    import ringcomm
    dev = rank_device(torch, a["device"], rank)
    comm = ringcomm.init(rank=rank, world_size=world, init_method=f"file://{a['dir']}/rc", timeout=a["timeout"])
    dist.init_process_group("gloo", init_method=f"file://{a['dir']}/gloo", rank=rank, world_size=world)
    want = world * (world + 1) / 2
    rows = []

    def agreed(n: int) -> int:   # every rank makes as many calls
        t = torch.tensor([n])
        comm.all_reduce(t, op=ringcomm.ReduceOp.MAX)
        return int(t.item())

    def bench(call, x) -> float:
        sync(torch, dev)
        t = time.perf_counter()
        call(x)
        sync(torch, dev)
        iters = agreed(max(a["min_iters"], min(a["iters"], int(a["time_per_size"] / max(time.perf_counter() - t,
                                                                                          1e-6)))))
        comm.barrier()
        return _timed(torch, dev, lambda i: call(x), iters)

    try:
        for nbytes in sizes(a["b"], a["e"], a["f"]):
            x = torch.full((nbytes // 4,), float(rank + 1), device=dev)
            comm.all_reduce(x)
            sync(torch, dev)
            row = dict(bytes=nbytes, world=world, ok=bool((x == want).all()))
            row["ringcomm_s"] = bench(lambda y: comm.all_reduce(y), x)
            if nbytes <= a["gloo_max"]:
                y = torch.full((nbytes // 4,), float(rank + 1), device=dev)
                dist.all_reduce(y)
                sync(torch, dev)
                row["gloo_ok"] = bool((y == want).all())
                row["gloo_s"] = bench(lambda z: dist.all_reduce(z), y)
            rows.append(row)
    finally:
        comm.close()
        dist.destroy_process_group()
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-np", type=int, default=2, help="processes (default 2)")
    add_sweep_args(p, iters=100, time_per_size=0.25)
    p.add_argument("--gloo-max", type=size_arg, default=size_arg("64M"), help="largest size gloo runs (default 64M)")
    p.add_argument("--json", default="", help="write the rows here")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.np < 2 or args.b < 4 or args.b > args.e or args.f < 2:
        print(f"device_bench: bad arguments (-np {args.np}, sizes {args.b}..{args.e} x{args.f})")
        return 2
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("device_bench: torch has no CUDA device (--device cpu runs it on CPU tensors)")
        return 2
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    t0 = time.perf_counter()
    ref = {n: floor_and_roof(torch, dev, n, args.np, max(args.min_iters, min(args.iters, 20)))
           for n in sizes(args.b, args.e, args.f)}
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    from ringcomm.core.launch import spawn
    with tempfile.TemporaryDirectory(prefix="rc-device-bench-") as d:
        a = dict(dir=d, device=args.device, b=args.b, e=args.e, f=args.f, gloo_max=args.gloo_max, iters=args.iters,
                 min_iters=min(args.min_iters, args.iters), time_per_size=args.time_per_size, timeout=args.timeout)
        rows = spawn(_rank_main, args.np, (a,), timeout=args.launch_timeout)[0]
    bus = 2 * (args.np - 1) / args.np
    p2p = os.environ.get("RINGCOMM_CUDA_P2P", "(default)")
    print(f"# all_reduce float32, {args.np} ranks, {args.device} tensors, RINGCOMM_CUDA_P2P={p2p}; times in us, "
          f"busbw in GB/s; floor: one copy + one reduce kernel in one process; roof: 2nS at the copy rate "
          f"(buffers rotated over >= 4x {fmt_size(cache_bytes(torch, dev))} cache)")
    print(f"{'size':>6} {'rc us':>9} {'rc busbw':>9} {'gloo us':>9} {'gloo busbw':>10} {'rc/gloo':>8} "
          f"{'floor us':>9} {'roof us':>9} {'of roof':>8} {'copy GB/s':>10} ok")
    status = 0
    for r in rows:
        r.update(ref[r["bytes"]])
        n = r["bytes"]
        r["ringcomm_busbw"] = n / r["ringcomm_s"] / 1e9 * bus
        r["of_roof"] = r["roof_s"] / r["ringcomm_s"]
        line = f"{fmt_size(n):>6} {r['ringcomm_s'] * 1e6:9.1f} {r['ringcomm_busbw']:9.2f} "
        if "gloo_s" in r:
            r["gloo_busbw"] = n / r["gloo_s"] / 1e9 * bus
            r["speedup_over_gloo"] = r["gloo_s"] / r["ringcomm_s"]
            line += f"{r['gloo_s'] * 1e6:9.1f} {r['gloo_busbw']:10.2f} {r['speedup_over_gloo']:8.1f} "
        else:
            line += f"{'-':>9} {'-':>10} {'-':>8} "
        ok = r["ok"] and r.get("gloo_ok", True)
        status |= 0 if ok else 1
        print(line + f"{r['floor_s'] * 1e6:9.1f} {r['roof_s'] * 1e6:9.1f} {r['of_roof']:8.2f} "
              f"{r['copy_gbps']:10.1f} {'yes' if ok else 'NO'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(np=args.np, device=args.device, p2p=p2p, rows=rows), f, indent=1)
    print(f"device_bench: {len(rows)} sizes, {'every sum right' if status == 0 else 'WRONG SUMS'} "
          f"({time.perf_counter() - t0:.1f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
