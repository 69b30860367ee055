"""The per-device c10d Backend (RINGCOMM_TORCH_BACKEND=c10d): torch keeps its own ProcessGroup
and registers ringcomm's Backend for the devices the backend string gives it.

Checked on real spawned ranks against gloo (results) and torch's own parsing (the device map):
* ``"ringcomm"``: ``group.WORLD`` is torch's ``ProcessGroup``; ``_get_backend(cpu)`` and
  ``_get_backend(cuda)`` are ringcomm's Backend; collectives, a sub-group, async works and their
  futures reach it and equal gloo's results;
* ``"cpu:gloo,cuda:ringcomm"``: CPU tensors go to ProcessGroupGloo and ringcomm's Backend sees
  none of them; the CUDA slot is ringcomm's;
* ``"cpu:ringcomm,cuda:gloo"``: the CPU slot is ringcomm's, the CUDA slot gloo's (the CPU wheel
  has no NCCL: ``"cpu:ringcomm,cuda:nccl"`` is checked through ``get_backend_config()``, and
  created only where CUDA and NCCL exist);
* ``RINGCOMM_TORCH_BACKEND=auto`` without a compiler warns once and falls back to the whole-group
  ProcessGroup, ``=c10d`` then raises.
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import traceback

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ringcomm.core.launch import spawn  # noqa: E402

import ranks  # noqa: E402

TIMEOUT = datetime.timedelta(seconds=30)
SPAWN_TIMEOUT_S = 150


def _init(backend: str, path: str, rank: int, ws: int) -> None:
    import ringcomm.torch  # noqa: F401 - registers the backend
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=ws,
                            timeout=TIMEOUT)


def _calls(be) -> list:
    return be._test_calls


def _trace(be) -> None:
    """Record the name of every collective that reaches ``be`` (an issue hook of its own)."""
    import ringcomm.torch as rct
    be._test_calls = []
    rct.add_issue_hook(lambda op, name, seq, t: be._test_calls.append((name, op)))


def _plain_ringcomm(rank: int, ws: int, d: str):
    from ringcomm.torch import backend_class
    _init("ringcomm", os.path.join(d, "plain"), rank, ws)
    pg = dist.group.WORLD
    assert type(pg) is dist.ProcessGroup, type(pg)
    cpu = pg._get_backend(torch.device("cpu"))
    assert type(cpu) is backend_class(), type(cpu)
    assert pg._get_backend(torch.device("cuda")) is cpu   # one object for both devices
    assert dist.get_backend() == "ringcomm"
    assert str(dist.get_backend_config()) == "cpu:ringcomm,cuda:ringcomm"
    assert cpu.communicator.world_size == ws and cpu.communicator.rank == rank
    gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    _trace(cpu)
    for dtype in (torch.float32, torch.int64):
        x = (torch.arange(1001, dtype=dtype) * (rank + 1)).contiguous()
        y = x.clone()
        dist.all_reduce(x)
        dist.all_reduce(y, group=gloo)
        assert torch.equal(x, y), (dtype, x[:4], y[:4])
    # async: the Work torch hands back reaches ringcomm's work (wait, is_completed, future)
    x = torch.full((64,), float(rank + 1))
    w = dist.all_reduce(x, async_op=True)
    value = w.get_future().wait()
    assert w.wait() is True and w.is_completed() and w.is_success()
    assert torch.equal(value[0], torch.full((64,), float(ws * (ws + 1) // 2)))
    out = torch.empty(ws * 3)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
    assert torch.equal(out, torch.arange(ws, dtype=torch.float32).repeat_interleave(3))
    dist.barrier()
    ops = [op for name, op in _calls(cpu)]
    assert ops[:3] == ["allreduce"] * 3 and "barrier" in ops, ops
    # a sub-group is a ProcessGroup of its own with its own ringcomm Backend
    sub = dist.new_group([0, 1], backend="ringcomm", timeout=TIMEOUT)
    if rank in (0, 1):
        sb = sub._get_backend(torch.device("cpu"))
        assert type(sb) is backend_class() and sb is not cpu
        t = torch.tensor([float(rank)])
        dist.broadcast(t, src=1, group=sub)
        assert t.item() == 1.0
    dist.destroy_process_group()
    assert cpu._closed, "destroy_process_group did not shut the Backend down"
    return "ok"


def _gloo_cpu(rank: int, ws: int, d: str):
    from ringcomm.torch import backend_class
    _init("cpu:gloo,cuda:ringcomm", os.path.join(d, "gloo_cpu"), rank, ws)
    pg = dist.group.WORLD
    cpu = pg._get_backend(torch.device("cpu"))
    cuda = pg._get_backend(torch.device("cuda"))
    assert isinstance(cpu, dist.ProcessGroupGloo), type(cpu)
    assert type(cuda) is backend_class(), type(cuda)
    assert str(dist.get_backend_config()) == "cpu:gloo,cuda:ringcomm"
    _trace(cuda)
    x = torch.arange(10, dtype=torch.float64) + rank
    dist.all_reduce(x)
    ref = sum(torch.arange(10, dtype=torch.float64) + r for r in range(ws))
    assert torch.equal(x, ref), (x, ref)
    dist.barrier()
    assert _calls(cuda) == [], _calls(cuda)
    dist.destroy_process_group()
    return "ok"


def _ringcomm_cpu(rank: int, ws: int, d: str):
    from torch.distributed.distributed_c10d import BackendConfig
    from ringcomm.torch import backend_class
    m = BackendConfig(dist.Backend("cpu:ringcomm,cuda:nccl")).get_device_backend_map()
    assert m == {"cpu": "ringcomm", "cuda": "nccl"}, m
    _init("cpu:ringcomm,cuda:gloo", os.path.join(d, "rc_cpu"), rank, ws)
    pg = dist.group.WORLD
    cpu = pg._get_backend(torch.device("cpu"))
    assert type(cpu) is backend_class(), type(cpu)
    assert isinstance(pg._get_backend(torch.device("cuda")), dist.ProcessGroupGloo)
    assert str(dist.get_backend_config()) == "cpu:ringcomm,cuda:gloo"
    _trace(cpu)
    x = torch.ones(5) * (rank + 1)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((5,), float(ws * (ws + 1) // 2)))
    assert [op for _, op in _calls(cpu)] == ["allreduce"], _calls(cpu)
    dist.destroy_process_group()
    return "ok"


def _ringcomm_cpu_nccl(rank: int, ws: int, d: str):
    from ringcomm.torch import backend_class
    torch.cuda.set_device(rank)
    _init("cpu:ringcomm,cuda:nccl", os.path.join(d, "nccl"), rank, ws)
    pg = dist.group.WORLD
    assert type(pg._get_backend(torch.device("cpu"))) is backend_class()
    assert isinstance(pg._get_backend(torch.device("cuda")), dist.ProcessGroupNCCL)
    x = torch.ones(4, device="cuda")
    dist.all_reduce(x)                              # NCCL
    y = torch.ones(4)
    dist.all_reduce(y)                              # ringcomm
    assert x.cpu().tolist() == [float(ws)] * 4 and y.tolist() == [float(ws)] * 4
    dist.destroy_process_group()
    return "ok"


def _battery(rank: int, ws: int, d: str):
    torch.set_num_threads(1)
    out = {}
    for name, fn in (("plain", _plain_ringcomm), ("gloo_cpu", _gloo_cpu),
                     ("ringcomm_cpu", _ringcomm_cpu)):
        try:
            out[name] = fn(rank, ws, d)
        except BaseException:  # noqa: BLE001 - reported per case
            out[name] = f"rank {rank}:\n{traceback.format_exc()}"
            if dist.is_initialized():
                dist.destroy_process_group()
    return out


def _battery_results(ws: int) -> dict:
    def start():
        per_rank = ranks.run_in_dir(_battery, ws, "ringcomm-c10d-test-", timeout=SPAWN_TIMEOUT_S,
                                    env={"RINGCOMM_TORCH_BACKEND": "c10d"})
        return {name: [r[name] for r in per_rank] for name in per_rank[0]}
    return ranks.once(("device_backend", ws), start, f"the world-{ws} c10d battery")


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
@pytest.mark.parametrize("case", ["plain", "gloo_cpu", "ringcomm_cpu"])
@pytest.mark.parametrize("ws", [2, 3])
def test_device_backend(ws, case):
    res = _battery_results(ws)[case]
    bad = [r for r in res if r != "ok"]
    assert not bad, "\n".join(bad)


@pytest.mark.timeout(SPAWN_TIMEOUT_S + 30)
def test_ringcomm_cpu_nccl_cuda():
    if not (torch.cuda.is_available() and torch.cuda.device_count() >= 2
            and dist.is_nccl_available()):
        pytest.skip("needs 2 GPUs and NCCL")
    with tempfile.TemporaryDirectory(prefix="ringcomm-c10d-test-") as d:
        assert spawn(_ringcomm_cpu_nccl, 2, (d,), timeout=SPAWN_TIMEOUT_S,
                     env={"RINGCOMM_TORCH_BACKEND": "c10d"}) == ["ok", "ok"]


_NO_COMPILER = r"""
import os, warnings, datetime, tempfile
import torch, torch.distributed as dist
import ringcomm.torch
from ringcomm.torch import extension
extension.extension_name = lambda: "ringcomm_c10d_no_such_build"   # never cached
with tempfile.TemporaryDirectory() as d:
    kw = dict(init_method=f"file://{d}/s", rank=0, world_size=1,
              timeout=datetime.timedelta(seconds=20))
    if os.environ["RINGCOMM_TORCH_BACKEND"] == "c10d":
        try:
            dist.init_process_group("ringcomm", **kw)
        except Exception as e:
            print("RAISED", type(e).__name__)
        raise SystemExit(0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        dist.init_process_group("ringcomm", **kw)
        g = dist.new_group(backend="ringcomm")
    msgs = [str(x.message) for x in w if "per-device c10d backend is unavailable" in str(x.message)]
    print("WARNINGS", len(msgs), msgs[0] if msgs else "")
    print("TYPE", type(dist.group.WORLD).__name__)
    t = torch.ones(3); dist.all_reduce(t); print("SUM", t.tolist())
    dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["auto", "c10d"])
def test_build_failure(tmp_path, mode):
    """No compiler (CXX names a missing program): auto warns once, naming the reason, and runs
    on the whole-group ProcessGroup; c10d raises."""
    env = dict(os.environ, RINGCOMM_TORCH_BACKEND=mode, CXX=str(tmp_path / "no-such-c++"),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), MAX_JOBS="1")
    r = subprocess.run([sys.executable, "-c", _NO_COMPILER], capture_output=True, text=True,
                       timeout=100, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    if mode == "c10d":
        assert "RAISED" in r.stdout, r.stdout + r.stderr
        return
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert lines.get("WARNINGS", "").startswith("1 "), r.stdout + r.stderr
    assert lines.get("TYPE") == "RingcommProcessGroup", r.stdout
    assert lines.get("SUM") == "[1.0, 1.0, 1.0]", r.stdout


@pytest.mark.timeout(300)
def test_build_cli():
    """``python -m ringcomm.torch --build`` prints where the cached trampoline is."""
    r = subprocess.run([sys.executable, "-m", "ringcomm.torch", "--build"], capture_output=True,
                       text=True, timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    path = r.stdout.split("ringcomm c10d trampoline: ", 1)[1].split(" (", 1)[0]
    assert os.path.isfile(path), r.stdout
