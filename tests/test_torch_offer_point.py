"""The offer point of ringcomm's torch backend (bindings/torch/trampoline.cpp, ``Trampoline::offer``):
every torch door to a ringcomm group's synchronous entry reaches it, a call is offered to the entry
at most once (a declined one never again), and the Python half follows the answer C++ gives.

Offers are counted in the ranks with no counter of ringcomm's: the test hands the backend its own
RcFastApi table (``_set_fast_path``, the C ABI of ringcomm/abi.h), whose entries are ctypes
callbacks that record each offer and forward it to ringcomm._C's table, or decline it themselves
(a case the real entry would take, changed in C++: Python must follow); and it wraps the
communicator's binding (``Communicator._c``) to record what the Python half offers
(``sync_all_reduce``, ``sync_broadcast``, ``sync_reduce``, ``sync_all_to_all``; the trampoline also
offers gather, scatter, barrier and split all_to_all, which the Python half then never offers). Results are checked against the exact values."""
from __future__ import annotations

import ctypes
import inspect

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ranks import require_backend, run_ranks  # noqa: E402

_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ALL_REDUCE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t)
_BROADCAST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                              ctypes.c_void_p, ctypes.c_size_t)
_REDUCE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                           ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t)
_ALL_TO_ALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_size_t)
_ALL_TO_ALL_V = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), ctypes.c_int32,
                                 ctypes.c_void_p, ctypes.c_size_t)
_ROOTED_PAIR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                                ctypes.c_void_p, ctypes.c_size_t)   # gather, scatter
_BARRIER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
DONE, DECLINED = 0, -1   # RC_CALL_DONE, RC_CALL_DECLINED


class _Api(ctypes.Structure):
    """RcFastApi (ringcomm/abi.h)."""
    _fields_ = [("version", ctypes.c_uint32), ("size", ctypes.c_uint32), ("release", _RELEASE),
                ("all_reduce", _ALL_REDUCE), ("broadcast", _BROADCAST), ("reduce", _REDUCE),
                ("all_to_all", _ALL_TO_ALL), ("all_to_all_v", _ALL_TO_ALL_V), ("gather", _ROOTED_PAIR),
                ("scatter", _ROOTED_PAIR), ("barrier", _BARRIER)]


# What an offer logs of its arguments, per entry of RcFastApi the test's table records (every one
# after ``release``, in _Api's order), and per synchronous entry of the communicator's binding
# (``sync_<name>``) the Python half offers through.
_FAST_ENTRIES = {
    "all_reduce": lambda h, a, out, op, msg, n: op,
    "broadcast": lambda h, a, root, msg, n: root,
    "reduce": lambda h, a, out, op, root, msg, n: root,
    "all_to_all": lambda h, a, out, msg, n: None,
    "all_to_all_v": lambda h, a, out, sc, rc, n, msg, k: (list(sc[:n]), list(rc[:n])),
    "gather": lambda h, a, out, root, msg, n: root,
    "scatter": lambda h, a, out, root, msg, n: root,
    "barrier": lambda h, msg, n: None,
}
assert list(_FAST_ENTRIES) == [field[0] for field in _Api._fields_[3:]]
_SYNC_ENTRIES = {
    "all_reduce": lambda x, out, op: op,
    "broadcast": lambda x, root: root,
    "reduce": lambda x, out, op, root: root,
    "all_to_all": lambda out, x, out_splits=None, in_splits=None: None,
}


