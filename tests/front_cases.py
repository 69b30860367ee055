"""Cases for tests/test_front.py that run INSIDE spawned ranks: the same bad calls on every back
end. Every rank makes the same bad call (so no rank waits for another), and records what it
raised: (exception class name, message). A hierarchical communicator is unusable after a
rejected collective (its engine is aborted), so each case gets a fresh communicator."""
import os

import numpy as np


def _np(shape, dtype="float32"):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


def cases(mk):
    """(name, call(comm)) pairs; ``mk(shape, dtype)`` makes an array of the back end's kind."""
    W = 2
    return [
        ("unsupported op for dtype", lambda c: c.all_reduce(mk((4,), "int32"), op="AVG")),
        ("unknown op", lambda c: c.all_reduce(mk((4,)), op="median")),
        ("all_reduce count", lambda c: c.all_reduce(mk((4,)), output=mk((5,)))),
        ("all_reduce dtype", lambda c: c.all_reduce(mk((4,)), output=mk((4,), "float64"))),
        ("unsupported dtype", lambda c: c.all_reduce(mk((4,), "complex64"))),
        ("non-contiguous", lambda c: c.all_reduce(mk((4, 4)).T)),
        ("broadcast root", lambda c: c.broadcast(mk((4,)), root=W)),
        ("reduce root", lambda c: c.reduce(mk((4,)), root=-1)),
        ("reduce_scatter count", lambda c: c.reduce_scatter(mk((4,)), mk((5,)))),
        ("reduce_scatter dtype", lambda c: c.reduce_scatter(mk((2,), "int64"), mk((4,)))),
        ("all_gather output", lambda c: c.all_gather(mk((3,)), mk((4,)))),
        ("all_to_all uneven", lambda c: c.all_to_all(mk((5,)), mk((5,)))),
        ("all_to_all splits", lambda c: c.all_to_all(mk((4,)), mk((4,)), input_splits=[3, 3])),
        ("gather size", lambda c: c.gather(mk((3 * W,)), mk((2,)), root=c.rank)),
        ("scatter without input", lambda c: c.scatter(mk((2,)), None, root=c.rank)),
        ("send to self", lambda c: c.send(mk((4,)), c.rank)),
        ("recv from outside", lambda c: c.recv(mk((4,)), W + 3)),
    ]


def host_only_cases():
    """Read-only numpy buffers (only the host and hierarchical back ends take numpy arrays)."""
    def ro(shape):
        a = _np(shape)
        a.flags.writeable = False
        return a
    return [
        ("read-only in place", lambda c: c.all_reduce(ro((4,)))),
        ("read-only recv", lambda c: c.recv(ro((4,)), 1 - c.rank)),
        ("stream on host arrays", lambda c: c.all_reduce(_np((4,)), stream=0)),
    ]


def _outcome(call, comm):
    try:
        call(comm)
    except Exception as e:  # noqa: BLE001 - the outcome is what the test compares
        return type(e).__name__, str(e)
    return "no error", ""


def run(rank, world, store_dir, kind, lib):
    """kind: "host" (one node), "hier" (every rank its own fake node) or "cuda"; lib: "numpy"
    or "torch" (CPU tensors; CUDA tensors for kind "cuda"). Returns {case: (class, message)}."""
    import ringcomm
    os.environ["RINGCOMM_NODE_ID"] = f"front-{kind}-{rank if kind == 'hier' else 0}"
    init = dict(rank=rank, world_size=world, init_method="file://" + os.path.join(store_dir, kind),
                timeout=60)
    if lib == "numpy":
        mk = _np
    else:
        import torch
        dev = "cuda" if kind == "cuda" else "cpu"

        def mk(shape, dtype="float32"):
            return torch.arange(int(np.prod(shape))).reshape(shape).to(getattr(torch, dtype)).to(dev)
    todo = cases(mk) + (host_only_cases() if lib == "numpy" else [])
    out = {}
    for i, (name, call) in enumerate(todo):
        if kind == "cuda":
            import ringcomm.cuda
            comm = ringcomm.cuda.init(prefix=f"front/{i}", device=0, **init)
        else:
            comm = ringcomm.init(prefix=f"front/{lib}/{i}", **init)
        expect = "HierarchicalCommunicator" if kind == "hier" else (
            "CudaCommunicator" if kind == "cuda" else "Communicator")
        if type(comm).__name__ != expect:
            out["_kind"] = f"{kind}: got {comm!r}"
        out[name] = _outcome(call, comm)
        comm.close()
    return out
