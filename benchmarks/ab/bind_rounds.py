"""The order of bound and unbound runs in the binding measurements (bind_tails.py,
arrival_skew.py): ``bind=none`` first in odd rounds, ``core`` first in even ones, so that a slow
stretch of the machine does not favour one side."""
from __future__ import annotations

import sys
from typing import Callable, Iterator, Sequence

BINDS = ("none", "core")


def alternating(rounds: int, binds: Sequence[str] = BINDS) -> Iterator[tuple[int, str]]:
    """(round, bind) in run order: ``binds`` in order in odd rounds, reversed in even ones."""
    for r in range(rounds):
        for bind in (tuple(binds) if r % 2 == 0 else tuple(reversed(binds))):
            yield r, bind


def run_alternating(rounds: int, measure: Callable[[str], dict],
                    binds: Sequence[str] = BINDS) -> dict[str, list[dict]]:
    """{bind: [...]} for each of ``binds``: ``measure(bind)`` per round, in the alternating order."""
    runs: dict[str, list[dict]] = {b: [] for b in binds}
    for r, bind in alternating(rounds, binds):
        runs[bind].append(measure(bind))
        print(f"# round {r + 1} bind {bind} done", file=sys.stderr)
    return runs
