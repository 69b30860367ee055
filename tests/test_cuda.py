"""CUDA support.

Without a GPU (CI, most dev machines) this checks everything that does not need one: the CUDA
module builds and imports (or reports unavailability cleanly), the GPU's dtype x op table equals the
CPU's, the channel planner, the Python adapters' validation, the host API's routing of CUDA arrays
(a clear UnsupportedError on every rank), a compile check of the kernels, and — through
ringcomm._C_test.AlgoSim, in every build — the one algorithm layer with the CUDA channel's options, run
between processes over host memory.

With a GPU: every collective x dtype x op against numpy with 2-4 processes sharing the visible GPUs
(every channel kind), CuPy arrays, a killed rank, and DDP on CUDA tensors over ringcomm vs gloo.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import ringcomm
import ringcomm.cuda as rcc
from ringcomm import _C, _C_test
from ringcomm.core.launch import spawn

import cuda_cases

ROOT = Path(__file__).resolve().parents[1]

try:
    from ringcomm import _C_cuda, _C_cuda_test
except ImportError:  # built without a CUDA toolkit
    _C_cuda = _C_cuda_test = None

needs_module = pytest.mark.skipif(_C_cuda is None, reason="ringcomm._C_cuda was not built (no CUDA toolkit)")
needs_gpu = pytest.mark.skipif(not rcc.is_available(), reason=f"CUDA unavailable: {rcc.unavailable_reason()}")


def _gpu_present() -> bool:
    """A GPU driver on this machine (independent of ringcomm)."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


# ================= no GPU needed =================

def test_cpu_module_does_not_need_cuda():
    # ringcomm._C never links CUDA: it must import (it did, above) and work without it.
    x = np.ones(4, np.float32)
    with ringcomm.init(rank=0, world_size=1) as c:
        c.all_reduce(x)
    assert x.tolist() == [1.0] * 4


def test_cuda_module_imports_or_reports_unavailable():
    assert isinstance(rcc.is_available(), bool)
    reason = rcc.unavailable_reason()
    if rcc.is_available():
        assert reason == "" and rcc.device_count() >= 1
        return
    assert reason, "unavailable without a reason"
    if _C_cuda is None:
        assert "without CUDA support" in reason
    else:
        st = _C_cuda.runtime_status()
        assert st["available"] is False and st["device_count"] == 0 and st["error"]
    if not _gpu_present():
        assert not rcc.is_available()


def test_is_available_false_without_gpu():
    if _gpu_present():
        pytest.skip("this machine has a GPU driver")
    assert rcc.is_available() is False
    with pytest.raises(ringcomm.UnsupportedError, match="CUDA unavailable"):
        rcc.init(rank=0, world_size=1)


@needs_module
def test_module_reports_compiled_archs():
    archs = _C_cuda.COMPILED_ARCHS.split(",")
    assert any(a.startswith("80") for a in archs) and any(a.startswith("90") for a in archs), archs


@needs_module
def test_gpu_dtype_op_table_equals_cpu_table():
    # Same enums, same supported-pair rule: the GPU switch has a kernel exactly where the CPU has one.
    for d in range(-1, 10):
        for o in range(-1, 9):
            assert _C_cuda_test.reduce_supported(d, o) == _C_test.reduce_supported(d, o), (d, o)
    assert sum(_C_cuda_test.reduce_supported(d, o) for d in range(9) for o in range(8)) == 50


@needs_module
def test_unsupported_pair_and_no_device_raise_typed_errors():
    # An unsupported pair is rejected before any CUDA call; with no device, CUDA calls raise
    # UnsupportedError ("CUDA unavailable"), never crash.
    with pytest.raises(ringcomm.UnsupportedError, match="AVG is not supported for dtype int32"):
        _C_cuda_test.reduce(1, 1, 1, 4, 6, 4, 1.0, 0, 0, True)
    if not rcc.is_available():
        with pytest.raises(ringcomm.UnsupportedError, match="CUDA unavailable"):
            _C_cuda_test.reduce(1, 1, 1, 4, 0, 0, 1.0, 0, 0, True)
        with pytest.raises(ringcomm.UnsupportedError, match="CUDA unavailable"):
            _C_cuda.Communicator(0, 1, 0, 5.0).local_info()


def _bitwise_same(got, want, dt):
    """Bit for bit, except that NaN payloads may differ (GPUs return the canonical NaN)."""
    g, w = cuda_cases._val(got, dt), cuda_cases._val(want, dt)
    if dt in ("float32", "float64", "float16", "bfloat16"):
        gn, wn = np.isnan(g.astype(np.float64)), np.isnan(w.astype(np.float64))
        return bool(np.array_equal(gn, wn)) and got[~gn].tobytes() == want[~wn].tobytes()
    return got.tobytes() == want.tobytes()


