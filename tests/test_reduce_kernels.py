"""CPU reduce kernels (csrc/kernels/reduce_cpu.cpp) against numpy references, bit for bit.

Every supported dtype x op is compared with a reference computed the same way in numpy
(fp16: float32 math then numpy's float16 rounding; bf16: float32 math then an RNE rounding
written here), on every compiled instruction-set copy this CPU runs (generic; avx2 and avx512
where it has them), each forced in turn; and a 2-rank all_reduce of every pair with each copy
forced by RINGCOMM_CPU_ISA.
The results must be bit identical: these are deterministic elementwise ops.

Inputs never hold two *different* NaNs at the same index for SUM/PRODUCT/AVG: which NaN payload
a + b returns then is up to the compiler's operand order (IEEE leaves it open), not a contract.
"""
from fractions import Fraction
import functools

import numpy as np
import pytest

from ringcomm._C import _reduce
from ringcomm._C_test import reduce_supported
from ringcomm.core.machine import cpu_flags

# rc::DType / rc::ReduceOp codes (csrc/common/dtype.h; part of the wire format, never renumbered).
F32, F64, F16, BF16, I8, U8, I32, I64, BOOL = range(9)
SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR = range(8)

DT_NAME = {F32: "float32", F64: "float64", F16: "float16", BF16: "bfloat16", I8: "int8",
           U8: "uint8", I32: "int32", I64: "int64", BOOL: "bool"}
OP_NAME = {SUM: "SUM", PROD: "PRODUCT", MIN: "MIN", MAX: "MAX", AVG: "AVG", BAND: "BAND",
           BOR: "BOR", BXOR: "BXOR"}
# numpy storage dtype per code (bfloat16 travels as its uint16 bit pattern).
STORAGE = {F32: np.float32, F64: np.float64, F16: np.float16, BF16: np.uint16, I8: np.int8,
           U8: np.uint8, I32: np.int32, I64: np.int64, BOOL: np.bool_}
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
FLOATS = (F32, F64, F16, BF16)
INTS = (I8, U8, I32, I64)
SIZES = (0, 1, 7, 33, 100, 1000003)
THIRD = 1.0 / 3.0


def expected_supported(dt, op):
    if op in (SUM, PROD):
        return dt != BOOL
    if op in (MIN, MAX):
        return True
    if op == AVG:
        return dt in FLOATS
    return dt in INTS  # BAND, BOR, BXOR


SUPPORTED = [(dt, op) for dt in DT_NAME for op in OP_NAME if expected_supported(dt, op)]
UNSUPPORTED = [(dt, op) for dt in DT_NAME for op in OP_NAME if not expected_supported(dt, op)]


def _isa_available(isa):
    x = np.zeros(4, np.float32)
    try:
        _reduce(x, x, x, F32, SUM, 1.0, isa=isa)
        return True
    except ValueError:
        return False


ISAS = [isa for isa in ("generic", "avx2", "avx512") if _isa_available(isa)]


# ----- references -------------------------------------------------------------------------------

def bf16_round(f32):
    """float32 array -> bfloat16 bits, round to nearest even; NaN keeps sign/top payload, gets quiet bit."""
    u = np.ascontiguousarray(f32, np.float32).view(np.uint32).astype(np.uint64)
    rne = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    qnan = (u >> 16) | 0x40
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, qnan, rne).astype(np.uint16)