def _recorded(log: list, name: str, key, obj, attr: str, declined=lambda: False):
    """``obj.attr`` (looked up at each call), recording: a call takes ``key``'s arguments (its
    defaults filled in), answers DECLINED while ``declined()`` or else forwards them all, in order,
    and then appends (name, ``key`` of them, the answer) to ``log``."""
    sig = inspect.signature(key)

    def call(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        answer = DECLINED if declined() else getattr(obj, attr)(*bound.args)
        log.append((name, key(*bound.args), answer))
        return answer
    return call


class Offers:
    """An RcFastApi table for backend ``be`` that records every offer as (collective, op code or
    root, the answer) and forwards it to ringcomm._C's table, or declines it while ``decline``."""

    def __init__(self, be):
        from ringcomm import _C
        real = _Api.from_address(_C._fast_api())
        self.log: list = []
        self.decline = False
        proto = dict(_Api._fields_)
        self._fns = {name: proto[name](_recorded(self.log, name, key, real, name, lambda: self.decline))
                     for name, key in _FAST_ENTRIES.items()}   # alive while the table is
        self.table = _Api(real.version, ctypes.sizeof(_Api), real.release, **self._fns)
        self.be = be
        self.on = bool(be._set_fast_path(ctypes.addressof(self.table), be.communicator._c._fast_handle()))

    def restore(self):
        self.be._set_fast_path(*self.be.communicator.sync_entry_handle())


class Binding:
    """A communicator's ringcomm._C.Communicator, recording the Python half's offers."""

    def __init__(self, core):
        self._core = core
        self.log: list = []
        for name, key in _SYNC_ENTRIES.items():
            setattr(self, f"sync_{name}", _recorded(self.log, name, key, core, f"sync_{name}"))

    def __getattr__(self, name):
        return getattr(self._core, name)


def _values(rank, n=6, dtype=torch.float32):
    return torch.arange(n, dtype=dtype) + rank + 1


def _expect(world, n=6, dtype=torch.float32):
    return sum(_values(r, n, dtype) for r in range(world))


def _doors(rank, world):
    import ringcomm.torch
    from ringcomm.core import tables
    from ringcomm.torch import ops
    from ringcomm.torch.extension import load

    rc = dist.new_group(backend="ringcomm")
    be = rc._get_backend(torch.device("cpu"))
    comm = be.communicator
    ringcomm.torch.all_reduce_(torch.ones(2), rc)           # learns the group's direct call
    sum_code = tables.op_code("sum")
    fast = Offers(be)
    binding = comm._c = Binding(comm._c)
    real_all_reduce, dist_calls = dist.all_reduce, []

    def counting_all_reduce(*a, **k):
        dist_calls.append(1)
        return real_all_reduce(*a, **k)

    out = {"on": fast.on}

    def case(name, call, check):
        fast.log.clear()
        binding.log.clear()
        dist_calls.clear()
        ok = bool(call())
        out[name] = {"fast": list(fast.log), "binding": list(binding.log), "dist": len(dist_calls),
                     "ok": ok and bool(check())}

    def all_reduce_by(door, x):
        if door == "dist":
            real_all_reduce(x, group=rc)
        elif door == "function":
            ringcomm.torch.all_reduce_(x, rc)
        else:
            torch.ops.ringcomm.all_reduce_(x, rc.group_name, "sum")
        return True

    dist.all_reduce = counting_all_reduce
    try:
        doors = ("dist", "function", "op")
        # (a) each door, a call the entry takes: one offer, through the offer point
        for door in doors:
            x = _values(rank)
            case(f"taken/{door}", lambda: all_reduce_by(door, x), lambda: torch.equal(x, _expect(world)))
        y = _values(rank) if rank == 0 else torch.zeros(6)
        case("taken/broadcast", lambda: dist.broadcast(y, src=0, group=rc) or True,
             lambda: torch.equal(y, _values(0)))
        def a2a_in(n=2):
            return torch.arange(world * n, dtype=torch.float32) + 100 * rank

        def a2a_want(n=2):
            return torch.cat([torch.arange(rank * n, rank * n + n, dtype=torch.float32) + 100 * j
                              for j in range(world)])

        def reduce_want(n=6):
            return _expect(world, n) if rank == 0 else _values(rank, n)

        def rooted_cases(tag, contiguous):
            shape = (lambda t: t) if contiguous else (lambda t: t.reshape(3, 4).t())
            n = 6 if contiguous else 12
            r = shape(_values(rank, n))
            case(f"{tag}/reduce", lambda: dist.reduce(r, dst=0, group=rc) or True,
                 lambda: torch.equal(r, shape(reduce_want(n))))
            o = torch.zeros(2 * world) if contiguous else torch.zeros(2 * world, 2)[:, 0]
            i = a2a_in()
            case(f"{tag}/all_to_all", lambda: dist.all_to_all_single(o, i, group=rc) or True,
                 lambda: torch.equal(o, a2a_want()))
            g = shape(_values(rank, n))
            lst = [torch.zeros(n) for _ in range(world)] if rank == 0 else None
            case(f"{tag}/gather", lambda: dist.gather(g, gather_list=lst, dst=0, group=rc) or True,
                 lambda: rank != 0 or all(torch.equal(lst[p], shape(_values(p, n)).reshape(-1)) for p in range(world)))
            so = shape(torch.zeros(n))
            sl = [_values(p, n) for p in range(world)] if rank == 0 else None
            case(f"{tag}/scatter", lambda: dist.scatter(so, scatter_list=sl, src=0, group=rc) or True,
                 lambda: torch.equal(so.reshape(-1), _values(rank, n)))

        rooted_cases("taken", True)
        case("taken/barrier", lambda: dist.barrier(group=rc) or True, lambda: True)
        # (b) a call the entry declines (not contiguous): offered once, then the general path,
        # never offered again (neither by the binding nor through dist.all_reduce)
        for door in doors:
            t = _values(rank, 12).reshape(3, 4).t()
            case(f"declined/{door}", lambda: all_reduce_by(door, t),
                 lambda: torch.equal(t, _expect(world, 12).reshape(3, 4).t()))
        b = (_values(0, 12) if rank == 0 else torch.zeros(12)).reshape(3, 4).t()
        case("declined/broadcast", lambda: dist.broadcast(b, src=0, group=rc) or True,
             lambda: torch.equal(b, _values(0, 12).reshape(3, 4).t()))
        rooted_cases("declined", False)
        # (c) a case changed in C++: the table declines what the entry would take; Python follows
        fast.decline = True
        rooted_cases("changed", True)
        for door in doors:
            x = _values(rank)
            case(f"changed/{door}", lambda: all_reduce_by(door, x), lambda: torch.equal(x, _expect(world)))
        case("changed/barrier", lambda: dist.barrier(group=rc) or True, lambda: True)
        y = _values(rank) if rank == 0 else torch.zeros(6)
        case("changed/broadcast", lambda: dist.broadcast(y, src=0, group=rc) or True,
             lambda: torch.equal(y, _values(0)))
        fast.decline = False
        # what the offer point does not offer: the Python half offers it once, or never
        x = _values(rank)
        case("avg", lambda: real_all_reduce(x, op=dist.ReduceOp.AVG, group=rc) or True,
             lambda: torch.allclose(x, _expect(world) / world))
        x = _values(rank)
        case("async", lambda: real_all_reduce(x, group=rc, async_op=True).wait(),
             lambda: torch.equal(x, _expect(world)))
        r = _values(rank)
        case("async/reduce", lambda: dist.reduce(r, dst=0, group=rc, async_op=True).wait(),
             lambda: torch.equal(r, reduce_want()))
        o, i = torch.zeros(2 * world), a2a_in()
        case("splits/all_to_all", lambda: dist.all_to_all_single(o, i, [2] * world, [2] * world, group=rc) or True,
             lambda: torch.equal(o, a2a_want()))
        p, q = _values(rank, 3), _values(rank, 5)
        case("coalesced", lambda: dist.all_reduce_coalesced([p, q], group=rc) or True,
             lambda: torch.equal(p, _expect(world, 3)) and torch.equal(q, _expect(world, 5)))
        z = torch.complex(_values(rank), -_values(rank))
        case("complex", lambda: ringcomm.torch.all_reduce_(z, rc) is z,
             lambda: torch.equal(z, torch.complex(_expect(world), -_expect(world))))
        # each op the function and the op take, offered with the entry's code of its name
        names = {}
        for name in ops._NAMES:
            i = torch.full((4,), rank + 1, dtype=torch.int32)
            fast.log.clear()
            ringcomm.torch.all_reduce_(i, rc, name)
            j = torch.full((4,), rank + 1, dtype=torch.int32)
            torch.ops.ringcomm.all_reduce_(j, rc.group_name, name)
            k = torch.full((4,), rank + 1, dtype=torch.int32)
            real_all_reduce(k, op=getattr(dist.ReduceOp, name.upper()), group=rc)
            names[name] = {"codes": [entry[1] for entry in fast.log],
                           "same": torch.equal(i, j) and torch.equal(j, k)}
        out["names"] = names
        out["header_ops"] = list(tables.TORCH_OPS)
        out["extension_ops"] = dict(load().REDUCE_OPS)
        fast.restore()
        # the offer point off (an issue hook needs the Python half, so the backend turned it
        # off): the function takes dist.all_reduce, whose Python half offers the call once
        seen = []
        hook = lambda op, g, seq, t: seen.append(op)   # noqa: E731
        ringcomm.torch.add_issue_hook(hook)
        try:
            out["off_with_hook"] = be._fast_native
            x = _values(rank)
            case("hook/function", lambda: ringcomm.torch.all_reduce_(x, rc) is x,
                 lambda: torch.equal(x, _expect(world)))
        finally:
            ringcomm.torch.remove_issue_hook(hook)
        out["hook_saw"] = seen
    finally:
        dist.all_reduce = real_all_reduce
        comm._c = binding._core
        dist.destroy_process_group(rc)
    out["sum_code"] = sum_code
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2])
def test_every_door_reaches_the_one_offer_point_once(world):
    require_backend("ringcomm")
    res = run_ranks(_doors, world, backend="gloo", timeout=300)
    for out in res:
        s = out["sum_code"]
        assert out["on"] is True, out
        for door in ("dist", "function", "op"):
            # (a) every door: one offer, taken there; the Python half offers nothing
            assert out[f"taken/{door}"] == {"fast": [("all_reduce", s, DONE)], "binding": [],
                                            "dist": 0, "ok": True}, (door, out)
            # (b) a declined call: one offer, then the general path; the function does not take
            # dist.all_reduce for it
            assert out[f"declined/{door}"] == {"fast": [("all_reduce", s, DECLINED)], "binding": [],
                                               "dist": 0, "ok": True}, (door, out)
            # (c) the same when C++ answers differently for a call the entry takes
            assert out[f"changed/{door}"] == {"fast": [("all_reduce", s, DECLINED)], "binding": [],
                                              "dist": 0, "ok": True}, (door, out)
        assert out["taken/broadcast"] == {"fast": [("broadcast", 0, DONE)], "binding": [], "dist": 0,
                                          "ok": True}, out
        for case in ("declined/broadcast", "changed/broadcast"):
            assert out[case] == {"fast": [("broadcast", 0, DECLINED)], "binding": [], "dist": 0,
                                 "ok": True}, (case, out)
        # dist.reduce and dist.all_to_all_single (no split sizes) through the same offer point:
        # taken there, or declined (by the entry, or by the table) and then the general path
        for coll, key in (("reduce", 0), ("all_to_all", None), ("gather", 0), ("scatter", 0)):
            assert out[f"taken/{coll}"] == {"fast": [(coll, key, DONE)], "binding": [], "dist": 0,
                                            "ok": True}, (coll, out)
            for case in (f"declined/{coll}", f"changed/{coll}"):
                assert out[case] == {"fast": [(coll, key, DECLINED)], "binding": [], "dist": 0,
                                     "ok": True}, (case, out[case])
        assert out["taken/barrier"] == {"fast": [("barrier", None, DONE)], "binding": [], "dist": 0,
                                        "ok": True}, out
        assert out["changed/barrier"] == {"fast": [("barrier", None, DECLINED)], "binding": [], "dist": 0,
                                          "ok": True}, out
        # not offered by the offer point: asynchronous (then not at all)
        assert out["async/reduce"] == {"fast": [], "binding": [], "dist": 0, "ok": True}, out
        # split sizes: offered as element counts (rows of dim 0 times the row's elements)
        w = len(res)
        assert out["splits/all_to_all"] == {"fast": [("all_to_all_v", ([2] * w, [2] * w), DONE)], "binding": [],
                                            "dist": 0, "ok": True}, out
        # not offered by the offer point: the Python half offers what it runs synchronously, once
        avg = out["avg"]
        assert avg["fast"] == [] and len(avg["binding"]) == 1 and avg["binding"][0][2] is True, out
        assert out["async"] == {"fast": [], "binding": [], "dist": 0, "ok": True}, out
        coalesced = out["coalesced"]
        assert coalesced["fast"] == [] and coalesced["ok"], out
        assert [b[2] for b in coalesced["binding"]] == [True], out
        # complex: dist.all_reduce hands over its real view, which the offer point offers once
        assert out["complex"] == {"fast": [("all_reduce", s, DONE)], "binding": [], "dist": 1,
                                  "ok": True}, out
        # the names: the header's list, the extension's table and the function's, one code each
        names = {n.lower() for n in out["header_ops"]}
        assert set(out["names"]) == names == set(out["extension_ops"]) and len(names) == 7, out
        for name, r in out["names"].items():
            assert r["codes"] == [out["extension_ops"][name]] * 3 and r["same"], (name, r)
        # the offer point off: not offered there; dist.all_reduce's Python half offers it once
        assert out["off_with_hook"] is False, out
        assert out["hook/function"] == {"fast": [], "binding": [("all_reduce", s, True)], "dist": 1,
                                        "ok": True}, out
        assert out["hook_saw"] == ["allreduce"], out


