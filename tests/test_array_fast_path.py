"""The synchronous all_reduce and broadcast fast paths (host.py): numpy arrays take one C++ call
that converts them and runs the collective (bindings/array_view_py.h), dense contiguous CPU torch
tensors go straight to the core call. What it takes must give exactly the
general path's results; what it does not take must reach the general path, which refuses or runs
it as before. Checked on a world of one (the binding's answer itself) and across processes
against numpy, with ranks on different paths in the same collective."""
import numpy as np
import pytest

import ringcomm
from ringcomm.launch import launch

torch = pytest.importorskip("torch")   # the general path's second array type

TAKEN = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64, np.bool_]


@pytest.fixture
def comm1():
    c = ringcomm.init(rank=0, world_size=1)
    yield c
    c.close()


@pytest.mark.parametrize("dt", TAKEN)
def test_binding_takes_native_contiguous_writable_arrays(comm1, dt):
    for n in (0, 1, 1000):
        x = np.ones(n, dt)
        assert comm1._c.all_reduce_array(x, None, 0 if dt is not np.bool_ else 3) is True
        assert np.array_equal(x, np.ones(n, dt))
        y = np.zeros(n, dt)
        assert comm1._c.all_reduce_array(x, y, 3) is True                  # MAX, out of place
        assert np.array_equal(y, np.ones(n, dt))
        assert comm1._c.broadcast_array(x, 0) is True


@pytest.mark.parametrize("make", [
    lambda: np.ones(10, np.float32)[::2],                       # not contiguous
    lambda: np.ones(10, np.dtype(">f4")),                       # big-endian
    lambda: np.ones(10, np.int16),                              # a dtype ringcomm does not reduce
    lambda: np.ones(10, np.uint32),
    lambda: np.ones(10, np.complex64),
    lambda: np.ones((4, 4), np.float32).T,                      # Fortran order
])
def test_binding_declines_other_arrays(comm1, make):
    x = make()
    assert comm1._c.all_reduce_array(x, None, 0) is False
    assert comm1._c.all_reduce_array(np.ones(x.size, np.float32), x, 0) is False
    assert comm1._c.broadcast_array(x, 0) is False


def test_binding_declines_read_only_and_unsupported_ops(comm1):
    x = np.ones(10, np.float32)
    x.flags.writeable = False
    assert comm1._c.all_reduce_array(x, None, 0) is False
    assert comm1._c.broadcast_array(x, 0) is False
    f = np.ones(4, np.float32)
    assert comm1._c.all_reduce_array(f, None, 5) is False                  # BAND on float
    assert comm1._c.all_reduce_array(f, None, 99) is False
    assert comm1._c.all_reduce_array(f, None, -1) is False
    assert comm1._c.all_reduce_array([1.0, 2.0], None, 0) is False         # not a buffer
    assert comm1._c.all_reduce_array(f, np.ones(4, np.float64), 0) is False  # dtypes differ
    assert comm1._c.all_reduce_array(f, np.ones(5, np.float32), 0) is False  # sizes differ
    for root in (1, -1, 2 ** 70, True, 0.0, "0"):                          # not a rank of one
        assert comm1._c.broadcast_array(f, root) is False


def test_declined_arrays_get_the_general_paths_errors(comm1):
    with pytest.raises(ringcomm.InvalidArgumentError, match="not contiguous"):
        comm1.all_reduce(np.ones(10, np.float32)[::2])
    ro = np.ones(10, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ringcomm.InvalidArgumentError, match="read-only"):
        comm1.all_reduce(ro)
    with pytest.raises(ringcomm.UnsupportedError, match="int16"):
        comm1.all_reduce(np.ones(3, np.int16))
    x = np.arange(6, dtype=np.int32)
    comm1.all_reduce(x, op=ringcomm.ReduceOp.BAND)                        # general path, bitwise op
    assert np.array_equal(x, np.arange(6, dtype=np.int32))
    buf = np.zeros(16, np.float32)
    with pytest.raises(ringcomm.InvalidArgumentError, match="overlap partially"):
        comm1.all_reduce(buf[0:8], output=buf[4:12])                      # taken, refused by the core
    with pytest.raises(ringcomm.InvalidArgumentError, match="root"):
        comm1.broadcast(np.ones(3, np.float32), root=1)
    with pytest.raises(ringcomm.InvalidArgumentError, match="root"):
        comm1.broadcast(np.ones(3, np.float32), root=True)


def test_closed_raises(comm1):
    comm1.close()
    with pytest.raises(ringcomm.ClosedError):
        comm1.all_reduce(np.ones(4, np.float32))