def bf16_widen(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


# The 16-bit types' conversions (to float32, from float32 rounding to nearest even); every other
# dtype is computed in its own type.
_HALF_CONVERSIONS = {
    F16: (lambda x: x.astype(np.float32), lambda f: f.astype(np.float16)),
    BF16: (bf16_widen, bf16_round),
}


def widen(dt, x):
    return _HALF_CONVERSIONS[dt][0](x) if dt in _HALF_CONVERSIONS else x


def narrow(dt, f):
    return _HALF_CONVERSIONS[dt][1](f) if dt in _HALF_CONVERSIONS else f


def reference(dt, op, a, b, scale=1.0):
    with np.errstate(all="ignore"):  # overflow to inf / inf - inf are expected here
        return _reference(dt, op, a, b, scale)


def _reference(dt, op, a, b, scale):
    if dt in FLOATS:
        wa, wb = widen(dt, a), widen(dt, b)
        if op in (MIN, MAX):
            # (a < b || isnan(a)) ? a : b on the widened values, picking the ORIGINAL bits.
            better = (wa < wb) if op == MIN else (wa > wb)
            return np.where(better | np.isnan(wa), a, b)
        s = np.float64(scale) if dt == F64 else np.float32(scale)
        if op == SUM or (op == AVG and scale == 1.0):
            r = wa + wb
        elif op == PROD:
            r = wa * wb
        else:
            r = (wa + wb) * s
        return narrow(dt, r)
    if dt == BOOL:
        fn = np.logical_and if op == MIN else np.logical_or
        return fn(a != 0, b != 0).astype(np.uint8)
    return {SUM: np.add, PROD: np.multiply, MIN: np.minimum, MAX: np.maximum,
            BAND: np.bitwise_and, BOR: np.bitwise_or, BXOR: np.bitwise_xor}[op](a, b)


def as_bits(x):
    x = np.ascontiguousarray(x)
    return x.view(BITS[x.dtype.itemsize])


def assert_bits_equal(out, ref, a, b, what=""):
    ob, rb = as_bits(out), as_bits(ref)
    if not np.array_equal(ob, rb):
        bad = np.flatnonzero(ob != rb)
        i = bad[:8]
        raise AssertionError(
            f"{what}: {bad.size} of {ob.size} elements differ; first at {i.tolist()}\n"
            f"  a   bits {as_bits(a)[i].tolist()} = {a[i].tolist()}\n"
            f"  b   bits {as_bits(b)[i].tolist()} = {b[i].tolist()}\n"
            f"  got bits {ob[i].tolist()}\n  ref bits {rb[i].tolist()}")


# ----- inputs -----------------------------------------------------------------------------------

SPECIAL_F = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 1e-40, -1e-40,
             5.960464477539063e-08, 6.103515625e-05, 65504.0, 65520.0, 3.3895313892515355e38, 1e300]


