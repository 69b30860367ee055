"""The synchronous all_reduce and broadcast entries (csrc/comm/sync_entry.h) as the host API uses
them: numpy arrays and torch CPU tensors take one C++ call that describes them and runs the
collective (bindings/sync_py.cpp). What the entry takes must give exactly the general path's
results; what it does not take must reach the general path, which refuses or runs it as before.
Checked on a world of one (the binding's answer itself) and across processes against numpy, with
ranks on different paths in the same collective."""
import numpy as np
import pytest

import ringcomm
from ringcomm.core.launch import launch

torch = pytest.importorskip("torch")   # the general path's second array type

TAKEN = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64, np.bool_]


@pytest.mark.parametrize("dt", TAKEN)
def test_binding_takes_native_contiguous_writable_arrays(comm1, dt):
    for n in (0, 1, 1000):
        x = np.ones(n, dt)
        assert comm1._c.sync_all_reduce(x, None, 0 if dt is not np.bool_ else 3) is True
        assert np.array_equal(x, np.ones(n, dt))
        y = np.zeros(n, dt)
        assert comm1._c.sync_all_reduce(x, y, 3) is True                  # MAX, out of place
        assert np.array_equal(y, np.ones(n, dt))
        assert comm1._c.sync_broadcast(x, 0) is True


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
    assert comm1._c.sync_all_reduce(x, None, 0) is False
    assert comm1._c.sync_all_reduce(np.ones(x.size, np.float32), x, 0) is False
    assert comm1._c.sync_broadcast(x, 0) is False


def test_binding_declines_read_only_and_unsupported_ops(comm1):
    x = np.ones(10, np.float32)
    x.flags.writeable = False
    assert comm1._c.sync_all_reduce(x, None, 0) is False
    assert comm1._c.sync_broadcast(x, 0) is False
    f = np.ones(4, np.float32)
    assert comm1._c.sync_all_reduce(f, None, 5) is False                  # BAND on float
    assert comm1._c.sync_all_reduce(np.ones(3, bool), None, 0) is False   # SUM on bool
    assert comm1._c.sync_all_reduce(f, None, 99) is False
    assert comm1._c.sync_all_reduce(f, None, -1) is False
    assert comm1._c.sync_all_reduce([1.0, 2.0], None, 0) is False         # not a buffer
    assert comm1._c.sync_all_reduce(f, np.ones(4, np.float64), 0) is False  # dtypes differ
    assert comm1._c.sync_all_reduce(f, np.ones(5, np.float32), 0) is False  # sizes differ
    for root in (1, -1, 2 ** 70, True, 0.0, "0"):                          # not a rank of one
        assert comm1._c.sync_broadcast(f, root) is False


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


@pytest.mark.parametrize("op", [True, False, 1.0, 0.0, np.ones(2), [0], {"op": 0}, None, "nope"],
                         ids=lambda o: type(o).__name__ + (f"-{o}" if not hasattr(o, "__len__") else ""))
def test_values_that_are_not_ops_are_refused_on_every_path(comm1, op):
    # A bool or a float equals an op's code (True == PRODUCT's 1) and an array or a list is not
    # hashable: neither may reach the op tables' lookups. Every op-taking call refuses them by name.
    x = np.ones(4, np.float32)
    calls = (lambda: comm1.all_reduce(x, op), lambda: comm1.all_reduce(x, op, output=np.empty_like(x)),
             lambda: comm1.all_reduce(x, op, async_op=True), lambda: comm1.reduce(x, 0, op),
             lambda: comm1.reduce_scatter(np.empty_like(x), x, op), lambda: comm1.general().all_reduce(x, op))
    for call in calls:
        with pytest.raises(ringcomm.InvalidArgumentError, match="unknown reduce op"):
            call()
    assert np.array_equal(x, np.ones(4, np.float32))                     # nothing ran


@pytest.mark.parametrize("op", [ringcomm.ReduceOp.MAX, 3, np.int64(3), np.uint8(3), "max", "MAX"],
                         ids=lambda o: type(o).__name__)
def test_every_spelling_of_an_op_is_taken(comm1, op):
    x = np.arange(4, dtype=np.float32)
    comm1.all_reduce(x, op)
    comm1.reduce(x, 0, op)
    assert np.array_equal(x, np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("root", [np.int64(0), np.int32(0), np.uint8(0)], ids=lambda r: type(r).__name__)
def test_numpy_integer_roots_are_ranks(comm1, root):
    x = np.arange(4, dtype=np.float32)
    comm1.broadcast(x, root)
    comm1.broadcast(x, root, async_op=True).wait()
    comm1.reduce(x, root)
    out = np.zeros(4, np.float32)
    comm1.gather(out, x, root)
    back = np.zeros(4, np.float32)
    comm1.scatter(back, out, root)
    assert np.array_equal(back, np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("root", [True, 0.0, "0", None, [0]], ids=lambda r: type(r).__name__)
def test_roots_that_are_not_integers_are_named(comm1, root):
    x = np.ones(4, np.float32)
    for call in (lambda: comm1.broadcast(x, root), lambda: comm1.reduce(x, root),
                 lambda: comm1.gather(np.zeros(4, np.float32), x, root)):
        with pytest.raises(ringcomm.InvalidArgumentError, match="is not a rank: pass an integer"):
            call()


def test_entries_are_builtins_bound_to_their_communicator(comm1):
    f = comm1._c.sync_all_reduce
    x = np.ones(4, np.float32)
    assert f(x, None, 0) is True and np.array_equal(x, np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"sync_all_reduce\(x, out, op\) takes 3 positional arguments, 1 given"):
        f(x)
    with pytest.raises(TypeError, match="takes 2 to 4 positional arguments, 5 given"):
        comm1._c.sync_all_to_all(x, x, None, None, None)
    out = np.zeros(4, np.float32)
    assert comm1._c.sync_all_to_all(out, x) is True and np.array_equal(out, x)   # even splits by default
    assert f(x, None, True) is False                                # a bool is not an op code
    assert comm1._c.sync_barrier() is True
    comm1.close()
    with pytest.raises(ringcomm.ClosedError):                       # the error table's class
        f(x, None, 0)


def test_closed_raises(comm1):
    comm1.close()
    with pytest.raises(ringcomm.ClosedError):
        comm1.all_reduce(np.ones(4, np.float32))


def _ranks_mixed_paths(comm):
    import torch

    from sync_entry_cases import EntrySpy
    r, n = comm.rank, comm.world_size
    wrong = []
    calls = 0                                   # synchronous calls this rank made
    spy = EntrySpy(comm).__enter__()            # records what the synchronous entries ran
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
                calls += r <= 2
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
                calls += r <= 1
                if r == 0:
                    comm.broadcast(x, root=root)                     # the numpy fast path
                elif r == 1:
                    comm.broadcast(torch.from_numpy(x), root=root)   # the torch fast path
                else:
                    comm.broadcast(x, root=root, async_op=True).wait()   # the general path
                if x.tobytes() != src.tobytes():
                    wrong.append(("broadcast", np.dtype(dt).name, count, root))
    spy.__exit__()
    taken = spy.taken()
    entry_calls = taken["all_reduce"] + taken["broadcast"]
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
    return wrong, outcome, bool((y == n * (n + 1) / 2).all()), (entry_calls, calls)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_fast_and_general_paths_agree_across_ranks(world):
    res = launch(_ranks_mixed_paths, world, timeout=280)
    for r, (wrong, outcome, after, (entry_calls, calls)) in enumerate(res):
        assert not wrong, (r, wrong[:10])
        assert entry_calls == calls, (r, entry_calls, calls)     # every synchronous call: the entry
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
