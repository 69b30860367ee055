"""The training libraries people put on torch.distributed, on "ringcomm" and on gloo: PyTorch
Lightning (DDP and ModelParallelStrategy / FSDP2, each with and without
``self.log(..., sync_dist=True)``), Hugging Face accelerate (the documented setup:
``init_process_group("ringcomm")`` before ``Accelerator(cpu=True)``; and accelerate's own bundled
test scripts, ``test_accelerate_script``), DeepSpeed ZeRO 1/2/3
(``deepspeed.init_distributed(dist_backend=...)``, ``DS_ACCELERATOR=cpu``), and torch DDP with
torch.distributed.checkpoint save/load.

ONE spawned group of 2 ranks runs every case (``_clients``); each case trains the same tiny model
on the same data twice in that process, once with the default group on ringcomm and once on gloo
(a fresh default group each time), and the final parameters must be EQUAL: at 2 ranks ringcomm's
all_reduce sums in gloo's order, so the results are bit for bit the same. A library that is not
importable skips its cases with the import error as the reason (``pip install -e ".[clients]"``).
accelerate's scripts run in processes of their own (``_run_accelerate_script``), one pair per
script and backend.
"""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
import traceback

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from ringcomm.core.launch import LaunchError, spawn  # noqa: E402

from mp_cases import free_port  # noqa: E402

WS = 2
TIMEOUT_S = 240
STEPS = 4

CASES: dict = {}
# cases whose ringcomm run is known to fail today: name -> the reason (pytest xfail, strict)
# and the text its error must contain (any other failure fails the test outright)
KNOWN_FAIL: dict = {}


class KnownFailure(AssertionError):
    """The failure a KNOWN_FAIL case is expected to show, and only that one."""


def case(needs: str):
    def deco(fn):
        CASES[fn.__name__[len("case_"):]] = (fn, needs)
        return fn
    return deco


def importable(mod: str) -> tuple[bool, str]:
    try:
        __import__(mod)
    except Exception as e:  # noqa: BLE001 - any import failure means the client is unusable
        return False, f"{mod} not importable ({type(e).__name__}: {e}); pip install -e \".[clients]\""
    return True, ""


# ---- one default group per (case, backend) --------------------------------------------------------
class Ctx:
    def __init__(self, rank, ws, tmpdir):
        self.rank, self.ws, self.tmpdir = rank, ws, tmpdir
        self.n = 0

    def init(self, backend: str):
        """A fresh default group on ``backend`` (a new file store each time)."""
        self.n += 1
        path = os.path.join(self.tmpdir, f"store-{self.n}")
        dist.init_process_group(backend, init_method=f"file://{path}", rank=self.rank,
                                world_size=self.ws, timeout=datetime.timedelta(seconds=30))

    @staticmethod
    def done():
        if dist.is_initialized():
            dist.destroy_process_group()


def both(ctx, run) -> str:
    """``run(backend)`` -> list of parameter tensors, on ringcomm and on gloo: must be equal."""
    out = {}
    for backend in ("ringcomm", "gloo"):
        ctx.init(backend)
        try:
            out[backend] = [p.detach().clone().cpu() for p in run(backend)]
            # every rank holds the same parameters
            flat = torch.cat([p.reshape(-1) for p in out[backend]])
            ref = flat.clone()
            dist.broadcast(ref, src=0)
            assert torch.equal(flat, ref), f"{backend}: parameters differ across ranks"
        finally:
            ctx.done()
    rc, gl = out["ringcomm"], out["gloo"]
    assert len(rc) == len(gl) and rc, (len(rc), len(gl))
    d = max((a - b).abs().max().item() for a, b in zip(rc, gl))
    assert all(torch.equal(a, b) for a, b in zip(rc, gl)), f"ringcomm vs gloo max abs diff {d:.3g}"
    moved = max((a - b).abs().max().item() for a, b in zip(rc, initial_params()))
    assert moved > 0, "training did not change the parameters"
    return f"{len(rc)} tensors equal to gloo's (moved {moved:.2g})"


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def initial_params():
    return [p.detach().clone() for p in tiny_model().parameters()]