@functools.lru_cache(maxsize=None)
def inputs(dt, n=max(SIZES)):
    """Deterministic (a, b) of length n: random bit patterns, ordinary values and specials."""
    rng = np.random.default_rng(1234 + dt)
    st = STORAGE[dt]
    if dt == BOOL:
        return rng.integers(0, 2, n).astype(np.bool_), rng.integers(0, 2, n).astype(np.bool_)
    if dt in INTS:
        info = np.iinfo(st)
        edge = np.array([info.min, info.min + 1, -1 if info.min else 1, 0, 1, info.max - 1, info.max], st)
        pair = []
        for _ in range(2):
            x = rng.integers(info.min, info.max, n, dtype=st, endpoint=True)
            x[rng.integers(0, n, n // 8)] = rng.choice(edge, n // 8)
            pair.append(x)
        return tuple(pair)
    pair = []
    for _ in range(2):
        with np.errstate(over="ignore"):
            x = _float_input(dt, rng, n)
        pair.append(x)
    a, b = pair
    # Where both are NaN make them the same NaN (see module docstring).
    both = np.isnan(widen(dt, a)) & np.isnan(widen(dt, b))
    as_bits(b)[both] = as_bits(a)[both]
    return a, b


def _float_input(dt, rng, n):
    st = STORAGE[dt]
    if dt == BF16:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
        nice = bf16_round((rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32))
        special = bf16_round(np.array(SPECIAL_F, np.float64).astype(np.float32))
    else:
        ib = BITS[np.dtype(st).itemsize]
        bits = rng.integers(0, np.iinfo(ib).max, n, dtype=ib, endpoint=True).view(st)
        nice = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(st)
        special = np.array(SPECIAL_F, np.float64).astype(st)
    x = np.where(rng.random(n) < 0.5, bits, nice)
    k = n // 16
    x[rng.integers(0, n, k)] = rng.choice(special, k)
    return np.ascontiguousarray(x, st)


def run(dt, op, a, b, scale=1.0, isa="auto", guard=3):
    """_reduce into a fresh dst with poisoned guard elements around it; checks the guards."""
    st = STORAGE[dt] if dt != BOOL else np.uint8
    n = a.size
    buf = np.empty(n + 2 * guard, st)
    as_bits(buf)[:] = np.iinfo(BITS[buf.itemsize]).max // 3  # poison
    poison = as_bits(buf).copy()
    dst = buf[guard:guard + n]  # odd offset: unaligned w.r.t. the vector width
    _reduce(dst, a, b, dt, op, scale, isa=isa)
    assert np.array_equal(as_bits(buf)[:guard], poison[:guard]), "wrote before dst"
    assert np.array_equal(as_bits(buf)[guard + n:], poison[guard + n:]), "wrote past dst"
    return dst


def _id(v):
    dt, op = v
    return f"{DT_NAME[dt]}-{OP_NAME[op]}"


# ----- tests ------------------------------------------------------------------------------------

def test_isas_found():
    assert "generic" in ISAS
    # Every copy this CPU can run is exercised: the tests below cover each one on this machine.
    flags = cpu_flags()
    if {"avx2", "f16c"} <= flags:
        assert "avx2" in ISAS
    if {"avx2", "f16c", "avx512f", "avx512bw", "avx512vl"} <= flags:
        assert "avx512" in ISAS
    else:
        assert "avx512" not in ISAS


def test_unknown_isa_name_rejected():
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="avx512"):
        _reduce(x, x, x, F32, SUM, 1.0, isa="avx1024")


def test_supported_matrix():
    for dt in DT_NAME:
        for op in OP_NAME:
            assert reduce_supported(dt, op) == expected_supported(dt, op), (DT_NAME[dt], OP_NAME[op])
    for dt, op in [(-1, SUM), (9, SUM), (F32, -1), (F32, 8), (100, 100)]:
        assert reduce_supported(dt, op) is False


@pytest.mark.parametrize("dt,op", UNSUPPORTED, ids=[_id(v) for v in UNSUPPORTED])
@pytest.mark.parametrize("n", [0, 5])
def test_unsupported_raises(dt, op, n):
    st = STORAGE[dt]
    x = np.zeros(n, st)
    with pytest.raises(TypeError, match=f"reduce op {OP_NAME[op]} is not supported for dtype {DT_NAME[dt]}"):
        _reduce(x.copy(), x, x, dt, op)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dt,op", SUPPORTED, ids=[_id(v) for v in SUPPORTED])
def test_matches_reference(dt, op, n, isa):
    a, b = (x[:n] for x in inputs(dt))
    scale = THIRD if op == AVG else 1.0
    out = run(dt, op, a, b, scale, isa)
    assert_bits_equal(out, reference(dt, op, a, b, scale), a, b, f"{DT_NAME[dt]} {OP_NAME[op]} n={n} {isa}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("scale", [1.0, THIRD, 0.25, 1.0 / 7.0, -2.0])
def test_avg_scales(dt, scale, isa):
    a, b = (x[:4099] for x in inputs(dt))
    out = run(dt, AVG, a, b, scale, isa)
    assert_bits_equal(out, reference(dt, AVG, a, b, scale), a, b, f"{DT_NAME[dt]} AVG scale={scale}")
    if scale == 1.0:  # AVG with scale 1 is SUM, bit for bit
        assert_bits_equal(out, run(dt, SUM, a, b, 1.0, isa), a, b, "AVG(1) vs SUM")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dt", FLOATS)
def test_avg_nan_scale(dt, isa):
    # A NaN scale whose float payload has all low bits set: bf16 rounding must not carry it
    # into -0 or inf (the NaN path of the RNE rounding).
    import struct
    nan = struct.unpack("<d", (0x7FFFFFFFFFFFFFFF).to_bytes(8, "little"))[0]
    # finite inputs only: with two NaN operands the payload would be the compiler's choice
    x = np.linspace(-3, 3, 37, dtype=np.float32)
    a = bf16_round(x) if dt == BF16 else x.astype(STORAGE[dt])
    b = a[::-1].copy()
    out = run(dt, AVG, a, b, nan, isa)
    assert np.isnan(widen(dt, out)).all()
    assert_bits_equal(out, reference(dt, AVG, a, b, nan), a, b, f"{DT_NAME[dt]} AVG nan scale")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dt,op", SUPPORTED, ids=[_id(v) for v in SUPPORTED])
def test_aliasing(dt, op, isa):
    n = 1003
    a0, b0 = (x[:n].copy() for x in inputs(dt))
    scale = THIRD if op == AVG else 1.0
    ref = reference(dt, op, a0, b0, scale)
    a, b = a0.copy(), b0.copy()
    _reduce(a, a, b, dt, op, scale, isa=isa)  # dst is a
    assert_bits_equal(a, ref, a0, b0, "dst=a")
    a, b = a0.copy(), b0.copy()
    _reduce(b, a, b, dt, op, scale, isa=isa)  # dst is b
    assert_bits_equal(b, ref, a0, b0, "dst=b")
    a = a0.copy()
    _reduce(a, a, a, dt, op, scale, isa=isa)  # all three the same buffer
    assert_bits_equal(a, reference(dt, op, a0, a0, scale), a0, a0, "dst=a=b")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dt", FLOATS)
def test_float_minmax_nan_inf(dt, isa):
    vals = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 1e-45, 65504.0], np.float64)
    a = np.repeat(vals, vals.size)  # every ordered pair, 100 elements: vector body + tail
    b = np.tile(vals, vals.size)
    if dt == BF16:
        a, b = bf16_round(a.astype(np.float32)), bf16_round(b.astype(np.float32))
    else:
        a, b = a.astype(STORAGE[dt]), b.astype(STORAGE[dt])
    wa, wb = widen(dt, a).astype(np.float64), widen(dt, b).astype(np.float64)
    for op, npfn in ((MIN, np.minimum), (MAX, np.maximum)):
        out = run(dt, op, a, b, 1.0, isa)
        assert_bits_equal(out, reference(dt, op, a, b), a, b, f"{DT_NAME[dt]} {OP_NAME[op]}")
        w = widen(dt, out).astype(np.float64)
        # numpy semantics: NaN in either input -> NaN; otherwise numpy's value.
        assert np.array_equal(np.isnan(w), np.isnan(wa) | np.isnan(wb))
        assert np.array_equal(w, npfn(wa, wb), equal_nan=True)
        # and the result is always one of the inputs, bit for bit
        assert np.all((as_bits(out) == as_bits(a)) | (as_bits(out) == as_bits(b)))