def _kernel_inputs(dt, op, n, rng):
    """Two inputs for (dt, op): wide ranges (integer wrap-around), and for floats NaN, +-inf,
    +-0, subnormals and values whose fp16/bf16 sums need rounding."""
    if dt == "bool":
        return [rng.integers(0, 3, n).astype(np.uint8).view(np.bool_) for _ in range(2)]
    if dt in ("int8", "uint8", "int32", "int64"):
        info = np.iinfo(dt)
        return [rng.integers(info.min, info.max, n, dtype=dt, endpoint=True) for _ in range(2)]
    vals = []
    for _ in range(2):
        v = rng.standard_normal(n).astype(np.float32) * 3
        special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 65504.0, 1.0009765625], np.float32)
        k = min(n, len(special))
        idx = rng.choice(n, k, replace=False) if n else []
        v[idx] = special[:k]
        vals.append(cuda_cases._raw(v, dt) if dt == "bfloat16" else v.astype(dt))
    return vals


@needs_module
@pytest.mark.parametrize("dt", ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64",
                                "bool"])
def test_cuda_kernel_body_matches_cpu_kernels(dt):
    """The CUDA reduce kernel's own code (__host__ __device__: the element ops, the 16-byte vector
    path with its head and tail, the scalar path for mismatched alignments, the grid-stride loop)
    run on the host, bit for bit against the CPU kernels: every op, lengths around the vector width,
    every alignment shift, several grid sizes, in place and out of place."""
    rng = np.random.default_rng(11)
    ops = [o for d, o in pairs_() if d == dt]
    bad = []
    for op in ops:
        code, opc = cuda_cases.DTYPE_CODES[dt], cuda_cases.OP_CODES[op]
        for n in (0, 1, 5, 16, 17, 33, 257, 4099):
            a, b = _kernel_inputs(dt, op, n, rng)
            for scale in ((1.0, 0.25, 1 / 3) if op == "AVG" else (1.0,)):
                want = np.empty_like(a)
                _C._reduce(want, a, b, code, opc, scale)
                for sa, sb, sd in ((0, 0, 0), (1, 1, 1), (3, 3, 3), (0, 1, 0), (2, 0, 5)):
                    for nth in (1, 7, 64, 1024):
                        bufs = []
                        for shift, src in ((sd, None), (sa, a), (sb, b)):
                            base = np.zeros(n + 16, dtype=a.dtype)
                            off = (-(base.ctypes.data // a.itemsize) % (16 // min(a.itemsize, 16))) + shift
                            v = base[off:off + n]
                            if src is not None:
                                v[:] = src
                            bufs.append(v)
                        _C_cuda_test.reduce_emulated(bufs[0], bufs[1], bufs[2], code, opc, scale, nth)
                        if not _bitwise_same(bufs[0], want, dt):
                            bad.append(f"{op} n={n} scale={scale} shifts={(sa, sb, sd)} threads={nth}")
                # in place (dst aliases a)
                x = a.copy()
                _C_cuda_test.reduce_emulated(x, x, b, code, opc, scale, 64)
                if not _bitwise_same(x, want, dt):
                    bad.append(f"{op} n={n} scale={scale} in place")
    assert not bad, bad[:20]


def pairs_():
    from mp_cases import pairs
    return pairs()


U = [bytes([i]) * 16 for i in range(4)]  # four GPU uuids


@needs_module
@pytest.mark.parametrize("case", ["one-gpu", "p2p", "no-p2p", "invisible", "no-ipc-events", "forced", "device"])
def test_channel_plan(case):
    plan = _C_cuda_test.plan_channels

    def kinds(infos, mode=0):
        n = len(infos)
        k = plan(infos, mode)
        return {(a, b): k[a * n + b] for a in range(n) for b in range(n) if a != b}

    all4 = dict(visible=U[:2], can_access=[1, 1])
    if case == "one-gpu":      # several processes on ONE GPU: IPC within the device
        assert set(kinds([dict(uuid=U[0])] * 3).values()) == {"ipc"}
    elif case == "p2p":
        assert set(kinds([dict(uuid=U[0], **all4), dict(uuid=U[1], **all4)]).values()) == {"ipc"}
    elif case == "no-p2p":     # both visible, no peer access: staged through host memory
        noacc = dict(visible=U[:2], can_access=[1, 0])
        k = kinds([dict(uuid=U[0], **noacc), dict(uuid=U[1], visible=U[:2], can_access=[0, 1])])
        assert set(k.values()) == {"host"}
    elif case == "invisible":  # one side cannot see the other's GPU (CUDA_VISIBLE_DEVICES): host
        k = kinds([dict(uuid=U[0], **all4), dict(uuid=U[1], visible=[U[1]], can_access=[1]), dict(uuid=U[0])])
        assert k[(0, 1)] == k[(1, 0)] == "host" and k[(0, 2)] == k[(2, 0)] == "ipc"
        assert k[(1, 2)] == k[(2, 1)] == "host"
    elif case == "no-ipc-events":
        k = kinds([dict(uuid=U[0]), dict(uuid=U[0], ipc_events=False)])
        assert set(k.values()) == {"hostsync"}
    elif case == "forced":
        one = [dict(uuid=U[0])] * 2
        assert set(kinds(one, 2).values()) == {"host"}
        assert set(kinds(one, 3).values()) == {"hostsync"}
        assert set(kinds(one, 1).values()) == {"ipc"}
        with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_CUDA_P2P=ipc"):
            plan([dict(uuid=U[0], visible=[U[0]], can_access=[1]), dict(uuid=U[1], visible=[U[1]], can_access=[1])], 1)
    elif case == "device":     # the device ring's flags live in the inboxes: ipc everywhere, or refused
        assert set(kinds([dict(uuid=U[0]), dict(uuid=U[0], ipc_events=False)], 4).values()) == {"ipc"}
        with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_CUDA_P2P=device"):
            plan([dict(uuid=U[0], visible=[U[0]], can_access=[1]), dict(uuid=U[1], visible=[U[1]], can_access=[1])], 4)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world,slot_bytes,nslots,style,streaming", [
    (1, 64, 2, "cuda", False), (2, 64, 2, "cuda", False), (3, 96, 2, "cuda", False), (4, 256, 3, "cuda", False),
    (3, 4096, 4, "cuda", False), (2, 64, 2, "host", True), (3, 4096, 4, "host", True)])
