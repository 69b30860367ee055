"""ringcomm's benchmark harness: ``python -m ringcomm.bench`` (also ``ringcomm-bench``).

nccl-tests-style sweeps (sizes -b..-e by -f, warm-up, adaptive timed iterations, a correctness
check per size, algbw/busbw with nccl-tests' bus factors) of ringcomm's collectives beside
torch.distributed gloo, MPI (mpi4py, ``pip install 'ringcomm[bench]'``) and NCCL, in one run,
with this machine's memcpy bandwidth as the ceiling. See ``cli.py`` for the phases,
``harness.py`` for how one measurement is taken, ``report.py`` for the figures.

Importing this package imports nothing heavy (no torch, no MPI, no extension).
"""
__all__ = ["main"]


def main(argv=None) -> int:
    from .cli import main as _main
    return _main(argv)