def _ranks_mixed_paths(comm, tensor_calls=False):
    import torch
    r, n = comm.rank, comm.world_size
    if tensor_calls:   # torch tensors through the c10d extension's TensorCalls (built by the test)
        from ringcomm.torch import extension
        extension.load()
        assert comm._load_tensor_calls()
    else:              # torch tensors through the Python attribute reads
        comm._tensor_calls = False
    wrong = []
    ops = [("SUM", np.add.reduce), ("MAX", np.maximum.reduce), ("MIN", np.minimum.reduce),
           ("PRODUCT", np.multiply.reduce), ("AVG", None)]
    for dt in TAKEN:
        for name, ref in ops:
            if dt is np.bool_ and name in ("AVG", "SUM", "PRODUCT"):
                continue
            if name == "AVG" and not np.issubdtype(dt, np.floating):
                continue
            for count in (0, 1, 7 * n + 3, 70000):
                ins = [((np.arange(count) * (p + 3) + count) % 5 + 1).astype(dt) for p in range(n)]
                if dt is np.bool_:
                    ins = [(np.arange(count) + p) % 3 == 0 for p in range(n)]
                want = (np.add.reduce([i.astype(np.float64) for i in ins]) / n).astype(dt) if ref is None \
                    else ref(np.stack(ins)) if count else ins[0]
                fast = np.array(ins[r])
                op = getattr(ringcomm.ReduceOp, name)
                if r == 0:
                    comm.all_reduce(fast, op=op)                 # the numpy fast path, in place
                elif r == 1:
                    out = np.empty_like(fast)
                    comm.all_reduce(fast, op=op, output=out)     # the numpy fast path, out of place
                    fast = out
                elif r == 2 and count % 2:
                    comm.all_reduce(torch.from_numpy(fast), op=op)   # the torch fast path, in place
                elif r == 2:
                    out = torch.empty(count, dtype=torch.from_numpy(fast).dtype)
                    comm.all_reduce(torch.from_numpy(fast), op=op, output=out)   # out of place
                    fast = out.numpy()
                else:
                    comm.all_reduce(fast, op=op, async_op=True).wait()   # the general path
                want = np.asarray(want, dtype=dt)
                if name == "AVG":   # scaled by 1/n in the dtype: within rounding of numpy's mean
                    tol = 2e-3 if dt is np.float16 else 1e-6
                    ok = np.allclose(fast.astype(np.float64), want.astype(np.float64), rtol=tol, atol=0)
                else:
                    ok = fast.tobytes() == want.tobytes()
                if not ok:
                    wrong.append((np.dtype(dt).name, name, count))
    for dt in TAKEN:
        for count in (0, 1, 7 * n + 3, 70000):
            for root in range(n):
                src = (np.arange(count) % 7 + root).astype(dt)
                x = src.copy() if r == root else np.zeros(count, dt)
                if r == 0:
                    comm.broadcast(x, root=root)                     # the numpy fast path
                elif r == 1:
                    comm.broadcast(torch.from_numpy(x), root=root)   # the torch fast path
                else:
                    comm.broadcast(x, root=root, async_op=True).wait()   # the general path
                if x.tobytes() != src.tobytes():
                    wrong.append(("broadcast", np.dtype(dt).name, count, root))
    # A rank whose array the fast path declines and the general path rejects, beside ranks on
    # the fast path: every rank raises, nothing hangs, the communicator stays usable.
    x = np.ones(12, np.float32)
    arg = x[::2] if r == n - 1 else x[:6]
    try:
        comm.all_reduce(arg)
        outcome = "no error"
    except ringcomm.InvalidArgumentError:
        outcome = "own error"
    except ringcomm.MismatchError:
        outcome = "mismatch"
    y = np.full(5, r + 1.0, np.float32)
    comm.all_reduce(y)
    return wrong, outcome, bool((y == n * (n + 1) / 2).all())


@pytest.fixture(scope="module")
def built_extension():
    from ringcomm.torch import extension
    return extension.load()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world,tensor_calls", [(2, False), (3, False), (4, False), (3, True), (4, True)])
def test_fast_and_general_paths_agree_across_ranks(world, tensor_calls, request):
    if tensor_calls:
        request.getfixturevalue("built_extension")
    res = launch(_ranks_mixed_paths, world, args=(tensor_calls,), timeout=280)
    for r, (wrong, outcome, after) in enumerate(res):
        assert not wrong, (r, wrong[:10])
        assert outcome == ("own error" if r == world - 1 else "mismatch"), (r, outcome)
        assert after


TORCH_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("dt", TORCH_DTYPES)
def test_torch_tensors_in_place(comm1, dt):
    for n in (0, 1, 1000):
        t = torch.ones(n, dtype=dt)
        comm1.all_reduce(t, op=ringcomm.ReduceOp.MAX)
        assert torch.equal(t, torch.ones(n, dtype=dt))
        comm1.broadcast(t, root=0)
        assert torch.equal(t, torch.ones(n, dtype=dt))