def test_cuda_algorithms_over_host_memory(world, slot_bytes, nslots, style, streaming, store_env):
    """The one algorithm layer (csrc/algo/: the ring schedule, pieces, fused reduce-forward, chains,
    direct exchanges), built into ringcomm._C on every build, between real processes over a shm
    channel. style "cuda" gives that channel the CUDA channel's options (slot residue = offset mod
    16, copy out before forwarding, own all_gather block placed first), so the code paths the CUDA
    build takes are run without a GPU; "host" with streaming stores covers the host options beside
    the communicator's tests. Tiny slots: every case streams through many slots at the minimum slot
    count; misaligned buffers exercise the slot offsets."""
    results = spawn(cuda_cases.sim_cases, world, (slot_bytes, nslots, style, streaming), timeout=280, env=store_env)
    failures = [f for fs in results for f in fs]
    assert not failures, "\n".join(failures[:30])


# ---- Python adapters (no GPU: fake __cuda_array_interface__ objects are never dereferenced) ----

def test_is_cuda_array():
    torch = pytest.importorskip("torch")
    assert not rcc.is_cuda_array(np.zeros(3))
    assert not rcc.is_cuda_array(torch.zeros(3))
    assert not rcc.is_cuda_array(None) and not rcc.is_cuda_array([1, 2])
    assert rcc.is_cuda_array(cuda_cases.FakeCudaArray())

    class DL:
        def __init__(self, dev):
            self.dev = dev

        def __dlpack__(self, stream=None):
            raise AssertionError("not consumed")

        def __dlpack_device__(self):
            return (self.dev, 0)
    assert rcc.is_cuda_array(DL(2)) and rcc.is_cuda_array(DL(13)) and not rcc.is_cuda_array(DL(1))


def test_as_cuda_buf_validation():
    F = cuda_cases.FakeCudaArray
    b = rcc.as_cuda_buf(F(8, "<f2"))
    assert (b.count, b.dtype, b.code, b.nbytes, b.writeable) == (8, "float16", 2, 16, True)
    assert rcc.as_cuda_buf(F(3, "|b1")).dtype == "bool"
    assert rcc.as_cuda_buf(F(3, "<i8", readonly=True)).writeable is False
    assert rcc.as_cuda_buf(F(8, "<f4", strides=(4,))).count == 8
    with pytest.raises(ringcomm.InvalidArgumentError, match="not C-contiguous"):
        rcc.as_cuda_buf(F(8, "<f4", strides=(8,)))
    with pytest.raises(ringcomm.UnsupportedError, match="dtype"):
        rcc.as_cuda_buf(F(8, "<c8"))
    with pytest.raises(ringcomm.UnsupportedError, match="not a CUDA array"):
        rcc.as_cuda_buf(object())
    torch = pytest.importorskip("torch")
    with pytest.raises(ringcomm.UnsupportedError, match="not a CUDA tensor"):
        rcc.as_cuda_buf(torch.zeros(2))


