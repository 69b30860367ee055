"""``python -m ringcomm.torch --build``: build the c10d Backend trampoline ahead of time (see
``extension.py``) and print where it is cached."""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ringcomm.torch",
                                description="ringcomm's torch.distributed backend")
    p.add_argument("--build", action="store_true",
                   help="build (or find cached) the per-device c10d Backend trampoline")
    p.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    args = p.parse_args(argv)
    if not args.build:
        p.print_help()
        return 0
    from . import extension
    t0 = time.perf_counter()
    module = extension.load(verbose=args.verbose)
    print(f"ringcomm c10d trampoline: {module.__file__} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
