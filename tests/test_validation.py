"""The one set of argument and overlap rules (csrc/comm/validation.h) that every communicator
applies before its header exchange, checked on a one-rank host communicator (ringcomm._C) against
plain interval arithmetic: buffers that are equal or disjoint where a collective allows it run (and
give a world of one's result, the input itself); a partial overlap raises InvalidArgumentError
before any data moves, and the communicator stays usable."""
import numpy as np
import pytest

import ringcomm
from ringcomm import _C

F32 = 0
SUM = 0


@pytest.fixture
def comm():
    c = _C.Communicator(0, 1, 10.0)
    c.connect([c.create()])
    yield c
    c.close()


def _overlap(a, an, b, bn):
    return an > 0 and bn > 0 and a < b + bn and b < a + an


def _addr(x, k=0):
    return x.ctypes.data + 4 * k


@pytest.mark.parametrize("shift", [0, 1, 3, 8, 9, -3])
def test_all_reduce_and_reduce_overlap(comm, shift):
    n = 8
    base = np.arange(32, dtype=np.float32)
    src = 12
    ok = shift == 0 or not _overlap(src, n, src + shift, n)
    want = base[src:src + n].copy()
    for call in (lambda i, o: comm.all_reduce(i, o, n, F32, SUM, False),
                 lambda i, o: comm.reduce(i, o, n, F32, SUM, 0, False)):
        buf = base.copy()
        if ok:
            call(_addr(buf, src), _addr(buf, src + shift))
            assert np.array_equal(buf[src + shift:src + shift + n], want)
        else:
            with pytest.raises(ringcomm.InvalidArgumentError, match="overlap partially"):
                call(_addr(buf, src), _addr(buf, src + shift))
            assert np.array_equal(buf, base)  # nothing moved
    comm.barrier(False)  # still usable


@pytest.mark.parametrize("out_at", [0, 2, 8, 20])
def test_all_gather_overlap(comm, out_at):
    n = 8
    base = np.arange(40, dtype=np.float32)
    buf = base.copy()
    inp = 10
    # world 1: the output is the input; inside the output only as its own (first) block.
    allowed = out_at == inp or not _overlap(inp, n, out_at, n)
    if allowed:
        comm.all_gather(_addr(buf, inp), _addr(buf, out_at), n, n, F32, False)
        assert np.array_equal(buf[out_at:out_at + n], base[inp:inp + n])
    else:
        with pytest.raises(ringcomm.InvalidArgumentError, match="all_gather"):
            comm.all_gather(_addr(buf, inp), _addr(buf, out_at), n, n, F32, False)
    comm.barrier(False)


@pytest.mark.parametrize("shift", [0, 4, 8, -8, 30])
def test_reduce_scatter_gather_scatter_all_to_all_overlap(comm, shift):
    n = 8
    base = np.arange(64, dtype=np.float32)
    a = 20
    b = a + shift
    # reduce_scatter / gather / scatter at world 1: equal or disjoint; all_to_all: disjoint only.
    eq_or_disjoint = shift == 0 or not _overlap(a, n, b, n)
    disjoint = not _overlap(a, n, b, n)
    cases = [
        ("reduce_scatter", eq_or_disjoint, lambda: comm.reduce_scatter(_addr(buf, a), _addr(buf, b), n, F32, SUM, False)),
        ("gather", eq_or_disjoint, lambda: comm.gather(_addr(buf, a), _addr(buf, b), n, F32, 0, False)),
        ("scatter", eq_or_disjoint, lambda: comm.scatter(_addr(buf, a), _addr(buf, b), n, F32, 0, False)),
        ("all_to_all", disjoint, lambda: comm.all_to_all(_addr(buf, a), _addr(buf, b), [n], [n], F32, False)),
    ]
    for name, ok, call in cases:
        buf = base.copy()
        if ok:
            call()
            assert np.array_equal(buf[b:b + n], base[a:a + n]), name
        else:
            with pytest.raises(ringcomm.InvalidArgumentError, match=name):
                call()
            assert np.array_equal(buf, base), name
    comm.barrier(False)


def test_bad_arguments_reject(comm):
    x = np.zeros(4, np.float32)
    with pytest.raises(ringcomm.InvalidArgumentError, match="root 1 is out of range"):
        comm.broadcast(_addr(x), 4, F32, 1, False)
    with pytest.raises(ringcomm.InvalidArgumentError, match="negative element count"):
        comm.all_reduce(_addr(x), _addr(x), -1, F32, SUM, False)
    with pytest.raises(ringcomm.InvalidArgumentError, match="input buffer is null"):
        comm.all_reduce(0, _addr(x), 4, F32, SUM, False)
    with pytest.raises(ringcomm.InvalidArgumentError, match="split lists need 1 entries"):
        comm.all_to_all(_addr(x), _addr(x), [2, 2], [4], F32, False)
    seq = comm.next_seq()
    comm.barrier(False)
    assert comm.next_seq() == seq + 1