@pytest.mark.parametrize("isa", ISAS)
def test_integer_wraparound(isa):
    cases = [
        (I8, SUM, [127, -128, 100], [1, -1, 100], [-128, 127, -56]),
        (I8, PROD, [127, -128, 16], [2, -1, 16], [-2, -128, 0]),
        (U8, SUM, [255, 200, 0], [1, 100, 0], [0, 44, 0]),
        (U8, PROD, [255, 16, 3], [255, 16, 3], [1, 0, 9]),
        (I32, SUM, [2**31 - 1, -2**31], [1, -1], [-2**31, 2**31 - 1]),
        (I32, PROD, [65536, -2**31], [65536, -1], [0, -2**31]),
        (I64, SUM, [2**63 - 1, -2**63], [1, -1], [-2**63, 2**63 - 1]),
        (I64, PROD, [2**32, 3037000500, -2**63], [2**32, 3037000500, -1], [0, -9223372036709301616, -2**63]),
        (U8, MIN, [0, 255], [255, 128], [0, 128]),
        (I8, MAX, [-128, 5], [-1, -5], [-1, 5]),
    ]
    for dt, op, a, b, want in cases:
        st = STORAGE[dt]
        a, b, want = (np.array(v, st) for v in (a, b, want))
        a, b, want = (np.tile(v, 13) for v in (a, b, want))  # vector body and tail
        out = run(dt, op, a, b, 1.0, isa)
        assert_bits_equal(out, want, a, b, f"{DT_NAME[dt]} {OP_NAME[op]}")
        assert_bits_equal(out, reference(dt, op, a, b), a, b, "numpy")


