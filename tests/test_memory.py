"""Formula, type and validation tests for ringcomm.training.memory.

(The seeds' worked examples themselves are in test_seed_examples.py.)
"""

from fractions import Fraction

import numpy as np
import pytest

from ringcomm.training.memory import (
    BYTES_PER_PARAMETER,
    GRAD_BYTES,
    OPTIMIZER_STATE_BYTES,
    PARAM_BYTES,
    activation_memory_bytes,
    stage2_bytes,
    training_memory_bytes,
    zero_communication_bytes,
    zero_memory_per_device,
)
from ringcomm.apps.simulate import ring_all_reduce_bytes


# ---------------------------------------------------------------------------
# training_memory_bytes
# ---------------------------------------------------------------------------

def test_constants_are_the_2_2_12_budget():
    # seed 000 / 001: 2 (fp16 params) + 2 (fp16 grads) + 12 (fp32 master, momentum, variance)
    assert (PARAM_BYTES, GRAD_BYTES, OPTIMIZER_STATE_BYTES, BYTES_PER_PARAMETER) == (2, 2, 12, 16)


@pytest.mark.parametrize("psi", [0, 1, 3, 1_000_000, 7_000_000_000, 175 * 10**9])
def test_training_memory_bytes_exact_ints(psi):
    mem = training_memory_bytes(psi)
    assert mem == {"params": 2 * psi, "grads": 2 * psi,
                   "optimizer_states": 12 * psi, "total": 16 * psi}
    assert all(type(v) is int for v in mem.values())
    assert mem["total"] == mem["params"] + mem["grads"] + mem["optimizer_states"]


def test_training_memory_bytes_accepts_floats_and_numpy():
    assert training_memory_bytes(7.5e9)["total"] == 120e9
    mem = training_memory_bytes(np.int64(1000))
    assert mem["total"] == 16000 and type(mem["total"]) is int


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf")])
def test_training_memory_bytes_rejects_bad_psi(bad):
    with pytest.raises(ValueError):
        training_memory_bytes(bad)


def test_training_memory_bytes_rejects_non_numbers():
    for bad in ("7e9", None, True, [1]):
        with pytest.raises(TypeError):
            training_memory_bytes(bad)


# ---------------------------------------------------------------------------
# zero_memory_per_device / stage2_bytes
# ---------------------------------------------------------------------------

def _zero_by_parts(psi, n, stage):
    """Independent reference: unsharded pieces at full size, sharded ones divided by n."""
    shard = {"params": stage >= 3, "grads": stage >= 2, "optimizer_states": stage >= 1}
    sizes = {"params": 2, "grads": 2, "optimizer_states": 12}
    return sum(Fraction(sizes[k] * psi, n if shard[k] else 1) for k in sizes)


@pytest.mark.parametrize("psi", [0, 1, 7, 1_000_000, 7_000_000_000, 7_500_000_000])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 64, 1024])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_memory_matches_parts(psi, n, stage):
    got = zero_memory_per_device(psi, n, stage)
    assert got == pytest.approx(float(_zero_by_parts(psi, n, stage)), rel=1e-15, abs=0)


def test_zero_memory_single_device_is_baseline():
    for stage in range(4):
        assert zero_memory_per_device(123_456, 1, stage) == 16 * 123_456


def test_zero_memory_monotone_in_stage_and_n():
    psi = 1_000_000
    for n in (2, 4, 8, 64):
        per_stage = [zero_memory_per_device(psi, n, s) for s in range(4)]
        assert per_stage == sorted(per_stage, reverse=True)
        assert len(set(per_stage)) == 4
    for stage in (1, 2, 3):
        per_n = [zero_memory_per_device(psi, n, stage) for n in range(1, 20)]
        assert all(a > b for a, b in zip(per_n, per_n[1:]))


@pytest.mark.parametrize("args", [(-1, 8, 0), (1e9, 0, 1), (1e9, -2, 1), (1e9, 8, 4),
                                  (1e9, 8, -1), (1e9, 8, 1.5), (1e9, 2.5, 1),
                                  (float("nan"), 8, 1), (1e9, 8, "1"), (1e9, 8, None),
                                  (1e9, 8, True)])
def test_zero_memory_validation(args):
    with pytest.raises(ValueError):
        zero_memory_per_device(*args)


def test_zero_memory_accepts_integral_floats_and_numpy_ints():
    assert zero_memory_per_device(7e9, 8.0, 1.0) == 38.5e9
    assert zero_memory_per_device(np.int64(7_000_000_000), np.int64(8), np.int64(3)) == 14e9


def test_stage2_bytes_validation():
    with pytest.raises(ValueError):
        stage2_bytes(-1, 8)
    with pytest.raises(ValueError):
        stage2_bytes(10, 0)


# ---------------------------------------------------------------------------
# zero_communication_bytes
# ---------------------------------------------------------------------------

def test_zero_communication_bytes():
    for M in (0, 1, 4000, 14e9):
        for n in range(1, 12):
            for stage in (0, 1, 2):
                assert zero_communication_bytes(M, n, stage) == ring_all_reduce_bytes(M, n)
            assert zero_communication_bytes(M, n, 3) == pytest.approx(3 * (n - 1) / n * M, rel=1e-15)
    assert zero_communication_bytes(1000, 1, 3) == 0
    with pytest.raises(ValueError):
        zero_communication_bytes(1000, 4, 5)
    with pytest.raises(ValueError):
        zero_communication_bytes(-1, 4, 0)


# ---------------------------------------------------------------------------
# activation_memory_bytes (Korthikanti et al., 2022)
# ---------------------------------------------------------------------------