def dataset(n=32):
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, 8, generator=g), torch.randn(n, 2, generator=g)


# ---- PyTorch Lightning ----------------------------------------------------------------------------
def _lightning_fit(ctx, backend: str, sync_dist: bool, logged: dict | None = None,
                   fsdp2: bool = False):
    """Fit; with ``sync_dist``, put the logged metrics and the same values computed by hand
    from every rank's local losses into ``logged``. ``fsdp2``: ModelParallelStrategy with the
    whole mesh as its data-parallel dimension, the model sharded by ``fully_shard`` in
    ``configure_model``; the parameters returned are the gathered full tensors."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = tiny_model()
            self.last_train_loss = None
            self.val_sum = None   # this rank's sum of loss x batch size over the last validation
            self.val_count = 0

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if sync_dist:
                self.log("train_loss", loss, sync_dist=True)
                self.last_train_loss = loss.detach().clone()
            return loss

        def on_validation_epoch_start(self):
            self.val_sum, self.val_count = torch.tensor(0.0), 0

        def validation_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if sync_dist:
                self.log("val_loss", loss, sync_dist=True)
                # Lightning's accumulation of an epoch-level mean: value += mean x batch size
                self.val_sum += loss.detach() * x.shape[0]
                self.val_count += x.shape[0]

        def configure_model(self):
            if fsdp2:
                from torch.distributed.fsdp import fully_shard
                mesh = self.device_mesh["data_parallel"]
                got = dist.get_backend(mesh.get_group())
                assert got == backend, got
                fully_shard(self.net[0], mesh=mesh)
                fully_shard(self.net, mesh=mesh)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x, y = dataset()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    module = Module()
    trainer = pl.Trainer(accelerator="cpu", devices=ctx.ws, num_nodes=1,
                         strategy=(ModelParallelStrategy(data_parallel_size=ctx.ws,
                                                         tensor_parallel_size=1,
                                                         process_group_backend=backend)
                                   if fsdp2 else DDPStrategy(process_group_backend=backend)),
                         max_steps=STEPS, limit_val_batches=2, val_check_interval=2,
                         num_sanity_val_steps=2 if sync_dist else 0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False,
                         default_root_dir=os.path.join(ctx.tmpdir, f"pl-{ctx.n}"))
    trainer.fit(module, loader, loader if sync_dist else None)
    assert trainer.global_step == STEPS, trainer.global_step
    assert dist.get_backend() == backend, dist.get_backend()
    if sync_dist:
        # by hand: the mean over ranks of the last step's loss; for the epoch-level val_loss,
        # (sum over ranks of loss x batch size) / (sum of batch sizes), each over ranks
        mine = [module.last_train_loss, module.val_sum, module.val_count]
        every = [None] * ctx.ws
        dist.all_gather_object(every, mine)
        ws = ctx.ws
        train = torch.stack([e[0] for e in every]).sum(0) / ws
        val = (torch.stack([e[1] for e in every]).sum(0) / ws) / (sum(e[2] for e in every) / ws)
        logged.update(train_logged=trainer.callback_metrics["train_loss"].clone(),
                      val_logged=trainer.callback_metrics["val_loss"].clone(),
                      train_by_hand=train, val_by_hand=val)
    if fsdp2:
        from torch.distributed.tensor import DTensor
        # the root module keeps its parameters unsharded after a forward without backward (the
        # last validation): shard them again before reading the DTensors
        module.net.reshard()
        params = list(module.net.parameters())
        assert all(isinstance(p, DTensor) for p in params), [type(p) for p in params]
        return [p.full_tensor() for p in params]
    return list(module.net.parameters())


@case("lightning")
def case_lightning_ddp(ctx):
    return both(ctx, lambda b: _lightning_fit(ctx, b, sync_dist=False))


def _check_logged(logged: dict) -> str:
    """The logged metrics of the ringcomm run equal gloo's and the values by hand, exactly."""
    rc, gl = logged["ringcomm"], logged["gloo"]
    for key in ("train", "val"):
        a, g, hand = rc[f"{key}_logged"], gl[f"{key}_logged"], rc[f"{key}_by_hand"]
        assert torch.equal(a, g), f"{key}_loss: ringcomm logged {a.item()!r}, gloo {g.item()!r}"
        assert torch.equal(a, hand), f"{key}_loss: logged {a.item()!r}, by hand {hand.item()!r}"
        assert torch.equal(g, gl[f"{key}_by_hand"]), f"{key}_loss: gloo run's own hand value"
    return f"train_loss {rc['train_logged'].item():.6g}, val_loss " \
           f"{rc['val_logged'].item():.6g} equal to gloo's and by hand"