@pytest.mark.parametrize("isa", ISAS)
def test_bool_nonzero_bytes_are_true(isa):
    a = np.tile(np.array([0, 1, 2, 255, 0, 128], np.uint8), 11)
    b = np.tile(np.array([0, 0, 4, 1, 7, 128], np.uint8), 11)
    out = run(BOOL, MIN, a, b, 1.0, isa)
    assert_bits_equal(out, np.tile(np.array([0, 0, 1, 1, 0, 1], np.uint8), 11), a, b, "logical and")
    out = run(BOOL, MAX, a, b, 1.0, isa)
    assert_bits_equal(out, np.tile(np.array([0, 1, 1, 1, 1, 1], np.uint8), 11), a, b, "logical or")


@pytest.mark.parametrize("isa", ISAS)
def test_half_rounding_known_bits(isa):
    # bf16: 1.0 = 0x3F80, ulp 2^-7. 1 + 2^-8 is a tie -> even (0x3F80); 0x3F81 + 2^-8 -> 0x3F82.
    a = np.array([0x3F80, 0x3F81, 0x3F80, 0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x3F80], np.uint16)
    b = np.array([0x3B80, 0x3B80, 0x3B81, 0x7B00, 0xFB00, 0x8001, 0x8001, 0x7FC1], np.uint16)
    # 0x3B81 = 2^-8 (1 + 2^-7): just above the tie -> rounds up. max + big -> inf. subnormals cancel.
    want = np.array([0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFF80, 0x0000, 0x8002, 0x7FC1], np.uint16)
    out = run(BF16, SUM, np.tile(a, 5), np.tile(b, 5), 1.0, isa)
    assert_bits_equal(out, np.tile(want, 5), np.tile(a, 5), np.tile(b, 5), "bf16 sum")
    # fp16: 1.0 = 0x3C00, ulp 2^-10; 2^-11 = 0x1000. 65504 + 16 -> 65520 rounds to inf.
    a = np.array([0x3C00, 0x3C01, 0x7BFF, 0x7BFF, 0x0001, 0x3C00], np.uint16)
    b = np.array([0x1000, 0x1000, 0x4C00, 0x4A00, 0x0001, 0x7E01], np.uint16)
    want = np.array([0x3C00, 0x3C02, 0x7C00, 0x7BFF, 0x0002, 0x7E01], np.uint16)
    a, b, want = (np.tile(v, 5).view(np.float16) for v in (a, b, want))
    out = run(F16, SUM, a, b, 1.0, isa)
    assert_bits_equal(out, want, a, b, "fp16 sum")


def _bf16_exact_rne(x):
    """Independent scalar reference: nearest bfloat16 of float32 x by exact rational arithmetic."""
    u = int(np.float32(x).view(np.uint32))
    lo = u >> 16
    hi = lo + 1
    f = Fraction(float(np.float32(x)))
    flo = Fraction(float(bf16_widen(np.array([lo], np.uint16))[0]))
    if (hi & 0x7FFF) == 0x7F80:  # rounding up goes to inf: treat inf as 2^128 for the midpoint
        fhi = Fraction(2**128) * (-1 if lo & 0x8000 else 1)
    else:
        fhi = Fraction(float(bf16_widen(np.array([hi], np.uint16))[0]))
    dlo, dhi = abs(f - flo), abs(fhi - f)
    return lo if dlo < dhi or (dlo == dhi and lo % 2 == 0) else hi


def test_bf16_reference_rounding_is_rne():
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, 3000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 1 << 16, 500, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    x = np.concatenate([bits, ties, np.array([0x7F7FFFFF, 0x7F7F8000, 0xFF7F8000, 0x00008000, 0x80018000],
                                             np.uint32)]).view(np.float32)
    x = x[~np.isnan(x) & ~np.isinf(x)]
    got = bf16_round(x)
    want = np.array([_bf16_exact_rne(v) for v in x], np.uint16)
    assert np.array_equal(got, want)
    nan = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FFFFFFF], np.uint32).view(np.float32)
    assert bf16_round(nan).tolist() == [0x7FC0, 0xFFC0, 0x7FC0, 0x7FFF]


