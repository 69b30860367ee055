"""Bucketed data parallelism written against ``torch.distributed`` calls only.

``BucketedDDP(module)`` keeps one replica of ``module`` per rank and averages the gradients over the
process group, overlapping the averaging with the backward pass:

* **Construction.** Parameters and buffers are broadcast from rank 0 of the group, so every replica
  starts identical. Parameters that require grad are grouped into *buckets* in reverse registration
  order (roughly the order in which backward produces their gradients); the first bucket is capped
  at ``first_bucket_mb`` so that the first all-reduce starts early, the others at
  ``bucket_cap_mb``. A bucket never mixes dtypes or devices; a parameter larger than the cap gets a
  bucket of its own.
* **One flat buffer per bucket, gradients as views.** Each bucket owns one contiguous buffer and
  every parameter's ``.grad`` is a view into it, so autograd accumulates straight into the buffer
  and the all-reduce runs on it in place: there is no concatenation copy before the collective and
  no scatter copy after it. The buckets' buffers are themselves slices, in bucket order, of ONE
  allocation per dtype/device (``flat_buffers``; each slice starts 256-byte aligned, the gaps
  stay zero), so all gradients of the model live in one contiguous buffer. If ``.grad`` was set
  to ``None`` (``optimizer.zero_grad()``), the view is zeroed and re-attached at the next forward
  pass (or, failing that, the freshly produced gradient is copied into the view when it is
  accumulated).
* **Overlap.** A ``register_post_accumulate_grad_hook`` on every parameter marks it ready; when the
  last parameter of a bucket is ready, that bucket's ``dist.all_reduce(buffer, async_op=True)`` is
  issued at once, during backward. Buckets are always issued in bucket order (a bucket that becomes
  ready early waits for its predecessors), so every rank issues the same collectives in the same
  order even if autograd visits parameters in a slightly different order.
* **Synchronisation point (the choice, as torch DDP makes it).** The wait happens automatically at
  the end of ``backward()``: a tensor hook on the module's outputs queues an autograd *final
  callback* (``Variable._execution_engine.queue_callback``) on the outermost backward, and that
  callback waits for every bucket and divides it by the world size. So after ``loss.backward()``
  returns, every ``.grad`` holds the average over ranks and ``optimizer.step()`` can run directly.
  The hook is placed on the outputs (and not queued from a parameter hook) so that the callback
  belongs to the *outer* backward even when parts of the model are recomputed by
  :func:`ringcomm.training.recompute.checkpoint`, whose nested backward would otherwise run the callback
  too early. ``finish_gradient_synchronization()`` does the same explicitly and is idempotent (use
  it when the loss does not flow through the wrapped module's outputs).
* **Unused parameters.** With ``find_unused_parameters=False`` (the default) a parameter that got
  no gradient in a synchronised backward raises ``RuntimeError`` naming the parameter(s). With
  ``True``, the buckets that are still incomplete at the end of backward are issued then (the
  unused parameters contribute what their ``.grad`` views hold: zero after ``zero_grad()``, or what
  earlier ``no_sync()`` steps accumulated), so all ranks issue the same collectives and stay in
  step even if different ranks leave different parameters unused.
* **Gradient accumulation.** Inside ``with ddp.no_sync():`` the forward pass (and the backward that
  follows it) only accumulates into the views; the next forward outside the context synchronises
  the accumulated sum. As in torch DDP, the decision is taken at forward time.

Buffers (e.g. BatchNorm running statistics) are broadcast at construction only.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.utils._pytree import tree_flatten

__all__ = ["BucketedDDP", "Bucket"]

_MB = 1024 * 1024
#: Each bucket's slice of the contiguous gradient buffer starts at a multiple of this many
#: elements (256 B in fp32), so that the collective sees cache-line aligned buffers.
_BUCKET_ALIGN = 64


class Bucket:
    """One bucket: a flat ``buffer`` and the parameters whose ``.grad`` are views into it.

    ``params``/``names`` are in the order their views sit in the buffer; ``offsets[i]`` is the
    element offset of ``params[i]``'s view.
    """

    __slots__ = ("index", "params", "names", "offsets", "buffer", "views", "ready", "pending",
                 "work", "launched")

    def __init__(self, index: int, params: list, names: list, dtype, device,
                 buffer: torch.Tensor | None = None):
        self.index = index
        self.params = params
        self.names = names
        self.offsets = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        # ``buffer``: this bucket's slice of the model's contiguous gradient buffer, if given.
        self.buffer = torch.zeros(total, dtype=dtype, device=device) if buffer is None else buffer
        self.views = [self.buffer[o:o + p.numel()].view(p.shape)
                      for o, p in zip(self.offsets, params)]
        self.ready = [False] * len(params)
        self.pending = len(params)
        self.work = None
        self.launched = False

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.pending = len(self.params)
        self.work = None
        self.launched = False

    def __repr__(self) -> str:
        return (f"Bucket({self.index}, {len(self.params)} params, {self.nbytes} bytes, "
                f"{self.buffer.dtype})")


class BucketedDDP(nn.Module):
    """Data-parallel wrapper with bucketed, overlapped gradient all-reduce (see module docstring).

    Args:
        module: the model replica (identical structure on every rank).
        process_group: the group to average over; ``None`` means the default (current) group, so
            it runs on whatever backend the user initialised (e.g. ``"ringcomm"``).
        bucket_cap_mb: cap of every bucket after the first, in MiB (float allowed).
        first_bucket_mb: cap of the first bucket (the last layers' gradients), in MiB.
        find_unused_parameters: tolerate parameters that receive no gradient (see above).
    """

    def __init__(self, module: nn.Module, process_group=None, bucket_cap_mb: float = 25,
                 first_bucket_mb: float = 1, find_unused_parameters: bool = False):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("BucketedDDP needs an initialised torch.distributed process group "
                               "(call torch.distributed.init_process_group first)")
        if bucket_cap_mb <= 0 or first_bucket_mb <= 0:
            raise ValueError(f"bucket sizes must be > 0 MiB, got bucket_cap_mb={bucket_cap_mb}, "
                             f"first_bucket_mb={first_bucket_mb}")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.bucket_cap_mb = bucket_cap_mb
        self.first_bucket_mb = first_bucket_mb
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True

        self._broadcast_state()

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._names = {id(p): n for n, p in named}
        self.buckets: list[Bucket] = self._build_buckets(named)
        self._where: dict[int, tuple[Bucket, int]] = {}
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self._where[id(p)] = (b, i)
                if p.grad is not None:
                    b.views[i].copy_(p.grad)
                p.grad = b.views[i]
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._grad_ready)
                              for _, p in named]

        # Per-backward state.
        self._sync_this_backward = False   # decided at forward time
        self._active = False               # a synchronised backward is in progress / unfinished
        self._next_bucket = 0              # buckets are issued strictly in this order
        self._finalize_queued = False
        self.buckets_issued_in_backward = 0   # statistics of the last synchronised backward
        self.buckets_issued_at_finalize = 0

    # ------------------------------------------------------------------ construction
    def _src(self) -> int:
        if self.process_group is None:
            return 0
        return dist.get_global_rank(self.process_group, 0)

    @torch.no_grad()
    def _broadcast_state(self) -> None:
        """Broadcast every parameter and buffer from rank 0, coalesced per dtype/device."""
        tensors = [p for p in self.module.parameters()] + [b for b in self.module.buffers()]
        groups: dict = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        cap = max(self.bucket_cap_mb, 1) * _MB   # one-off copies: chunk by at least 1 MiB

        def send(chunk):
            flat = torch.cat([c.detach().reshape(-1) for c in chunk])
            dist.broadcast(flat, src=self._src(), group=self.process_group)
            off = 0
            for c in chunk:
                c.copy_(flat[off:off + c.numel()].view_as(c))
                off += c.numel()

        for ts in groups.values():
            chunk, nbytes = [], 0
            for t in ts:
                size = t.numel() * t.element_size()
                if chunk and nbytes + size > cap:
                    send(chunk)
                    chunk, nbytes = [], 0
                chunk.append(t)
                nbytes += size
            if chunk:
                send(chunk)

    def _build_buckets(self, named) -> list[Bucket]:
        """Group parameters into buckets, then lay every bucket of one dtype/device end to end in
        ONE contiguous buffer (``flat_buffers``), each bucket starting at a multiple of
        ``_BUCKET_ALIGN`` elements; a bucket's buffer is its slice of it."""
        groups = self._group_params(named)
        totals: dict = {}
        starts = []
        for params, _names in groups:
            key = (params[0].dtype, params[0].device)
            start = -(-totals.get(key, 0) // _BUCKET_ALIGN) * _BUCKET_ALIGN
            starts.append(start)
            totals[key] = start + sum(p.numel() for p in params)
        self.flat_buffers = {key: torch.zeros(n, dtype=key[0], device=key[1])
                             for key, n in totals.items()}
        buckets = []
        for (params, names), start in zip(groups, starts):
            flat = self.flat_buffers[(params[0].dtype, params[0].device)]
            n = sum(p.numel() for p in params)
            buckets.append(Bucket(len(buckets), params, names, params[0].dtype, params[0].device,
                                  buffer=flat[start:start + n]))
        return buckets

    def _group_params(self, named) -> list[tuple[list, list]]:
        """(params, names) per bucket, in bucket order (reverse registration order)."""
        buckets: list = []
        cur: list = []
        cur_names: list = []
        cur_bytes = 0
        cap = self.first_bucket_mb * _MB

        def close():
            nonlocal cur, cur_names, cur_bytes, cap
            if cur:
                buckets.append((cur, cur_names))
                cap = self.bucket_cap_mb * _MB
            cur, cur_names, cur_bytes = [], [], 0

        for name, p in reversed(named):
            nbytes = p.numel() * p.element_size()
            if cur and (p.dtype != cur[0].dtype or p.device != cur[0].device
                        or cur_bytes + nbytes > cap):
                close()
            cur.append(p)
            cur_names.append(name)
            cur_bytes += nbytes
        close()
        return buckets

    # ------------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        training = torch.is_grad_enabled()
        if training:
            self._prepare_for_backward()
        out = self.module(*args, **kwargs)
        if training and self._sync_this_backward:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._output_grad_hook)
        return out

    def _prepare_for_backward(self) -> None:
        if self._active:
            # The previous synchronised forward never finished its backward (e.g. a forward whose
            # loss was discarded): drain what it issued so that the collectives stay paired.
            self._wait_issued()
        self._sync_this_backward = self.require_backward_grad_sync
        self._attach_grad_views()
        for b in self.buckets:
            b.reset()
        self._next_bucket = 0
        self._finalize_queued = False
        self._active = self._sync_this_backward
        self.buckets_issued_in_backward = 0
        self.buckets_issued_at_finalize = 0

    @torch.no_grad()
    def _attach_grad_views(self) -> None:
        """Make every ``.grad`` the bucket view again (``zero_grad()`` may have set it to None)."""
        for b in self.buckets:
            missing = [i for i, p in enumerate(b.params) if p.grad is None]
            if len(missing) == len(b.params):
                b.buffer.zero_()
            for i, p in enumerate(b.params):
                g = p.grad
                if g is None:
                    if len(missing) != len(b.params):
                        b.views[i].zero_()
                    p.grad = b.views[i]
                elif g.data_ptr() != b.views[i].data_ptr():
                    b.views[i].copy_(g)
                    p.grad = b.views[i]

    # ------------------------------------------------------------------ backward
    def _output_grad_hook(self, grad):
        self._queue_finalize()
        return None

    def _queue_finalize(self) -> None:
        if not self._finalize_queued:
            self._finalize_queued = True
            Variable._execution_engine.queue_callback(self._finalize_from_autograd)

    def _grad_ready(self, p: torch.Tensor) -> None:
        b, i = self._where[id(p)]
        view = b.views[i]
        if p.grad is None or p.grad.data_ptr() != view.data_ptr():
            # .grad was replaced during this backward (it was None or a foreign tensor when the
            # accumulation happened): fold it into the bucket.
            with torch.no_grad():
                view.copy_(p.grad)
            p.grad = view
        if not self._active:
            return   # no_sync() or a backward without a synchronised forward: accumulate only
        if b.ready[i]:
            if b.launched:
                raise RuntimeError(
                    f"BucketedDDP: parameter '{b.names[i]}' received a second gradient after its "
                    f"bucket was already all-reduced in this backward pass (is it used in "
                    f"several recomputed segments, or is backward run twice on one forward?)")
            return
        b.ready[i] = True
        b.pending -= 1
        if b.pending == 0:
            self._issue_ready_buckets(in_backward=True)

    def _issue_ready_buckets(self, in_backward: bool) -> None:
        buckets = self.buckets
        while self._next_bucket < len(buckets) and buckets[self._next_bucket].pending == 0:
            b = buckets[self._next_bucket]
            b.work = dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, group=self.process_group,
                                     async_op=True)
            b.launched = True
            self._next_bucket += 1
            if in_backward:
                self.buckets_issued_in_backward += 1
            else:
                self.buckets_issued_at_finalize += 1
        if in_backward and self._next_bucket == len(self.buckets):
            # Everything is issued. Normally the output hook has queued the final callback already;
            # if the loss did not flow through our outputs, queue it from here.
            self._queue_finalize()

    def _finalize_from_autograd(self) -> None:
        self.finish_gradient_synchronization()

    def _wait_issued(self) -> None:
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
                b.work = None
        self._active = False

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Issue what is left, wait for every bucket and divide by the world size.

        Runs automatically at the end of a synchronised ``backward()``; calling it again (or after
        a ``no_sync()`` backward) does nothing.
        """
        if not self._active:
            return
        unready = [b.names[i] for b in self.buckets for i in range(len(b.params))
                   if not b.ready[i]]
        if unready and not self.find_unused_parameters:
            self._wait_issued()
            shown = ", ".join(repr(n) for n in unready[:20])
            more = f" (and {len(unready) - 20} more)" if len(unready) > 20 else ""
            raise RuntimeError(
                f"BucketedDDP: {len(unready)} parameter(s) received no gradient in this backward "
                f"pass: {shown}{more}. Their buckets cannot be all-reduced, and the ranks would "
                f"fall out of step. If some parameters are legitimately unused, construct "
                f"BucketedDDP(..., find_unused_parameters=True); otherwise make every parameter "
                f"that requires grad contribute to the loss (or set requires_grad=False).")
        for b in self.buckets[self._next_bucket:]:
            # Unused parameters contribute their current .grad views (zero unless accumulated).
            b.ready = [True] * len(b.params)
            b.pending = 0
        self._issue_ready_buckets(in_backward=False)
        self._wait_issued()
        for b in self.buckets:
            b.buffer.div_(self.world_size)

    # ------------------------------------------------------------------ utilities
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward passes inside this context (and their backward) only accumulate gradients."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def remove_hooks(self) -> None:
        """Detach the gradient hooks from the module's parameters (e.g. before re-wrapping it).
        The ``.grad`` views stay valid tensors."""
        for h in self._hook_handles:
            h.remove()
        self._hook_handles = []

    def bucket_summary(self) -> list[dict]:
        """One dict per bucket: index, parameter names, bytes, dtype."""
        return [{"index": b.index, "names": list(b.names), "bytes": b.nbytes,
                 "dtype": str(b.buffer.dtype)} for b in self.buckets]

    def extra_repr(self) -> str:
        return (f"world_size={self.world_size}, buckets={len(self.buckets)}, "
                f"bucket_cap_mb={self.bucket_cap_mb}, first_bucket_mb={self.first_bucket_mb}, "
                f"find_unused_parameters={self.find_unused_parameters}")
