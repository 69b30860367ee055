"""Prototype: a Python c10d Backend that torch 2.13 attaches PER DEVICE (not a ProcessGroup
subclass, which torch puts in place of the whole group).

    python tests/torch_suite/proto_backend.py        # 2 spawned CPU ranks; prints "proto: OK"

torch 2.13 binds ``torch._C._distributed_c10d.Backend`` without a constructor or a trampoline
(subclassing it from Python fails with "TypeError: ...: No constructor defined!"; checked first,
below), so the backend class comes from a 40-line C++ extension, ``py_backend_ext.cpp``
(``PyBackend``: a c10d::Backend with a pybind11 trampoline), built with
``torch.utils.cpp_extension.load`` (about 2.5 min the first time on these 2 cores, then cached in
~/.cache/torch_extensions). Backend "proto" is registered with
``dist.Backend.register_backend(..., extended_api=True, devices=["cpu", "cuda"])``; its creator
returns ``ProtoBackend(PyBackend)``, which torch attaches per device
(``pg._register_backend(device, CUSTOM, backend)``). ProtoBackend's allreduce is numpy over the group's own store (each rank posts its
tensor, reads the others', sums in rank order) and completes through a Future
(``_create_work_from_future``): nothing of gloo's is involved. Checked on 2 ranks:
  * "proto": ``_get_backend(cpu)`` is the ProtoBackend, ``get_backend()`` == "proto",
    ``get_backend_config()`` == "cpu:proto,cuda:proto", all_reduce / barrier reach it;
  * "cpu:gloo,cuda:proto": cpu tensors go to gloo (``_get_backend(cpu)`` is ProcessGroupGloo),
    the cuda slot is the ProtoBackend (creating it needs no GPU);
  * "cpu:proto,cuda:nccl" parses into {cpu: proto, cuda: nccl} (``BackendConfig``); creating it
    needs NCCL, absent from the CPU wheel.
"""
from __future__ import annotations

import datetime
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

HERE = os.path.dirname(os.path.abspath(__file__))


def python_subclass_of_backend_fails() -> str:
    """torch 2.13: a Python subclass of the C++ Backend cannot be constructed."""
    class Direct(C10dBackend):
        def __init__(self):
            super().__init__(0, 1)
    try:
        Direct()
    except TypeError as e:
        return str(e)
    raise AssertionError("torch.distributed Backend is constructible from Python now: "
                         "the C++ trampoline is no longer needed")


def _ext():
    from torch.utils.cpp_extension import load
    return load(name="ringcomm_proto_pybackend",
                sources=[os.path.join(HERE, "py_backend_ext.cpp")], verbose=False)


PyBackend = _ext().PyBackend
_LIVE: list = []   # torch holds the backend from C++ only; the Python half must stay alive


class ProtoBackend(PyBackend):
    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        _LIVE.append(self)
        self._store, self._rank, self._size = store, rank, size
        self._seq = 0
        self.calls: list[str] = []

    # the name ProcessGroup reports for this device's backend (get_backend, repr)
    def getBackendName(self) -> str:  # noqa: N802 - torch's spelling
        return "proto"

    def _done(self, result) -> object:
        fut = Future()
        fut.set_result(result)
        return _create_work_from_future(fut)

    def _exchange(self, arr: np.ndarray) -> list[np.ndarray]:
        """Every rank's array, in rank order (through the store: keys seq/rank)."""
        self._seq += 1
        self._store.set(f"proto/{self._seq}/{self._rank}", arr.tobytes())
        out = []
        for r in range(self._size):
            b = self._store.get(f"proto/{self._seq}/{r}")
            out.append(np.frombuffer(b, dtype=arr.dtype).reshape(arr.shape))
        return out

    def allreduce(self, tensors, opts=None):
        self.calls.append("allreduce")
        for t in tensors:
            parts = self._exchange(t.detach().cpu().numpy())
            acc = parts[0].copy()
            for p in parts[1:]:
                acc += p
            t.copy_(torch.from_numpy(acc))
        return self._done(tensors)

    def barrier(self, opts=None):
        self.calls.append("barrier")
        self._exchange(np.zeros(1, dtype=np.uint8))
        return self._done([])


def _create(dist_opts, backend_options=None):
    return ProtoBackend(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                        dist_opts.timeout)


def register():
    if "PROTO" not in dist.Backend._plugins:
        dist.Backend.register_backend("proto", _create, extended_api=True, devices=["cpu", "cuda"])


def _rank(rank: int, ws: int, tmp: str, q) -> None:
    try:
        register()
        timeout = datetime.timedelta(seconds=30)
        dist.init_process_group("proto", init_method=f"file://{tmp}/a", rank=rank,
                                world_size=ws, timeout=timeout)
        pg = dist.group.WORLD
        be = pg._get_backend(torch.device("cpu"))
        assert isinstance(be, ProtoBackend), type(be)
        assert type(pg) is dist.ProcessGroup, type(pg)      # torch's own group, not replaced
        assert dist.get_backend() == "proto", dist.get_backend()
        cfg = str(dist.get_backend_config())
        assert cfg == "cpu:proto,cuda:proto", cfg
        t = torch.arange(4, dtype=torch.float32) + rank
        dist.all_reduce(t)
        ref = sum(np.arange(4, dtype=np.float32) + r for r in range(ws))
        assert np.array_equal(t.numpy(), ref), (t, ref)
        dist.barrier()
        assert be.calls == ["allreduce", "barrier"], be.calls
        dist.destroy_process_group()

        dist.init_process_group("cpu:gloo,cuda:proto", init_method=f"file://{tmp}/b",
                                rank=rank, world_size=ws, timeout=timeout)
        pg = dist.group.WORLD
        cpu_be = pg._get_backend(torch.device("cpu"))
        cuda_be = pg._get_backend(torch.device("cuda"))
        assert isinstance(cpu_be, dist.ProcessGroupGloo), type(cpu_be)
        assert isinstance(cuda_be, ProtoBackend), type(cuda_be)
        t = torch.ones(3)
        dist.all_reduce(t)                                   # cpu tensor: gloo
        assert torch.equal(t, torch.full((3,), float(ws))) and cuda_be.calls == [], cuda_be.calls
        dist.destroy_process_group()

        from torch.distributed.distributed_c10d import BackendConfig
        m = BackendConfig(dist.Backend("cpu:proto,cuda:nccl")).get_device_backend_map()
        assert m == {"cpu": "proto", "cuda": "nccl"}, m
        q.put((rank, None))
    except BaseException:  # noqa: BLE001
        import traceback
        q.put((rank, traceback.format_exc()))


def main() -> int:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ws = 2
    print("python subclass of Backend:", python_subclass_of_backend_fails())
    with tempfile.TemporaryDirectory(prefix="proto-backend-") as tmp:
        procs = [ctx.Process(target=_rank, args=(r, ws, tmp, q)) for r in range(ws)]
        for p in procs:
            p.start()
        errs = []
        try:
            for _ in range(ws):
                r, err = q.get(timeout=120)
                if err:
                    errs.append(f"rank {r}:\n{err}")
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
    if errs:
        print("proto: FAILED\n" + "\n".join(errs))
        return 1
    print(f"proto: OK (torch {torch.__version__}, {ws} ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
