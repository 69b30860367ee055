"""torch.distributed all_reduce (or broadcast, reduce, all_to_all_single) on backend "ringcomm"
beside "gloo" in the same run, the same backend with the c10d trampoline's C++ fast path off, and ringcomm's own API at the
same sizes. Prints a markdown table.

    python benchmarks/probes/torch_backend_bench.py                 # 2 processes, 4 KiB / 1 MiB / 64 MiB
    python benchmarks/probes/torch_backend_bench.py --sizes 4K,256K,1M,16M,64M --world-size 2
    python benchmarks/probes/torch_backend_bench.py --op broadcast --sizes 1K,4K,64K
    python benchmarks/probes/torch_backend_bench.py --op reduce|all_to_all --sizes 1K,4K,16K

Every rank runs, per size, rounds of: the collective on the gloo group, on the ringcomm group
(the trampoline's fast path on, as users get it), on the ringcomm group with the fast path off
(``_set_fast_path(0, 0)``: every call takes the Python half, src/ringcomm/torch/collectives.py),
and ``comm.<op>`` on that group's own ringcomm Communicator (so the overhead column compares the
same communicator with and without torch in between, and the fast-path column what the C++ path
saves per call). Within a round each variant runs for about ``--min-time`` seconds after a
warm-up, with the ranks released together by a barrier; a variant's time per call is the slowest
rank's mean. The table reports, per variant, the best round (the least disturbed by other load on
the machine) and checks each result. float32, SUM, root 0. Bus bandwidth uses nccl-tests'
factors: all_reduce 2(n-1)/n, broadcast and reduce 1, all_to_all (n-1)/n.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    if s and s[-1] in UNITS:
        return int(float(s[:-1]) * UNITS[s[-1]])
    return int(s)


def fmt_size(n: int) -> str:
    for unit, v in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v and n % v == 0:
            return f"{n // v} {unit}"
    return f"{n} B"


def _timed(fn, min_time: float, warmup: int, barrier) -> tuple[float, int]:
    """Seconds per call of fn() and the number of calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    barrier()
    # Estimate how many calls fill min_time, agree on one count (the ranks must make the same
    # number of collective calls), then time exactly that many.
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    return one, max(1, min(100_000, int(min_time / one)))


VARIANTS = ("gloo", "ringcomm", "no_fast_path", "api")


