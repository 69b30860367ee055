"""Communication volume: the bytes each rank moves through each kind of collective.

``CommVolume().install()`` wraps the ``torch.distributed`` collectives (``DistPatch``) and, when
the ``ringcomm`` backend is importable, registers its issue hook (``ringcomm.torch.add_issue_hook``:
called by the backend each time it issues a collective). A wrapped call sets ``_current`` to its
(kind, size) before calling through; the issue hook, which fires synchronously inside that call
on the calling thread, books the size under ``hook`` and clears ``_current``, so each byte counted
under ``hook`` is one the backend actually issued. ``dist`` counts the same calls at the
``torch.distributed`` level, for every backend (gloo has no issue hook).

Per call, ``size`` is the full tensor (nccl-tests' convention: all-reduce the buffer,
reduce-scatter the input, all-gather the output), and ``wire`` the bytes each rank sends in a
ring: all-reduce ``2 (n-1)/n * size``, reduce-scatter and all-gather ``(n-1)/n * size``,
broadcast ``size`` (``ringcomm.training.memory.zero_communication_bytes`` uses the same factors: ZeRO-1/2's
reduce-scatter + all-gather move what one all-reduce moves; ZeRO-3's two all-gathers + one
reduce-scatter 1.5 times that). Only calls made while ``active`` are counted.
"""
from __future__ import annotations

import functools
import threading

from .dist_patch import DistPatch

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "other")

# torch.distributed function -> (kind, which argument holds the full-size tensor(s)).
_CALLS = {
    "all_reduce": ("all_reduce", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "all_gather_into_tensor": ("all_gather", 0),
    "all_gather_single": ("all_gather", 0),
    "_all_gather_base": ("all_gather", 0),
    "all_gather": ("all_gather", 0),
    "broadcast": ("broadcast", 0),
}
# The backend's op names (RingcommProcessGroup._run) -> kind.
_BACKEND_KINDS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "allgather": "all_gather", "all_gather_into_tensor": "all_gather",
    "allgather_coalesced": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "broadcast": "broadcast",
}


def _nbytes(obj) -> int:
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(t) for t in obj)
    return obj.numel() * obj.element_size() if hasattr(obj, "element_size") else 0


def wire_factor(kind: str, n: int) -> float:
    """Bytes each rank sends per byte of the full tensor, in a ring of ``n`` ranks."""
    if n <= 1:
        return 0.0
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_gather": (n - 1) / n, "broadcast": 1.0}.get(kind, 0.0)


def _table() -> dict:
    return {k: {"calls": 0, "size": 0, "wire": 0.0} for k in KINDS}


class CommVolume:
    """Counts collective bytes per kind, at the ``torch.distributed`` level (``dist``) and, on the
    ringcomm backend, as issued by the backend (``hook``). See the module docstring."""

    def __init__(self):
        self.active = False
        self.dist = _table()
        self.hook = _table()
        #: backend issues with no wrapped call around them (e.g. torch DDP's C++ reducer).
        self.hook_unattributed: dict = {}
        #: whether the ringcomm issue hook was registered (stays True after uninstall()).
        self.hook_installed = False
        self._local = threading.local()
        self._patch = DistPatch(self._wrap)
        self._hook_fn = None

    def reset(self) -> None:
        self.dist, self.hook, self.hook_unattributed = _table(), _table(), {}

    def install(self) -> "CommVolume":
        self._patch.install()
        try:
            import ringcomm.torch as rt
            self._hook_fn = self._on_issue
            rt.add_issue_hook(self._hook_fn)
            self.hook_installed = True
        except Exception:  # noqa: BLE001 - no ringcomm backend: the dist-level count only
            self._hook_fn = None
        return self

    def uninstall(self) -> None:
        if self._hook_fn is not None:
            import ringcomm.torch as rt
            rt.remove_issue_hook(self._hook_fn)
            self._hook_fn = None
        self._patch.uninstall()

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.uninstall()

    # -- counting ----------------------------------------------------------------------------
    def _wrap(self, name: str, fn):
        kind, arg = _CALLS.get(name, ("other", None))
        meter = self

        @functools.wraps(fn)
        def counted(*args, **kwargs):
            # Count the outermost call only: reduce_scatter_tensor calls reduce_scatter_single.
            if not meter.active or getattr(meter._local, "depth", 0):
                return fn(*args, **kwargs)
            import torch.distributed as dist
            size = 0
            if arg is not None:
                names = ("tensor", "output", "input") if arg == 0 else ("input", "input_tensor")
                t = args[arg] if len(args) > arg else next(
                    (kwargs[k] for k in names if k in kwargs), None)
                size = _nbytes(t) if t is not None else 0
            n = dist.get_world_size(kwargs.get("group"))
            wire = wire_factor(kind, n) * size
            row = meter.dist[kind]
            row["calls"] += 1
            row["size"] += size
            row["wire"] += wire
            meter._local.current = (kind, size, wire)
            meter._local.depth = 1
            try:
                return fn(*args, **kwargs)
            finally:
                meter._local.current = None
                meter._local.depth = 0
        return counted

    def _on_issue(self, op: str, group_name: str, seq: int, t: float) -> None:
        if not self.active:
            return
        current = getattr(self._local, "current", None)
        kind = _BACKEND_KINDS.get(op, "other")
        if current is None or current[0] != kind:
            self.hook_unattributed[op] = self.hook_unattributed.get(op, 0) + 1
            return
        self._local.current = None
        row = self.hook[kind]
        row["calls"] += 1
        row["size"] += current[1]
        row["wire"] += current[2]

    # -- results -----------------------------------------------------------------------------
    def counts(self) -> dict:
        """{"source": "issue_hook" | "dist", per kind {calls, size, wire}, "dist": ..., ...}:
        the top-level kinds come from the backend's issue hook when it is installed and saw the
        calls, else from the torch.distributed wrappers."""
        use_hook = self.hook_installed and sum(r["calls"] for r in self.hook.values()) > 0
        src = self.hook if use_hook else self.dist
        out = {k: dict(v) for k, v in src.items()}
        out["source"] = "issue_hook" if use_hook else "dist"
        out["dist"] = {k: dict(v) for k, v in self.dist.items()}
        out["hook"] = {k: dict(v) for k, v in self.hook.items()}
        out["hook_unattributed"] = dict(self.hook_unattributed)
        return out
