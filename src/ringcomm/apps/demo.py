"""`python -m ringcomm.apps.demo [-np N]`: all-reduce across N local processes and print the result
(the seed's example: workers [1,2,3], [10,20,30], [100,200,300], ... -> their sum)."""
import argparse

import numpy as np

import ringcomm


def _work(comm):
    x = np.array([1, 2, 3], dtype=np.float32) * 10 ** comm.rank
    before = x.tolist()
    comm.all_reduce(x)
    return before, x.tolist()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-np", "--world-size", type=int, default=4)
    return p


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    for rank, (before, after) in enumerate(ringcomm.launch(_work, a.world_size, timeout=120)):
        print(f"rank {rank}: {before} -> all_reduce -> {after}")


if __name__ == "__main__":
    main()
