"""Hierarchical ringcomm vs flat gloo on fake nodes (one machine), all_reduce float32.

    python examples/hier_bench.py                      # 4 ranks as 2 nodes x 2; 64 KiB and 64 MiB
    python examples/hier_bench.py -np 4 --nodes 2 --sizes 65536,67108864 --iters 20

Every rank gets RINGCOMM_NODE_ID from ``ringcomm.hier.fake_nodes_env`` (as the bench harness's
``--nodes K`` does), so ``ringcomm.init`` returns the hierarchical communicator; the flat gloo
group runs over the same processes (``ProcessGroupGloo`` on the same store). A flat ringcomm
communicator (all ranks as one node, shared memory only) is measured too, for reference. Time per
call = median over interleaved repetitions of the slowest rank's mean; busbw = size / time x 2 (n-1) / n.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def _rank(rank, world, nodes, sizes, iters, warmup, reps, store_dir):
    import datetime

    import torch
    import torch.distributed as dist

    import ringcomm
    import ringcomm.hier as hier
    from ringcomm.core.rendezvous import FileStore
    init = dict(rank=rank, world_size=world, init_method="file://" + store_dir, timeout=300)
    os.environ["RINGCOMM_NODE_ID"] = "same-node"
    flat_rc = ringcomm.init(prefix="bench/flat", **init)
    os.environ.update(hier.fake_nodes_env(rank, world, nodes))
    hier_rc = ringcomm.init(prefix="bench/hier", **init)
    store = hier.c10d_store(FileStore(store_dir))   # keep a reference: a Python-side c10d Store
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("bench/gloo", store), rank, world,
                                 datetime.timedelta(seconds=300))
    runners = {
        "ringcomm hierarchical": lambda x: hier_rc.all_reduce(x),
        "gloo flat": lambda x: gloo.allreduce([x]).wait(),
        "ringcomm flat (1 node)": lambda x: flat_rc.all_reduce(x),
    }
    out = {"desc": repr(hier_rc)}
    try:
        for size in sizes:
            n = size // 4
            bufs = {name: torch.full((n,), 1.0) for name in runners}
            for name, fn in runners.items():        # warm-up and a correctness check
                x = bufs[name]
                for _ in range(warmup):
                    fn(x)
                x.fill_(float(rank))
                fn(x)
                out[(name, size, "ok")] = bool(torch.all(x == sum(range(world))))
            k = iters if size <= (1 << 20) else max(2, iters // 10)
            for rep in range(reps):                   # interleaved: load shifts hit all alike
                for name, fn in runners.items():
                    x = bufs[name]
                    hier_rc.barrier()
                    t0 = time.perf_counter()
                    for _ in range(k):
                        fn(x)
                    out.setdefault((name, size), []).append((time.perf_counter() - t0) / k)
    finally:
        gloo.shutdown()
        hier_rc.close()
        flat_rc.close()
    return out


def _fmt_size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-np", type=int, default=4, dest="world")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--sizes", default="65536,67108864")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median reported)")
    return p


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    from ringcomm.core.launch import spawn
    sizes = [int(s) for s in a.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="rc-hier-bench-") as d:
        res = spawn(_rank, a.world, (a.nodes, sizes, a.iters, a.warmup, a.reps, d), timeout=1800)
    names = list(dict.fromkeys(k[0] for k in res[0] if isinstance(k, tuple)))
    n = a.world
    print(f"all_reduce float32, {n} ranks faked as {a.nodes} nodes on one machine "
          f"({os.cpu_count()} cores); {res[0]['desc']}")
    print(f"| size | {' | '.join(names)} | gloo time / hierarchical time |")
    print("|---" * (len(names) + 2) + "|")
    for size in sizes:
        cells, times = [], {}
        for name in names:
            # per repetition the slowest rank; over repetitions the median
            t = statistics.median(max(r[(name, size)][i] for r in res) for i in range(a.reps))
            ok = all(r[(name, size, "ok")] for r in res)
            times[name] = t
            busbw = size / t * 2 * (n - 1) / n / 1e9
            cells.append(f"{t * 1e3:.3f} ms, {busbw:.2f} GB/s{'' if ok else ' WRONG'}")
        ratio = times["gloo flat"] / times["ringcomm hierarchical"]
        print(f"| {_fmt_size(size)} | {' | '.join(cells)} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