@case("lightning")
def case_lightning_fsdp2(ctx):
    """ModelParallelStrategy (FSDP2: reduce-scatter of the gradients with ReduceOp.AVG, all-gather
    of the parameters): at 2 ranks every sum has two terms, and a + b rounds the same in any
    order, so the parameters equal gloo's bit for bit."""
    return both(ctx, lambda b: _lightning_fit(ctx, b, sync_dist=False, fsdp2=True))


@case("lightning")
def case_lightning_fsdp2_sync_dist(ctx):
    """ModelParallelStrategy with ``self.log(..., sync_dist=True)``: Lightning's reduction goes
    through the same ``_sync_ddp_if_available`` as DDP's (AVG on ringcomm, SUM / world on gloo)."""
    logged = {"ringcomm": {}, "gloo": {}}
    info = both(ctx, lambda b: _lightning_fit(ctx, b, sync_dist=True, logged=logged[b],
                                              fsdp2=True))
    return f"{info}; {_check_logged(logged)}"


@case("lightning")
def case_lightning_sync_dist(ctx):
    """Lightning reduces logged values with ReduceOp.AVG on every backend not named "gloo" (an
    integer AVG for the batch-size counts) and with SUM / world size on gloo: the logged
    metrics must equal gloo's and the values computed by hand, exactly (at 2 ranks halving a
    float is exact either way)."""
    logged = {"ringcomm": {}, "gloo": {}}
    info = both(ctx, lambda b: _lightning_fit(ctx, b, sync_dist=True, logged=logged[b]))
    return f"{info}; {_check_logged(logged)}"


# ---- accelerate -----------------------------------------------------------------------------------
def _accelerate_fit(ctx, backend: str):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    # the state is a per-process singleton: each run starts a new one on the current group
    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    acc = Accelerator(cpu=True)
    assert acc.num_processes == ctx.ws and acc.process_index == ctx.rank
    assert dist.get_backend() == backend
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = dataset()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    model, opt, loader = acc.prepare(model, opt, loader)
    for step, (xb, yb) in enumerate(loader):
        if step == STEPS:
            break
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    # accelerate's own collectives over the backend
    g = acc.gather(torch.tensor([float(ctx.rank)]))
    assert g.tolist() == [float(r) for r in range(ctx.ws)], g
    r = acc.reduce(torch.tensor([1.0 + ctx.rank]), reduction="sum")
    assert r.item() == sum(1.0 + q for q in range(ctx.ws)), r
    acc.wait_for_everyone()
    return list(acc.unwrap_model(model).parameters())


@case("accelerate")
def case_accelerate(ctx):
    return both(ctx, lambda b: _accelerate_fit(ctx, b))


