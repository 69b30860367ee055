"""Single-process teaching simulations of distributed training.

Every "device" is an ordinary array in this process.  These are the seeds'
worked examples turned into functions (seed 000's ``distributed.py`` API and
seed 001's NumPy simulations), reproduced exactly:

* :func:`ring_all_reduce`, :func:`ring_trace`, :func:`format_ring_trace`,
  :func:`all_reduce_mean`, :func:`ring_all_reduce_bytes` -- the ring
  all-reduce (reduce-scatter then all-gather) and its cost;
* :func:`single_device_gradient`, :func:`data_parallel_gradients`,
  :func:`accumulate` -- data parallelism / gradient accumulation equal the
  one-big-batch gradient;
* :func:`gelu`, :func:`mlp`, :func:`tensor_parallel_mlp` -- Megatron's
  column/row split of the transformer MLP;
* :func:`pipeline_bubble_fraction`, :func:`gpipe_schedule`,
  :func:`format_gpipe_schedule` -- GPipe's fill/drain bubble.

Only numpy is imported at module level; torch is imported lazily, inside the
functions, and only when torch tensors are passed in.  This module never
touches the ringcomm C extension.

Ring convention (shared with the C++ ring schedule): ``N`` workers, each
array cut into ``N`` chunks with ``numpy.array_split`` semantics (the first
``size % N`` chunks are one element longer), worker ``r`` sends to worker
``(r + 1) % N``.  At reduce-scatter step ``s`` (0-based, ``s < N-1``) worker
``r`` sends chunk ``(r - s) % N`` and the receiver adds it into its own copy;
afterwards worker ``r`` owns the fully summed chunk ``(r + 1) % N``.  At
all-gather step ``s`` worker ``r`` sends chunk ``(r + 1 - s) % N`` and the
receiver overwrites its copy.  All sends of a step are snapshotted before any
receive is applied (simultaneous communication).
"""

from __future__ import annotations

import math
import numbers
import sys

import numpy as np

__all__ = [
    "chunk_bounds",
    "ring_all_reduce",
    "all_reduce_mean",
    "ring_trace",
    "format_ring_trace",
    "ring_all_reduce_bytes",
    "single_device_gradient",
    "data_parallel_gradients",
    "accumulate",
    "gelu",
    "mlp",
    "tensor_parallel_mlp",
    "pipeline_bubble_fraction",
    "gpipe_schedule",
    "format_gpipe_schedule",
]


# ---------------------------------------------------------------------------
# helpers: torch detection without importing torch, argument checks
# ---------------------------------------------------------------------------

