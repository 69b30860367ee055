"""The order of bound and unbound runs in the binding measurements (bind_tails.py,
arrival_skew.py): ``bind=none`` first in odd rounds, ``core`` first in even ones, so that a slow
stretch of the machine does not favour one side."""
from __future__ import annotations

import sys
from typing import Callable, Iterator


def alternating(rounds: int) -> Iterator[tuple[int, str]]:
    """(round, bind) in run order."""
    for r in range(rounds):
        for bind in (("none", "core") if r % 2 == 0 else ("core", "none")):
            yield r, bind


def run_alternating(rounds: int, measure: Callable[[str], dict]) -> dict[str, list[dict]]:
    """{"none": [...], "core": [...]}: ``measure(bind)`` per round, in the alternating order."""
    runs: dict[str, list[dict]] = {"none": [], "core": []}
    for r, bind in alternating(rounds):
        runs[bind].append(measure(bind))
        print(f"# round {r + 1} bind {bind} done", file=sys.stderr)
    return runs
