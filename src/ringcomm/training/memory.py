"""Memory and communication-volume formulas for distributed training.

Pure Python (no numpy, no torch, no C extension). Every formula here comes
from the seed documents in ``shared/seeds/`` or from the paper they cite:

* the mixed-precision Adam budget of ZeRO (Rajbhandari et al., 2020):
  2 bytes of fp16 parameters + 2 bytes of fp16 gradients + 12 bytes of fp32
  optimizer state (master weights, momentum, variance) = 16 bytes/parameter
  (seed 000, "The Math: The Training Memory Budget"; seed 001, "Sharding
  the model states");
* the per-device bytes of the ZeRO stages 0-3 (seed 000's stage table and
  Exercise 2, seed 001's 7B-on-8-GPUs example);
* the communication volume of the ZeRO stages relative to plain data
  parallelism (seed 001: stages 1 and 2 cost the same as an all-reduce,
  stage 3 is 1.5 times that);
* transformer activation memory (Korthikanti et al., 2022), which the seeds
  mention only qualitatively (activation checkpointing, gradient
  accumulation storing "activations for one micro batch at a time").

Sizes are in bytes. Integer inputs give exact ``int`` results wherever the
formula has no division; formulas with a ``/ n`` return whatever Python's
true division gives (a ``float``), computed in the order the seeds write
them so that the seeds' printed numbers reproduce exactly.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

__all__ = [
    "PARAM_BYTES",
    "GRAD_BYTES",
    "OPTIMIZER_STATE_BYTES",
    "BYTES_PER_PARAMETER",
    "training_memory_bytes",
    "zero_memory_per_device",
    "stage2_bytes",
    "zero_communication_bytes",
    "activation_memory_bytes",
]

#: fp16 copy of the parameters used in forward/backward (bytes per parameter).
PARAM_BYTES = 2
#: fp16 gradients (bytes per parameter).
GRAD_BYTES = 2
#: Adam's ``K = 12``: fp32 master weights (4) + momentum (4) + variance (4).
OPTIMIZER_STATE_BYTES = 12
#: 2 + 2 + 12 = 16 bytes per parameter.
BYTES_PER_PARAMETER = PARAM_BYTES + GRAD_BYTES + OPTIMIZER_STATE_BYTES

_ZERO_STAGES = (0, 1, 2, 3)


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------

def _nonneg_number(value, name):
    """Return ``value`` as a plain int/float, requiring a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _integer(value, name, minimum):
    """Return ``value`` as an int >= ``minimum`` (integral floats accepted)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if not isinstance(value, numbers.Integral):
        value = float(value)
        if not value.is_integer():
            raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _stage(stage):
    if isinstance(stage, bool) or not isinstance(stage, numbers.Real):
        raise ValueError(f"stage must be one of 0, 1, 2, 3, got {stage!r}")
    if not isinstance(stage, numbers.Integral):
        if not float(stage).is_integer():
            raise ValueError(f"stage must be one of 0, 1, 2, 3, got {stage!r}")
    stage = int(stage)
    if stage not in _ZERO_STAGES:
        raise ValueError(f"stage must be one of 0, 1, 2, 3, got {stage}")
    return stage


def _exact(value: Fraction):
    """An exact Fraction as int when integral, else as float."""
    if value.denominator == 1:
        return int(value)
    return float(value)


# ---------------------------------------------------------------------------
# model-state memory (ZeRO)
# ---------------------------------------------------------------------------

def training_memory_bytes(psi):
    """Bytes of model state for mixed-precision Adam training of ``psi`` parameters.

    The memory model of the ZeRO paper, as seed 000 states it::

        params            2 * psi   (fp16 weights used by forward/backward)
        grads             2 * psi   (fp16 gradients)
        optimizer_states 12 * psi   (fp32 master weights + Adam momentum + variance)
        total            16 * psi

    Activations are not included (see :func:`activation_memory_bytes`).

    >>> mem = training_memory_bytes(7_500_000_000)   # seed 000: 7.5B -> 120 GB
    >>> {k: v / 1e9 for k, v in mem.items()}
    {'params': 15.0, 'grads': 15.0, 'optimizer_states': 90.0, 'total': 120.0}

    Returns a dict with keys ``params``, ``grads``, ``optimizer_states`` and
    ``total`` (in that order), ints for an int ``psi``.
    """
    psi = _nonneg_number(psi, "psi")
    return {
        "params": PARAM_BYTES * psi,
        "grads": GRAD_BYTES * psi,
        "optimizer_states": OPTIMIZER_STATE_BYTES * psi,
        "total": BYTES_PER_PARAMETER * psi,
    }


def zero_memory_per_device(psi, n, stage):
    """Per-device model-state bytes under ZeRO stage ``stage`` on ``n`` devices.

    The stage table of seed 000 / seed 001 (``psi`` parameters, ``n`` devices)::

        stage 0  baseline (nothing partitioned)      16 psi
        stage 1  P_os     (optimizer states)          4 psi + 12 psi / n
        stage 2  P_os+g   (+ gradients)               2 psi + 14 psi / n
        stage 3  P_os+g+p (+ parameters; = FSDP)     16 psi / n

    Seed 001's worked example, 7B parameters on 8 GPUs, gives exactly
    112, 38.5, 26.25 and 14 GB:

    >>> [zero_memory_per_device(7e9, 8, s) / 1e9 for s in range(4)]
    [112.0, 38.5, 26.25, 14.0]

    Stage 0 is an exact int for an int ``psi``; stages 1-3 divide by ``n``
    and return a float (evaluated in the order written above).

    Raises ValueError unless ``psi >= 0``, ``n >= 1`` (an integer) and
    ``stage`` is one of 0, 1, 2, 3.
    """
    psi = _nonneg_number(psi, "psi")
    n = _integer(n, "n", 1)
    stage = _stage(stage)
    if stage == 0:
        return 16 * psi
    if stage == 1:
        return 4 * psi + 12 * psi / n
    if stage == 2:
        return 2 * psi + 14 * psi / n
    return 16 * psi / n


def stage2_bytes(psi, n):
    """Seed 000, Exercise 2: ZeRO stage-2 bytes per device, derived by parts.

    2 bytes of fp16 parameters stay replicated; the 2 bytes of gradients and
    the 12 bytes of optimizer state are partitioned ``n`` ways::

        2 * psi + (2 + 12) * psi / n

    It equals ``zero_memory_per_device(psi, n, 2)`` (seed: ``psi = 1_000_000,
    n = 8`` gives 3750000.0 both ways).
    """
    psi = _nonneg_number(psi, "psi")
    n = _integer(n, "n", 1)
    return PARAM_BYTES * psi + (GRAD_BYTES + OPTIMIZER_STATE_BYTES) * psi / n


def zero_communication_bytes(m, n, stage):
    """Bytes each device sends per training step under ZeRO stage ``stage``.

    ``m`` is the size in bytes of the (16-bit) gradient / parameter array,
    i.e. what plain data parallelism all-reduces; ``n`` the number of devices.

    * stages 0, 1, 2: a ring all-reduce, or its two halves (reduce-scatter of
      the gradients + all-gather of the updated parameters), which move the
      same volume: ``2 (n-1)/n * m``.  Seed 001: "stages 1 and 2 cost no
      more communication than plain data parallelism".
    * stage 3: the parameters are all-gathered twice (forward and backward)
      and the gradients reduce-scattered once: ``3 (n-1)/n * m``, exactly
      1.5 times plain data parallelism (seed 001: "The communication volume
      grows to 1.5 times that of plain data parallelism").

    Each reduce-scatter or all-gather over a ring moves ``(n-1)/n * m``
    bytes per device (Patarasuk & Yuan, 2009).  Returns a float, like
    ``ringcomm.apps.simulate.ring_all_reduce_bytes`` (``2 (n-1) m / n`` for stages
    0-2 is exactly that function's value).
    """
    m = _nonneg_number(m, "m")
    n = _integer(n, "n", 1)
    stage = _stage(stage)
    passes = 3 if stage == 3 else 2
    return passes * (n - 1) * m / n


# ---------------------------------------------------------------------------
# activation memory (Korthikanti et al., 2022)
# ---------------------------------------------------------------------------

_RECOMPUTE_MODES = ("none", "selective", "full")


def activation_memory_bytes(
    seq_len,
    micro_batch_size,
    hidden_size,
    num_layers,
    num_heads,
    *,
    bytes_per_element=2,
    recompute="none",
    tensor_parallel=1,
    sequence_parallel=False,
):
    """Activation bytes a transformer stores for the backward pass.

    Source: Korthikanti et al. (2022), "Reducing Activation Recomputation in
    Large Transformer Models", Section 4 and Table 2.  With ``s`` the
    sequence length, ``b`` the micro-batch size, ``h`` the hidden size,
    ``a`` the number of attention heads, ``L`` the number of layers and
    16-bit activations (``bytes_per_element=2``; dropout masks 1 byte), one
    transformer layer stores::

        recompute="none"       s*b*h * (34 + 5*a*s/h)   bytes
        recompute="selective"  s*b*h * 34                (attention scores,
                                                          softmax, dropout
                                                          recomputed)
        recompute="full"       s*b*h * 2                 (only the layer input
                                                          is checkpointed)

    and the total is ``L`` times that.  The 34 is 11 (attention) + 19 (MLP)
    + 4 (two layer norms); the ``5*a*s/h`` term is the ``5*a*s^2*b`` bytes of
    attention scores, softmax output, its dropout mask and output.

    With tensor parallelism of degree ``t`` (Table 2)::

        no sequence parallel   s*b*h * (10 + 24/t + 5*a*s/(h*t))
        sequence parallel      s*b*h * (34/t + 5*a*s/(h*t))

    (selective recomputation drops the ``5*a*s`` term; full recomputation
    stays ``2*s*b*h`` per layer, as in the paper's table).

    ``bytes_per_element`` other than 2 generalises the paper's element count
    (activations at ``e`` bytes, dropout masks at 1 byte):
    ``34 -> 16e + 2``, ``5 -> 2e + 1``, ``10 -> 4e + 2``, ``24 -> 12e``,
    full recompute ``2 -> e``; with ``e = 2`` this is exactly the paper.

    Gradient accumulation (seed 002) only changes ``micro_batch_size``: the
    activations of one micro-batch are alive at a time, so accumulating over
    ``k`` micro-batches of a batch divides this number by ``k``.

    The seeds give no activation formula of their own, so this paper's is
    used.  Embedding, final layer-norm and output-logit activations are
    neglected, as in the paper's per-layer formula.

    ``recompute`` accepts ``"none"``, ``"selective"``, ``"full"``, or a
    bool (``True`` = full activation checkpointing, ``False`` = none).
    Returns an ``int`` when the byte count is exact (always, for the
    default single-device case), else a ``float``.

    >>> activation_memory_bytes(2048, 1, 12288, 1, 96)   # GPT-3 175B, 1 layer
    2868903936
    """
    s = _integer(seq_len, "seq_len", 1)
    b = _integer(micro_batch_size, "micro_batch_size", 1)
    h = _integer(hidden_size, "hidden_size", 1)
    num_layers = _integer(num_layers, "num_layers", 0)
    a = _integer(num_heads, "num_heads", 1)
    t = _integer(tensor_parallel, "tensor_parallel", 1)
    e = _nonneg_number(bytes_per_element, "bytes_per_element")
    if e == 0:
        raise ValueError("bytes_per_element must be > 0")
    e = Fraction(e)
    if isinstance(recompute, bool):
        recompute = "full" if recompute else "none"
    if recompute not in _RECOMPUTE_MODES:
        raise ValueError(
            f"recompute must be one of {_RECOMPUTE_MODES} or a bool, got {recompute!r}"
        )
    if not isinstance(sequence_parallel, bool):
        raise TypeError("sequence_parallel must be a bool")

    sbh = Fraction(s * b * h)
    if recompute == "full":
        per_layer = sbh * e
    else:
        linear = 16 * e + 2          # 34 for 16-bit activations
        replicated = 4 * e + 2       # 10: layer norms, block inputs, dropout masks
        scores = (2 * e + 1) * a * s / Fraction(h)  # 5*a*s/h
        if sequence_parallel:
            per_elem = linear / t
        else:
            per_elem = replicated + (linear - replicated) / t
        if recompute == "none":
            per_elem += scores / t
        per_layer = sbh * per_elem
    return _exact(per_layer * num_layers)