@pytest.mark.parametrize("isa", ISAS)
def test_all_fp16_bf16_patterns(isa):
    # Every 16-bit pattern against a spread of partners, including every NaN/subnormal.
    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    rng = np.random.default_rng(3)
    for dt in (F16, BF16):
        for op in (SUM, PROD, MIN, MAX, AVG):
            b = rng.integers(0, 1 << 16, a.size, dtype=np.uint32).astype(np.uint16)
            wa, wb = widen(dt, a.view(STORAGE[dt])), widen(dt, b.view(STORAGE[dt]))
            both = np.isnan(wa) & np.isnan(wb)
            b[both] = a[both]
            aa, bb = a.view(STORAGE[dt]), b.view(STORAGE[dt])
            scale = THIRD if op == AVG else 1.0
            out = run(dt, op, aa, bb, scale, isa)
            assert_bits_equal(out, reference(dt, op, aa, bb, scale), aa, bb, f"{DT_NAME[dt]} {OP_NAME[op]}")


def test_bad_arguments():
    a = np.ones(16, np.float32)
    b = np.ones(16, np.float32)
    d = np.empty(16, np.float32)
    with pytest.raises(ValueError):
        _reduce(d, a[:15], b, F32, SUM)  # length mismatch
    with pytest.raises(ValueError):
        _reduce(d, a, b, F64, SUM)  # itemsize does not match the dtype code
    with pytest.raises(ValueError):
        _reduce(np.empty(32, np.float32)[::2], a, b, F32, SUM)  # not contiguous
    ro = np.empty(16, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        _reduce(ro, a, b, F32, SUM)  # read-only dst
    with pytest.raises(ValueError):
        _reduce([0.0] * 16, a, b, F32, SUM)  # not an array: the result would be lost
    buf = np.ones(17, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        _reduce(buf[1:], buf[:16], b, F32, SUM)  # dst partially overlaps a
    with pytest.raises(ValueError, match="scale"):
        _reduce(d, a, b, F32, SUM, 0.5)  # only AVG takes a scale
    with pytest.raises(ValueError):
        _reduce(d, a, b, 9, SUM)
    with pytest.raises(ValueError):
        _reduce(d, a, b, F32, 8)
    with pytest.raises(ValueError):
        _reduce(d, a, b, F32, SUM, 1.0, isa="sse9")
    # nothing above may have written dst through a partial overlap or otherwise
    assert np.array_equal(buf, np.ones(17, np.float32))


def test_isa_knob():
    """RINGCOMM_CPU_ISA picks the copy once per process; a bad value raises, naming the knob."""
    import os
    import subprocess
    import sys
    import ringcomm._C

    code = ("import numpy as np; from ringcomm._C import _reduce\n"
            "a = np.arange(37, dtype=np.float32); d = np.empty_like(a)\n"
            "try:\n    _reduce(d, a, a, 0, 0)\nexcept ValueError as e:\n    print('ValueError', e)\n"
            "else:\n    print('ok', bool((d == 2 * a).all()))\n")
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(ringcomm._C.__file__)))
    path = os.pathsep.join([pkg_root] + [p for p in sys.path if p])
    for value, want in [("generic", "ok True"), ("auto", "ok True"), ("bogus", "RINGCOMM_CPU_ISA")] + (
            [("avx2", "ok True")] if "avx2" in ISAS else [("avx2", "ValueError")]):
        env = dict(os.environ, RINGCOMM_CPU_ISA=value, PYTHONPATH=path)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        assert want in out.stdout, (value, out.stdout)


