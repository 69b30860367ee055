"""Process-wide state of the ringcomm torch backend: issue hooks (tests, tracing), the live
process groups, shut down at interpreter exit, and ``ringcomm.torch.all_reduce_``'s direct calls."""
from __future__ import annotations

import atexit
from typing import Callable

__all__ = ["add_issue_hook", "remove_issue_hook", "issue_hooks", "live_groups", "direct_calls",
           "forget_direct_calls"]

# ---- issue hooks (tests, tracing) -----------------------------------------------------------------
issue_hooks: list[Callable[[str, str, int, float], None]] = []


def add_issue_hook(fn: Callable[[str, str, int, float], None]) -> None:
    """Call ``fn(op, group_name, seq, time.perf_counter())`` whenever a collective is issued."""
    issue_hooks.append(fn)
    _refresh_groups()


def remove_issue_hook(fn: Callable[[str, str, int, float], None]) -> None:
    issue_hooks.remove(fn)
    _refresh_groups()


def _refresh_groups() -> None:
    # The trampoline's C++ allreduce fast path bypasses the hooks: it is on only while there are none.
    for g in list(live_groups):
        refresh = getattr(g, "_refresh_fast", None)
        if refresh is not None:
            refresh()


# ---- live groups, shut down at exit -----------------------------------------------------------------
# Strong references: torch holds a per-device Backend from C++ only, and the trampoline finds the
# Python methods on this object, so it must live until shutdown() removes it.
live_groups: set = set()


@atexit.register
def _shutdown_all_at_exit() -> None:
    for pg in list(live_groups):
        try:
            pg.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


# ---- ringcomm.torch.all_reduce_'s direct calls (ops.py) ----------------------------------------------
# A process group (None: the default group) -> the direct call of its ringcomm c10d backend
# (``backend._direct_all_reduce()``: ``call(tensor, op_code) -> bool``, whose ``owner`` is the
# backend), learnt on the group's first call; the backend's shutdown() removes its entries, so a
# group torch destroyed is not held here.
direct_calls: dict = {}


def forget_direct_calls(backend) -> None:
    for key, call in list(direct_calls.items()):
        if call.owner is backend:
            direct_calls.pop(key, None)