def _fallback(rank, world):
    # The whole-group ProcessGroup: no trampoline; its calls reach the synchronous entry through
    # the communicator's binding, once (a non-contiguous tensor staged into a contiguous copy
    # first).
    import ringcomm.torch
    from ringcomm.torch.backend import RingcommProcessGroup
    pg = dist.group.WORLD
    assert isinstance(pg, RingcommProcessGroup), type(pg)
    comm = pg.communicator
    binding = comm._c = Binding(comm._c)
    out = {}
    try:
        for name, call in (("dist", lambda t: dist.all_reduce(t)),
                           ("function", lambda t: ringcomm.torch.all_reduce_(t))):
            for kind in ("contiguous", "strided"):
                binding.log.clear()
                t = _values(rank, 12) if kind == "contiguous" else _values(rank, 12).reshape(3, 4).t()
                want = _expect(world, 12) if kind == "contiguous" else _expect(world, 12).reshape(3, 4).t()
                call(t)
                out[f"{kind}/{name}"] = {"binding": list(binding.log), "ok": bool(torch.equal(t, want))}
    finally:
        comm._c = binding._core
    return out


def test_the_whole_group_fallback_offers_each_call_once():
    res = run_ranks(_fallback, 2, backend="ringcomm", env={"RINGCOMM_TORCH_BACKEND": "group"},
                    timeout=240)
    for out in res:
        for name in ("dist", "function"):
            for kind in ("contiguous", "strided"):
                assert out[f"{kind}/{name}"] == {"binding": [("all_reduce", 0, True)], "ok": True}, out
