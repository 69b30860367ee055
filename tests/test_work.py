"""ringcomm.Work: the one handle interface. Every handle class in the package derives from it,
and the handles a communicator returns answer it (single process: no peers needed)."""
import numpy as np
import pytest

import ringcomm
from ringcomm.core.work import CoreWork, WrappedWork


def test_every_handle_class_is_a_work():
    import ringcomm.cuda
    import ringcomm.hier.executor
    import ringcomm.hier.gloo_engine
    import ringcomm.hier.mpi_engine
    classes = [CoreWork, WrappedWork, ringcomm.cuda.Work, ringcomm.hier.HierWork,
               ringcomm.hier.gloo_engine.GlooWork, ringcomm.hier.mpi_engine.MPIWork]
    if pytest.importorskip("torch") is not None:
        from ringcomm.torch import work as tw
        classes += [tw.RingcommWork, tw.DoneWork, tw.MultiWork]
    for cls in classes:
        assert issubclass(cls, ringcomm.Work), cls


def test_host_handles_answer_the_interface():
    with ringcomm.init(rank=0, world_size=1) as comm:
        x = np.arange(6, dtype=np.float32)
        h = comm.all_reduce(x, async_op=True)
        assert isinstance(h, ringcomm.Work)
        assert h.result() is x and h.is_completed() and h.exception() is None
        assert comm.barrier(async_op=True).wait(timeout=10) is None
        assert comm.all_reduce(x) is None
        np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32))


class _Inner:
    def __init__(self, fail=None):
        self.waits, self.fail = [], fail

    def wait(self, *timeout):
        self.waits.append(timeout)
        if self.fail:
            raise self.fail
        return "inner result"

    def is_completed(self):
        return bool(self.waits)

    def exception(self):
        return self.fail


class _Counting(WrappedWork):
    __slots__ = ("after",)

    def __init__(self, inner):
        super().__init__(inner)
        self.after = 0

    def _after_wait(self):
        self.after += 1


def test_wrapped_work_waits_once_then_runs_its_step_once():
    inner = _Inner()
    w = _Counting(inner)
    assert not w.is_completed()
    assert w.wait(2.5) == "inner result" and w.wait() is None
    assert inner.waits == [(2.5,)] and w.after == 1 and w.is_completed()
    done = _Counting(None)
    assert done.is_completed() and done.wait() is None and done.after == 1


def test_wrapped_work_passes_the_inner_error_and_skips_its_step():
    err = ringcomm.PeerFailureError("peer died")
    w = _Counting(_Inner(err))
    with pytest.raises(ringcomm.PeerFailureError):
        w.wait()
    assert w.after == 0 and w.exception() is err
