"""ringcomm.training.tp against the dense modules in one process, on spawned CPU ranks.

One group of 4 ranks per backend (shared with ``test_pp.py``: ``tp_pp_group``) runs every case
(``_rank_cases``): the 4-rank cases on the default group and the 2-rank cases on the sub-groups {0, 1} and {2, 3} at the same time (so the
``group=`` argument is exercised too). Every rank builds the dense module and the data from the
same seed and compares its own shards, outputs and gradients with the dense ones, sliced here in
the test (not with the library's slicing).

Tolerances (relative: max |tp - dense| / max |dense| per tensor):
* fp32: 1e-6. The same products; only the order of the sums over the split dimension changes
  (row-parallel partial outputs summed by all-reduce, column-parallel input gradients likewise).
* bf16: 2e-2 (~5 bf16 ulps of 2^-8): the row-parallel layer rounds each rank's partial output to
  bf16 before the all-reduce adds them (in bf16), where the dense GEMM rounds once after
  accumulating the whole sum; the column parallel input gradient likewise. Observed <= ~8e-3.
"""
from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import tp_pp_group

WORLD = tp_pp_group.WORLD
FP32_TOL = 1e-6
BF16_TOL = 2e-2
D, H, HEADS = 16, 64, 4
SHAPE = (3, 5, D)      # batch, sequence, features


# ----------------------------------------------------------------------------- references
class DenseAttention(nn.Module):
    """Causal multi-head self-attention, the layout of ringcomm.apps.train.Block's attention."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(att.transpose(1, 2).reshape(b, t, d))


def _rows(t, r, n):                      # column parallel: output features = weight rows
    c = t.shape[0] // n
    return t[r * c:(r + 1) * c]


def _cols(t, r, n):                      # row parallel: input features = weight columns
    c = t.shape[1] // n
    return t[:, r * c:(r + 1) * c]


def _qkv_rows(t, r, n):                  # rank r's heads of q, of k and of v
    d = t.shape[0] // 3
    return torch.cat([_rows(t[j * d:(j + 1) * d], r, n) for j in range(3)])


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


class _Count:
    """Counts tp's collectives: its all-reduces (``ringcomm.torch.all_reduce_``, which tp looks up
    at call time in its module) and torch.distributed's all_gather / broadcast calls."""

    NAMES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast")

    def __init__(self):
        self.n = {k: 0 for k in self.NAMES}
        self._orig = {}

    def __enter__(self):
        from ringcomm.training import tp
        for k in self.NAMES:
            owner, attr = (tp, "all_reduce_") if k == "all_reduce" else (dist, k)
            orig = getattr(owner, attr)
            self._orig[k] = (owner, attr, orig)

            def wrapped(*a, _k=k, _o=orig, **kw):
                self.n[_k] += 1
                return _o(*a, **kw)
            setattr(owner, attr, wrapped)
        return self

    def __exit__(self, *exc):
        for owner, attr, f in self._orig.values():
            setattr(owner, attr, f)


def _data(dtype, seed=7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*SHAPE, generator=g).to(dtype)
    dy = torch.randn(*SHAPE, generator=g).to(dtype)
    return x, dy


def _run(module, x, dy):
    """Forward, then backward of <y, dy>; returns (y, x.grad, counts forward, counts backward)."""
    x = x.clone().requires_grad_(True)
    with _Count() as cf:
        y = module(x)
    with _Count() as cb:
        y.backward(dy)
    return y.detach(), x.grad, cf.n, cb.n


# ----------------------------------------------------------------------------- cases (in ranks)
def _compare(name, dense, par, pairs, x, dy):
    """``pairs``: [(dense grad slice fn, parallel parameter, dense parameter)]."""
    yd, gxd, _, _ = _run(dense, x, dy)
    yp, gxp, cf, cb = _run(par, x, dy)
    errs = {"out": _rel(yp, yd), "dx": _rel(gxp, gxd)}
    for i, (fn, pp, dp) in enumerate(pairs):
        errs[f"w{i}"] = _rel(pp.data, fn(dp.data))
        errs[f"g{i}"] = _rel(pp.grad, fn(dp.grad))
    return {"errs": errs, "fwd": cf, "bwd": cb}


