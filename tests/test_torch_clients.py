"""PyTorch's own clients on the "ringcomm" backend: DDP (every option and the built-in comm hooks),
the overlap of DDP's bucket all-reduces with backward, FSDP2, DeviceMesh/DTensor, and the torchrun
example.

Each world size starts ONE group of ranks that runs every case (``_clients``), reporting per case
``None`` or the failing rank's traceback; the pytest tests look the results up. Every training run
is compared with the same run on gloo (same process, a gloo group over the same ranks: max abs
parameter difference <= 1e-6 in fp32) and, where the method is exact, with one process training
on the full batch.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from mp_cases import free_port, max_abs_diff  # noqa: E402
import ranks  # noqa: E402
from torch_battery import init_world, registry, run_cases  # noqa: E402

WORLD_SIZES = [2, 3]
STEPS = 5
GLOO_TOL = 1e-6          # ringcomm vs gloo, fp32 (the issue's bound)
SINGLE_TOL = 2e-5        # DDP vs one process on the full batch: other summation order, 5 Adam steps
TIMEOUT_S = 240

CASES, case = registry()


# ---- models and data ----------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d_in=16, hidden=32, d_out=4, unused=False, depth=2):
        super().__init__()
        layers, d = [], d_in
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), nn.Tanh()]
            d = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(hidden, d_out)
        self.unused = nn.Linear(hidden, d_out) if unused else None

    def forward(self, x):
        return self.head(self.body(x))


class Block(nn.Module):
    """A small transformer block (attention + MLP, pre-norm), deterministic (no dropout)."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        # bias=False: a key-projection bias has an exactly-zero true gradient (softmax ignores
        # it), and AdamW turns the rounding noise there into lr-sized steps that differ between
        # any two summation orders; without it, the comparison with one process is meaningful.
        self.layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=64, dropout=0.0,
                                                batch_first=True, norm_first=True, bias=False)
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        return self.head(self.layer(x).mean(1))


