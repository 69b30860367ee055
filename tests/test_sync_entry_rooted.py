"""The synchronous entries of reduce, all_to_all (even or given split sizes), gather, scatter and barrier
(csrc/comm/sync_entry.h, bindings/sync_py.cpp) as the plain API uses them: the public call of a
host communicator takes the C++ entry (EntrySpy sees the offer and the entry's True; the core
issued exactly one collective), what the entry takes gives the general path's results bit for
bit, and what it declines reaches the general path, whose error (type and message) is the one a
caller gets, as before the entries existed."""
import numpy as np
import pytest

import ringcomm
from ringcomm.core import tables
from sync_entry_cases import EntrySpy, issued


def test_entries_run_what_they_take_and_nothing_else(comm1):
    x, y = np.ones(6, np.float32), np.zeros(6, np.float32)
    taken = [
        lambda: comm1._c.sync_reduce(x, None, 0, 0),
        lambda: comm1._c.sync_reduce(x, y, int(tables.ReduceOp.MAX), 0),
        lambda: comm1._c.sync_all_to_all(y, x),
        lambda: comm1._c.sync_all_to_all(y, x, [6], [6]),                        # split sizes given
        lambda: comm1._c.sync_all_to_all(y, x, (6,), None),
        lambda: comm1._c.sync_gather(y, x, 0),
        lambda: comm1._c.sync_scatter(y, x, 0),
        lambda: comm1._c.sync_barrier(),
    ]
    for i, f in enumerate(taken):
        assert issued(comm1, f) == (True, 1), i
    ro = np.ones(6, np.float32)
    ro.flags.writeable = False
    declined = [
        lambda: comm1._c.sync_reduce(x, None, 0, 1),                             # root not a rank
        lambda: comm1._c.sync_reduce(x, None, 0, True),                          # root a bool
        lambda: comm1._c.sync_reduce(x, None, 0, -1),
        lambda: comm1._c.sync_reduce(x, None, int(tables.ReduceOp.BAND), 0),     # op of another kind
        lambda: comm1._c.sync_reduce(ro, None, 0, 0),                            # in place, read-only
        lambda: comm1._c.sync_reduce(x, np.zeros(5, np.float32), 0, 0),          # sizes differ
        lambda: comm1._c.sync_reduce(x, np.zeros(6, np.float64), 0, 0),          # dtypes differ
        lambda: comm1._c.sync_reduce(x[::2], None, 0, 0),                        # not compact
        lambda: comm1._c.sync_all_to_all(ro, x),
        lambda: comm1._c.sync_all_to_all(np.zeros(6, np.int32), x),
        lambda: comm1._c.sync_all_to_all(x, x),                                  # overlapping
        lambda: comm1._c.sync_all_to_all(y, [1.0] * 6),                          # not an array
        lambda: comm1._c.sync_all_to_all(y, x, [6], [5]),                        # sizes do not sum
        lambda: comm1._c.sync_all_to_all(y, x, [6, 0], [6, 0]),                  # not world sizes
        lambda: comm1._c.sync_all_to_all(y, x, [True], None),                    # a bool
        lambda: comm1._c.sync_all_to_all(y, x, np.array([6]), None),             # not a list
        lambda: comm1._c.sync_all_to_all(y, x, [2**70], None),                   # over int64
        lambda: comm1._c.sync_all_to_all(y, x, None, [-1]),
        lambda: comm1._c.sync_gather(None, x, 0),                                # the root's output
        lambda: comm1._c.sync_gather(np.zeros(7, np.float32), x, 0),
        lambda: comm1._c.sync_gather(ro, x, 0),
        lambda: comm1._c.sync_gather(y, x, 1),
        lambda: comm1._c.sync_scatter(y, None, 0),                               # the root's input
        lambda: comm1._c.sync_scatter(ro, x, 0),
        lambda: comm1._c.sync_scatter(y, np.ones(6, np.float16), 0),
        lambda: comm1._c.sync_scatter(y, x, 2**40),
    ]
    for i, f in enumerate(declined):
        assert issued(comm1, f) == (False, 0), i


def test_public_calls_take_the_entry(comm1):
    torch = pytest.importorskip("torch")
    for wrap in (np.asarray, torch.from_numpy):
        x, y = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
        with EntrySpy(comm1) as spy:
            before = comm1._c.next_seq()
            comm1.reduce(wrap(x), root=0)
            comm1.reduce(wrap(x), root=0, op=ringcomm.ReduceOp.MAX, output=wrap(y))
            comm1.all_to_all(wrap(y), wrap(x))
            comm1.gather(wrap(y), wrap(x), root=0)
            comm1.scatter(wrap(y), wrap(x), root=0)
            comm1.barrier()
            assert comm1._c.next_seq() - before == 6
        assert spy.offers == [("reduce", True), ("reduce", True), ("all_to_all", True), ("gather", True),
                              ("scatter", True), ("barrier", True)], wrap
        assert (y == x).all()
    with EntrySpy(comm1) as spy:
        comm1.all_to_all(y, x, output_splits=[8], input_splits=[8])      # split sizes: offered too
        comm1.all_to_all(y, x, output_splits=np.array([8]))             # declined: not a list
        assert spy.offers == [("all_to_all", True), ("all_to_all", False)]
    # What the entry is not offered: asynchronous calls.
    with EntrySpy(comm1) as spy:
        comm1.reduce(x, async_op=True).wait()
        comm1.all_to_all(y, x, async_op=True).wait()
        comm1.barrier(async_op=True).wait()
        assert spy.offers == []