CONFIGS = [  # (seq_len, micro_batch, hidden, layers, heads)
    (2048, 1, 12288, 96, 96),     # GPT-3 175B
    (2048, 4, 4096, 32, 32),      # 7B-class
    (1024, 8, 768, 12, 12),       # GPT-2 small
    (7, 3, 10, 2, 4),             # tiny, h not divisible nicely
    (1, 1, 1, 1, 1),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_activation_paper_formula_no_parallelism(cfg):
    s, b, h, L, a = cfg
    # Korthikanti et al. 2022, eq. (1): s*b*h*(34 + 5*a*s/h) bytes per layer (16-bit)
    per_layer = Fraction(s * b * h) * (34 + Fraction(5 * a * s, h))
    assert per_layer == 34 * s * b * h + 5 * a * s * s * b       # integral
    got = activation_memory_bytes(s, b, h, L, a)
    assert got == L * (34 * s * b * h + 5 * a * s * s * b)
    assert type(got) is int
    # full recomputation: only the layer input, 2*s*b*h per layer
    assert activation_memory_bytes(s, b, h, L, a, recompute="full") == L * 2 * s * b * h
    assert activation_memory_bytes(s, b, h, L, a, recompute=True) == L * 2 * s * b * h
    assert activation_memory_bytes(s, b, h, L, a, recompute=False) == got
    # selective recomputation: drops the 5*a*s/h attention term
    assert activation_memory_bytes(s, b, h, L, a, recompute="selective") == L * 34 * s * b * h


def test_activation_gpt3_numbers():
    # GPT-3 175B, one layer, one sequence: s*b*h = 25_165_824; 34 + 5*96*2048/12288 = 114
    assert activation_memory_bytes(2048, 1, 12288, 1, 96) == 25_165_824 * 114 == 2_868_903_936
    assert activation_memory_bytes(2048, 1, 12288, 96, 96) == 96 * 2_868_903_936


@pytest.mark.parametrize("cfg", CONFIGS[:3])
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activation_tensor_and_sequence_parallel(cfg, t):
    s, b, h, L, a = cfg
    sbh = Fraction(s * b * h)
    # Korthikanti et al. 2022, Table 2
    tp = sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))
    tp_sp = sbh * (Fraction(34, t) + Fraction(5 * a * s, h * t))
    tp_sel = sbh * (10 + Fraction(24, t))
    tp_sp_sel = sbh * Fraction(34, t)
    kw = dict(tensor_parallel=t)
    assert activation_memory_bytes(s, b, h, L, a, **kw) == pytest.approx(float(L * tp), rel=1e-15)
    assert activation_memory_bytes(s, b, h, L, a, sequence_parallel=True, **kw) == \
        pytest.approx(float(L * tp_sp), rel=1e-15)
    assert activation_memory_bytes(s, b, h, L, a, recompute="selective", **kw) == \
        pytest.approx(float(L * tp_sel), rel=1e-15)
    assert activation_memory_bytes(s, b, h, L, a, recompute="selective", sequence_parallel=True,
                                   **kw) == pytest.approx(float(L * tp_sp_sel), rel=1e-15)
    assert activation_memory_bytes(s, b, h, L, a, recompute="full", **kw) == L * 2 * s * b * h
    if t == 1:  # t = 1 collapses to the single-device formula
        assert activation_memory_bytes(s, b, h, L, a, **kw) == activation_memory_bytes(s, b, h, L, a)


def test_activation_bytes_per_element_generalisation():
    s, b, h, L, a = 128, 2, 64, 3, 4
    sbh, as2b = s * b * h, a * s * s * b
    # e = 2 is the paper; e = 4 (fp32 activations, 1-byte dropout masks): 66 sbh + 9 as^2 b
    assert activation_memory_bytes(s, b, h, L, a, bytes_per_element=2) == L * (34 * sbh + 5 * as2b)
    assert activation_memory_bytes(s, b, h, L, a, bytes_per_element=4) == L * (66 * sbh + 9 * as2b)
    assert activation_memory_bytes(s, b, h, L, a, bytes_per_element=4, recompute="full") == L * 4 * sbh


def test_activation_scales_linearly_with_micro_batch_and_layers():
    base = activation_memory_bytes(512, 1, 1024, 1, 16)
    assert activation_memory_bytes(512, 6, 1024, 1, 16) == 6 * base
    assert activation_memory_bytes(512, 1, 1024, 24, 16) == 24 * base
    assert activation_memory_bytes(512, 1, 1024, 0, 16) == 0
    # quadratic in sequence length through the attention term
    a1 = activation_memory_bytes(512, 1, 1024, 1, 16)
    a2 = activation_memory_bytes(1024, 1, 1024, 1, 16)
    assert a2 - 2 * a1 == 5 * 16 * 1024 * 1024 - 2 * 5 * 16 * 512 * 512


@pytest.mark.parametrize("kwargs", [dict(recompute="some"), dict(tensor_parallel=0),
                                    dict(bytes_per_element=0), dict(bytes_per_element=-2)])
def test_activation_validation_kwargs(kwargs):
    with pytest.raises(ValueError):
        activation_memory_bytes(128, 1, 64, 2, 4, **kwargs)


@pytest.mark.parametrize("args", [(0, 1, 64, 2, 4), (128, 0, 64, 2, 4), (128, 1, 0, 2, 4),
                                  (128, 1, 64, -1, 4), (128, 1, 64, 2, 0), (128.5, 1, 64, 2, 4)])
def test_activation_validation_args(args):
    with pytest.raises(ValueError):
        activation_memory_bytes(*args)
