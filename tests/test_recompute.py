"""ringcomm.training.recompute.checkpoint: same gradients, same dropout masks, fewer saved bytes.

Single process (fast). The distributed combination, BucketedDDP + checkpoint on a residual
network, is in test_ddp.py (it shares that module's group of ranks).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ringcomm.training.recompute import checkpoint

pytestmark = pytest.mark.timeout(60)


class ResBlock(nn.Module):
    def __init__(self, d, p_drop=0.0):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p_drop)

    def forward(self, x):
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm(x)))))


class Net(nn.Module):
    def __init__(self, d=32, depth=4, p_drop=0.0, checkpointed=False):
        super().__init__()
        self.blocks = nn.ModuleList(ResBlock(d, p_drop) for _ in range(depth))
        self.head = nn.Linear(d, 5)
        self.checkpointed = checkpointed

    def forward(self, x):
        for blk in self.blocks:
            x = checkpoint(blk, x) if self.checkpointed else blk(x)
        return self.head(x)


def _pair(**kw):
    torch.manual_seed(0)
    plain = Net(**kw)
    ck = Net(checkpointed=True, **kw)
    ck.load_state_dict(plain.state_dict())
    return plain, ck


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


class SavedBytes:
    """Bytes saved for backward while active (every packed tensor counted, as the assignment's
    check does), plus the peak of those still alive."""

    def __init__(self):
        self.total = 0

    def __enter__(self):
        def pack(t):
            self.total += t.numel() * t.element_size()
            return t
        self._ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_gradients_equal_no_checkpoint(input_requires_grad):
    plain, ck = _pair()
    x = torch.randn(16, 32, requires_grad=input_requires_grad)
    y = torch.randn(16, 5)
    outs, grads, xgrads = [], [], []
    for m in (plain, ck):
        x.grad = None
        out = m(x)
        F.mse_loss(out, y).backward()
        outs.append(out.detach())
        grads.append(_grads(m))
        xgrads.append(None if x.grad is None else x.grad.clone())
    assert torch.equal(outs[0], outs[1])
    for a, b in zip(*grads):
        assert torch.equal(a, b)   # exact: the same deterministic fp32 ops run again
    if input_requires_grad:
        assert torch.equal(xgrads[0], xgrads[1])
    else:
        assert xgrads == [None, None]


def test_dropout_masks_match_rng_restored():
    plain, ck = _pair(p_drop=0.5)
    x = torch.randn(16, 32, requires_grad=True)
    res = []
    for m in (plain, ck):
        torch.manual_seed(123)
        x.grad = None
        out = m(x)
        out.pow(2).sum().backward()
        after = torch.rand(4)   # the recomputation must not change the RNG stream either
        res.append((out.detach(), _grads(m), x.grad.clone(), after))
    (o1, g1, xg1, r1), (o2, g2, xg2, r2) = res
    assert torch.equal(o1, o2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    assert torch.equal(xg1, xg2)
    assert torch.equal(r1, r2)


def test_without_rng_preservation_dropout_differs():
    # Sanity check of the test above: if the RNG state were not restored, masks would differ.
    _, ck = _pair(p_drop=0.5)
    plain, _ = _pair(p_drop=0.5)
    x = torch.randn(16, 32)
    torch.manual_seed(123)
    plain(x).pow(2).sum().backward()

    class NoRng(Net):
        def forward(self, x):
            for blk in self.blocks:
                x = checkpoint(blk, x, preserve_rng_state=False)
            return self.head(x)

    torch.manual_seed(0)
    nr = NoRng(p_drop=0.5)
    nr.load_state_dict(plain.state_dict())
    torch.manual_seed(123)
    nr(x).pow(2).sum().backward()
    assert not all(torch.equal(a, b) for a, b in zip(_grads(plain), _grads(nr)))


@pytest.mark.parametrize("depth,batch", [(1, 64), (4, 64)])
def test_saved_bytes_at_least_halved(depth, batch):
    plain, ck = _pair(depth=depth)
    x = torch.randn(batch, 32, requires_grad=True)
    counts = []
    for m in (plain, ck):
        with SavedBytes() as sb:
            out = m(x)
        out.sum().backward()   # still trainable after counting
        counts.append(sb.total)
    assert counts[1] * 2 <= counts[0], counts


def test_mixed_args_and_outputs():
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)

    def fn(x, mask, scale, opts, pair):
        h = lin(x) * scale
        if opts["square"]:
            h = h * h
        h = h.masked_fill(mask, 0.0)
        return {"main": h + pair[0], "aux": [pair[1] * 2.0, "tag", 7], "idx": mask.nonzero()}

    x = torch.randn(3, 6, requires_grad=True)
    mask = torch.rand(3, 6) > 0.5                   # a tensor that cannot require grad
    a = torch.randn(3, 6, requires_grad=True)
    b = torch.randn(3, 6)                           # a float tensor that does not require grad
    args = (x, mask, 1.5, {"square": True}, (a, b))

    ref = fn(*args)
    (ref["main"].sum() + ref["aux"][0].sum()).backward()
    gref = [x.grad.clone(), a.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]
    for t in (x, a, lin.weight, lin.bias):
        t.grad = None

    out = checkpoint(fn, *args)
    assert out["aux"][1:] == ["tag", 7]
    assert torch.equal(out["idx"], ref["idx"])
    assert not out["idx"].requires_grad   # integer outputs are non-differentiable
    assert torch.equal(out["main"], ref["main"].detach())
    (out["main"].sum() + out["aux"][0].sum()).backward()
    got = [x.grad, a.grad, lin.weight.grad, lin.bias.grad]
    assert all(torch.equal(g, r) for g, r in zip(got, gref))
    assert b.grad is None


def test_parameters_get_grads_when_no_input_requires_grad():
    torch.manual_seed(0)
    blk = ResBlock(8)
    x = torch.randn(4, 8)   # plain data: requires_grad=False
    blk(x).sum().backward()
    ref = _grads(blk)
    blk.zero_grad(set_to_none=True)
    out = checkpoint(blk, x)
    assert out.requires_grad
    out.sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(_grads(blk), ref))


def test_autocast_bf16_recompute_matches():
    plain, ck = _pair()
    x = torch.randn(16, 32, requires_grad=True)
    res = []
    for m in (plain, ck):
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
        out.float().sum().backward()
        res.append((out.detach(), _grads(m), x.grad.clone()))
    assert res[0][0].dtype == torch.bfloat16
    assert torch.equal(res[0][0], res[1][0])
    assert all(torch.equal(a, b) for a, b in zip(res[0][1], res[1][1]))
    assert torch.equal(res[0][2], res[1][2])


def test_no_grad_mode_just_runs():
    blk = ResBlock(8)
    x = torch.randn(2, 8)
    with torch.no_grad():
        out = checkpoint(blk, x)
    assert torch.equal(out, blk(x).detach())
    assert not out.requires_grad


def test_autograd_grad_is_rejected_clearly():
    blk = ResBlock(8)
    x = torch.randn(2, 8, requires_grad=True)
    out = checkpoint(blk, x)
    with pytest.raises(RuntimeError, match="autograd.grad"):
        torch.autograd.grad(out.sum(), x)