def test_general_path_never_offers_the_new_entries(comm1):
    x, y = np.ones(6, np.float32), np.zeros(6, np.float32)
    g = comm1.general()
    with EntrySpy(comm1) as spy:
        before = comm1._c.next_seq()
        g.reduce(x, root=0)
        g.all_to_all(y, x)
        g.gather(y, x, root=0)
        g.scatter(y, x, root=0)
        g.barrier()
        assert spy.offers == [] and comm1._c.next_seq() - before == 5


def _error(f):
    try:
        f()
    except ringcomm.RingcommError as e:
        return type(e), str(e)
    return None


def test_declined_calls_raise_the_general_paths_errors(comm1):
    """Each call below is declined by its entry (or not offered) and raises; the error is the
    general path's (Communicator.general(), never offered), type and message."""
    f32, f64 = np.ones(4, np.float32), np.zeros(4, np.float64)
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    calls = [
        ("reduce", lambda c: c.reduce(f32, root=1)),
        ("reduce", lambda c: c.reduce(f32, root=True)),
        ("reduce", lambda c: c.reduce(f32, root=0, op=ringcomm.ReduceOp.BAND)),
        ("reduce", lambda c: c.reduce(f32, root=0, op="nope")),
        ("reduce", lambda c: c.reduce(ro, root=0)),
        ("reduce", lambda c: c.reduce(f32, root=0, output=f64)),
        ("reduce", lambda c: c.reduce(f32, root=0, output=np.zeros(5, np.float32))),
        ("reduce", lambda c: c.reduce(np.ones(8, np.float32)[::2], root=0)),
        ("reduce", lambda c: c.reduce(np.ones(4, np.complex64), root=0)),
        ("all_to_all", lambda c: c.all_to_all(f64, f32)),
        ("all_to_all", lambda c: c.all_to_all(ro, f32)),
        ("all_to_all", lambda c: c.all_to_all(np.zeros(5, np.float32), f32)),
        ("all_to_all", lambda c: c.all_to_all(np.zeros(8, np.float32)[::2], f32)),
        ("all_to_all", lambda c: c.all_to_all(f32.copy(), f32, output_splits=[3], input_splits=[4])),
        ("all_to_all", lambda c: c.all_to_all(f32.copy(), f32, output_splits=[4, 0])),
        ("all_to_all", lambda c: c.all_to_all(f32.copy(), f32, input_splits=[-1])),
        ("gather", lambda c: c.gather(None, f32, root=0)),
        ("gather", lambda c: c.gather(np.zeros(5, np.float32), f32, root=0)),
        ("gather", lambda c: c.gather(f64, f32, root=0)),
        ("gather", lambda c: c.gather(f32.copy(), f32, root=3)),
        ("scatter", lambda c: c.scatter(f32.copy(), None, root=0)),
        ("scatter", lambda c: c.scatter(ro, f32, root=0)),
        ("scatter", lambda c: c.scatter(f32.copy(), f64, root=0)),
        ("scatter", lambda c: c.scatter(f32.copy(), f32, root=-1)),
    ]
    for i, (name, call) in enumerate(calls):
        with EntrySpy(comm1) as spy:
            got = _error(lambda: call(comm1))
            assert all(answer is False for _, answer in spy.offers), (i, spy.offers)
        want = _error(lambda: call(comm1.general()))
        assert got is not None and got == want, (i, got, want)
        assert name in got[1], (i, got)
    x = np.ones(4, np.float32)
    x2 = np.zeros(4, np.float32)
    comm1.close()
    for name, call in [("reduce", lambda c: c.reduce(x, root=0)), ("all_to_all", lambda c: c.all_to_all(x2, x)),
                       ("gather", lambda c: c.gather(x2, x, root=0)), ("scatter", lambda c: c.scatter(x2, x, root=0)),
                       ("barrier", lambda c: c.barrier())]:
        got = _error(lambda: call(comm1))
        assert got is not None and got[0] is ringcomm.ClosedError, (name, got)
        assert got == _error(lambda: call(comm1.general())), (name, got)     # the same message
    with EntrySpy(comm1) as spy, pytest.raises(ringcomm.ClosedError):
        comm1.barrier()
    assert spy.offers == [("barrier", False)]                           # declined: closed


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_rooted_collectives_and_all_to_all_through_the_entry(world):
    pytest.importorskip("torch")
    from ringcomm.core.launch import launch
    from sync_entry_cases import rooted_and_all_to_all
    for r, (wrong, taken, calls, overlap, outcomes) in enumerate(launch(rooted_and_all_to_all, world, timeout=280)):
        assert wrong == [], (r, wrong[:10])
        assert taken == calls, (r, taken, calls)
        assert overlap == ([("all_to_all", False)], True), (r, overlap)
        last = r == world - 1
        assert outcomes == [("all_to_all", "InvalidArgumentError" if last else "mismatch"),
                            ("reduce", "UnsupportedError" if last else "mismatch"),
                            ("gather", "InvalidArgumentError" if last else "mismatch"),
                            ("scatter", "InvalidArgumentError" if last else "mismatch")], (r, outcomes)