# ---- accelerate's bundled test scripts -----------------------------------------------------------
# Each script runs on 2 fresh processes (ranks set up as torchrun does), once per backend, through
# the documented one-line setup: ``init_process_group(backend)`` before accelerate creates its
# state. ``ACCELERATE_USE_CPU=1`` is what ``accelerate launch --cpu`` sets; it turns the scripts'
# ``Accelerator()`` into ``DistributedType.MULTI_CPU`` on the group that exists.
ACCELERATE_RUN = {
    # script -> create PartialState(cpu=True) before the script: test_ops.py builds its state with
    # a bare ``PartialState()``, which reads no ACCELERATE_USE_CPU and, without an accelerator,
    # resolves to DistributedType.NO (one process) under any launcher (accelerate/state.py,
    # PartialState._prepare_backend: the MULTI_CPU branch needs ``cpu``)
    "test_ops.py": True,
    "test_sync.py": False,
    "test_script.py": False,
}
# The other scripts 1.15.0 ships, and the accelerate code that keeps each from running on CPU
# ranks whatever the backend (gloo fails the same way, or the script has no group to put ringcomm
# under); tried by hand on both backends.
ACCELERATE_NOT_RUN = {
    "test_distributed_data_loop.py":
        "gloo fails too: accelerate/accelerator.py join_uneven_inputs runs Join only `if "
        "self.multi_device:` (MULTI_GPU, MULTI_XPU, ..., not MULTI_CPU), else warns 'Joining "
        "uneven inputs is only supported for multi-GPU training'; test_can_join_uneven_inputs "
        "then leaves rank 0 in DDP's forward and rank 1 in wait_for_everyone (gloo: send timeout "
        "after the group timeout; ringcomm: MismatchError broadcast vs barrier at once)",
    "test_ddp_comm_hook.py":
        "gloo fails too: test_ddp_comm_hook builds its reference as DistributedDataParallel("
        "model, device_ids=[accelerator.local_process_index], ...), which torch refuses for CPU "
        "modules (ValueError: device_ids and output_device arguments only work with "
        "single-device/multiple-device GPU modules)",
    "test_merge_weights.py":
        "gloo fails too: accelerate/utils/fsdp_utils.py save_fsdp_model enters "
        "FSDP.state_dict_type(...), whose exit restores a None state_dict_type (torch 2.13 "
        "fully_sharded_data_parallel.py set_state_dict_type: KeyError: None)",
    "test_notebook.py":
        "starts its own processes (accelerate/launchers.py notebook_launcher), in which "
        "PartialState creates the group with accelerate's own backend choice: there is no "
        "point before accelerate's state where the one-line setup could run",
    "test_cli.py": "no process group: prints the number of GPUs (0 here)",
}
ACCELERATE_TIMEOUT_S = 150

_ACCELERATE_RUNNER = r"""
import datetime, faulthandler, json, os, runpy, sys
faulthandler.enable()   # a crash prints every thread's Python stack into the rank's output
import torch
import torch.distributed as dist
backend, script, cpu_state = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
calls = []
if backend == "ringcomm":
    import ringcomm.torch as rct
    rct.add_issue_hook(lambda op, group, seq, t: calls.append(op))
torch.set_num_threads(1)
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))   # the one-line setup
assert dist.get_backend() == backend, dist.get_backend()
later = []
init = dist.init_process_group
def recorded_init(*args, **kwargs):
    later.append(str(kwargs.get("backend", args[0] if args else None)))
    return init(*args, **kwargs)
dist.init_process_group = dist.distributed_c10d.init_process_group = recorded_init
if cpu_state:
    from accelerate.state import PartialState
    PartialState(cpu=True)
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
print("RUNNER-RESULT " + json.dumps({"ringcomm_ops": calls, "later_inits": later}), flush=True)
if dist.is_initialized():
    dist.destroy_process_group()
if backend == "gloo":
    # The reference's result is complete here. Its interpreter teardown is not what is compared,
    # and torch's gloo objects can abort there (std::terminate) after a script that passed; the
    # ringcomm run goes through the whole teardown, which stays under test.
    sys.stdout.flush()
    os._exit(0)
"""


