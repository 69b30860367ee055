"""One collective on float32 numpy buffers, with what every rank must find in its output: the
cases of the probes that time calls one at a time (``--trace``'s table, benchmarks/probes/knob_ab.py).

``count`` is the full buffer's elements (a multiple of the world size). Rank r's input ``x`` is
base + r for all_gather and all_to_all and base elsewhere (a broadcast's non-root: zeros), base
repeating 1..7. all_reduce, reduce (root 0) and broadcast (root 0) work in place on ``x``;
all_gather, reduce_scatter and all_to_all write ``y`` (the size being the input's).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np

IN_PLACE = ("all_reduce", "reduce", "broadcast")
OPS = IN_PLACE + ("all_gather", "reduce_scatter", "all_to_all")


class CheckedCall:
    def __init__(self, op: str, count: int, rank: int, world: int):
        if op not in OPS:
            raise ValueError(f"no checked case for {op!r} (one of {', '.join(OPS)})")
        self.op, self.rank = op, rank
        base = self.base = (np.arange(count) % 7 + 1).astype(np.float32)
        blk = count // world
        self.x = np.empty(count, dtype=np.float32)
        self.y = None if op in IN_PLACE else np.empty(
            {"all_gather": count * world, "reduce_scatter": blk}.get(op, count), dtype=np.float32)
        self.want: np.ndarray | None
        if op == "all_reduce" or (op == "reduce" and rank == 0):
            self.want = base * world
        elif op == "reduce":
            self.want = None   # a non-root's buffer is not written
        elif op == "broadcast":
            self.want = base
        elif op == "all_gather":
            self.want = np.concatenate([base + p for p in range(world)])
        elif op == "reduce_scatter":
            self.want = (base * world)[rank * blk:(rank + 1) * blk]
        else:
            # Rank p sends base + p; rank r's block q of the output is rank q's block r.
            self.want = np.concatenate([(base + q)[rank * blk:(rank + 1) * blk] for q in range(world)])

    def fill(self) -> None:
        """The rank's input, written again before every call (in-place calls overwrite it)."""
        if self.op in ("all_gather", "all_to_all"):
            self.x[:] = self.base + self.rank
        else:
            self.x[:] = self.base if (self.op != "broadcast" or self.rank == 0) else 0

    def bound(self, comm: Any) -> Callable[[], Any]:
        """The call on ``comm``, its arguments bound (nothing chosen between the clocks)."""
        x, y = self.x, self.y
        if self.op == "all_reduce":
            return partial(comm.all_reduce, x)
        if self.op in ("reduce", "broadcast"):
            return partial(getattr(comm, self.op), x, root=0)
        return partial(getattr(comm, self.op), y, x)

    def wrong(self) -> int:
        """Elements of the output that differ from what the rank must find."""
        if self.want is None:
            return 0
        return int(np.count_nonzero((self.x if self.y is None else self.y) != self.want))