def _worker(rank: int, world: int, store_path: str, op: str, sizes: list, rounds: int,
            min_time: float):
    import torch
    import torch.distributed as dist
    import ringcomm.torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("ringcomm", init_method=f"file://{store_path}", rank=rank,
                            world_size=world)
    rc = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    be = rc._get_backend(torch.device("cpu"))
    comm = be.communicator

    def sync():
        dist.barrier(group=gloo)

    def fast_path(on: bool):
        """The trampoline's C++ fast path on (as the backend keeps it) or off (the Python half)."""
        if on:
            be._refresh_fast()
        else:
            be._set_fast_path(0, 0)
            be._fast_native = False

    results = {}  # (size, variant) -> best seconds per call
    for nbytes in sizes:
        n = nbytes // 4
        x = torch.ones(n, dtype=torch.float32)
        y = torch.zeros(n, dtype=torch.float32)   # all_to_all's output
        res = x
        if op == "broadcast":
            calls = {"gloo": lambda: dist.broadcast(x, src=0, group=gloo),
                     "ringcomm": lambda: dist.broadcast(x, src=0, group=rc),
                     "api": lambda: comm.broadcast(x, root=0)}
            want = torch.full((n,), 1.0)
        elif op == "reduce":
            calls = {"gloo": lambda: dist.reduce(x, dst=0, group=gloo),
                     "ringcomm": lambda: dist.reduce(x, dst=0, group=rc),
                     "api": lambda: comm.reduce(x, root=0)}
            # checked on the root only: gloo may leave other ranks' tensors changed
            want = torch.full((n,), float(sum(range(1, world + 1)))) if rank == 0 else None
        elif op == "all_to_all":
            calls = {"gloo": lambda: dist.all_to_all_single(y, x, group=gloo),
                     "ringcomm": lambda: dist.all_to_all_single(y, x, group=rc),
                     "api": lambda: comm.all_to_all(y, x)}
            want = torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(n // world)
            res = y
        else:
            calls = {"gloo": lambda: dist.all_reduce(x, group=gloo),
                     "ringcomm": lambda: dist.all_reduce(x, group=rc),
                     "api": lambda: comm.all_reduce(x)}
            want = torch.full((n,), float(sum(range(1, world + 1))))
        calls["no_fast_path"] = calls["ringcomm"]
        warm = 20 if nbytes <= (1 << 20) else 3
        for _ in range(rounds):
            for name in VARIANTS:
                fn = calls[name]
                fast_path(name != "no_fast_path")
                x.fill_(0.0)
                _, count = _timed(fn, min_time, warm, sync)
                # every rank must run the same count: take the smallest proposal
                c = torch.tensor([count], dtype=torch.int64)
                dist.all_reduce(c, op=dist.ReduceOp.MIN, group=gloo)
                count = int(c.item())
                x.fill_(0.0)  # zeros stay zero however often they are summed or sent: checked below
                sync()
                t0 = time.perf_counter()
                for _ in range(count):
                    fn()
                dt = (time.perf_counter() - t0) / count
                t = torch.tensor([dt], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
                dt = t.item()
                if x.abs().max().item() != 0.0:
                    raise RuntimeError(f"{name} {op} {nbytes} B: wrong result")
                key = (nbytes, name)
                results[key] = min(results.get(key, float("inf")), dt)
        # one correctness check with real values per size and variant
        for name in VARIANTS:
            fast_path(name != "no_fast_path")
            x.fill_(float(rank + 1))
            calls[name]()
            if want is not None and not torch.equal(res, want):
                raise RuntimeError(f"{name} {op} {nbytes} B: got {res[:4].tolist()}, "
                                   f"want {want[:4].tolist()}")
        fast_path(True)
    dist.destroy_process_group()
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=("all_reduce", "broadcast", "reduce", "all_to_all"), default="all_reduce")
    p.add_argument("--sizes", default="4K,1M,64M", help="comma-separated byte sizes (K/M/G)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="rounds per size; the best is reported")
    p.add_argument("--min-time", type=float, default=0.2, help="seconds per timed measurement")
    p.add_argument("--timeout", type=float, default=900)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    for s in sizes:
        if s % 4:
            p.error(f"size {s} is not a whole number of float32 elements")

    from ringcomm.core.launch import spawn
    with tempfile.TemporaryDirectory(prefix="ringcomm-torch-bench-") as d:
        res = spawn(_worker, args.world_size,
                    (os.path.join(d, "store"), args.op, sizes, args.rounds, args.min_time),
                    timeout=args.timeout)[0]

    n = args.world_size
    bus, factor = {"broadcast": (1.0, "1"), "reduce": (1.0, "1"),
                   "all_to_all": ((n - 1) / n, "(n-1)/n")}.get(args.op, (2 * (n - 1) / n, "2(n-1)/n"))
    print(f"{args.op}, float32, {n} processes, torch.distributed backends vs ringcomm's API "
          f"(best of {args.rounds} rounds; busbw = size x {factor} / time)\n")
    print("| size | gloo | ringcomm backend | speed-up vs gloo | fast path off | fast path saves | "
          "ringcomm API | backend overhead |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        g, r, slow, a = (res[(s, v)] for v in VARIANTS)

        def cell(t):
            return f"{t * 1e6:,.1f} µs ({s * bus / t / 1e9:.2f} GB/s)"

        print(f"| {fmt_size(s)} | {cell(g)} | {cell(r)} | {g / r:.1f}x | {cell(slow)} | "
              f"{(slow - r) * 1e6:,.2f} µs | {cell(a)} | {(r / a - 1) * 100:+.1f}% |")
    sys.stdout.flush()
    return 0

if __name__ == "__main__":
    sys.exit(main())
