"""Shared helper for tests that run ``torch.distributed`` ranks.

    from torch_ranks import run_ranks, BACKENDS, require_backend

    def _cases(rank, world_size, n):          # module-level, so the spawned ranks can import it
        ...                                   # torch.distributed is initialised here
        return {...}                          # picklable

    @pytest.mark.timeout(180)
    @pytest.mark.parametrize("backend", BACKENDS)
    def test_x(backend):
        require_backend(backend)
        results = run_ranks(_cases, 2, backend=backend, args=(3,))

``run_ranks`` runs on the session's group of ``world_size`` ranks (``rank_pool``: the first
failure comes back as ``LaunchError`` with the rank's traceback, a timeout reports every rank's
stack), creates a temporary file store, and in every rank runs
``init_process_group(backend, init_method="file://...")`` -> ``fn(rank, world_size, *args)`` ->
``destroy_process_group()``; it returns the results in rank order. The ranks import torch once
for the whole session; a test module still runs many cases per call.

Backend ``"ringcomm"`` needs ``import ringcomm.torch`` to succeed; ``require_backend`` skips the
calling test (with the import error as the reason) when it does not.
"""
from __future__ import annotations

import os

from typing import Any, Callable, Sequence

import shutil
import tempfile

from ringcomm.launch import LaunchError

import rank_pool

__all__ = ["run_ranks", "BACKENDS", "backend_available", "require_backend", "LaunchError"]

BACKENDS = ["gloo", "ringcomm"]


_PROBED: dict = {}


def backend_available(backend: str) -> tuple[bool, str]:
    """(True, "") if ``backend`` can be used for ``init_process_group``, else (False, reason).

    For ``"ringcomm"``: ``import ringcomm.torch`` must succeed, and (checked once per session, in
    this process) a one-rank process group on it must initialise, so that a half-landed backend
    skips with its error instead of failing every spawned rank.
    """
    if backend != "ringcomm":
        return True, ""
    if backend in _PROBED:
        return _PROBED[backend]
    try:
        import ringcomm.torch  # noqa: F401  (registers the "ringcomm" backend)
    except Exception as e:  # noqa: BLE001 - any import failure means "not available yet"
        result = (False, f"ringcomm torch backend not importable: {type(e).__name__}: {e}")
    else:
        result = _probe_one_rank(backend)
    _PROBED[backend] = result
    return result


def _probe_one_rank(backend: str) -> tuple[bool, str]:
    import torch.distributed as dist
    if dist.is_initialized():
        return True, ""
    try:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    except Exception as e:  # noqa: BLE001
        return False, (f"ringcomm torch backend imports but cannot create a process group: "
                       f"{type(e).__name__}: {e}")
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return True, ""


def require_backend(backend: str) -> None:
    """Skip the calling pytest test if ``backend`` is not available."""
    ok, reason = backend_available(backend)
    if not ok:
        import pytest
        pytest.skip(reason)


def _rank_entry(rank: int, world_size: int, fn: Callable, backend: str, store_path: str,
                args: tuple, num_threads: int | None) -> Any:
    import torch
    import torch.distributed as dist
    if num_threads:
        torch.set_num_threads(num_threads)
    if backend == "ringcomm":
        import ringcomm.torch  # noqa: F401
    dist.init_process_group(backend, init_method="file://" + store_path, rank=rank,
                            world_size=world_size)
    try:
        return fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, backend: str = "gloo",
              args: Sequence[Any] = (), timeout: float = 180, env: dict | None = None,
              num_threads: int | None = 1) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks with torch.distributed
    initialised on ``backend``; return the results in rank order (raises ``LaunchError``)."""
    ok, reason = backend_available(backend)
    if not ok:
        raise RuntimeError(reason)
    tmp = tempfile.mkdtemp(prefix="ringcomm-torch-ranks-")
    try:
        return rank_pool.run(_rank_entry, world_size,
                             (fn, backend, os.path.join(tmp, "store"), tuple(args), num_threads),
                             timeout=timeout, env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_on_gloo_and_ringcomm(fn: Callable[..., Any], world_size: int, args_for: Callable[[str], Sequence[Any]],
                             timeout: float = 180) -> dict:
    """{backend: run_ranks(fn, ...)} for gloo and ringcomm, the same code side by side
    (``args_for(backend)`` gives fn's arguments); skips the calling test if either is missing."""
    observed = {}
    for backend in ("gloo", "ringcomm"):
        require_backend(backend)
        observed[backend] = run_ranks(fn, world_size, backend=backend, args=args_for(backend), timeout=timeout)
    return observed