def _mlp_case(group, dtype):
    from ringcomm.training import tp
    n, r = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(11)
    dense = nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D)).to(dtype)
    par = tp.from_dense(dense, group=group)
    assert isinstance(par, tp.ParallelMLP)
    rows, cols, same = (lambda t: _rows(t, r, n)), (lambda t: _cols(t, r, n)), (lambda t: t)
    pairs = [(rows, par[0].weight, dense[0].weight), (rows, par[0].bias, dense[0].bias),
             (cols, par[2].weight, dense[2].weight), (same, par[2].bias, dense[2].bias)]
    x, dy = _data(dtype)
    return _compare("mlp", dense, par, pairs, x, dy)


def _linear_case(group, dtype, style):
    from ringcomm.training import tp
    n, r = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(12)
    dense = nn.Linear(D, 2 * D).to(dtype)
    par = tp.from_dense(dense, group=group, style=style)
    sl = (lambda t: _rows(t, r, n)) if style == "column" else (lambda t: _cols(t, r, n))
    pairs = [(sl, par.weight, dense.weight),
             ((lambda t: _rows(t, r, n)) if style == "column" else (lambda t: t),
              par.bias, dense.bias)]
    x, dy = _data(dtype)
    dy = torch.randn(*SHAPE[:-1], 2 * D, generator=torch.Generator().manual_seed(3)).to(dtype)
    return _compare(style, dense, par, pairs, x, dy)


def _attn_case(group, dtype):
    from ringcomm.training import tp
    n, r = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(13)
    dense = DenseAttention(D, HEADS).to(dtype)
    par = tp.ParallelSelfAttention(D, HEADS, group=group, dtype=dtype).load_dense(dense)
    qkv = lambda t: _qkv_rows(t, r, n)  # noqa: E731
    pairs = [(qkv, par.qkv.weight, dense.qkv.weight), (qkv, par.qkv.bias, dense.qkv.bias),
             (lambda t: _cols(t, r, n), par.proj.weight, dense.proj.weight),
             (lambda t: t, par.proj.bias, dense.proj.bias)]
    x, dy = _data(dtype)
    return _compare("attn", dense, par, pairs, x, dy)


