"""The CUDA path's bookkeeping, checked on the host (no GPU, no CUDA build needed).

- Pinned / IPC-mapped range ownership (csrc/transport/pin_registry.h through ringcomm._C_test.PinRegistry):
  what a drained close releases, what a non-drained close retires, and that a later claim never
  gets a retired (or foreign, or another owner's) range; against an independent interval model.
- The Python guards of arrays used on another stream (ringcomm.cuda.inflight and the CUDA
  communicator's issuing methods, driven over a fake core): record_stream is called with the
  right stream for every send/recv and every collective given ``stream=``, and every array stays
  referenced until its work is over on the GPU.
The same properties on a real GPU: tests/test_cuda_reliability.py.
"""
import gc
import random
import weakref

import pytest

import ringcomm
from ringcomm import _C, _C_test
from ringcomm.cuda import communicator as cuda_comm
from ringcomm.cuda.buffers import CudaBuf
from ringcomm.cuda.inflight import InflightRefs, StreamGuard

PAGE = 4096


# ================= pinned-range ownership =================

def test_claim_held_and_conflicting_owner():
    r = _C_test.PinRegistry()
    a, b = r.new_owner(), r.new_owner()
    assert a != b and a != 0 and b != 0
    assert r.claim(a, 10 * PAGE, 2 * PAGE) == "fresh"
    assert r.claim(a, 10 * PAGE, 2 * PAGE) == "held"          # the same range again: reuse
    with pytest.raises(ringcomm.RingcommError, match="overlaps"):
        r.claim(b, 11 * PAGE, PAGE)                           # inside a's range
    with pytest.raises(ringcomm.RingcommError, match="overlaps"):
        r.claim(a, 10 * PAGE, PAGE)                           # a itself, as another range
    with pytest.raises(ringcomm.RingcommError, match="overlaps"):
        r.claim(a, 10 * PAGE, 2 * PAGE, "ipc")                # a itself, as another kind
    assert r.claim(b, 12 * PAGE, PAGE) == "fresh"             # adjacent: free
    assert [(x["begin"], x["owner"], x["state"]) for x in r.ranges()] == [(10 * PAGE, a, "live"),
                                                                         (12 * PAGE, b, "live")]


def test_drained_close_releases_and_the_pages_may_be_claimed_again():
    r = _C_test.PinRegistry()
    a = r.new_owner()
    r.claim(a, 0x10000, PAGE)
    r.claim(a, 0x20000, 4 * PAGE, "ipc")
    out = r.settle(a, drained=True)                           # the caller unregisters / closes these
    assert [(x["begin"], x["bytes"], x["kind"]) for x in out] == [(0x10000, PAGE, "host"),
                                                                 (0x20000, 4 * PAGE, "ipc")]
    assert r.ranges() == [] and r.retired_bytes() == 0
    b = r.new_owner()
    assert r.claim(b, 0x10000, PAGE) == "fresh"


def test_non_drained_close_retires_and_no_later_owner_gets_the_pages():
    r = _C_test.PinRegistry()
    a = r.new_owner()
    r.claim(a, 100 * PAGE, 4 * PAGE)
    r.claim(a, 200 * PAGE, 2 * PAGE, "ipc")
    assert r.settle(a, drained=False) == []                   # nothing to unregister: all stays
    assert {x["state"] for x in r.ranges()} == {"retired"}
    assert r.retired_bytes() == 6 * PAGE
    b = r.new_owner()
    for begin, n in [(100 * PAGE, 4 * PAGE), (99 * PAGE, 2 * PAGE), (103 * PAGE, 8 * PAGE),
                     (101 * PAGE, PAGE), (90 * PAGE, 20 * PAGE), (201 * PAGE, PAGE)]:
        with pytest.raises(ringcomm.RingcommError, match="retired"):
            r.claim(b, begin, n)
    with pytest.raises(ringcomm.RingcommError, match="retired"):
        r.claim(a, 100 * PAGE, 4 * PAGE)                      # not even by its former owner
    assert r.claim(b, 104 * PAGE, PAGE) == "fresh"            # the next page is free
    assert r.release(a) == [] and r.settle(a, drained=True) == []   # retired ranges never come back
    assert r.retired_bytes() == 6 * PAGE


def test_foreign_registration_is_refused_and_forgotten():
    r = _C_test.PinRegistry()
    a = r.new_owner()
    assert r.claim(a, 5 * PAGE, PAGE) == "fresh"
    with pytest.raises(ringcomm.RingcommError, match="already registered"):
        r.reject_foreign(a, 5 * PAGE, PAGE)
    assert r.ranges() == []
    r.claim(a, 6 * PAGE, PAGE)
    b = r.new_owner()
    r.drop(b, 6 * PAGE)                                       # not b's: no effect
    assert len(r.ranges()) == 1
    r.drop(a, 6 * PAGE)
    assert r.ranges() == []