def _accelerate_scripts_dir() -> str | None:
    """Where the installed accelerate keeps its test scripts (found without importing it)."""
    import importlib.util
    spec = importlib.util.find_spec("accelerate")
    if spec is None or not spec.origin:
        return None
    return os.path.join(os.path.dirname(spec.origin), "test_utils", "scripts")


def _run_accelerate_script(script: str, backend: str, cpu_state: bool, tmpdir: str) -> list:
    """Both ranks' (exit status, output) of one script on one backend."""
    import subprocess
    import sys
    port = free_port()
    procs = []
    for rank in range(WS):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WS),
                   LOCAL_WORLD_SIZE=str(WS), NODE_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")
        log = open(os.path.join(tmpdir, f"{backend}-{rank}.log"), "w+")
        procs.append((subprocess.Popen(
            [sys.executable, "-c", _ACCELERATE_RUNNER, backend,
             os.path.join(_accelerate_scripts_dir(), script), "1" if cpu_state else "0"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmpdir, env=env,
            start_new_session=True), log))
    out = []
    deadline = time.monotonic() + ACCELERATE_TIMEOUT_S
    for proc, log in procs:
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                    p.wait()
            rc = "timeout"
        log.seek(0)
        out.append((rc, log.read()))
        log.close()
    return out


def _headers(output: str) -> list:
    """The script's section titles (``**Test ...**``, test_ops.py's ``testing ...``), in order."""
    return [line.strip() for line in output.splitlines()
            if line.strip().startswith(("**", "testing "))]


def _accelerate_shipped() -> list | None:
    """The test scripts the installed accelerate ships, or None where it is not installed."""
    where = _accelerate_scripts_dir()
    if not where or not os.path.isdir(where):
        return None
    return sorted(f for f in os.listdir(where) if f.startswith("test_") and f.endswith(".py"))


def _accelerate_params():
    """Every shipped script but those explained in ACCELERATE_NOT_RUN: one this file does not
    know fails its test."""
    shipped = _accelerate_shipped()
    if shipped is None:
        shipped = sorted(ACCELERATE_RUN)
    return [pytest.param(f, id=f[:-3]) for f in shipped if f not in ACCELERATE_NOT_RUN]


def test_accelerate_scripts_not_run_are_shipped_and_explained():
    """The scripts not run here are ones this accelerate ships (an explanation never outlives
    its script), none of them is also run, and each says why."""
    ok, why = importable("accelerate")
    if not ok:
        pytest.skip(why)
    shipped = set(_accelerate_shipped() or ())
    assert set(ACCELERATE_NOT_RUN) <= shipped, sorted(set(ACCELERATE_NOT_RUN) - shipped)
    assert not set(ACCELERATE_NOT_RUN) & set(ACCELERATE_RUN)
    assert set(ACCELERATE_RUN) <= shipped, sorted(set(ACCELERATE_RUN) - shipped)
    assert all(len(reason) > 20 for reason in ACCELERATE_NOT_RUN.values())


@pytest.mark.timeout(2 * ACCELERATE_TIMEOUT_S + 60)
@pytest.mark.parametrize("script", _accelerate_params())
def test_accelerate_script(script, tmp_path):
    """One of accelerate's own test scripts on ringcomm and on gloo: both pass, run the same
    sections, and on ringcomm the script's collectives reached ringcomm (an issue hook counts
    them) and accelerate created no group of its own."""
    ok, why = importable("accelerate")
    if not ok:
        pytest.skip(why)
    assert script in ACCELERATE_RUN, \
        f"{script}: shipped by this accelerate but neither run nor explained here"
    results = {}
    for backend in ("gloo", "ringcomm"):
        d = tmp_path / backend
        d.mkdir()
        ranks = _run_accelerate_script(script, backend, ACCELERATE_RUN[script], str(d))
        for rank, (rc, output) in enumerate(ranks):
            assert rc == 0, f"{script} on {backend}, rank {rank}: exit {rc}\n{output[-6000:]}"
        runner = [json.loads(line.split(" ", 1)[1]) for _, output in ranks
                  for line in output.splitlines() if line.startswith("RUNNER-RESULT ")]
        assert len(runner) == WS, f"{script} on {backend}: the runner did not finish on every rank"
        assert all(not r["later_inits"] for r in runner), \
            f"{script} on {backend}: accelerate created its own group: {runner}"
        results[backend] = (ranks[0][1], runner)
    rc_out, rc_runner = results["ringcomm"]
    gl_out = results["gloo"][0]
    assert _headers(rc_out) == _headers(gl_out), (_headers(rc_out), _headers(gl_out))
    for rank, r in enumerate(rc_runner):
        assert r["ringcomm_ops"], f"{script}: no collective reached ringcomm on rank {rank}"
    ops = sorted(set(rc_runner[0]["ringcomm_ops"]))
    print(f"[{script}] {len(_headers(rc_out))} sections as on gloo; "
          f"{len(rc_runner[0]['ringcomm_ops'])} collectives on ringcomm ({', '.join(ops)})")


# ---- DeepSpeed ------------------------------------------------------------------------------------
def _deepspeed_fit(ctx, backend: str, stage: int):
    import sys

    import deepspeed
    import deepspeed.comm.torch  # noqa: F401
    ds_torch = sys.modules["deepspeed.comm.torch"]   # the attribute deepspeed.comm.torch is torch
    # DeepSpeed's shared-memory all-reduce op (ninja-built on first use) serves only
    # inference_all_reduce; ZeRO training goes through torch.distributed, i.e. the backend under
    # test. Not building it keeps the test free of a one-minute JIT compile.
    ds_torch.build_shm_op = lambda: None
    _reset_deepspeed_state()
    deepspeed.init_distributed(dist_backend=backend)
    assert dist.get_backend() == backend
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
              "train_batch_size": 4 * ctx.ws, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 6}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    x, y = dataset()
    for step in range(STEPS):
        lo = (step * ctx.ws + ctx.rank) * 4
        loss = torch.nn.functional.mse_loss(engine(x[lo:lo + 4]), y[lo:lo + 4])
        engine.backward(loss)
        engine.step()
    params = list(engine.module.parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params):
            out = [p.detach().clone() for p in params]
    else:
        out = [p.detach().clone() for p in params]
    engine.destroy()
    _reset_deepspeed_state()
    return out


