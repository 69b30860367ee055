"""Pipeline parallelism over ``torch.distributed`` point-to-point calls (``isend`` / ``irecv``).

    from ringcomm.training.pp import Pipeline
    pipe = Pipeline([model[:2], model[2:]], schedule="1f1b", microbatches=8, loss_fn=F.cross_entropy)
    loss = pipe.step(x, y)          # forward + backward of one batch; then opt.step() as usual

Rank ``s`` of the pipeline group runs stage ``s`` (``stages[s]``; the other stages' modules are
not kept). One :meth:`Pipeline.step` splits the batch into ``m`` micro-batches along dimension 0
(``torch.tensor_split``: sizes may differ by one), runs every micro-batch's forward and backward
through the stages in the order of the schedule, and leaves the gradients accumulated in the stage
module's parameters. The loss lives on the last stage: micro-batch ``k``'s loss is weighted by
``n_k / N``, so for a mean-reduced ``loss_fn`` the gradients are those of the whole batch's loss.

Schedules (:func:`schedule`), per stage, as a list of ``("F", k)`` / ``("B", k)``:

* ``"gpipe"``: all ``m`` forwards, then all ``m`` backwards. Holds the activations of ``m``
  micro-batches.
* ``"1f1b"``: ``min(p - s - 1, m)`` warm-up forwards, then one forward and one backward
  alternately, then the remaining backwards. Holds at most ``p - s`` micro-batches' activations.

Both idle each stage for ``(p - 1) / (m + p - 1)`` of the step when every stage's forward and
backward take the same time (seed 001's bubble).

Messages between two stages: a header (int64: dtype code, number of dimensions, the sizes) then
the data, matched in the order they are issued (tag 0). Activations go to stage ``s + 1`` after a
forward, the gradient of a stage's input goes to stage ``s - 1`` after a backward; sends are
asynchronous and completed at the end of the step (the sent tensors are kept alive until then),
receives are waited on where their data is needed.

Measurement (``Pipeline.stats`` after each step, this stage): ``busy_s`` is the time in the
stage's forward, loss and backward computation; ``wall_s`` the step from a barrier at its start to
a barrier at its end (``measure=True``, default), ``idle_s = wall_s - busy_s`` (waiting for a
neighbour, messaging, the end-of-step wait), ``bubble = idle_s / wall_s``; ``peak_inflight`` the
most micro-batches whose activations were alive at once; ``peak_saved_bytes`` the peak bytes held
by autograd for backward (unique storages; parameters and the caller's inputs and targets, of
which the micro-batches are views, excluded).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from .saved_tensors import SavedTensorMeter, _storage

__all__ = ["Pipeline", "schedule", "bubble_fraction", "SavedTensorMeter", "SCHEDULES"]

SCHEDULES = ("gpipe", "1f1b")
# Header layout: [dtype code, ndim, size_0, ..., size_{MAX_DIMS-1}] (int64).
MAX_DIMS = 8
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool)


def bubble_fraction(p: int, m: int) -> float:
    """GPipe's (and 1F1B's) idle fraction per stage: ``(p - 1) / (m + p - 1)``."""
    return (p - 1) / (m + p - 1)


def schedule(kind: str, p: int, stage: int, m: int) -> list:
    """The order of stage ``stage``'s operations: ``[("F", k) | ("B", k), ...]``."""
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
    if p < 1 or m < 1 or not 0 <= stage < p:
        raise ValueError(f"need p >= 1, m >= 1, 0 <= stage < p (got p={p}, stage={stage}, m={m})")
    if kind == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    warm = min(p - stage - 1, m)
    ops = [("F", k) for k in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    ops += [("B", k) for k in range(m - warm, m)]
    return ops


class Pipeline:
    """One stage of a pipeline; see the module docstring.

    ``stages``: a list with one module per rank of ``group`` (this rank keeps
    ``stages[rank]``), or this rank's stage module alone. ``loss_fn(output, target)`` runs on
    the last stage. ``measure`` adds a barrier at the start and end of each step so that every
    stage's idle time is measured over the same span.
    """

    def __init__(self, stages, schedule: str = "1f1b", microbatches: int = 1, loss_fn=None,
                 group=None, measure: bool = True):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if int(microbatches) < 1:
            raise ValueError(f"microbatches must be >= 1, got {microbatches}")
        self.group = group
        self.p = dist.get_world_size(group)
        self.stage = dist.get_rank(group)
        if self.stage < 0:
            raise ValueError(f"rank {dist.get_rank()} is not a member of the pipeline group")
        if isinstance(stages, (list, tuple, nn.ModuleList)):
            if len(stages) != self.p:
                raise ValueError(f"{len(stages)} stages for a group of {self.p} ranks")
            stages = stages[self.stage]
        if not isinstance(stages, nn.Module):
            raise TypeError(f"a stage must be an nn.Module, got {type(stages).__name__}")
        self.module = stages
        self.schedule, self.m = schedule, int(microbatches)
        self.is_first, self.is_last = self.stage == 0, self.stage == self.p - 1
        if self.is_last and loss_fn is None:
            raise ValueError("the last stage needs loss_fn(output, target)")
        self.loss_fn = loss_fn
        self.measure = measure
        self.stats: dict = {}

    # ---- messaging --------------------------------------------------------------------------------
    def _peer(self, stage: int) -> int:
        return stage if self.group is None else dist.get_global_rank(self.group, stage)

    def _send(self, t: torch.Tensor, stage: int, pending: list) -> None:
        if t.dim() > MAX_DIMS:
            raise ValueError(f"pipeline messages have at most {MAX_DIMS} dimensions, got {t.dim()}")
        t = t.detach().contiguous()
        header = torch.zeros(2 + MAX_DIMS, dtype=torch.int64)
        header[0] = _DTYPES.index(t.dtype)
        header[1] = t.dim()
        header[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        dst = self._peer(stage)
        # Both tensors stay referenced in ``pending`` until their sends complete.
        pending.append((dist.isend(header, dst=dst, group=self.group), header))
        pending.append((dist.isend(t, dst=dst, group=self.group), t))

    def _recv(self, stage: int) -> torch.Tensor:
        src = self._peer(stage)
        header = torch.empty(2 + MAX_DIMS, dtype=torch.int64)
        dist.irecv(header, src=src, group=self.group).wait()
        dtype, ndim = _DTYPES[int(header[0])], int(header[1])
        out = torch.empty([int(v) for v in header[2:2 + ndim]], dtype=dtype)
        dist.irecv(out, src=src, group=self.group).wait()
        return out

    # ---- one step ---------------------------------------------------------------------------------
    def step(self, inputs=None, targets=None):
        """Forward and backward of one batch; returns the batch loss (a 0-d tensor) on the last
        stage, ``None`` elsewhere. ``inputs`` is needed on the first stage only, ``targets`` on
        the last stage only."""
        m = self.m
        if self.is_first:
            if inputs is None:
                raise ValueError("the first stage needs the inputs")
            x_mb = torch.tensor_split(inputs, m)
        if self.is_last:
            if targets is None:
                raise ValueError("the last stage needs the targets")
            y_mb = torch.tensor_split(targets, m)
            total = targets.shape[0]
            if total < m:
                raise ValueError(f"a batch of {total} cannot be split into {m} micro-batches")
        meter = SavedTensorMeter(exclude=self.module)
        # The caller's batch is not the pipeline's memory: micro-batches are views of it.
        for t in (inputs, targets):
            if isinstance(t, torch.Tensor):
                meter.exclude.add(_storage(t)[0])
        held: dict = {}           # micro-batch -> (stage input, output or weighted loss)
        pending: list = []        # (work, tensor) of sends not yet completed
        busy, peak_inflight, loss_sum = 0.0, 0, None
        if self.measure:
            dist.barrier(group=self.group)
        t_start = time.perf_counter()
        for op, k in schedule(self.schedule, self.p, self.stage, m):
            if op == "F":
                if self.is_first:
                    x = x_mb[k]
                else:
                    x = self._recv(self.stage - 1)
                    if x.is_floating_point():
                        x.requires_grad_(True)
                t0 = time.perf_counter()
                with meter:
                    out = self.module(x)
                    if self.is_last:
                        out = self.loss_fn(out, y_mb[k]) * (y_mb[k].shape[0] / total)
                busy += time.perf_counter() - t0
                held[k] = (x, out)
                peak_inflight = max(peak_inflight, len(held))
                if self.is_last:
                    loss_sum = out.detach() if loss_sum is None else loss_sum + out.detach()
                else:
                    self._send(out, self.stage + 1, pending)
            else:
                x, out = held.pop(k)
                grad = None if self.is_last else self._recv(self.stage + 1)
                t0 = time.perf_counter()
                torch.autograd.backward(out, grad)
                busy += time.perf_counter() - t0
                del out
                if not self.is_first:
                    if x.grad is None:
                        raise RuntimeError(f"stage {self.stage}: micro-batch {k}'s input got no "
                                           f"gradient (does the stage use its input?)")
                    self._send(x.grad, self.stage - 1, pending)
        for work, _ in pending:
            work.wait()
        pending.clear()
        if self.measure:
            dist.barrier(group=self.group)
        wall = time.perf_counter() - t_start
        self.stats = dict(stage=self.stage, stages=self.p, microbatches=m,
                          schedule=self.schedule, busy_s=busy, wall_s=wall,
                          idle_s=max(wall - busy, 0.0),
                          bubble=max(wall - busy, 0.0) / wall if wall > 0 else 0.0,
                          expected_bubble=bubble_fraction(self.p, m),
                          peak_inflight=peak_inflight, peak_saved_bytes=meter.peak)
        return loss_sum

    def parameters(self):
        return self.module.parameters()