def test_bad_claims_raise_invalid_argument():
    r = _C_test.PinRegistry()
    with pytest.raises(ringcomm.InvalidArgumentError):
        r.claim(0, PAGE, PAGE)
    with pytest.raises(ringcomm.InvalidArgumentError):
        r.claim(r.new_owner(), PAGE, 0)
    with pytest.raises(ringcomm.InvalidArgumentError):
        r.claim(r.new_owner(), PAGE, PAGE, "device")


class _Model:
    """An independent model of the registry: a plain list of intervals."""

    def __init__(self):
        self.ranges = []      # dicts like ranges()

    def claim(self, owner, begin, n, kind):
        for x in self.ranges:
            if x["begin"] < begin + n and begin < x["begin"] + x["bytes"]:
                if (x["owner"], x["state"], x["begin"], x["bytes"], x["kind"]) == (owner, "live", begin, n, kind):
                    return "held"
                return "error"
        self.ranges.append(dict(begin=begin, bytes=n, kind=kind, owner=owner, state="live"))
        return "fresh"

    def settle(self, owner, drained):
        mine = [x for x in self.ranges if x["owner"] == owner and x["state"] == "live"]
        if drained:
            self.ranges = [x for x in self.ranges if x not in mine]
            return sorted(mine, key=lambda x: x["begin"])
        for x in mine:
            x["state"] = "retired"
        return []

    def drop(self, owner, begin):
        self.ranges = [x for x in self.ranges
                       if not (x["owner"] == owner and x["state"] == "live" and x["begin"] == begin)]

    def snapshot(self):
        return sorted(self.ranges, key=lambda x: x["begin"])


@pytest.mark.parametrize("seed", range(6))
def test_registry_matches_an_interval_model(seed):
    rng = random.Random(seed)
    r, m = _C_test.PinRegistry(), _Model()
    owners = [r.new_owner() for _ in range(4)]
    for _ in range(400):
        owner = rng.choice(owners)
        what = rng.random()
        if what < 0.7:
            begin, n = rng.randrange(64) * PAGE, rng.randint(1, 4) * PAGE
            kind = rng.choice(["host", "host", "ipc"])
            want = m.claim(owner, begin, n, kind)
            try:
                got = r.claim(owner, begin, n, kind)
            except ringcomm.RingcommError:
                got = "error"
            assert got == want, (begin, n, kind)
        elif what < 0.85:
            drained = rng.random() < 0.5
            assert r.settle(owner, drained) == m.settle(owner, drained)
            if rng.random() < 0.5:          # a closed owner never comes back: a new one takes its place
                owners[owners.index(owner)] = r.new_owner()
        else:
            begin = rng.randrange(64) * PAGE
            r.drop(owner, begin)
            m.drop(owner, begin)
        assert r.ranges() == m.snapshot()
    assert r.retired_bytes() == sum(x["bytes"] for x in m.ranges if x["state"] == "retired")


# ================= arrays used on another stream =================

class FakeTensor:
    """Looks like a torch tensor to the guards (module torch.*, record_stream)."""
    __module__ = "torch.fake"

    def __init__(self, log, addr, n):
        self.log, self.addr, self.n, self.lib = log, addr, n, "torch"

    def record_stream(self, s):
        self.log.append((self.addr, s))


class FakeCupy:
    """A CuPy-like array: no record_stream, only a reference protects it."""
    __module__ = "cupy_fake"

    def __init__(self, addr, n):
        self.addr, self.n, self.lib = addr, n, "cupy"


class FakeTorchStream:
    __module__ = "torch.cuda.streams"

    def __init__(self, handle):
        self.cuda_stream = handle


class FakeWork:
    def __init__(self, op):
        self.op, self.done, self.code, self.seq = op, False, -1, 0

    def wait(self, timeout=-1.0):
        self.done = True

    def is_completed(self):
        return self.done

    def error_code(self):
        return self.code if self.done else -1

    def error_message(self):
        return ""

    def source(self):
        return 1