def _reset_deepspeed_state():
    """deepspeed.comm and deepspeed.utils.groups cache the groups of the last init in module
    globals; each run here starts on a new default group, so they start empty."""
    import deepspeed.comm.comm as ds_comm
    from deepspeed.utils import groups
    ds_comm.cdb = None
    for name, value in list(vars(groups).items()):
        if name.startswith("_") and name.isupper() and isinstance(value, (dict, type(None))) \
                or isinstance(value, dist.ProcessGroup):
            setattr(groups, name, {} if isinstance(value, dict) else None)
    groups.mesh_device = None


for _stage in (1, 2, 3):
    def _make(stage):
        def fn(ctx):
            return both(ctx, lambda b: _deepspeed_fit(ctx, b, stage))
        fn.__name__ = f"case_deepspeed_zero{stage}"
        return fn
    case("deepspeed")(_make(_stage))


# ---- torch DDP + torch.distributed.checkpoint --------------------------------------------------
def _ddp_dcp(ctx, backend: str):
    import torch.distributed.checkpoint as dcp
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(tiny_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = dataset()
    sampler = torch.utils.data.distributed.DistributedSampler(
        torch.utils.data.TensorDataset(x, y), shuffle=True, seed=3)
    idx = list(iter(sampler))
    for step in range(STEPS):
        b = idx[4 * step:4 * step + 4]
        torch.nn.functional.mse_loss(model(x[b]), y[b]).backward()
        opt.step()
        opt.zero_grad()
    path = os.path.join(ctx.tmpdir, f"dcp-{backend}")
    dcp.save({"model": model.module.state_dict()}, checkpoint_id=path)
    fresh = tiny_model()
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=path)
    fresh.load_state_dict(state["model"])
    for a, b in zip(fresh.parameters(), model.module.parameters()):
        assert torch.equal(a, b), "DCP load differs from the saved parameters"
    return list(fresh.parameters())