def test_stream_handles():
    assert rcc._stream_handle(None) is None
    assert rcc._stream_handle(0) == 0 and rcc._stream_handle(1234) == 1234

    class TorchLike:
        cuda_stream = 77

    class CupyLike:
        ptr = 88
    assert rcc._stream_handle(TorchLike()) == 77 and rcc._stream_handle(CupyLike()) == 88
    with pytest.raises(ringcomm.InvalidArgumentError, match="not a CUDA stream"):
        rcc._stream_handle("default")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,mixed", [(1, False), (2, False), (3, True)])
def test_cpu_api_with_cuda_array_raises_clearly_everywhere(world, mixed, store_env):
    """Without CUDA, a CUDA-like array given to the host API raises UnsupportedError ("CUDA
    unavailable") on every rank that passed one; a rank that passed a host array raises
    MismatchError instead of waiting; the communicator stays usable."""
    if rcc.is_available():
        pytest.skip("CUDA is available here: the arrays would be routed to it")
    res = spawn(cuda_cases.unavailable_cases, world, (mixed,), timeout=100, env=store_env)
    for r, out in enumerate(res):
        (kind, msg), after = out
        if mixed and r != 0:
            assert kind == "MismatchError", (r, out)
        else:
            assert kind == "UnsupportedError" and "CUDA unavailable" in msg, (r, out)
        assert after == [float(world)] * 4


def test_cuda_sources_compile():
    """A CUDA source that does not compile fails here (CI compiles them: it has nvcc): the library's
    kernels (the device check's hand-off probe: tests/test_device_check.py)."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        pytest.skip("nvcc not found")
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([nvcc, "-std=c++17", "--fmad=false", "-arch=sm_90", "-I", str(ROOT / "csrc"),
                            "-I", str(ROOT / "csrc" / "include"), "-c",
                            str(ROOT / "csrc/kernels/reduce.cu"), "-o", os.path.join(d, "reduce.o"),
                            "-Xcompiler", "-Wall,-Wextra"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
        assert "warning" not in r.stderr.lower(), r.stderr[-4000:]


# ================= GPU =================

@needs_gpu
def test_gpu_reduce_kernels_match_cpu_bitwise():
    """Every dtype x op on the GPU against the CPU kernels, bit for bit (NaN payloads aside),
    aligned and misaligned, with NaNs in the floating inputs."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    from mp_cases import make, pairs
    import cuda_cases as cc
    bad = []
    for dt, op in pairs():
        code, opc = cc.DTYPE_CODES[dt], cc.OP_CODES[op]
        for n in (0, 1, 15, 17, 1000, 1 << 20):
            for shift in (0, 1, 3):
                a, b = cc._raw(make(dt, n, 0, 1, op), dt), cc._raw(make(dt, n, 1, 1, op), dt)
                if dt in ("float32", "float64", "float16") and n > 2:
                    a[1] = np.nan
                scale = 0.25 if op == "AVG" else 1.0
                want = np.empty_like(a)
                _C._reduce(want, a, b, code, opc, scale)
                host = [torch.from_numpy(v.view(np.int16) if v.dtype == np.uint16 else v) for v in (a, b)]
                dev = [torch.zeros(n + shift, dtype=host[0].dtype, device="cuda")[shift:] for _ in range(3)]
                dev[0].copy_(host[0])
                dev[1].copy_(host[1])
                _C_cuda_test.reduce(dev[2].data_ptr(), dev[0].data_ptr(), dev[1].data_ptr(), n, code, opc, scale,
                                torch.cuda.current_stream().cuda_stream, torch.cuda.current_device(), True)
                got = dev[2].cpu().numpy()
                got = got.view(np.uint16) if a.dtype == np.uint16 else got
                if not _bitwise_same(got, want, dt):
                    bad.append(f"{dt} {op} n={n} shift={shift}")
    assert not bad, bad[:20]


@needs_gpu
@pytest.mark.timeout(120)
def test_gpu_cupy_arrays(store_env):
    pytest.importorskip("cupy")
    assert spawn(cuda_cases.gpu_cupy_cases, 2, timeout=100, env=store_env) == [True, True]