def model_for(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        return MLP()
    if kind == "unused":
        return MLP(unused=True)
    if kind == "deep":
        return MLP(d_in=64, hidden=64, depth=6)
    if kind == "block":
        return Block()
    raise ValueError(kind)


def global_batch(kind: str, step: int, micro: int, ws: int):
    """The full batch of one (step, micro-step): 4 samples per rank, rank r owns rows 4r..4r+3."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    n = 4 * ws
    if kind == "block":
        x = torch.randn(n, 6, 32, generator=g)
    elif kind == "deep":
        x = torch.randn(n, 64, generator=g)
    else:
        x = torch.randn(n, 16, generator=g)
    y = torch.randn(n, 4, generator=g)
    return x, y


def shard(t, rank):
    return t[4 * rank:4 * rank + 4]


def loss_fn(out, y):
    return nn.functional.mse_loss(out, y)


SINGLE_EPS = 1e-6


def adamw(params, eps=None):
    # Against gloo: torch's default AdamW (eps 1e-8); ringcomm adds in gloo's order, so the
    # parameters must come out the same. Against one process (another summation order by nature):
    # eps=SINGLE_EPS, since with 1e-8 a gradient element that happens to be ~1e-9 turns the
    # last-bit noise of that other order into a visible step; 1e-6 keeps the comparison
    # meaningful at SINGLE_TOL without hiding real errors.
    return torch.optim.AdamW(params, lr=1e-2) if eps is None else torch.optim.AdamW(params, lr=1e-2, eps=eps)


def train_single(kind: str, ws: int, micro_steps: int = 1) -> list:
    """One process, full batch: the reference for exact data-parallel methods."""
    model = model_for(kind)
    opt = adamw(model.parameters(), SINGLE_EPS)
    for step in range(STEPS):
        for m in range(micro_steps):
            x, y = global_batch(kind, step, m, ws)
            loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def train_ddp(group, kind: str, rank: int, ws: int, *, no_sync: bool = False, hook=None,
              hook_state=None, step_hook=None, eps=None, **ddp_kwargs) -> list:
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = model_for(kind)
    ddp = DDP(model, process_group=group, **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(hook_state(group) if callable(hook_state) else group, hook)
    opt = adamw(ddp.parameters(), eps)
    for step in range(STEPS):
        if no_sync:
            x, y = global_batch(kind, step, 0, ws)
            with ddp.no_sync():
                loss_fn(ddp(shard(x, rank)), shard(y, rank)).backward()
            x, y = global_batch(kind, step, 1, ws)
            loss_fn(ddp(shard(x, rank)), shard(y, rank)).backward()
        else:
            x, y = global_batch(kind, step, 0, ws)
            out = ddp(shard(x, rank))
            loss = loss_fn(out, shard(y, rank))
            if step_hook is not None:
                step_hook(step, model, loss)
            else:
                loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def compare(ctx, what: str, single: list | None = None, gloo_tol: float = GLOO_TOL,
            **kw) -> str:
    p_rc = train_ddp(ctx.rc, rank=ctx.rank, ws=ctx.ws, **kw)
    p_gloo = train_ddp(ctx.gloo, rank=ctx.rank, ws=ctx.ws, **kw)
    d = max_abs_diff(p_rc, p_gloo)
    assert d <= gloo_tol, f"{what}: ringcomm vs gloo max abs diff {d:.3g} > {gloo_tol}"
    line = f"{what}: vs gloo {d:.2g}"
    if single is not None:
        p_rc = train_ddp(ctx.rc, rank=ctx.rank, ws=ctx.ws, eps=SINGLE_EPS, **kw)
        ds = max_abs_diff(p_rc, single)
        if ds > SINGLE_TOL:
            # How far DDP lands from one process depends on the machine's matmul kernels (the
            # ISA torch dispatches to), not only on the collective: beyond SINGLE_TOL, gloo on the
            # same machine is the reference, and ringcomm must equal it.
            p_gloo = train_ddp(ctx.gloo, rank=ctx.rank, ws=ctx.ws, eps=SINGLE_EPS, **kw)
            dg = max_abs_diff(p_gloo, single)
            d = max_abs_diff(p_rc, p_gloo)
            assert dg > SINGLE_TOL and d <= gloo_tol, (
                f"{what}: ringcomm vs single process {ds:.3g} > {SINGLE_TOL} "
                f"(gloo vs single process {dg:.3g}, ringcomm vs gloo {d:.3g})")
        line += f", vs single process {ds:.2g}"
    # every rank holds the same parameters
    flat = torch.cat([p.reshape(-1) for p in p_rc])
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=ctx.gloo)
    assert torch.equal(flat, ref), f"{what}: parameters differ across ranks"
    return line


# ---- DDP ----------------------------------------------------------------------------------------
# name: (label, model kind, train_single's extra arguments, DDP's keyword arguments). Each
# trains DDP on ringcomm and on gloo and compares both with one process on the full batch.
DDP_VS_SINGLE = {
    "ddp_mlp": ("ddp mlp", "mlp", {}, {}),
    "ddp_transformer_block": ("ddp block", "block", {}, {}),
    "ddp_no_sync": ("ddp no_sync", "mlp", {"micro_steps": 2}, {"no_sync": True}),
    "ddp_find_unused_parameters": ("ddp find_unused", "unused", {},
                                   {"find_unused_parameters": True}),
    "ddp_gradient_as_bucket_view": ("ddp bucket view", "block", {},
                                    {"gradient_as_bucket_view": True}),
    "ddp_static_graph": ("ddp static_graph", "mlp", {}, {"static_graph": True}),
    "ddp_small_buckets": ("ddp small buckets", "deep", {}, {"bucket_cap_mb": 0.01}),
}


def _ddp_vs_single(label, kind, single_kw, ddp_kw):
    def run(ctx):
        return compare(ctx, label, train_single(kind, ctx.ws, **single_kw), kind=kind, **ddp_kw)
    return run


for _name, _spec in DDP_VS_SINGLE.items():
    CASES[_name] = _ddp_vs_single(*_spec)


@case
def case_ddp_fp16_compress_hook(ctx):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    # The hook sums fp16 values, where the order of additions shows in the result: ringcomm's
    # all-reduce combines every element in gloo's order at 2 and 3 ranks (ring_schedule.h,
    # ar_chunk_*), so the parameters agree to the same bound as in fp32.
    return compare(ctx, "ddp fp16 hook", None, kind="mlp",
                   hook=default_hooks.fp16_compress_hook)


@case
def case_ddp_powersgd_hook(ctx):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    def state(group):
        return ps.PowerSGDState(process_group=group, matrix_approximation_rank=2,
                                start_powerSGD_iter=2, min_compression_rate=0.5,
                                use_error_feedback=True, warm_start=True, random_seed=0)

    return compare(ctx, "ddp powerSGD", None, kind="block", hook=ps.powerSGD_hook,
                   hook_state=state)


@case
def case_ddp_overlap(ctx):
    """At least one bucket all-reduce is issued while backward is still computing gradients:
    before the first layer's weight gradient (the last one autograd produces) exists."""
    import ringcomm.torch as rct
    issued = []
    rc_name = ctx.rc.group_name

    def on_issue(op, group, seq, t):
        if group == rc_name:
            issued.append((op, t))

    marks = {}

    def step_hook(step, model, loss):
        if step != 2:
            loss.backward()
            return
        def first_grad(grad):
            marks.setdefault("first_layer_grad", time.perf_counter())

        h = model.body[0].weight.register_hook(first_grad)
        issued.clear()
        rct.add_issue_hook(on_issue)
        try:
            loss.backward()
            marks["backward_returned"] = time.perf_counter()
        finally:
            rct.remove_issue_hook(on_issue)
            h.remove()

    train_ddp(ctx.rc, "deep", ctx.rank, ctx.ws, bucket_cap_mb=0.01, step_hook=step_hook)
    early = [op for op, t in issued if op == "allreduce" and t < marks["first_layer_grad"]]
    n_all = sum(1 for op, _ in issued if op == "allreduce")
    assert n_all >= 3, f"expected several bucket all-reduces, saw {issued}"
    assert early, ("no bucket all-reduce was issued before backward reached the first layer: "
                   f"{issued}, marks {marks}")
    assert marks["first_layer_grad"] < marks["backward_returned"]
    return f"{len(early)} of {n_all} bucket all-reduces issued before the first layer's grad"


# ---- FSDP2 --------------------------------------------------------------------------------------
@case
def case_fsdp2_mlp(ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (ctx.ws,))
    assert dist.get_backend(mesh.get_group()) == "ringcomm"
    model = model_for("mlp")
    for layer in model.body:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = adamw(model.parameters(), SINGLE_EPS)
    for step in range(STEPS):
        x, y = global_batch("mlp", step, 0, ctx.ws)
        loss_fn(model(shard(x, ctx.rank)), shard(y, ctx.rank)).backward()
        opt.step()
        opt.zero_grad()
    full = [p.full_tensor().detach() for p in model.parameters()]
    single = train_single("mlp", ctx.ws)
    d = max_abs_diff(full, single)
    assert d <= SINGLE_TOL, f"FSDP2 vs single process: max abs diff {d:.3g} > {SINGLE_TOL}"
    return f"fsdp2 vs single process {d:.2g}"


# ---- DeviceMesh / DTensor -----------------------------------------------------------------------
@case
def case_device_mesh(ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    ws, r = ctx.ws, ctx.rank
    mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("dp",))
    pg = mesh.get_group("dp")
    assert dist.get_backend(pg) == "ringcomm", dist.get_backend(pg)
    full = torch.arange(ws * 4 * 3, dtype=torch.float32).reshape(ws * 4, 3)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(dt.to_local(), full[4 * r:4 * r + 4])
    assert torch.equal(dt.full_tensor(), full)                       # all-gather (functional)
    assert torch.equal(dt.redistribute(mesh, [Replicate()]).to_local(), full)
    s = (dt * 2).sum()                                               # partial -> all-reduce
    assert s.full_tensor().item() == 2 * full.sum().item()
    # a 2-D mesh: its sub-groups are new ringcomm groups
    mesh2 = init_device_mesh("cpu", (1, ws), mesh_dim_names=("a", "b"))
    assert dist.get_backend(mesh2.get_group("b")) == "ringcomm"
    t = torch.ones(3)
    dist.all_reduce(t, group=mesh2.get_group("b"))
    assert torch.equal(t, torch.full((3,), float(ws)))
    return "1-D and 2-D meshes, DTensor shard/replicate/partial"


# ---- the spawned group ----------------------------------------------------------------------------
def _clients(rank, ws, d):
    import ringcomm.torch  # noqa: F401
    torch.set_num_threads(1)
    ctx = init_world(rank, ws, d, 60)
    results = {name: (err, info or "", seconds)
               for name, (err, info, seconds) in run_cases(ctx, CASES).items()}
    dist.destroy_process_group()
    return results


def client_results(ws: int) -> dict:
    """``{case: (every rank's error or None, rank 0's info)}`` from ONE group per world size."""
    def start():
        per_rank = ranks.run_in_dir(_clients, ws, "ringcomm-torch-clients-", timeout=TIMEOUT_S)
        merged = {}
        for name in CASES:
            errs = [res[name][0] for res in per_rank if res[name][0]]
            merged[name] = ("\n".join(errs) if errs else None, per_rank[0][name][1])
        return merged
    return ranks.once(("clients", ws), start, f"the world-{ws} group of the torch clients")


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_client(ws, name):
    err, info = client_results(ws)[name]
    if err is not None:
        pytest.fail(f"world size {ws}, case {name}:\n{err}")
    print(f"[ws={ws}] {info}")


@pytest.mark.timeout(180)
def test_torchrun_example():
    """``torchrun --nproc-per-node 4 examples/ddp_mlp.py`` (env:// rendezvous) on ringcomm."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
           "--master-port", str(free_port()),
           os.path.join(root, "examples", "ddp_mlp.py"), "--steps", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun timed out:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:]
    assert "backend ringcomm  world 4" in out and "identical on all ranks: True" in out, out[-4000:]


