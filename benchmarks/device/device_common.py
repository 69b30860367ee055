"""What the programs of benchmarks/device/ share: sizes as arguments and in tables, the size sweep, the
rank's device, a device sync, and the arguments of a timed sweep over sizes.

The programs run as scripts, so this folder is first on their ``sys.path``; a program loaded some
other way (the tests load them by file) puts the folder there itself before importing this module.
"""
from __future__ import annotations

import argparse


def size_arg(s: str) -> int:
    """'64K', '1M', '256MiB', '4096' -> bytes."""
    t = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


def fmt_size(n: int) -> str:
    """Bytes as the largest whole unit: 1048576 -> '1M', 1536 -> '1536'."""
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


def sizes(b: int, e: int, f: int) -> list:
    """b, b*f, b*f^2, ... up to e."""
    out, s = [], b
    while s <= e:
        out.append(s)
        s *= f
    return out


def sync(torch, dev) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def rank_device(torch, kind: str, rank: int):
    """The device of ``rank`` for ``--device kind``: a GPU each, round robin over the visible ones, made
    current; or the CPU."""
    if kind == "cuda":
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def add_sweep_args(p: argparse.ArgumentParser, *, iters: int, time_per_size: float) -> None:
    """The size sweep (-b, -e, -f), the timed calls per size, the device and the time limits."""
    p.add_argument("-b", type=size_arg, default=size_arg("1K"), help="smallest size (default 1K)")
    p.add_argument("-e", type=size_arg, default=size_arg("256M"), help="largest size (default 256M)")
    p.add_argument("-f", type=int, default=4, help="size factor (default 4)")
    p.add_argument("--iters", type=int, default=iters, help=f"timed calls per size at most (default {iters})")
    p.add_argument("--min-iters", type=int, default=3, help="timed calls per size at least (default 3)")
    p.add_argument("--time-per-size", type=float, default=time_per_size,
                   help=f"seconds of timed calls per size (default {time_per_size})")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--timeout", type=float, default=30, help="the communicator's timeout (s, default 30)")
    p.add_argument("--launch-timeout", type=float, default=600, help="the whole run's limit (s, default 600)")
