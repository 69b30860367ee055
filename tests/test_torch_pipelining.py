"""torch.distributed.pipelining (torch's own PipelineStage and schedules, code we did not write) on
the "ringcomm" backend at 3 ranks, where activations and gradients of 1.2 MB between stages take
the point-to-point rendezvous (csrc/comm/p2p_engine.h). ONE spawned group of 3 ranks trains a
6-layer model split into 3 stages for 2 steps with GPipe and 1F1B, each on ringcomm and on gloo
(a fresh default group each time): the parameters and losses must be EQUAL to gloo's (point-to-
point moves bytes; nothing is reduced), and close to a single process that runs the same
microbatches through the whole model."""
from __future__ import annotations

import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.pipelining")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from ringcomm.core.launch import spawn  # noqa: E402

WS = 3
H, ROWS, MICRO, LAYERS, STEPS = 256, 1200, 4, 6, 2  # an activation: 1200 x 256 float32 = 1.2 MB
SCHEDULES = ("gpipe", "1f1b")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(H, H), nn.Tanh())])


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(ROWS * MICRO, H, generator=g), torch.randn(ROWS * MICRO, H, generator=g)


def _reference():
    """One process: the same microbatches through the whole model, gradients averaged over them (the
    schedules' default, scale_grads), the same SGD steps. (parameters, summed loss per step)."""
    model, (x, y) = _model(), _data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO)):
            loss = nn.functional.mse_loss(model(xm), ym)
            (loss / MICRO).backward()
            total += float(loss.detach())
        losses.append(total)
        opt.step()
    return [p.detach() for p in model.parameters()], losses


def _train(rank, ws, store, backend, schedule_name):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    dist.init_process_group(backend, init_method=f"file://{store}/{backend}-{schedule_name}", rank=rank,
                            world_size=ws)
    try:
        full = _model()
        per = len(full) // ws
        sub = full[rank * per:(rank + 1) * per]
        stage = PipelineStage(sub, rank, ws, torch.device("cpu"))
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
        schedule = kind(stage, n_microbatches=MICRO, loss_fn=nn.functional.mse_loss)
        opt = torch.optim.SGD(sub.parameters(), lr=0.1)
        x, y = _data()
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            if rank == 0:
                schedule.step(x)
            elif rank == ws - 1:
                per_micro = []
                schedule.step(target=y, losses=per_micro)
                losses.append(float(sum(float(v.detach()) for v in per_micro)))
            else:
                schedule.step()
            opt.step()
        return [p.detach().clone() for p in sub.parameters()], losses
    finally:
        dist.destroy_process_group()


def _group(rank, ws, store):
    import ringcomm.torch  # noqa: F401  (registers "ringcomm")
    torch.set_num_threads(1)
    return {(b, s): _train(rank, ws, store, b, s) for s in SCHEDULES for b in ("ringcomm", "gloo")}


_results: dict = {}


def _run() -> list:
    if not _results:
        with tempfile.TemporaryDirectory(prefix="ringcomm-pipelining-") as d:
            _results["ranks"] = spawn(_group, WS, (d,), timeout=240)
    return _results["ranks"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_torch_pipelining_equals_gloo_and_the_single_process(schedule):
    ranks = _run()
    ref_params, ref_losses = _reference()
    per = 2 * LAYERS // WS  # parameters per stage: a weight and a bias per Linear
    for rank, got in enumerate(ranks):
        ours, _ = got[("ringcomm", schedule)]
        theirs, _ = got[("gloo", schedule)]
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), f"rank {rank}: differs from gloo"
        ref = ref_params[rank * per:(rank + 1) * per]
        assert len(ours) == len(ref)
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    last = ranks[-1]
    assert last[("ringcomm", schedule)][1] == last[("gloo", schedule)][1]
    assert last[("ringcomm", schedule)][1] == pytest.approx(ref_losses, rel=1e-5)
