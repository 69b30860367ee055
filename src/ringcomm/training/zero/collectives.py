"""The collectives ZeRO issues, on one process group, with an exact ``all_reduce``-based
fallback for backends that lack a native reduce-scatter or all-gather."""
from __future__ import annotations

import warnings
from typing import Callable

import torch
import torch.distributed as dist

from ...core.work import WrappedWork
from .knobs import _COLLECTIVES_ENV

# torch >= 2.10 renamed the "into tensor" collectives; the old names warn. Same semantics.
_reduce_scatter_fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _require_dist() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ringcomm.training.zero needs an initialised torch.distributed process group "
                           "(call torch.distributed.init_process_group first)")


class _Work(WrappedWork):
    """A collective in flight: ``wait()`` waits for it and then runs ``finish`` (once). A
    synchronous call is passed ``work=None`` and finishes at once."""

    __slots__ = ("_finish",)

    def __init__(self, work, finish: Callable[[], None] | None = None):
        super().__init__(work)
        self._finish = finish
        if work is None:
            self.wait()

    def _after_wait(self) -> None:
        if self._finish is not None:
            self._finish()


class _Collectives:
    """The four collectives ZeRO needs, on one process group, with ranks and the global rank of
    the group's rank 0. ``reduce_scatter_sum`` and ``all_gather`` try the backend's native call;
    if it raises (and the policy is ``auto``) they switch, for good, to an exact fallback built
    on ``all_reduce`` (a sum with zeros is exact, so the all-gather fallback is bitwise equal)."""

    # What "the backend does not support this call" raises: c10d errors are RuntimeError
    # subclasses; ringcomm.UnsupportedError is a TypeError.
    _CATCH = (RuntimeError, NotImplementedError, TypeError)

    def __init__(self, group, policy: str | None, knob_policy: str):
        """``policy``: the argument collectives=; None takes ``knob_policy`` (RINGCOMM_ZERO_COLLECTIVES)."""
        policy = policy if policy is not None else knob_policy
        if policy not in ("auto", "native", "fallback"):
            raise ValueError(f"collectives policy must be 'auto', 'native' or 'fallback', got "
                             f"{policy!r} (argument collectives= or ${_COLLECTIVES_ENV})")
        self.group = group
        self.policy = policy
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("ringcomm.training.zero: this process is not a member of process_group")
        self.src = dist.get_global_rank(group if group is not None else dist.group.WORLD, 0)
        self.native = {"reduce_scatter": policy != "fallback", "all_gather": policy != "fallback"}
        #: which implementations actually ran, per op ("native" / "fallback"): for tests.
        self.used: dict[str, set] = {"reduce_scatter": set(), "all_gather": set()}

    def _give_up_native(self, op: str, err: BaseException) -> None:
        if self.policy == "native":
            raise err
        backend = dist.get_backend(self.group)
        # stacklevel 4: _give_up_native <- _try_native <- reduce_scatter_sum / all_gather <- caller
        warnings.warn(f"ringcomm.training.zero: backend {backend!r} raised {type(err).__name__}: {err} "
                      f"for {op}; using the all_reduce-based fallback for the rest of this run",
                      RuntimeWarning, stacklevel=4)
        self.native[op] = False

    def _try_native(self, op: str, call) -> _Work | None:
        """``call()``'s work while ``op`` still runs natively; None once it does not (``call``
        raised what the policy falls back on, now or earlier): the caller runs the fallback."""
        if not self.native[op]:
            return None
        try:
            work = call()
        except self._CATCH as e:
            self._give_up_native(op, e)
            return None
        self.used[op].add("native")
        return _Work(work)

    def reduce_scatter_sum(self, out: torch.Tensor, inp: torch.Tensor,
                           async_op: bool = False) -> _Work:
        """``out`` (S elements) = this rank's slice of the SUM of every rank's ``inp`` (N*S).
        The fallback reduces ``inp`` in place."""
        work = self._try_native("reduce_scatter", lambda: _reduce_scatter_fn(
            out, inp, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op))
        return work if work is not None else self.reduce_scatter_sum_fallback(out, inp, async_op)

    def reduce_scatter_sum_fallback(self, out, inp, async_op=False) -> _Work:
        """Fallback: all_reduce(SUM) of the whole input, then keep this rank's slice."""
        self.used["reduce_scatter"].add("fallback")
        lo = self.rank * out.numel()
        work = dist.all_reduce(inp, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op)
        return _Work(work if async_op else None, lambda: out.copy_(inp[lo:lo + out.numel()]))

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = False) -> _Work:
        """``out`` (N*S elements) = the concatenation of every rank's ``inp`` (S) in rank order."""
        work = self._try_native("all_gather", lambda: _all_gather_fn(
            out, inp, group=self.group, async_op=async_op))
        return work if work is not None else self.all_gather_fallback(out, inp, async_op)

    def all_gather_fallback(self, out, inp, async_op=False) -> _Work:
        """Fallback: zeros everywhere but this rank's slice, then all_reduce(SUM): exact."""
        self.used["all_gather"].add("fallback")
        lo = self.rank * inp.numel()
        out.zero_()
        out[lo:lo + inp.numel()].copy_(inp)
        work = dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group, async_op=async_op)
        return _Work(work if async_op else None)

    def all_reduce_sum(self, t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)

    def broadcast(self, t: torch.Tensor) -> None:
        """Broadcast from the group's rank 0."""
        dist.broadcast(t, src=self.src, group=self.group)
