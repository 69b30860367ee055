"""A battery of torch.distributed cases run in one spawned group of ranks per world size.

Spawning a rank that imports torch costs seconds here, so a test module registers its cases
(``registry``), runs them ONCE per world size (``battery_results``, on the session's group of ranks
of that size: ``ranks.once``) whose ranks call ``init_world`` then ``run_cases``, and its pytest
tests only look the outcomes up (``battery_test``, ``fail_on_error``). Each rank holds a ringcomm
world group and a gloo group over the same ranks.

After every case all ranks agree on its outcome over gloo (so every rank reports every rank's
error); after a failure the battery goes on on a fresh ringcomm group, since the failed one may
hold a half-done collective. ``RINGCOMM_TEST_CASES=a,b`` runs only those cases (a debugging aid).
"""
from __future__ import annotations

import datetime
import os
import time
import traceback
from typing import Callable

import pytest

import ranks

SKIPPED = "skipped"


def registry() -> tuple[dict, Callable]:
    """``(CASES, case)``: ``@case`` on ``def case_<name>(ctx)`` registers it as ``CASES[name]``."""
    cases: dict = {}

    def case(fn):
        cases[fn.__name__[len("case_"):]] = fn
        return fn
    return cases, case


class Ctx:
    """What a case gets: its rank, the world size, the ringcomm group (replaced after a failed
    case), the gloo group over the same ranks, and the groups' timeout."""

    def __init__(self, rank, ws, rc, gloo, timeout):
        self.rank, self.ws, self.rc, self.gloo, self.timeout = rank, ws, rc, gloo, timeout


def init_world(rank: int, ws: int, d: str, timeout_s: float) -> Ctx:
    """In a rank: the ringcomm default group on a file store in directory ``d``, and a gloo group
    beside it."""
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=timeout_s)
    store_path = os.path.join(d, "store")
    dist.init_process_group("ringcomm", init_method=f"file://{store_path}", rank=rank,
                            world_size=ws, timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    return Ctx(rank, ws, dist.group.WORLD, gloo, timeout)


def run_cases(ctx: Ctx, cases: dict) -> dict:
    """In a rank: ``{name: (error, returned value, seconds)}`` for every case, in order. ``error``
    is None or every failing rank's traceback; a case left out by RINGCOMM_TEST_CASES gets
    ``(None, SKIPPED, 0.0)``."""
    import torch.distributed as dist
    only = [c for c in os.environ.get("RINGCOMM_TEST_CASES", "").split(",") if c]
    results = {}
    for name, fn in cases.items():
        if only and name not in only:
            results[name] = (None, SKIPPED, 0.0)
            continue
        t0 = time.perf_counter()
        value = None
        try:
            value = fn(ctx)
            err = None
        except BaseException:  # noqa: BLE001
            err = f"rank {ctx.rank}:\n{traceback.format_exc()}"
        status = [None] * ctx.ws
        dist.all_gather_object(status, err, group=ctx.gloo)
        errs = [s for s in status if s]
        results[name] = ("\n".join(errs) if errs else None, value, time.perf_counter() - t0)
        if errs:
            ctx.rc = dist.new_group(backend="ringcomm", timeout=ctx.timeout)
    return results


def fail_on_error(res: dict, ws: int, name: str) -> None:
    """Fail the calling test if case ``name`` failed."""
    if res[name] is not None:
        pytest.fail(f"world size {ws}, case {name}:\n{res[name]}")


def battery_entry(rank: int, ws: int, d: str, module: str, case_timeout_s: float) -> dict:
    """In a rank: the ringcomm default group, then every case of ``module``'s ``CASES`` in turn;
    ``{name: error or None}``. Top-level (not a closure) so that a spawned rank can import it."""
    import importlib

    import torch
    import torch.distributed as dist

    import ringcomm.torch  # noqa: F401 - registers the backend
    torch.set_num_threads(1)
    cases = importlib.import_module(module).CASES
    ctx = init_world(rank, ws, d, case_timeout_s)
    results = {name: err for name, (err, _, _) in run_cases(ctx, cases).items()}
    dist.destroy_process_group()
    return results


def battery_results(module: str, cases: dict, ws: int, prefix: str, timeout: float,
                    case_timeout_s: float) -> dict:
    """``{name: error or None}`` for every case of ``module`` at world size ``ws``, from ONE
    group (``battery_entry``) for the session (``ranks.once``: a group that did not start or
    finish fails every test that reads it). Every rank holds every rank's errors (``run_cases``
    agrees on them), so rank 0's suffice."""
    def start():
        per_rank = ranks.run_in_dir(battery_entry, ws, prefix, (module, case_timeout_s),
                                    timeout=timeout)
        return {name: per_rank[0][name] for name in cases}
    return ranks.once(("battery", module, ws), start, f"the world-{ws} battery of {module}")


def battery_test(module: str, cases: dict, world_sizes: list, prefix: str, timeout: float,
                 case_timeout_s: float) -> Callable:
    """A pytest test ``(ws, name)`` over every world size and case of ``module``'s battery (its
    ``CASES``, complete when this is called), failing on the case's error; its timeout covers
    running the battery."""
    @pytest.mark.timeout(timeout + 60)
    @pytest.mark.parametrize("name", list(cases))
    @pytest.mark.parametrize("ws", world_sizes)
    def test(ws, name):
        fail_on_error(battery_results(module, cases, ws, prefix, timeout, case_timeout_s), ws, name)
    return test