def _is_torch(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _torch():
    import torch  # lazy: numpy-only users never import torch

    return torch


def _positive_int(value, name, minimum=1):
    """``value`` as an int >= ``minimum``; integral floats (``8.0``) are accepted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, numbers.Integral):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def chunk_bounds(size, n):
    """``(start, stop)`` of each of the ``n`` ring chunks of a ``size``-element array.

    ``numpy.array_split`` semantics: the first ``size % n`` chunks hold
    ``size // n + 1`` elements, the rest ``size // n`` (possibly 0 when
    ``size < n``).

    >>> chunk_bounds(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    size = _positive_int(size, "size", 0)
    n = _positive_int(n, "n", 1)
    q, r = divmod(size, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + q + (1 if i < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


# ---------------------------------------------------------------------------
# the ring all-reduce
# ---------------------------------------------------------------------------

class _Workers:
    """Per-device flat working copies (one common dtype) and how to give them back.

    Accepted per-device values: torch tensors (all of them, then), numpy
    arrays / numpy scalars, (nested) lists or tuples, Python numbers.  Each
    result is returned as the kind that device passed in.
    """

    def __init__(self, tensors):
        if isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__len__"):
            raise TypeError("expected a list of per-device arrays/tensors")
        tensors = list(tensors)
        if not tensors:
            raise ValueError("need at least one device (got an empty list)")
        n_torch = sum(_is_torch(t) for t in tensors)
        if 0 < n_torch < len(tensors):
            raise TypeError("mix of torch tensors and non-torch values; pass one kind")
        self.torch = n_torch == len(tensors)
        if self.torch:
            torch = _torch()
            self.shape = tuple(tensors[0].shape)
            for i, t in enumerate(tensors):
                if tuple(t.shape) != self.shape:
                    raise ValueError(
                        f"all devices must hold the same shape: device 0 has "
                        f"{self.shape}, device {i} has {tuple(t.shape)}")
            dtype = tensors[0].dtype
            for t in tensors[1:]:
                dtype = torch.promote_types(dtype, t.dtype)
            self.kinds = ["torch"] * len(tensors)
            self.bufs = [t.detach().reshape(-1).to(dtype=dtype, copy=True)
                         for t in tensors]
        else:
            arrays, self.kinds = [], []
            for t in tensors:
                if isinstance(t, np.ndarray):
                    kind = "ndarray"
                elif isinstance(t, np.generic):
                    kind = "npscalar"
                elif isinstance(t, (list, tuple)):
                    kind = "list"
                elif isinstance(t, numbers.Number):
                    kind = "scalar"
                else:
                    raise TypeError(
                        f"unsupported per-device value of type {type(t).__name__}")
                a = np.asarray(t)
                if a.dtype == object:
                    raise TypeError("per-device values must be numeric arrays")
                arrays.append(a)
                self.kinds.append(kind)
            self.shape = arrays[0].shape
            for i, a in enumerate(arrays):
                if a.shape != self.shape:
                    raise ValueError(
                        f"all devices must hold the same shape: device 0 has "
                        f"{self.shape}, device {i} has {a.shape}")
            dtype = np.result_type(*arrays)
            self.bufs = [np.array(a, dtype=dtype).reshape(-1) for a in arrays]
        self.n = len(self.bufs)
        self.bounds = chunk_bounds(int(np.prod(self.shape, dtype=np.int64)), self.n)

    def _copy(self, x):
        return x.clone() if self.torch else x.copy()

    def _send(self, payload, dst):
        if self.torch and payload.device != self.bufs[dst].device:
            return payload.to(self.bufs[dst].device)
        return payload

    def steps(self):
        """Run the ring in place on ``self.bufs``, yielding a label after each step."""
        n, bufs, bounds = self.n, self.bufs, self.bounds
        for s in range(n - 1):
            chunks = [(r - s) % n for r in range(n)]
            sent = [self._copy(bufs[r][slice(*bounds[c])]) for r, c in enumerate(chunks)]
            for r, c in enumerate(chunks):
                dst = (r + 1) % n
                lo, hi = bounds[c]
                bufs[dst][lo:hi] += self._send(sent[r], dst)
            yield f"reduce-scatter, step {s + 1}"
        for s in range(n - 1):
            chunks = [(r + 1 - s) % n for r in range(n)]
            sent = [self._copy(bufs[r][slice(*bounds[c])]) for r, c in enumerate(chunks)]
            for r, c in enumerate(chunks):
                dst = (r + 1) % n
                lo, hi = bounds[c]
                bufs[dst][lo:hi] = self._send(sent[r], dst)
            yield f"all-gather, step {s + 1}"

    def run(self):
        for _ in self.steps():
            pass

    def result(self, i, buf=None):
        """Device ``i``'s buffer (or ``buf``) reshaped and returned as its input kind."""
        buf = self.bufs[i] if buf is None else buf
        out = buf.reshape(self.shape)
        kind = self.kinds[i]
        if kind in ("torch", "ndarray"):
            return out
        if kind == "npscalar":
            return out[()]
        return out.tolist()  # list -> nested list, scalar -> Python number

    def state(self, i):
        """Device ``i``'s current buffer as a (nested) Python list."""
        return self.bufs[i].reshape(self.shape).tolist()


def ring_all_reduce(tensors):
    """Sum ``tensors`` (one per device) with a ring all-reduce; one result per device.

    Seed 000's ``ring_all_reduce``: the arrays are cut into ``N`` chunks
    (``numpy.array_split`` semantics, so any size works, even fewer elements
    than devices), then ``N-1`` reduce-scatter steps and ``N-1`` all-gather
    steps pass chunks to the right neighbour (see the module docstring for
    the exact chunk schedule).  Each step's sends are snapshotted before its
    receives are applied, as with truly simultaneous communication.

    Every device ends with the elementwise sum.  Results have the input's
    type per device (torch tensor in -> torch tensor out on the same device;
    numpy -> numpy; list -> list; number -> number) and the common promoted
    dtype.  Inputs are not modified; torch inputs are detached.

    >>> import numpy as np
    >>> out = ring_all_reduce([np.array([1, 2, 3]), np.array([10, 20, 30]),
    ...                        np.array([100, 200, 300])])
    >>> [o.tolist() for o in out]
    [[111, 222, 333], [111, 222, 333], [111, 222, 333]]
    """
    workers = _Workers(tensors)
    workers.run()
    return [workers.result(i) for i in range(workers.n)]


def all_reduce_mean(tensors):
    """Seed 000 Exercise 1: the all-reduce **mean** = ring all-reduce sum / N.

    This is what gradient averaging needs (seed 001: GPU gradients 0.2 and
    0.4 -> both get 0.3).  Integer inputs give floating-point means.
    """
    workers = _Workers(tensors)
    workers.run()
    n = workers.n
    return [workers.result(i, workers.bufs[i] / n) for i in range(n)]


def ring_trace(arrays):
    """State of every worker at the start and after each of the ``2(N-1)`` ring steps.

    Returns a list of ``(label, [state of worker 0, ..., worker N-1])`` rows
    (states as Python lists in the arrays' shape); labels are ``"start"``,
    ``"reduce-scatter, step 1"`` ... ``"reduce-scatter, step N-1"``,
    ``"all-gather, step 1"`` ... ``"all-gather, step N-1"``.  Seed 001's
    three-worker table:

    >>> for label, states in ring_trace([[1, 2, 3], [10, 20, 30], [100, 200, 300]]):
    ...     print(label, states)
    start [[1, 2, 3], [10, 20, 30], [100, 200, 300]]
    reduce-scatter, step 1 [[1, 2, 303], [11, 20, 30], [100, 220, 300]]
    reduce-scatter, step 2 [[1, 222, 303], [11, 20, 333], [111, 220, 300]]
    all-gather, step 1 [[111, 222, 303], [11, 222, 333], [111, 220, 333]]
    all-gather, step 2 [[111, 222, 333], [111, 222, 333], [111, 222, 333]]
    """
    workers = _Workers(arrays)
    snapshot = lambda: [workers.state(i) for i in range(workers.n)]  # noqa: E731
    rows = [("start", snapshot())]
    for label in workers.steps():
        rows.append((label, snapshot()))
    return rows


def _format_table(header, rows):
    widths = [max(len(r[j]) for r in [header] + rows) for j in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
             for r in [header] + rows]
    return "\n".join(lines)


def format_ring_trace(rows):
    """Render :func:`ring_trace` rows as seed 001's table (returns the string).

    >>> print(format_ring_trace(ring_trace([[1, 2, 3], [10, 20, 30], [100, 200, 300]])))
    after                   worker 0         worker 1         worker 2
    start                   [1, 2, 3]        [10, 20, 30]     [100, 200, 300]
    reduce-scatter, step 1  [1, 2, 303]      [11, 20, 30]     [100, 220, 300]
    reduce-scatter, step 2  [1, 222, 303]    [11, 20, 333]    [111, 220, 300]
    all-gather, step 1      [111, 222, 303]  [11, 222, 333]   [111, 220, 333]
    all-gather, step 2      [111, 222, 333]  [111, 222, 333]  [111, 222, 333]
    """
    rows = list(rows)
    if not rows:
        raise ValueError("no rows to format")
    n = len(rows[0][1])
    header = ["after"] + [f"worker {i}" for i in range(n)]
    body = [[str(label)] + [str(s) for s in states] for label, states in rows]
    return _format_table(header, body)


def ring_all_reduce_bytes(M, N):
    """Bytes each device sends in a ring all-reduce of an ``M``-byte array over ``N`` devices.

    ``2 (N-1) / N * M`` (Patarasuk & Yuan, 2009): ``N-1`` reduce-scatter and
    ``N-1`` all-gather steps, each sending one ``M/N`` chunk.  Seed 000:
    ``ring_all_reduce_bytes(4000, 4) == 6000.0``; seed 001: 1.5 times the
    array with 4 workers, 1.97 with 64, never 2.  Returns a float
    (computed as ``2 * (N - 1) * M / N``, one rounding).
    """
    if isinstance(M, bool) or not isinstance(M, numbers.Real):
        raise TypeError(f"M must be a number of bytes, got {M!r}")
    if not math.isfinite(M) or M < 0:
        raise ValueError(f"M must be finite and >= 0, got {M!r}")
    N = _positive_int(N, "N", 1)
    return 2 * (N - 1) * M / N


# ---------------------------------------------------------------------------
# data parallelism: gradients of a linear model under mean squared error
# ---------------------------------------------------------------------------

def _check_linear(W, x, y, where=""):
    ws, xs, ys = tuple(W.shape), tuple(x.shape), tuple(y.shape)
    if len(ws) != 2:
        raise ValueError(f"W must be 2-D (out, in), got shape {ws}")
    if len(xs) != 2 or xs[1] != ws[1]:
        raise ValueError(f"x{where} must have shape (batch, {ws[1]}), got {xs}")
    if len(ys) != 2 or ys != (xs[0], ws[0]):
        raise ValueError(f"y{where} must have shape ({xs[0]}, {ws[0]}), got {ys}")
    if xs[0] == 0:
        raise ValueError(f"x{where} has no samples")


def _use_torch(*objs):
    for o in objs:
        if _is_torch(o):
            return True
        if isinstance(o, (list, tuple)) and any(_is_torch(e) for e in o):
            return True
    return False


def _mse_grad_torch(W, x, y):
    """Seed 000's recipe: autograd of ``((x @ w.T - y) ** 2).mean()`` w.r.t. a copy of W."""
    torch = _torch()
    W = torch.as_tensor(W)
    x = torch.as_tensor(x, dtype=W.dtype, device=W.device)
    y = torch.as_tensor(y, dtype=W.dtype, device=W.device)
    _check_linear(W, x, y)
    w = W.detach().clone().requires_grad_(True)
    loss = ((x @ w.T - y) ** 2).mean()
    return torch.autograd.grad(loss, w)[0]


def _float_dtype(*arrays):
    dt = np.result_type(*arrays)
    return dt if np.issubdtype(dt, np.floating) else np.dtype(np.float64)


def _mse_grad_numpy(W, x, y):
    """Closed form of the same gradient: ``2 / (B * out) * (x W^T - y)^T x``."""
    W, x, y = np.asarray(W), np.asarray(x), np.asarray(y)
    dt = _float_dtype(W, x, y)
    W, x, y = W.astype(dt, copy=False), x.astype(dt, copy=False), y.astype(dt, copy=False)
    _check_linear(W, x, y)
    residual = x @ W.T - y                      # (B, out)
    return (2.0 / residual.size) * (residual.T @ x)


def single_device_gradient(W, x, y):
    """Gradient of the mean squared error of ``y ~ x @ W.T`` w.r.t. ``W`` on one device.

    ``W`` has shape ``(out, in)``, ``x`` ``(B, in)``, ``y`` ``(B, out)``; the
    loss is seed 000's ``((x @ W.T - y) ** 2).mean()`` -- the mean over all
    ``B * out`` elements.  Torch inputs use autograd (as in the seed) and
    return a tensor; numpy / list inputs use the closed form
    ``2 / (B * out) * (x W^T - y)^T x`` and return a numpy array.
    """
    if _use_torch(W, x, y):
        return _mse_grad_torch(W, x, y)
    return _mse_grad_numpy(W, x, y)


def _shard_grads(W, x_shards, y_shards, what):
    x_shards, y_shards = list(x_shards), list(y_shards)
    if not x_shards:
        raise ValueError(f"need at least one {what}")
    if len(x_shards) != len(y_shards):
        raise ValueError(
            f"got {len(x_shards)} x {what}s but {len(y_shards)} y {what}s")
    sizes = [len(x) for x in x_shards]
    if len(set(sizes)) != 1:
        raise ValueError(
            f"uneven {what}s (sample counts {sizes}): each {what}'s loss is a mean over "
            f"its own samples, and the plain average of those per-{what} means (what an "
            f"all-reduce mean computes) equals the mean over the whole batch only when "
            f"every {what} has the same number of samples -- the mean of means is not "
            f"the global mean. Use equal-sized {what}s (or weight each gradient by its "
            f"sample count).")
    if _use_torch(W, x_shards, y_shards):
        grads = [_mse_grad_torch(W, x, y) for x, y in zip(x_shards, y_shards)]
    else:
        grads = [_mse_grad_numpy(W, x, y) for x, y in zip(x_shards, y_shards)]
    return grads


def data_parallel_gradients(W, x_shards, y_shards):
    """Seed 000's data-parallel gradient: per-shard gradients, ring all-reduce, divide by N.

    Device ``i`` computes :func:`single_device_gradient` of its shard
    ``(x_shards[i], y_shards[i])``; the ``N`` gradients are summed with
    :func:`ring_all_reduce` and divided by ``N``.  With equal-sized shards
    this equals ``single_device_gradient(W, concat(x_shards),
    concat(y_shards))`` (to float rounding).  Returns the averaged gradient
    (identical on every device): a torch tensor if any input is a tensor,
    else a numpy array.

    Raises ValueError for uneven shards: the mean of per-shard means is
    not the mean over the whole batch.
    """
    grads = _shard_grads(W, x_shards, y_shards, "shard")
    summed = ring_all_reduce(grads)
    return summed[0] / len(grads)


def accumulate(W, x_micro_batches, y_micro_batches):
    """Seed 000 Exercise 3: gradient accumulation on one device.

    The mean-loss gradient of each micro-batch, computed one after the other
    and summed in a running total, then divided by the number of
    micro-batches.  Only one micro-batch's activations are alive at a time
    (seed 002).  Equals :func:`data_parallel_gradients` over the same shards
    and the single-device gradient of the whole batch; uneven micro-batches
    raise ValueError for the same reason.
    """
    grads = _shard_grads(W, x_micro_batches, y_micro_batches, "micro-batch")
    total = grads[0]
    for g in grads[1:]:
        total = total + g
    return total / len(grads)


# ---------------------------------------------------------------------------
# tensor parallelism: Megatron's MLP split
# ---------------------------------------------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x, approximate="tanh"):
    """GeLU, by default with the tanh approximation the seed's numbers need.

    ``approximate="tanh"`` (default): ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``;
    ``approximate="none"``: the exact ``0.5 x (1 + erf(x / sqrt 2))``.
    Seed 001 quotes GeLU(1) ~ 0.841, GeLU(2) ~ 1.955, 2 GeLU(1) ~ 1.682 and an
    MLP output of (1.682, 2.796): the tanh form gives 0.84119, 1.95460,
    1.68238 and (1.68238, 2.79579), the erf form 1.95450 and 1.68269, which
    would round to 1.954 and 1.683.  Same names as
    ``torch.nn.functional.gelu``; torch tensors are computed with it.
    """
    if approximate not in ("tanh", "none"):
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    if _is_torch(x):
        return _torch().nn.functional.gelu(x, approximate=approximate)
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(x.dtype, copy=False)


def _as_matrices(X, A, B):
    if _use_torch(X, A, B):
        torch = _torch()
        ref = next(t for t in (X, A, B) if _is_torch(t))
        conv = lambda t: torch.as_tensor(t, dtype=ref.dtype, device=ref.device)  # noqa: E731
        X, A, B = conv(X), conv(A), conv(B)
        if not X.is_floating_point():
            X, A, B = X.double(), A.double(), B.double()
    else:
        X, A, B = np.asarray(X), np.asarray(A), np.asarray(B)
        dt = _float_dtype(X, A, B)
        X, A, B = X.astype(dt, copy=False), A.astype(dt, copy=False), B.astype(dt, copy=False)
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError("A and B must be 2-D matrices")
    if X.ndim < 1 or X.shape[-1] != A.shape[0]:
        raise ValueError(f"X's last dimension must be {A.shape[0]}, got shape {tuple(X.shape)}")
    if B.shape[0] != A.shape[1]:
        raise ValueError(f"B must have {A.shape[1]} rows to match A's columns, "
                         f"got shape {tuple(B.shape)}")
    return X, A, B


def mlp(X, A, B, approximate="tanh"):
    """The unsplit transformer MLP ``GeLU(X A) B`` (reference for :func:`tensor_parallel_mlp`)."""
    X, A, B = _as_matrices(X, A, B)
    return gelu(X @ A, approximate) @ B


def tensor_parallel_mlp(X, A, B, n, approximate="tanh", return_partials=False):
    """Megatron-LM's tensor-parallel MLP (seed 001) simulated on ``n`` devices.

    ``A`` (``d x f``) is split by columns into ``n`` contiguous blocks
    ``A_i`` and ``B`` (``f x d_out``) by the matching rows ``B_i``
    (``numpy.array_split`` semantics, so ``f`` need not divide by ``n``).
    Device ``i`` computes its partial output ``GeLU(X A_i) B_i``, which has
    the full output shape; one :func:`ring_all_reduce` adds them up:
    ``Y = sum_i GeLU(X A_i) B_i = GeLU(X A) B``.  ``X`` may be one token
    (1-D) or a batch (``... x d``).

    ``approximate`` selects the GeLU (see :func:`gelu`; default ``"tanh"``,
    which reproduces the seed's numbers).  With ``return_partials=True``
    returns ``(Y, [partial_0, ..., partial_{n-1}])``.
    """
    n = _positive_int(n, "n", 1)
    X, A, B = _as_matrices(X, A, B)
    partials = []
    for lo, hi in chunk_bounds(A.shape[1], n):
        partials.append(gelu(X @ A[:, lo:hi], approximate) @ B[lo:hi, :])
    Y = ring_all_reduce(partials)[0]
    return (Y, partials) if return_partials else Y


# ---------------------------------------------------------------------------
# pipeline parallelism: GPipe
# ---------------------------------------------------------------------------

def pipeline_bubble_fraction(p, m):
    """Fraction of time a stage is idle in a GPipe pipeline: ``(p - 1) / (m + p - 1)``.

    ``p`` stages, ``m`` micro-batches (seed 001).  ``(2, 3) -> 1/4``,
    ``(4, 8) -> 3/11 ~ 27%``, ``(4, 32) -> 3/35 ~ 8.6%``.  The same fraction
    holds for the forward pass, the backward pass and both together, and
    for 1F1B.  (Narayanan et al. write the bubble as ``(p - 1) / m`` of the
    *ideal* time instead.)
    """
    p = _positive_int(p, "p", 1)
    m = _positive_int(m, "m", 1)
    return (p - 1) / (m + p - 1)


def gpipe_schedule(p, m):
    """GPipe's forward-pass slot table: one row per stage, ``m + p - 1`` slots.

    ``rows[stage][slot]`` is the micro-batch that stage works on in that
    slot, or ``None`` when idle: micro-batch ``k`` is at stage ``s`` in slot
    ``s + k``.  Seed 001, ``p = 2, m = 3``::

        stage 0:  0     1     2     None
        stage 1:  None  0     1     2

    Each stage idles ``p - 1`` of the ``m + p - 1`` slots, so the idle cells
    are :func:`pipeline_bubble_fraction` of the table.
    """
    p = _positive_int(p, "p", 1)
    m = _positive_int(m, "m", 1)
    slots = m + p - 1
    return [[(t - s) if 0 <= t - s < m else None for t in range(slots)]
            for s in range(p)]


def format_gpipe_schedule(rows, idle="·"):
    """Render :func:`gpipe_schedule` as seed 001's table ("·" = idle; returns the string).

    >>> print(format_gpipe_schedule(gpipe_schedule(2, 3)))
    stage    slot 0  slot 1  slot 2  slot 3
    stage 0  0       1       2       ·
    stage 1  ·       0       1       2
    """
    rows = [list(r) for r in rows]
    if not rows:
        raise ValueError("no rows to format")
    header = ["stage"] + [f"slot {t}" for t in range(len(rows[0]))]
    body = [[f"stage {s}"] + [idle if c is None else str(c) for c in row]
            for s, row in enumerate(rows)]
    return _format_table(header, body)