def test_isa_auto_choice_per_dtype():
    """auto runs bfloat16 on AVX-512 where the CPU has it and every other dtype on AVX2 (else
    generic); a forced RINGCOMM_CPU_ISA applies to every dtype."""
    import os
    import subprocess
    import sys
    import ringcomm._C
    import ringcomm._C_test

    code = ("from ringcomm._C_test import reduce_isa\n"
            f"print(','.join(reduce_isa(c) for c in {sorted(DT_NAME)!r}))\n")
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(ringcomm._C.__file__)))
    path = os.pathsep.join([pkg_root] + [p for p in sys.path if p])
    base = "avx2" if "avx2" in ISAS else "generic"
    want_auto = ["avx512" if (c == BF16 and "avx512" in ISAS) else base for c in sorted(DT_NAME)]
    cases = [("auto", want_auto)] + [(isa, [isa] * len(DT_NAME)) for isa in ISAS]
    for value, want in cases:
        env = dict(os.environ, RINGCOMM_CPU_ISA=value, PYTHONPATH=path)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().split(",") == want, (value, out.stdout)
    with pytest.raises(ValueError, match="dtype code"):
        ringcomm._C_test.reduce_isa(len(DT_NAME))


def _all_reduce_every_pair(rank, world, store, counts):
    """On one rank: every supported dtype x op all-reduced at each count (small whole numbers,
    so every copy and numpy agree exactly), checked against numpy; returns the copy each dtype's
    kernels ran on here and the pairs that came out wrong."""
    import torch
    import ringcomm
    from ringcomm._C_test import reduce_isa
    comm = ringcomm.init(rank=rank, world_size=world, init_method=f"file://{store}", timeout=60)
    ops = {SUM: ringcomm.ReduceOp.SUM, PROD: ringcomm.ReduceOp.PRODUCT, MIN: ringcomm.ReduceOp.MIN,
           MAX: ringcomm.ReduceOp.MAX, AVG: ringcomm.ReduceOp.AVG, BAND: ringcomm.ReduceOp.BAND,
           BOR: ringcomm.ReduceOp.BOR, BXOR: ringcomm.ReduceOp.BXOR}
    wrong = []
    try:
        for dt, op in SUPPORTED:
            for n in counts:
                base = [np.arange(n) % 7 + r * 3 - (0 if dt in (U8, BOOL) else 4) for r in range(world)]
                if dt == BOOL:
                    base = [(b % 2).astype(bool) for b in base]
                if dt == BF16:       # the API takes bfloat16 as torch tensors
                    vals = [torch.tensor(b, dtype=torch.float32) for b in base]
                    x = vals[rank].to(torch.bfloat16)
                else:
                    vals = [b.astype(STORAGE[dt]) for b in base]
                    x = vals[rank].copy()
                comm.all_reduce(x, op=ops[op])
                got = x.float().numpy() if dt == BF16 else x
                f = np.float32 if dt == BF16 else STORAGE[dt]
                a, b = (np.asarray(v, dtype=f) for v in vals)
                want = {SUM: lambda: a + b, PROD: lambda: a * b, MIN: lambda: np.minimum(a, b),
                        MAX: lambda: np.maximum(a, b), AVG: lambda: (a + b) / f(2),
                        BAND: lambda: a & b, BOR: lambda: a | b, BXOR: lambda: a ^ b}[op]()
                if not np.array_equal(np.asarray(got, dtype=f), want.astype(f)):
                    wrong.append((DT_NAME[dt], OP_NAME[op], n))
        return sorted({reduce_isa(dt) for dt in DT_NAME}), wrong
    finally:
        comm.close()


@pytest.mark.parametrize("isa", ISAS)
def test_collectives_on_each_forced_isa(isa):
    """RINGCOMM_CPU_ISA forces one copy in the ranks of a 2-rank communicator, and its
    all_reduce gives numpy's result for every dtype x op, at a count of a few KiB and one of
    hundreds: so on an AVX-512 machine the AVX2 and generic copies also carry real collectives."""
    from ringcomm.core.launch import spawn_with_store
    res = spawn_with_store(_all_reduce_every_pair, 2, lambda s: (s, (1000, 100_001)), timeout=240,
                           env={"RINGCOMM_CPU_ISA": isa})
    for rank, (used, wrong) in enumerate(res):
        assert used == [isa], (rank, used)
        assert wrong == [], (rank, wrong)