@needs_gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_gpu_all_reduce_order(world, store_env):
    """CUDA all_reduce adds in the host's order (gloo's): results bit-identical to the CPU path."""
    pytest.importorskip("torch")
    res = spawn(cuda_cases.gpu_order_cases, world, timeout=100, env=store_env)
    fails = [f for r in res for f in r]
    assert not fails, "\n".join(fails[:20])


@needs_gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_gpu_killed_rank_makes_others_raise(world, store_env):
    pytest.importorskip("torch")
    res = spawn(cuda_cases.gpu_killed_rank, world, timeout=100, env=store_env, may_die=[1])
    for r, out in enumerate(res):
        if r == 1:
            continue
        kind, dt, msg = out
        assert kind in ("PeerFailureError", "TimeoutError"), (r, out)
        assert dt < 30.0, f"rank {r} took {dt:.1f} s to notice the dead peer"


@needs_gpu
@pytest.mark.timeout(300)
def test_gpu_ddp_over_ringcomm_matches_gloo(store_env):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    import ringcomm.torch  # noqa: F401 - registers the backend
    devices = dist.Backend.backend_capability.get("ringcomm", [])
    if "cuda" not in devices:
        pytest.skip(f"the ringcomm torch backend does not register CUDA yet (devices={devices})")
    if not dist.is_gloo_available():
        pytest.skip("gloo unavailable")
    del torch
    ref = spawn(cuda_cases.gpu_ddp, 2, ("gloo", 5), timeout=280, env=store_env)
    got = spawn(cuda_cases.gpu_ddp, 2, ("ringcomm", 5), timeout=280, env=store_env)
    for r in range(2):
        for a, b in zip(ref[r], got[r]):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def _run_backend_ops(world, device, store_env):
    pytest.importorskip("torch")
    fails = spawn(cuda_cases.backend_ops, world, (device,), timeout=100, env=store_env)
    assert not [f for fs in fails for f in fs], fails


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_backend_ops_case_on_cpu(world, store_env):
    """The case test_gpu_torch_backend_ops runs on CUDA tensors, checked here on CPU tensors."""
    _run_backend_ops(world, "cpu", store_env)


@needs_gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_gpu_torch_backend_ops(world, store_env):
    """The "ringcomm" torch backend on CUDA tensors: every op it maps, staging paths, futures."""
    _run_backend_ops(world, "cuda", store_env)


# Ordered by priority (a short device session runs them in this order): every channel kind with
# several processes on one GPU first, then more ranks and the default slot size.
GPU_CONFIGS = [(2, "auto", "tiny"), (4, "auto", "tiny"), (2, "host", "tiny"), (2, "hostsync", "tiny"),
               (3, "auto", "default"), (4, "host", "tiny"), (3, "hostsync", "tiny"), (2, "auto", "default")]


# Whole-case limit (s) of one GPU configuration; benchmarks/device/gpu_check.sh lowers it to fit a device session.
GPU_CASE_TIMEOUT = float(os.environ.get("RC_TEST_GPU_CASE_TIMEOUT", "880"))


@needs_gpu
@pytest.mark.timeout(GPU_CASE_TIMEOUT + 20)
@pytest.mark.parametrize("world,mode,slots", GPU_CONFIGS)
def test_gpu_all_collectives(world, mode, slots, store_env):
    """2-4 processes sharing the visible GPUs (several per GPU when fewer GPUs than ranks); every
    collective x dtype x op x count on torch CUDA tensors against numpy; async work on a side
    stream; stream order without host synchronisation."""
    pytest.importorskip("torch")
    slot_bytes, nslots = (4096, 2) if slots == "tiny" else (2 << 20, 4)
    route = "api" if world != 3 else "cuda"
    results = spawn(cuda_cases.gpu_collective_cases, world, (mode, slot_bytes, nslots, route), timeout=GPU_CASE_TIMEOUT,
                    env=store_env)
    failures = [f for fs, _ in results for f in fs]
    assert not failures, "\n".join(failures[:30])
    base = results[0][1]
    for r, (_, d) in enumerate(results[1:], 1):
        assert d == base, f"rank {r}'s all_reduce results differ bitwise from rank 0's"


def test_cuda_benchmark_skips_cleanly_without_gpu():
    if rcc.is_available():
        pytest.skip("CUDA is available: the benchmark would run (benchmarks/device/gpu_check.sh runs it)")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/device/cuda_bench.py"), "-e", "1M"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("SKIP: CUDA unavailable"), r.stdout
