"""ringcomm's benchmark harness: ``python -m ringcomm.bench`` (also ``ringcomm-bench``).

nccl-tests-style sweeps (sizes -b..-e by -f, warm-up, at least 20 timed calls and a time budget
per cell, a correctness check per size, algbw/busbw with nccl-tests' bus factors) of ringcomm's
collectives beside torch.distributed gloo, MPI (mpi4py, ``pip install 'ringcomm[bench]'``) and
NCCL, in one run, with this machine's memcpy bandwidth as the ceiling. Each cell reports its count
of timed calls and their spread (min / median / p90 / p99), each library's busbw and a peer's
speedup: measurements only (the judging is benchmarks/report/check_targets.py's). See
``cli.py`` for the phases, ``spec.py`` for what names a measurement, ``harness.py`` for how one
is taken, ``report.py`` for the figures.

Importing this package imports nothing heavy (no torch, no MPI, no extension).
"""
__all__ = ["main"]


def main(argv=None) -> int:
    from .cli import main as _main
    return _main(argv)
