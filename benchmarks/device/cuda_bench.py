"""CUDA benchmarks. Skips cleanly (exit 0) without a usable GPU.

1. Reduce kernel vs device-to-device copy, in the same run, on the same buffers:
   the reduce kernel reads two buffers and writes one (3 x size bytes of memory traffic), the copy
   reads one and writes one (2 x size); the ratio compares memory-traffic bandwidths
   (target: the reduce kernel >= 80% of the copy).
2. all_reduce: ringcomm-CUDA beside NCCL (torch.distributed "nccl") in the same processes, one GPU
   per rank, when >= 2 GPUs are visible (target at >= 64 MiB: busbw >= 0.9 x NCCL's). algbw =
   size / time, busbw = algbw x 2(n-1)/n (nccl-tests' factors). Each size is checked for
   correctness first.
3. --procs-per-gpu K (K >= 2): ringcomm-CUDA all_reduce with K processes sharing each GPU (no NCCL
   peer: NCCL refuses two ranks on one GPU); informational.

    python benchmarks/device/cuda_bench.py [-b 1M] [-e 256M] [-f 4] [--iters 20] [--world N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_common import fmt_size, size_arg, sizes  # noqa: E402


# ---- 1. reduce kernel vs D2D copy -------------------------------------------------------------------
def bench_kernels(args) -> list:
    from ringcomm import _C_cuda
    rows = []
    print("\n# reduce kernel vs cudaMemcpy D2D (same buffers, same run)")
    print(f"{'size':>8} {'dtype':>9} {'reduce GB/s':>12} {'copy GB/s':>10} {'ratio':>6}   "
          f"(memory traffic: reduce 3x size, copy 2x size)")
    for dt_name, dt in (("float32", 0), ("bfloat16", 3), ("float16", 2)):
        for n in sizes(args.b, args.e, args.f):
            r = _C_cuda._bench_reduce(args.device, n, dt, 0, args.iters)
            red = 3 * r["bytes"] / r["reduce_s"] / 1e9
            cpy = 2 * r["bytes"] / r["copy_s"] / 1e9
            rows.append(dict(kind="kernel", size=n, dtype=dt_name, reduce_gbps=red, copy_gbps=cpy, ratio=red / cpy))
            print(f"{fmt_size(n):>8} {dt_name:>9} {red:12.1f} {cpy:10.1f} {red / cpy:6.2f}")
    return rows


# ---- 2./3. all_reduce ---------------------------------------------------------------------------------
def _rank_main(rank, world, args_d, store_dir, per_gpu):
    import torch
    import torch.distributed as dist

    import ringcomm.cuda
    ngpu = torch.cuda.device_count()
    dev = (rank // per_gpu) % ngpu
    torch.cuda.set_device(dev)
    comm = ringcomm.cuda.init(rank=rank, world_size=world, init_method=f"file://{store_dir}/rc", device=dev,
                              timeout=120)
    use_nccl = per_gpu == 1 and world <= ngpu and dist.is_nccl_available()
    if use_nccl:
        dist.init_process_group("nccl", init_method=f"file://{store_dir}/nccl-pg", rank=rank, world_size=world)
    rows = []
    try:
        for n in sizes(args_d["b"], args_d["e"], args_d["f"]):
            count = n // 4
            x = torch.full((count,), float(rank + 1), device=f"cuda:{dev}")
            comm.all_reduce(x)
            torch.cuda.synchronize()
            ok = bool((x == world * (world + 1) / 2).all())

            def timeit(fn):
                for _ in range(args_d["warmup"]):
                    fn()
                torch.cuda.synchronize()
                if use_nccl:
                    dist.barrier()
                else:
                    comm.barrier()
                t0 = time.perf_counter()
                for _ in range(args_d["iters"]):
                    fn()
                torch.cuda.synchronize()
                return (time.perf_counter() - t0) / args_d["iters"]
            t_rc = timeit(lambda: comm.all_reduce(x))
            row = dict(kind="all_reduce", size=n, world=world, per_gpu=per_gpu, ok=ok, ringcomm_s=t_rc)
            if use_nccl:
                y = torch.full((count,), float(rank + 1), device=f"cuda:{dev}")
                dist.all_reduce(y)
                torch.cuda.synchronize()
                row["nccl_ok"] = bool((y == world * (world + 1) / 2).all())
                row["nccl_s"] = timeit(lambda: dist.all_reduce(y))
            rows.append(row)
    finally:
        comm.close()
        if use_nccl:
            dist.destroy_process_group()
    return rows, comm.channels()


def bench_all_reduce(args, world: int, per_gpu: int) -> list:
    from ringcomm.core.launch import spawn
    d = tempfile.mkdtemp(prefix="rc-cuda-bench-")
    args_d = dict(b=max(args.b, 4), e=args.e, f=args.f, iters=args.iters, warmup=args.warmup)
    res = spawn(_rank_main, world, (args_d, d, per_gpu), timeout=args.timeout)
    rows, channels = res[0]
    bus = 2 * (world - 1) / world
    peer = "NCCL" if "nccl_s" in rows[0] else None
    print(f"\n# all_reduce float32, {world} ranks, {per_gpu} per GPU" + (" (vs NCCL)" if peer else ""))
    hdr = f"{'size':>8} {'rc time us':>11} {'rc algbw':>9} {'rc busbw':>9} {'ok':>3}"
    if peer:
        hdr += f" {'nccl us':>9} {'nccl busbw':>10} {'rc/nccl':>8}"
    print(f"# channels: {channels}")
    print(hdr + "   (GB/s)")
    for r in rows:
        alg = r["size"] / r["ringcomm_s"] / 1e9
        ok = "y" if r["ok"] else "N"
        line = f"{fmt_size(r['size']):>8} {r['ringcomm_s'] * 1e6:11.1f} {alg:9.2f} {alg * bus:9.2f} {ok:>3}"
        r["ringcomm_busbw"] = alg * bus
        if peer:
            nalg = r["size"] / r["nccl_s"] / 1e9
            r["nccl_busbw"] = nalg * bus
            line += f" {r['nccl_s'] * 1e6:9.1f} {nalg * bus:10.2f} {alg / nalg:8.2f}"
        print(line)
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", type=size_arg, default=size_arg("1M"))
    p.add_argument("-e", type=size_arg, default=size_arg("256M"))
    p.add_argument("-f", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--world", type=int, default=0, help="ranks for the NCCL comparison (default: all GPUs)")
    p.add_argument("--procs-per-gpu", type=int, default=2, help="ranks per GPU for the shared-GPU run (0: skip)")
    p.add_argument("--no-kernels", action="store_true", help="skip the reduce-kernel vs copy table")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", default="", help="write the rows here")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)

    import ringcomm.cuda
    if not ringcomm.cuda.is_available():
        print(f"SKIP: CUDA unavailable: {ringcomm.cuda.unavailable_reason()}")
        return 0
    from ringcomm import _C_cuda
    st = _C_cuda.runtime_status()
    print(f"ringcomm CUDA: {st['device_count']} device(s), runtime {st['runtime_version']}, driver "
          f"{st['driver_version']}, compiled for {_C_cuda.COMPILED_ARCHS}")
    rows = [] if args.no_kernels else bench_kernels(args)
    try:
        import torch
    except ImportError:
        print("SKIP all_reduce benchmarks: torch is not installed")
        torch = None
    if torch is not None and torch.cuda.is_available():
        n = torch.cuda.device_count()
        world = args.world or n
        if n >= 2 and world >= 2:
            rows += bench_all_reduce(args, min(world, n), 1)
        else:
            print(f"\n# all_reduce vs NCCL: skipped ({n} GPU visible; NCCL needs one GPU per rank)")
        if args.procs_per_gpu >= 2:
            rows += bench_all_reduce(args, args.procs_per_gpu * max(1, min(n, 2)), args.procs_per_gpu)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
