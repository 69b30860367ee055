"""One group of 4 spawned ranks per backend runs the cases of both ``test_tp.py`` and
``test_pp.py`` (``test_tp._rank_cases`` then ``test_pp._rank_cases``): each rank that imports
torch costs seconds on these 2 cores, so the two files share one group instead of starting their
own. Results are kept for the session (``ranks.once``), keyed ``"tp/<case>"`` and ``"pp/<case>"``."""
from __future__ import annotations

import traceback

import pytest

import ranks
from ranks import BACKENDS, require_backend, run_ranks

WORLD = 4


def _rank_cases(rank, world_size):
    import test_pp
    import test_tp
    out = {f"tp/{k}": v for k, v in test_tp._rank_cases(rank, world_size).items()}
    out.update({f"pp/{k}": v for k, v in test_pp._rank_cases(rank, world_size).items()})
    return out


def run_cases(cases: dict) -> dict:
    """In a rank: every case's result, or ``{"error": traceback}`` (reported by the test that reads
    that case). A barrier after each case keeps the ranks in step, so that one case's failure
    cannot desynchronise the next."""
    import torch.distributed as dist
    out = {}
    for name, fn in cases.items():
        try:
            out[name] = fn()
        except Exception:  # noqa: BLE001 - reported by the test of that case
            out[name] = {"error": traceback.format_exc()}
        dist.barrier()
    return out


def group_test(fn):
    """A test that reads the group: one id per backend, a timeout that covers starting the group."""
    return pytest.mark.timeout(200)(pytest.mark.parametrize("backend", BACKENDS)(fn))


def case(backend: str, name: str) -> list:
    """Every rank's result of case ``name`` (fails the calling test on a case's error)."""
    require_backend(backend)
    what = f"the {WORLD}-rank {backend} group"
    per_rank = ranks.once(("tp_pp", backend), lambda: run_ranks(_rank_cases, WORLD, backend=backend,
                                                                timeout=240), what)
    return ranks.case_of(per_rank, name, what)