class FakeCore:
    """The CUDA core's Python surface, recording every call (rank 0 of 2, device 0)."""
    P2P = 0xABC000

    def __init__(self):
        self.rank, self.world_size, self.device, self.timeout = 0, 2, 0, 30.0
        self.closed = False
        self.works = []
        self.p2p_stream = self.P2P
        self.idle = False

    def p2p_idle(self):
        return self.idle

    def stream_capturing(self, stream):
        return False  # capture is tested over the fake CUDA runtime (tests/test_cuda_fake.py)

    def reject(self, code):
        raise AssertionError("no call in these tests is rejected")

    def close(self):
        self.closed = True

    def __getattr__(self, name):
        if name in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier", "all_to_all",
                    "gather", "scatter", "send", "recv"):
            def call(*args):
                w = FakeWork(name)
                self.works.append(w)
                return w
            return call
        raise AttributeError(name)


CURRENT = 0x5000     # the fake "current stream" of every array


@pytest.fixture
def fake(monkeypatch):
    log = []

    def adapt(x, what="array"):
        return CudaBuf(x, x.addr, x.n, "float32", 0, x.n * 4, True, 0, x.lib)

    monkeypatch.setattr(cuda_comm, "as_cuda_buf", adapt)
    monkeypatch.setattr(cuda_comm, "current_stream", lambda b, device: CURRENT)
    core = FakeCore()
    comm = cuda_comm.CudaCommunicator(core, "test")
    made = []

    def make_stream(handle, device):
        made.append((handle, device))
        return ("stream", handle, device)

    comm._guard._make_stream = make_stream
    comm._stream_idle = lambda s: core.idle
    return comm, core, log, made


_addr = iter(range(0x100000, 1 << 40, 0x10000))


def _arrays(log, lib, *counts):
    if lib == "torch":
        return [FakeTensor(log, next(_addr), n) for n in counts]
    return [FakeCupy(next(_addr), n) for n in counts]


# Every call that runs on a stream other than the caller's current one: (name, array counts,
# how to issue it given the arrays and a stream argument). stream=None for send/recv: they run on
# the internal stream whatever the caller passes.
def _calls():
    return [
        ("all_reduce", (8,), lambda c, a, s: c.all_reduce(a[0], async_op=True, stream=s)),
        ("all_reduce out", (8, 8), lambda c, a, s: c.all_reduce(a[0], output=a[1], async_op=True, stream=s)),
        ("reduce_scatter", (4, 8), lambda c, a, s: c.reduce_scatter(a[0], a[1], async_op=True, stream=s)),
        ("all_gather", (16, 8), lambda c, a, s: c.all_gather(a[0], a[1], async_op=True, stream=s)),
        ("broadcast", (8,), lambda c, a, s: c.broadcast(a[0], root=1, async_op=True, stream=s)),
        ("reduce", (8,), lambda c, a, s: c.reduce(a[0], root=0, async_op=True, stream=s)),
        ("reduce out", (8, 8), lambda c, a, s: c.reduce(a[0], root=0, output=a[1], async_op=True, stream=s)),
        ("all_to_all", (8, 8), lambda c, a, s: c.all_to_all(a[0], a[1], async_op=True, stream=s)),
        ("gather", (16, 8), lambda c, a, s: c.gather(a[0], a[1], root=0, async_op=True, stream=s)),
        ("scatter", (8, 16), lambda c, a, s: c.scatter(a[0], a[1], root=0, async_op=True, stream=s)),
        ("all_reduce sync", (8,), lambda c, a, s: c.all_reduce(a[0], stream=s)),
    ]


def _p2p_calls():
    return [
        ("isend", lambda c, a: c.send(a[0], 1, async_op=True)),
        ("irecv", lambda c, a: c.recv(a[0], 1, async_op=True)),
        ("isend tagged on a stream", lambda c, a: c.send(a[0], 1, async_op=True, tag=3, stream=0x7777)),
        ("irecv any source", lambda c, a: c.recv(a[0], None, async_op=True)),
        ("send sync", lambda c, a: c.send(a[0], 1)),
        ("recv sync", lambda c, a: c.recv(a[0], 1)),
    ]


def _alive(refs):
    gc.collect(0)   # the arrays die by reference count; a young-generation pass takes any cycle among them
    return [r() is not None for r in refs]


@pytest.mark.parametrize("lib", ["torch", "cupy"])
@pytest.mark.parametrize("given", ["int", "torch-object"])
@pytest.mark.parametrize("case", range(len(_calls())), ids=[c[0] for c in _calls()])
def test_collective_on_a_given_stream_is_guarded(fake, case, given, lib):
    comm, core, log, made = fake
    name, counts, issue = _calls()[case]
    handle = 0x7000 + case
    stream = handle if given == "int" else FakeTorchStream(handle)
    arrays = _arrays(log, lib, *counts)
    refs = [weakref.ref(a) for a in arrays]
    h = issue(comm, arrays, stream)
    want = ("stream", handle, 0) if given == "int" else stream
    if lib == "torch":
        # Every torch array of the call, once, with the stream the work runs on.
        assert sorted(log, key=lambda e: e[0]) == sorted([(a.addr, want) for a in arrays], key=lambda e: e[0])
    else:
        assert log == []
    assert made == ([(handle, 0)] if (given == "int" and lib == "torch") else [])
    del arrays, h
    w = core.works[-1]
    if name.endswith("sync"):
        assert not w.done
    assert _alive(refs) == [True] * len(refs)          # work not over: the arrays are held
    w.done = True
    comm._guard.refs.prune()
    assert _alive(refs) == [False] * len(refs)         # over: let go