def _checkpoint_case(group):
    """A dense checkpoint (torch.save of the dense state_dict) loads into freshly built parallel
    modules with different initial weights; their outputs then equal from_dense's bitwise."""
    from ringcomm.training import tp
    torch.manual_seed(14)
    dense_mlp = nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D))
    dense_att = DenseAttention(D, HEADS)
    buf = io.BytesIO()
    torch.save({"mlp": dense_mlp.state_dict(), "att": dense_att.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf)
    torch.manual_seed(99)
    mlp = tp.ParallelMLP(D, H, group=group)
    att = tp.ParallelSelfAttention(D, HEADS, group=group)
    before = tp.from_dense(dense_mlp, group=group)[0].weight.detach().clone()
    changed_init = not torch.equal(mlp[0].weight.detach(), before)
    mlp.load_state_dict(ck["mlp"])
    att.load_state_dict(ck["att"])
    x, _ = _data(torch.float32)
    ref_mlp = tp.from_dense(dense_mlp, group=group)
    ref_att = tp.ParallelSelfAttention(D, HEADS, group=group).load_dense(dense_att)
    with torch.no_grad():
        same = (torch.equal(mlp(x), ref_mlp(x)) and torch.equal(att(x), ref_att(x)))
        dense_err = max(_rel(mlp(x), dense_mlp(x)), _rel(att(x), dense_att(x)))
    # Shard-shaped tensors load as they are (a tensor-parallel checkpoint of the same layout).
    mlp2 = tp.ParallelMLP(D, H, group=group)
    mlp2.load_state_dict(mlp.state_dict())
    with torch.no_grad():
        shard_ok = torch.equal(mlp2(x), mlp(x))
    return {"changed_init": changed_init, "same": same, "dense_err": dense_err,
            "shard_ok": shard_ok}


def _init_case(group):
    """Constructed with the same seed, the shards are slices of nn.Linear(in, out)."""
    from ringcomm.training import tp
    n, r = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(21)
    ref_c = nn.Linear(D, 2 * D)
    torch.manual_seed(21)
    col = tp.ColumnParallelLinear(D, 2 * D, group=group)
    torch.manual_seed(22)
    ref_r = nn.Linear(2 * D, D)
    torch.manual_seed(22)
    row = tp.RowParallelLinear(2 * D, D, group=group)
    return {"col": torch.equal(col.weight, _rows(ref_c.weight, r, n))
            and torch.equal(col.bias, _rows(ref_c.bias, r, n)),
            "row": torch.equal(row.weight, _cols(ref_r.weight, r, n))
            and torch.equal(row.bias, ref_r.bias),
            "col_shape": tuple(col.weight.shape), "row_shape": tuple(row.weight.shape)}


def _seed001_case(group):
    """Seed 001: X = (1, 2), XA = (1, 2, 1, 0), partial outputs (0.841, 1.955) and
    (0.841, 0.841), Y = (1.682, 2.796), GeLU in its tanh form (as the seed's numbers)."""
    from ringcomm.apps import simulate
    from ringcomm.training import tp
    A = torch.tensor([[1., 0., 1., 0.], [0., 1., 0., 0.]])
    B = torch.tensor([[1., 0.], [0., 1.], [1., 1.], [0., 0.]])
    dense = nn.Sequential(nn.Linear(2, 4, bias=False), nn.GELU(approximate="tanh"),
                          nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        dense[0].weight.copy_(A.T)          # nn.Linear computes x W^T: W = A^T
        dense[2].weight.copy_(B.T)
    mlp = tp.from_dense(dense, group=group)
    X = torch.tensor([[1., 2.]])
    with torch.no_grad():
        xa = mlp[0](X)                                  # this rank's columns of XA
        partial = F.linear(mlp[1](xa), mlp[2].weight)   # this rank's partial output
        Y = mlp(X)
    _, sim_partials = simulate.tensor_parallel_mlp(X.numpy(), A.numpy(), B.numpy(), 2,
                                                   return_partials=True)
    return {"xa": xa[0].tolist(), "partial": partial[0].tolist(), "y": Y[0].tolist(),
            "sim_partial": [float(v) for v in sim_partials[dist.get_rank(group)][0]]}


def _dp_tp_case(dtype=torch.float32):
    """2 (data) x 2 (tensor) on 4 ranks: the tensor-parallel MLP on each tp group, the batch
    split over the dp groups, gradients averaged over dp = dense gradients of the full batch."""
    from ringcomm.training import tp
    groups = tp.make_groups(2)
    torch.manual_seed(15)
    dense = nn.Sequential(nn.Linear(D, H), nn.GELU(), nn.Linear(H, D))
    par = tp.from_dense(dense, group=groups.tp)
    g = torch.Generator().manual_seed(5)
    x, t = torch.randn(8, D, generator=g), torch.randn(8, D, generator=g)
    F.mse_loss(dense(x), t).backward()
    lo = groups.dp_rank * 4
    F.mse_loss(par(x[lo:lo + 4]), t[lo:lo + 4]).backward()
    for p in par.parameters():
        dist.all_reduce(p.grad, group=groups.dp)
        p.grad /= 2
    r = groups.tp_rank
    errs = [_rel(par[0].weight.grad, _rows(dense[0].weight.grad, r, 2)),
            _rel(par[0].bias.grad, _rows(dense[0].bias.grad, r, 2)),
            _rel(par[2].weight.grad, _cols(dense[2].weight.grad, r, 2)),
            _rel(par[2].bias.grad, dense[2].bias.grad)]
    return {"errs": errs, "tp_rank": groups.tp_rank, "dp_rank": groups.dp_rank,
            "tp_size": dist.get_world_size(groups.tp), "dp_size": dist.get_world_size(groups.dp)}


def _rank_cases(rank, world_size):
    torch.manual_seed(0)
    pair01 = dist.new_group([0, 1])
    pair23 = dist.new_group([2, 3])
    pair = pair01 if rank < 2 else pair23
    cases = {}
    for n, grp in ((4, None), (2, pair)):
        for dn, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            cases[f"mlp/{n}/{dn}"] = lambda g=grp, d=dt: _mlp_case(g, d)
            cases[f"attn/{n}/{dn}"] = lambda g=grp, d=dt: _attn_case(g, d)
            for style in ("column", "row"):
                cases[f"{style}/{n}/{dn}"] = lambda g=grp, d=dt, s=style: _linear_case(g, d, s)
        cases[f"checkpoint/{n}"] = lambda g=grp: _checkpoint_case(g)
        cases[f"init/{n}"] = lambda g=grp: _init_case(g)
    cases["seed001/2"] = lambda: _seed001_case(pair)
    cases["dp_tp"] = _dp_tp_case
    return tp_pp_group.run_cases(cases)


# ----------------------------------------------------------------------------- pytest side
def _case(backend, name):
    return tp_pp_group.case(backend, "tp/" + name)


params_n = pytest.mark.parametrize("n", [2, 4])
params_dt = pytest.mark.parametrize("dt", ["fp32", "bf16"])
TOL = {"fp32": FP32_TOL, "bf16": BF16_TOL}


def _within_tol(backend, name, dt) -> list:
    """Case ``name``'s results, each checked to be within ``dt``'s tolerance of the dense model."""
    per_rank = _case(backend, name)
    for r in per_rank:
        assert max(r["errs"].values()) <= TOL[dt], r["errs"]
    return per_rank


@tp_pp_group.group_test
@params_n
@params_dt
def test_parallel_mlp_equals_dense(backend, n, dt):
    _within_tol(backend, f"mlp/{n}/{dt}", dt)


@tp_pp_group.group_test
@params_n
def test_parallel_mlp_one_all_reduce_each_way(backend, n):
    for r in _case(backend, f"mlp/{n}/fp32"):
        assert r["fwd"] == {"all_reduce": 1, "all_gather": 0, "all_gather_into_tensor": 0,
                            "broadcast": 0}
        assert r["bwd"] == {"all_reduce": 1, "all_gather": 0, "all_gather_into_tensor": 0,
                            "broadcast": 0}


@tp_pp_group.group_test
@params_n
@params_dt
def test_head_parallel_attention_equals_dense(backend, n, dt):
    for r in _within_tol(backend, f"attn/{n}/{dt}", dt):
        assert r["fwd"]["all_reduce"] == 1 and r["bwd"]["all_reduce"] == 1
        assert r["fwd"]["all_gather"] == 0 and r["bwd"]["all_gather"] == 0


@tp_pp_group.group_test
@params_n
@params_dt
@pytest.mark.parametrize("style", ["column", "row"])
def test_linear_equals_dense(backend, n, dt, style):
    for r in _within_tol(backend, f"{style}/{n}/{dt}", dt):
        if style == "column":
            # gather_output: an all-gather forward (its backward is a local split); the input
            # gradient is all-reduced backward.
            assert (r["fwd"]["all_gather"], r["fwd"]["all_reduce"]) == (1, 0)
            assert (r["bwd"]["all_gather"], r["bwd"]["all_reduce"]) == (0, 1)
        else:
            # the input is scattered (local) forward, partial outputs all-reduced; backward
            # all-gathers the input gradient.
            assert (r["fwd"]["all_gather"], r["fwd"]["all_reduce"]) == (0, 1)
            assert (r["bwd"]["all_gather"], r["bwd"]["all_reduce"]) == (1, 0)


@tp_pp_group.group_test
@params_n
def test_dense_checkpoint_loads(backend, n):
    for r in _case(backend, f"checkpoint/{n}"):
        assert r["changed_init"]
        assert r["same"] and r["shard_ok"]
        assert r["dense_err"] <= FP32_TOL


@tp_pp_group.group_test
@params_n
def test_init_is_a_slice_of_the_dense_init(backend, n):
    for r in _case(backend, f"init/{n}"):
        assert r["col"] and r["row"]
        assert r["col_shape"] == (2 * D // n, D) and r["row_shape"] == (D, 2 * D // n)


@tp_pp_group.group_test
def test_seed001_megatron_example_on_two_ranks(backend):
    res = _case(backend, "seed001/2")
    expect_xa = [[1.0, 2.0], [1.0, 0.0]]
    expect_partial = [[0.841, 1.955], [0.841, 0.841]]
    for rank, r in enumerate(res):
        pr = rank % 2                       # two pairs, {0, 1} and {2, 3}
        assert r["xa"] == expect_xa[pr]
        assert [round(v, 3) for v in r["partial"]] == expect_partial[pr]
        assert r["partial"] == pytest.approx(r["sim_partial"], rel=1e-6)
        assert [round(v, 3) for v in r["y"]] == [1.682, 2.796]


@tp_pp_group.group_test
def test_data_x_tensor_parallel_gradients(backend):
    res = _case(backend, "dp_tp")
    assert sorted((r["dp_rank"], r["tp_rank"]) for r in res) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in res:
        assert r["tp_size"] == 2 and r["dp_size"] == 2
        assert max(r["errs"]) <= FP32_TOL, r["errs"]


def test_tp_block_on_one_rank_equals_the_dense_block():
    """Without a process group (tensor-parallel size 1) the demo's TPBlock is the dense
    ringcomm.apps.train.Block: same parameters, same output to fp32 roundoff."""
    from ringcomm.apps.parallel_demo import TPBlock
    from ringcomm.apps.train import Block
    torch.manual_seed(0)
    blk = Block(D, HEADS)
    x = torch.randn(*SHAPE)
    with torch.no_grad():
        ref = blk(x)
        out = TPBlock(blk, None)(x)
    assert _rel(out, ref) <= FP32_TOL