@case("torch")
def case_ddp_dcp(ctx):
    return both(ctx, lambda b: _ddp_dcp(ctx, b))


# ---- the spawned group ----------------------------------------------------------------------------
def _clients(rank, ws, tmpdir, names):
    import ringcomm.torch  # noqa: F401  (registers "ringcomm")
    torch.set_num_threads(1)
    # what a launcher (torchrun) would set: Lightning and accelerate read these to find the rank
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ws), NODE_RANK="0",
                      LOCAL_WORLD_SIZE=str(ws), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29533"), DS_ACCELERATOR="cpu")
    ctx = Ctx(rank, ws, tmpdir)
    results = {}
    for name in names:
        fn, _needs = CASES[name]
        t0 = time.perf_counter()
        try:
            info, err = fn(ctx) or "", None
        except BaseException:  # noqa: BLE001 - reported to the parent, per case
            info, err = "", f"rank {rank}:\n{traceback.format_exc()}"
            Ctx.done()
        results[name] = (err, info, time.perf_counter() - t0)
        # kept per case, so that a rank that hangs later still reports the cases it finished
        with open(os.path.join(tmpdir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    return results


_results: dict = {}


def _runnable() -> dict:
    """case -> skip reason ("" when its library imports)."""
    out = {}
    for name, (_fn, needs) in CASES.items():
        ok, why = importable("lightning.pytorch" if needs == "lightning" else needs)
        out[name] = "" if ok else why
    return out


def client_results() -> dict:
    if not _results:
        # the cases expected to fail run last: a failure there may leave a rank stuck
        names = sorted((n for n, why in _runnable().items() if not why),
                       key=lambda n: n in KNOWN_FAIL)
        if not names:
            _results["__none__"] = True
            return _results
        with tempfile.TemporaryDirectory(prefix="ringcomm-clients-") as d:
            try:
                per_rank = spawn(_clients, WS, (d, names), timeout=TIMEOUT_S,
                                 env={"MASTER_PORT": str(free_port())})
            except LaunchError as e:
                per_rank = []
                for r in range(WS):
                    try:
                        with open(os.path.join(d, f"rank{r}.json")) as f:
                            per_rank.append(json.load(f))
                    except (OSError, ValueError):
                        per_rank.append({})
                launch_error = str(e)
            else:
                launch_error = None
        for name in names:
            if not all(name in res for res in per_rank):
                _results[name] = (f"no result from every rank: {launch_error}", "")
                continue
            errs = [res[name][0] for res in per_rank if res[name][0]]
            _results[name] = ("\n".join(errs) if errs else None,
                              f"{per_rank[0][name][1]} ({per_rank[0][name][2]:.1f} s)")
    return _results


def _params():
    out = []
    for name in CASES:
        marks = ([pytest.mark.xfail(strict=True, raises=KnownFailure, reason=KNOWN_FAIL[name][0])]
                 if name in KNOWN_FAIL else [])
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("name", _params())
def test_client(name):
    why = _runnable()[name]
    if why:
        pytest.skip(why)
    res = client_results()
    err, info = res[name]
    if err is not None:
        if name in KNOWN_FAIL and KNOWN_FAIL[name][1] in err:
            raise KnownFailure(f"case {name}:\n{err}")
        pytest.fail(f"case {name}:\n{err}")
    print(f"[{name}] {info}")