@pytest.mark.parametrize("lib", ["torch", "cupy"])
@pytest.mark.parametrize("case", range(len(_p2p_calls())), ids=[c[0] for c in _p2p_calls()])
def test_send_recv_are_guarded_on_the_internal_stream(fake, case, lib):
    comm, core, log, made = fake
    name, issue = _p2p_calls()[case]
    arrays = _arrays(log, lib, 8)
    refs = [weakref.ref(a) for a in arrays]
    issue(comm, arrays)
    if lib == "torch":
        assert log == [(arrays[0].addr, ("stream", FakeCore.P2P, 0))]
        assert made == [(FakeCore.P2P, 0)]
    else:
        assert log == [] and made == []
    del arrays
    w = core.works[-1]
    if "sync" in name:
        assert w.done          # the call waited
    else:
        assert not w.done
        assert _alive(refs) == [True]
        w.done = True
    comm._guard.refs.prune()
    assert _alive(refs) == [False]


def test_failed_work_is_held_until_its_stream_drains(fake):
    comm, core, log, made = fake
    x, y = _arrays(log, "cupy", 8, 8)
    rx, ry = weakref.ref(x), weakref.ref(y)
    comm.send(x, 1, async_op=True)
    comm.all_reduce(y, async_op=True, stream=0x9000)
    del x, y
    for w in core.works:
        w.done, w.code = True, 2          # failed: no fence proves the GPU is done
    comm._guard.refs.prune()
    assert _alive([rx, ry]) == [True, True]
    core.idle = True                      # both streams drained (p2p_idle / _stream_idle)
    comm._guard.refs.prune()
    assert _alive([rx, ry]) == [False, False]


def test_calls_on_the_current_stream_hold_nothing(fake):
    comm, core, log, made = fake
    x, y = _arrays(log, "torch", 8, 8)
    rx = weakref.ref(x)
    comm.all_reduce(x, async_op=True)
    comm.all_gather(_arrays(log, "torch", 16)[0], y, async_op=True)
    assert log == [] and made == [] and len(comm._guard.refs) == 0
    del x
    assert _alive([rx]) == [False]        # stream order protects it: nothing keeps it


def test_one_torch_stream_object_per_handle(fake):
    comm, core, log, made = fake
    for _ in range(3):
        comm.send(_arrays(log, "torch", 4)[0], 1, async_op=True)
        comm.all_reduce(_arrays(log, "torch", 4)[0], async_op=True, stream=0x6000)
    assert made == [(FakeCore.P2P, 0), (0x6000, 0)]
    assert len(log) == 6


def test_new_calls_and_close_prune_completed_entries(fake):
    comm, core, log, made = fake
    x = _arrays(log, "cupy", 8)[0]
    rx = weakref.ref(x)
    comm.send(x, 1, async_op=True)
    del x
    core.works[-1].done = True
    comm.recv(_arrays(log, "cupy", 8)[0], 1, async_op=True)   # issuing prunes
    assert _alive([rx]) == [False]
    assert len(comm._guard.refs) == 1
    core.works[-1].done = True
    comm.close()
    assert len(comm._guard.refs) == 0


def test_inflight_refs_alone():
    refs = InflightRefs()
    w = FakeWork("x")
    refs.hold(w, (None,), lambda: True)   # nothing to hold
    refs.hold(None, (object(),), lambda: True)
    assert len(refs) == 0
    o = FakeCupy(1, 1)
    refs.hold(w, (o, None), lambda: False)
    assert refs.prune() == 1
    w.done = True
    assert refs.prune() == 0


def test_stream_guard_uses_torch_external_stream_by_default(monkeypatch):
    from ringcomm.cuda import inflight
    calls = []
    monkeypatch.setattr(inflight, "torch_stream", lambda h, d: calls.append((h, d)) or ("ext", h, d))
    g = StreamGuard(3)
    log = []
    t = FakeTensor(log, 1, 1)
    g.guard(FakeWork("send"), (t,), 0x42, lambda: False)
    assert calls == [(0x42, 3)] and log == [(1, ("ext", 0x42, 3))]