def test_torch_tensors_the_fast_path_declines(comm1):
    comm1.all_reduce(torch.ones(2))       # the adapter has seen torch: the fast path is armed
    with pytest.raises(ringcomm.InvalidArgumentError, match="not contiguous"):
        comm1.all_reduce(torch.ones(10)[::2])
    with pytest.raises(ringcomm.InvalidArgumentError, match="not contiguous"):
        comm1.broadcast(torch.ones(4, 4).t(), root=0)
    with pytest.raises(ringcomm.UnsupportedError, match="int16"):
        comm1.all_reduce(torch.ones(3, dtype=torch.int16))
    with pytest.raises((ringcomm.UnsupportedError, ringcomm.InvalidArgumentError), match="layout|contiguous"):
        comm1.all_reduce(torch.ones(3).to_sparse())
    with pytest.raises(ringcomm.InvalidArgumentError, match="root"):
        comm1.broadcast(torch.ones(3), root=1)
    with pytest.raises(ringcomm.InvalidArgumentError, match="root"):
        comm1.broadcast(torch.ones(3), root=True)
    t = torch.arange(6, dtype=torch.int32)
    comm1.all_reduce(t, op=ringcomm.ReduceOp.BXOR)                    # a bitwise op: general path
    assert torch.equal(t, torch.arange(6, dtype=torch.int32))
    p = torch.nn.Parameter(torch.ones(4), requires_grad=False)        # a subclass: general path
    comm1.all_reduce(p)
    assert torch.equal(p.data, torch.ones(4))
    comm1.close()
    with pytest.raises(ringcomm.ClosedError):
        comm1.all_reduce(torch.ones(4))


def test_tensor_calls_take_plain_cpu_tensors_and_decline_the_rest(comm1, built_extension):
    """The c10d extension's TensorCalls (the host API's torch path once it is built): takes dense
    contiguous CPU tensors of every reduced dtype but bool with SUM/PRODUCT/MIN/MAX (AVG: floats),
    declines everything else having done nothing; its results are the general path's."""
    tc = comm1._load_tensor_calls()
    assert tc and tc.on and comm1._tensor_calls is tc
    for dt in TORCH_DTYPES[:-1]:
        for n in (0, 1, 1000):
            t = torch.arange(n).to(dt)
            for op in (0, 1, 2, 3) + ((4,) if dt.is_floating_point else ()):
                assert tc.all_reduce(t, None, op) is True
                assert torch.equal(t, torch.arange(n).to(dt)), (dt, n, op)
                o = torch.empty(n, dtype=dt)
                assert tc.all_reduce(t, o, op) is True                     # out of place
                assert torch.equal(o, torch.arange(n).to(dt)), (dt, n, op)
            assert tc.broadcast(t, 0) is True
            assert torch.equal(t, torch.arange(n).to(dt))
    declined = [torch.ones(3, dtype=torch.bool), torch.ones(10)[::2], torch.ones(4, 4).t(),
                torch.ones(3).to_sparse(), torch.ones(3, dtype=torch.int16), torch.empty(3, device="meta"),
                np.ones(3, np.float32), [1.0], None]
    f, i = torch.ones(4), torch.ones(4, dtype=torch.int32)
    for x in declined:
        assert tc.all_reduce(x, None, 0) is False, x
        assert tc.broadcast(x, 0) is False, x
        if x is not None:
            assert tc.all_reduce(f, x, 0) is False, x                  # not an output it takes
    for out in (torch.ones(5), torch.ones(4, dtype=torch.float64)):   # another size or dtype
        assert tc.all_reduce(f, out, 0) is False
    for op in (-1, 5, 6, 7, 8, 99):
        assert tc.all_reduce(f, None, op) is False
    assert tc.all_reduce(i, None, 4) is False                          # AVG on an integer dtype
    buf = torch.zeros(16)
    with pytest.raises(ringcomm.InvalidArgumentError, match="overlap partially"):
        tc.all_reduce(buf[0:8], buf[4:12], 0)                          # taken, refused by the core
    with pytest.raises(ringcomm.InvalidArgumentError, match="root"):   # the core checks the root
        tc.broadcast(f, 1)
    # The general path's refusals are unchanged with TensorCalls in use.
    with pytest.raises(ringcomm.UnsupportedError, match="AVG"):
        comm1.all_reduce(i, op=ringcomm.ReduceOp.AVG)
    b = torch.tensor([True, False])
    comm1.all_reduce(b, op=ringcomm.ReduceOp.MAX)                      # bool: the Python path
    assert torch.equal(b, torch.tensor([True, False]))
    comm1.close()
    assert comm1._tensor_calls is False                                # the handle is dropped
    with pytest.raises(ringcomm.ClosedError):
        tc.all_reduce(f, None, 0)                                      # a kept reference raises
    with pytest.raises(ringcomm.ClosedError):
        comm1.all_reduce(torch.ones(4))


def test_tensor_calls_refuse_a_foreign_table(built_extension):
    """A table of another version, or none, leaves TensorCalls off (it then takes nothing)."""
    bogus = np.zeros(8, np.uint32)                                     # version 0
    tc = built_extension.TensorCalls(bogus.ctypes.data, 0)
    assert not tc.on
    assert tc.all_reduce(torch.ones(2), None, 0) is False
    assert built_extension.TensorCalls(0, 0).on is False
