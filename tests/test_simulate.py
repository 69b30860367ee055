"""Property and edge-case tests for ringcomm.apps.simulate against independent references.

(The seeds' worked examples themselves are in test_seed_examples.py.)
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ringcomm.apps.simulate import (
    accumulate,
    all_reduce_mean,
    chunk_bounds,
    data_parallel_gradients,
    format_gpipe_schedule,
    format_ring_trace,
    gelu,
    gpipe_schedule,
    mlp,
    pipeline_bubble_fraction,
    ring_all_reduce,
    ring_all_reduce_bytes,
    ring_trace,
    single_device_gradient,
    tensor_parallel_mlp,
)

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


# ---------------------------------------------------------------------------
# chunking
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 2, 3, 5, 7, 10, 12, 13])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_chunk_bounds_match_array_split(size, n):
    ref = np.array_split(np.arange(size), n)
    got = chunk_bounds(size, n)
    assert len(got) == n
    assert [np.arange(size)[lo:hi].tolist() for lo, hi in got] == [c.tolist() for c in ref]


# ---------------------------------------------------------------------------
# ring all-reduce: correctness against numpy's sum
# ---------------------------------------------------------------------------

SHAPES = [(), (1,), (2,), (3,), (5,), (7,), (12,), (2, 3), (3, 5), (4, 1, 3), (0,), (2, 0)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("shape", SHAPES)
def test_ring_all_reduce_int_exact(n, shape):
    rng = np.random.default_rng(hash((n, shape)) % 2**32)
    xs = [rng.integers(-1000, 1000, size=shape) for _ in range(n)]
    out = ring_all_reduce(xs)
    ref = np.sum(np.stack(xs), axis=0)
    assert len(out) == n
    for o in out:
        assert isinstance(o, np.ndarray)
        assert o.shape == ref.shape and o.dtype == ref.dtype
        assert np.array_equal(o, ref)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_ring_all_reduce_float_random_shapes(n):
    rng = np.random.default_rng(n)
    for _ in range(10):
        shape = tuple(rng.integers(1, 6, size=rng.integers(1, 4)))
        xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
        out = ring_all_reduce(xs)
        ref = np.sum(np.stack(xs).astype(np.float64), axis=0)
        for o in out:
            assert o.dtype == np.float32 and o.shape == shape
            np.testing.assert_allclose(o, ref, rtol=1e-5, atol=1e-5)
            # every device ends bit-identical (the all-gather copies the owner's chunk)
            assert np.array_equal(o, out[0])


def test_ring_all_reduce_does_not_modify_inputs():
    xs = [np.arange(5.0) * (i + 1) for i in range(3)]
    before = [x.copy() for x in xs]
    out = ring_all_reduce(xs)
    for x, b in zip(xs, before):
        assert np.array_equal(x, b)
    out[0][0] = 99.0
    assert out[1][0] != 99.0  # results are independent buffers


def test_ring_all_reduce_types_round_trip():
    assert ring_all_reduce([[1, 2], [3, 4]]) == [[4, 6], [4, 6]]
    assert ring_all_reduce([[[1], [2]], [[3], [4]]]) == [[[4], [6]], [[4], [6]]]
    assert ring_all_reduce([1, 2, 3]) == [6, 6, 6]
    assert all(isinstance(v, int) for v in ring_all_reduce([1, 2, 3]))
    out = ring_all_reduce([np.float32(1.5), np.float32(2.0)])
    assert all(isinstance(v, np.float32) and v == 3.5 for v in out)
    out = ring_all_reduce([np.array([1, 2], dtype=np.int32), np.array([0.5, 0.5])])
    assert all(o.dtype == np.float64 for o in out)  # promoted common dtype
    assert [o.tolist() for o in out] == [[1.5, 2.5]] * 2


def test_ring_all_reduce_errors():
    with pytest.raises(ValueError):
        ring_all_reduce([])
    with pytest.raises(ValueError, match="same shape"):
        ring_all_reduce([np.zeros(3), np.zeros(4)])
    with pytest.raises(TypeError):
        ring_all_reduce([np.zeros(3), "abc"])
    with pytest.raises(TypeError):
        ring_all_reduce(5)


def test_all_reduce_mean_matches_numpy():
    rng = np.random.default_rng(3)
    for n in range(1, 7):
        xs = [rng.standard_normal((3, 4)) for _ in range(n)]
        for o in all_reduce_mean(xs):
            np.testing.assert_allclose(o, np.mean(np.stack(xs), axis=0), rtol=1e-12, atol=1e-12)
    assert all_reduce_mean([[1, 2], [2, 3]]) == [[1.5, 2.5], [1.5, 2.5]]


# ---------------------------------------------------------------------------
# ring schedule: an independent check of the chunk convention
# ---------------------------------------------------------------------------

def _bits(mask):
    return {i for i in range(mask.bit_length()) if mask >> i & 1}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_ring_trace_follows_schedule_convention(n):
    # Worker r holds 2**r in every one of its n chunks (one element per chunk), so each
    # cell's value is the bitmask of the workers whose data it contains.
    rows = ring_trace([[2**r] * n for r in range(n)])
    full = 2**n - 1
    assert [label for label, _ in rows] == (
        ["start"]
        + [f"reduce-scatter, step {s}" for s in range(1, n)]
        + [f"all-gather, step {s}" for s in range(1, n)]
    )
    # reduce-scatter step s (0-based): worker r sends chunk (r - s) % n to r + 1, which
    # adds it; so after the step, worker r's chunk (r - 1 - s) % n holds workers
    # r, r-1, ..., r-1-s and every other chunk keeps its previous value.
    prev = rows[0][1]
    for s in range(n - 1):
        states = rows[1 + s][1]
        for r in range(n):
            c = (r - 1 - s) % n
            assert _bits(states[r][c]) == {(r - k) % n for k in range(s + 2)}
            for other in range(n):
                if other != c:
                    assert states[r][other] == prev[r][other]
        prev = states
    # after reduce-scatter worker r owns the fully reduced chunk (r + 1) % n
    for r in range(n):
        if n > 1:
            assert prev[r][(r + 1) % n] == full
    # all-gather step s: worker r sends chunk (r + 1 - s) % n, the receiver copies it, so
    # after the step worker r holds the finished chunks (r + 1 - k) % n for k = 0..s+1.
    for s in range(n - 1):
        states = rows[n + s][1]
        for r in range(n):
            finished = {c for c in range(n) if states[r][c] == full}
            assert finished == {(r + 1 - k) % n for k in range(s + 2)}
    assert rows[-1][1] == [[full] * n] * n


def test_ring_trace_uneven_sizes_end_in_sum():
    for n in range(1, 7):
        for size in (1, n - 1, n + 1, 2 * n + 3):
            if size < 1:
                continue
            xs = [list(range(r * 100, r * 100 + size)) for r in range(n)]
            rows = ring_trace(xs)
            assert len(rows) == 2 * n - 1
            assert rows[0] == ("start", xs)
            assert rows[-1][1] == [np.sum(xs, axis=0).tolist()] * n
            # the last trace row is exactly what ring_all_reduce returns
            assert ring_all_reduce(xs) == rows[-1][1]


def test_format_ring_trace_shape():
    text = format_ring_trace(ring_trace([[1.5, 2], [3, 4], [5, 6], [7, 8]]))
    lines = text.splitlines()
    assert len(lines) == 1 + 7
    assert lines[0].split()[:3] == ["after", "worker", "0"]
    assert lines[-1].startswith("all-gather, step 3")
    assert lines[-1].count("[16.5, 20.0]") == 4
    with pytest.raises(ValueError):
        format_ring_trace([])


# ---------------------------------------------------------------------------
# ring all-reduce with torch
# ---------------------------------------------------------------------------

def test_ring_all_reduce_torch_types_and_values():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    for n in range(1, 7):
        for shape in [(1,), (n - 1 if n > 1 else 1,), (7,), (3, 4), (2, 3, 5)]:
            xs = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)]
            out = ring_all_reduce(xs)
            ref = torch.stack(xs).sum(0)
            for o in out:
                assert isinstance(o, torch.Tensor)
                assert o.dtype == torch.float64 and tuple(o.shape) == shape
                assert torch.allclose(o, ref, rtol=1e-12, atol=1e-12)
                assert torch.equal(o, out[0])
    ints = [torch.arange(5) * (i + 1) for i in range(3)]
    out = ring_all_reduce(ints)
    assert all(o.dtype == torch.int64 and o.tolist() == [0, 6, 12, 18, 24] for o in out)


def test_ring_all_reduce_torch_detaches_and_promotes():
    torch = pytest.importorskip("torch")
    a = torch.ones(4, requires_grad=True)
    b = torch.full((4,), 2.0, dtype=torch.float64)
    out = ring_all_reduce([a, b])
    assert all(o.dtype == torch.float64 and not o.requires_grad for o in out)
    assert out[0].tolist() == [3.0] * 4
    assert a.tolist() == [1.0] * 4
    bf = [torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)] * 3
    assert ring_all_reduce(bf)[0].dtype == torch.bfloat16
    with pytest.raises(TypeError, match="mix"):
        ring_all_reduce([torch.zeros(2), np.zeros(2)])


def test_all_reduce_mean_torch_int_becomes_float():
    torch = pytest.importorskip("torch")
    out = all_reduce_mean([torch.tensor([1, 2]), torch.tensor([2, 3])])
    assert out[0].is_floating_point() and out[0].tolist() == [1.5, 2.5]


def test_ring_all_reduce_bytes_formula_and_validation():
    for M in (0, 1, 4000, 10**12, 2.5):
        for N in range(1, 10):
            assert ring_all_reduce_bytes(M, N) == pytest.approx(2 * (N - 1) / N * M, rel=1e-15)
    with pytest.raises(ValueError):
        ring_all_reduce_bytes(-1, 4)
    with pytest.raises(ValueError):
        ring_all_reduce_bytes(100, 0)
    with pytest.raises(ValueError):
        ring_all_reduce_bytes(100, 2.5)
    with pytest.raises(TypeError):
        ring_all_reduce_bytes("100", 2)
    assert ring_all_reduce_bytes(100, 4.0) == 150.0


# ---------------------------------------------------------------------------
# gradients: closed form vs finite differences vs torch autograd
# ---------------------------------------------------------------------------

def _mse(W, x, y):
    return np.mean((x @ W.T - y) ** 2)


def test_single_device_gradient_finite_differences():
    rng = np.random.default_rng(5)
    W = rng.standard_normal((3, 4))
    x = rng.standard_normal((7, 4))
    y = rng.standard_normal((7, 3))
    g = single_device_gradient(W, x, y)
    eps = 1e-6
    fd = np.zeros_like(W)
    for i in range(W.shape[0]):
        for j in range(W.shape[1]):
            Wp, Wm = W.copy(), W.copy()
            Wp[i, j] += eps
            Wm[i, j] -= eps
            fd[i, j] = (_mse(Wp, x, y) - _mse(Wm, x, y)) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_single_device_gradient_numpy_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    W = rng.standard_normal((2, 5))
    x = rng.standard_normal((6, 5))
    y = rng.standard_normal((6, 2))
    g_np = single_device_gradient(W, x, y)
    g_t = single_device_gradient(torch.tensor(W), torch.tensor(x), torch.tensor(y))
    assert isinstance(g_np, np.ndarray) and isinstance(g_t, torch.Tensor)
    np.testing.assert_allclose(g_np, g_t.numpy(), rtol=1e-12, atol=1e-12)
    # independent: autograd on the loss directly
    w = torch.tensor(W, requires_grad=True)
    ((torch.tensor(x) @ w.T - torch.tensor(y)) ** 2).mean().backward()
    np.testing.assert_allclose(g_np, w.grad.numpy(), rtol=1e-12, atol=1e-12)
    # lists work too
    np.testing.assert_allclose(single_device_gradient(W.tolist(), x.tolist(), y.tolist()), g_np)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_data_parallel_equals_single_device_numpy(n):
    rng = np.random.default_rng(10 + n)
    W = rng.standard_normal((3, 4))
    xs = [rng.standard_normal((3, 4)) for _ in range(n)]
    ys = [rng.standard_normal((3, 3)) for _ in range(n)]
    dp = data_parallel_gradients(W, xs, ys)
    sd = single_device_gradient(W, np.concatenate(xs), np.concatenate(ys))
    acc = accumulate(W, xs, ys)
    np.testing.assert_allclose(dp, sd, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(acc, sd, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_data_parallel_equals_single_device_torch(n):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(n)
    W = torch.randn(4, 3, generator=g)
    xs = [torch.randn(5, 3, generator=g) for _ in range(n)]
    ys = [torch.randn(5, 4, generator=g) for _ in range(n)]
    dp = data_parallel_gradients(W, xs, ys)
    sd = single_device_gradient(W, torch.cat(xs), torch.cat(ys))
    assert isinstance(dp, torch.Tensor) and dp.dtype == torch.float32
    assert torch.allclose(dp, sd, atol=1e-6)
    assert W.grad is None  # W itself is never touched by autograd


def test_uneven_shards_really_differ_and_are_rejected():
    rng = np.random.default_rng(11)
    W = rng.standard_normal((2, 3))
    x = rng.standard_normal((6, 3))
    y = rng.standard_normal((6, 2))
    xs, ys = [x[:4], x[4:]], [y[:4], y[4:]]
    # the "mean of means" would be wrong:
    naive = (single_device_gradient(W, xs[0], ys[0]) + single_device_gradient(W, xs[1], ys[1])) / 2
    assert not np.allclose(naive, single_device_gradient(W, x, y))
    with pytest.raises(ValueError, match="global mean"):
        data_parallel_gradients(W, xs, ys)


def test_gradient_input_validation():
    W = np.zeros((2, 3))
    with pytest.raises(ValueError):
        data_parallel_gradients(W, [], [])
    with pytest.raises(ValueError):
        data_parallel_gradients(W, [np.zeros((2, 3))], [np.zeros((2, 2))] * 2)
    with pytest.raises(ValueError):
        single_device_gradient(W, np.zeros((2, 4)), np.zeros((2, 2)))
    with pytest.raises(ValueError):
        single_device_gradient(W, np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError):
        single_device_gradient(np.zeros(3), np.zeros((2, 3)), np.zeros((2, 1)))


# ---------------------------------------------------------------------------
# tensor parallelism
# ---------------------------------------------------------------------------

def _gelu_tanh_ref(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 9])
def test_tensor_parallel_mlp_matches_direct(n):
    rng = np.random.default_rng(20 + n)
    X = rng.standard_normal((5, 4))
    A = rng.standard_normal((4, 7))          # 7 hidden units: not divisible by most n
    B = rng.standard_normal((7, 3))
    direct = _gelu_tanh_ref(X @ A) @ B
    Y, partials = tensor_parallel_mlp(X, A, B, n, return_partials=True)
    assert len(partials) == n and all(p.shape == (5, 3) for p in partials)
    np.testing.assert_allclose(Y, direct, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mlp(X, A, B), direct, rtol=1e-12, atol=1e-12)
    Ye = tensor_parallel_mlp(X, A, B, n, approximate="none")
    np.testing.assert_allclose(Ye, mlp(X, A, B, approximate="none"), rtol=1e-12, atol=1e-12)


def test_tensor_parallel_mlp_torch_matches_direct():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    g = torch.Generator().manual_seed(1)
    X = torch.randn(2, 3, 8, generator=g, dtype=torch.float64)
    A = torch.randn(8, 10, generator=g, dtype=torch.float64)
    B = torch.randn(10, 6, generator=g, dtype=torch.float64)
    for approx in ("tanh", "none"):
        direct = F.gelu(X @ A, approximate=approx) @ B
        for n in (1, 2, 3, 4):
            Y = tensor_parallel_mlp(X, A, B, n, approximate=approx)
            assert isinstance(Y, torch.Tensor) and Y.shape == (2, 3, 6)
            assert torch.allclose(Y, direct, rtol=1e-12, atol=1e-12)
        # numpy path agrees with torch
        np.testing.assert_allclose(mlp(X.numpy(), A.numpy(), B.numpy(), approx), direct.numpy(),
                                   rtol=1e-12, atol=1e-12)


def test_gelu_matches_torch():
    torch = pytest.importorskip("torch")
    z = np.linspace(-5, 5, 41)
    for approx in ("tanh", "none"):
        ref = torch.nn.functional.gelu(torch.tensor(z), approximate=approx).numpy()
        np.testing.assert_allclose(gelu(z, approx), ref, rtol=1e-12, atol=1e-14)
    assert gelu(np.float32(1.0)).dtype == np.float32
    with pytest.raises(ValueError):
        gelu(1.0, approximate="sigmoid")


def test_tensor_parallel_mlp_validation():
    with pytest.raises(ValueError):
        tensor_parallel_mlp(np.ones(3), np.ones((2, 4)), np.ones((4, 2)), 2)
    with pytest.raises(ValueError):
        tensor_parallel_mlp(np.ones(2), np.ones((2, 4)), np.ones((3, 2)), 2)
    with pytest.raises(ValueError):
        tensor_parallel_mlp(np.ones(2), np.ones((2, 4)), np.ones((4, 2)), 0)


# ---------------------------------------------------------------------------
# pipeline parallelism
# ---------------------------------------------------------------------------

def test_gpipe_schedule_properties():
    for p in range(1, 7):
        for m in range(1, 9):
            rows = gpipe_schedule(p, m)
            assert len(rows) == p and all(len(r) == m + p - 1 for r in rows)
            for s, row in enumerate(rows):
                # each stage runs micro-batches 0..m-1 in order, in consecutive slots from s
                assert [c for c in row if c is not None] == list(range(m))
                assert row.index(0) == s
            # micro-batch k reaches stage s+1 one slot after stage s
            for s in range(p - 1):
                for k in range(m):
                    assert rows[s + 1].index(k) == rows[s].index(k) + 1
            cells = [c for r in rows for c in r]
            assert pipeline_bubble_fraction(p, m) == pytest.approx(cells.count(None) / len(cells))
    assert pipeline_bubble_fraction(1, 7) == 0.0
    assert "·" in format_gpipe_schedule(gpipe_schedule(3, 2))
    assert "-" in format_gpipe_schedule(gpipe_schedule(3, 2), idle="-")


def test_pipeline_validation():
    for bad in ((0, 3), (2, 0), (-1, 1)):
        with pytest.raises(ValueError):
            pipeline_bubble_fraction(*bad)
        with pytest.raises(ValueError):
            gpipe_schedule(*bad)
    with pytest.raises(ValueError):
        gpipe_schedule(2.5, 3)
    with pytest.raises(TypeError):
        gpipe_schedule("2", 3)


# ---------------------------------------------------------------------------
# works with numpy alone (torch must not be imported)
# ---------------------------------------------------------------------------

def test_modules_work_without_torch():
    code = textwrap.dedent(f"""
        import importlib.util, sys
        sys.modules["torch"] = None          # any "import torch" now raises ImportError
        def load(folder, name):
            spec = importlib.util.spec_from_file_location(
                "rc_" + name, {SRC!r} + "/ringcomm/" + folder + "/" + name + ".py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
        sim, mem = load("apps", "simulate"), load("training", "memory")
        import numpy as np
        assert sim.ring_all_reduce([[1, 2, 3], [10, 20, 30], [100, 200, 300]]) == [[111, 222, 333]] * 3
        W = np.ones((2, 3)); xs = [np.ones((2, 3))] * 2; ys = [np.zeros((2, 2))] * 2
        assert np.allclose(sim.data_parallel_gradients(W, xs, ys),
                           sim.single_device_gradient(W, np.ones((4, 3)), np.zeros((4, 2))))
        assert round(float(sim.mlp([1., 2.], [[1, 0, 1, 0], [0, 1, 0, 0]],
                                   [[1, 0], [0, 1], [1, 1], [0, 0]])[0]), 3) == 1.682
        assert mem.zero_memory_per_device(7e9, 8, 1) == 38.5e9
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
