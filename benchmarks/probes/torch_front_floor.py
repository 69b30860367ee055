"""The cost of torch's collective front against its floor, with no peer to wait for: one process,
a world of one, ``dist.all_reduce`` back to back on a "ringcomm" group and on a group of the
do-nothing backend "ringcomm_null" (``ringcomm.torch.null_backend``), plus
``ringcomm.torch.all_reduce_`` on the ringcomm group. The three take turns in blocks of
``--block`` calls, ``--rounds`` times; per peer the median over blocks of the mean time per call.
What ringcomm's ``dist.all_reduce`` takes above the null backend's is ours: the offer point
(bindings/torch/trampoline.cpp), the GIL released around the entry, the C entry and the
communicator's synchronous call of one rank (its sequence number, its trace record when
RINGCOMM_TRACE is on).

    python benchmarks/probes/torch_front_floor.py                  # 1 KiB float32, 20 rounds of 500
    python benchmarks/probes/torch_front_floor.py --size 64K --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1K", help="bytes of float32 (K/M)")
    p.add_argument("--block", type=int, default=500, help="calls per block")
    p.add_argument("--rounds", type=int, default=20, help="blocks per peer")
    p.add_argument("--json", help="write the per-block figures here")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    from ringcomm.bench.spec import parse_size
    nbytes = parse_size(a.size)
    if nbytes <= 0 or nbytes % 4 or a.block < 1 or a.rounds < 1:
        p.error("--size must be a positive multiple of 4, --block and --rounds >= 1")

    import torch
    import torch.distributed as dist
    import ringcomm.torch
    from ringcomm.torch import null_backend

    torch.set_num_threads(1)
    null_backend.register()
    loadavg = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ringcomm-front-floor-") as d:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(d, 'store')}", rank=0, world_size=1)
        try:
            rc = dist.new_group(backend="ringcomm")
            nullg = dist.new_group(backend=null_backend.NULL_BACKEND_NAME)
            ops = {"ringcomm": lambda x: dist.all_reduce(x, group=rc),
                   "null": lambda x: dist.all_reduce(x, group=nullg),
                   "ringcomm_fn": lambda x: ringcomm.torch.all_reduce_(x, rc)}
            x = torch.ones(nbytes // 4, dtype=torch.float32)
            per = {k: [] for k in ops}
            cpu = {k: [] for k in ops}
            for r in range(-1, a.rounds):            # round -1 warms every peer up
                names = list(ops)
                names = names[r % 3:] + names[:r % 3]
                for name in names:
                    op = ops[name]
                    c0, t0 = time.thread_time(), time.perf_counter()
                    for _ in range(a.block):
                        op(x)
                    t1, c1 = time.perf_counter(), time.thread_time()
                    if r >= 0:
                        per[name].append((t1 - t0) / a.block * 1e6)
                        cpu[name].append((c1 - c0) / a.block * 1e6)
            if not bool(torch.all(x == 1.0)):
                raise RuntimeError(f"a world of one changed the tensor: {x[:4].tolist()}")
        finally:
            dist.destroy_process_group()
    med = {k: float(np.median(v)) for k, v in per.items()}
    print(f"dist.all_reduce of {nbytes} B float32, world of one, back to back, {a.rounds} rounds of "
          f"{a.block} calls per peer (taking turns); load average before "
          f"{' '.join(f'{v:.2f}' for v in loadavg)}\n")
    print("| peer | µs per call: median of blocks | min block | CPU µs per call |")
    print("|---|---|---|---|")
    for k in ops:
        print(f"| {k} | {med[k]:.2f} | {min(per[k]):.2f} | {float(np.median(cpu[k])):.2f} |")
    print(f"\nringcomm's dist.all_reduce above the null backend's: {med['ringcomm'] - med['null']:.2f} µs "
          f"(median of the rounds' differences {float(np.median(np.subtract(per['ringcomm'], per['null']))):.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bytes": nbytes, "block": a.block, "rounds": a.rounds, "loadavg": loadavg,
                       "per_call_us": per, "cpu_us": cpu}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
