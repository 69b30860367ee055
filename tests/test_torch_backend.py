"""torch.distributed backend "ringcomm": every operation, sync and async, against gloo and a
single-process reference.

Spawning a rank that imports torch costs seconds on small machines, so each world size starts ONE
group of ranks which runs every case in turn (``_battery``: the collectives of
tests/torch_backend_cases.py, then the cases below) and reports, per case, ``None``
or the failing rank's traceback. The pytest tests then only look the results up. Each rank builds
a ringcomm world group and a gloo group over the same ranks; each case runs the operation on
ringcomm, the same operation on gloo where gloo supports it, and compares both with the result
computed locally from every rank's (deterministic) input.
"""
from __future__ import annotations

import datetime
import os
import time
import traceback

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ranks  # noqa: E402
from mp_cases import free_port  # noqa: E402
from torch_backend_cases import CASES, assert_same, case  # noqa: E402
from torch_battery import fail_on_error, init_world, run_cases  # noqa: E402

WORLD_SIZES = [2, 3]
CASE_TIMEOUT_S = 30        # ringcomm/gloo group timeout inside the battery: a desync fails fast
BATTERY_TIMEOUT_S = 200    # the whole spawned battery for one world size


@case
def case_send_recv(ctx):
    ws, r = ctx.ws, ctx.rank
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    for n in (5, 300_000):
        # isend / irecv around the ring
        out = torch.empty(n)
        rw = dist.irecv(out, src=prv, group=ctx.rc)
        sw = dist.isend(torch.full((n,), float(r)), dst=nxt, group=ctx.rc)
        sw.wait()
        rw.wait()
        assert_same(out, torch.full((n,), float(prv)), f"irecv n={n}")
        # blocking send/recv, ordered so that it cannot deadlock
        out = torch.empty(n, dtype=torch.int64)
        if r % 2 == 0:
            dist.send(torch.full((n,), r, dtype=torch.int64), dst=nxt, group=ctx.rc)
            src = dist.recv(out, src=prv, group=ctx.rc)
        else:
            src = dist.recv(out, src=prv, group=ctx.rc)
            dist.send(torch.full((n,), r, dtype=torch.int64), dst=nxt, group=ctx.rc)
        assert src == prv, src
        assert_same(out, torch.full((n,), prv, dtype=torch.int64), f"recv n={n}")
    # receive into a non-contiguous tensor
    base = torch.zeros(6, 2)
    w1 = dist.irecv(base[:, 0], src=prv, group=ctx.rc)
    dist.isend(torch.arange(6, dtype=torch.float32), dst=nxt, group=ctx.rc).wait()
    w1.wait()
    assert_same(base[:, 0].contiguous(), torch.arange(6, dtype=torch.float32), "recv strided")
    assert_same(base[:, 1].contiguous(), torch.zeros(6), "recv strided untouched")


@case
def case_batch_isend_irecv(ctx):
    ws, r = ctx.ws, ctx.rank
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    for n in (16, 250_000):
        from_prv, from_nxt = torch.empty(n), torch.empty(n)
        ops = [dist.P2POp(dist.isend, torch.full((n,), float(r)), nxt, group=ctx.rc),
               dist.P2POp(dist.isend, torch.full((n,), float(-r)), prv, group=ctx.rc),
               dist.P2POp(dist.irecv, from_prv, prv, group=ctx.rc),
               dist.P2POp(dist.irecv, from_nxt, nxt, group=ctx.rc)]
        # With 2 ranks next == prev: the peer's two messages match our two irecvs in issue order.
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert_same(from_prv, torch.full((n,), float(prv)), "batch ring from prev")
        assert_same(from_nxt, torch.full((n,), float(-nxt)), "batch ring from next")


@case
def case_object_collectives(ctx):
    r, ws = ctx.rank, ctx.ws
    big = "x" * (9 << 20) if r == 0 else ""  # > TCPStore's 8 MiB value limit: data never goes via the store
    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": r, "big": len(big)}, group=ctx.rc)
    assert objs == [{"rank": i, "big": (9 << 20) if i == 0 else 0} for i in range(ws)], objs
    lst = [big, {"k": [1, 2, 3]}, None] if r == 0 else [None, None, None]
    dist.broadcast_object_list(lst, src=0, group=ctx.rc)
    assert len(lst[0]) == 9 << 20 and lst[1] == {"k": [1, 2, 3]} and lst[2] is None
    for root in range(ws):
        g = [None] * ws if r == root else None
        dist.gather_object(("r", r), g, dst=root, group=ctx.rc)
        if r == root:
            assert g == [("r", i) for i in range(ws)], g
        out = [None]
        dist.scatter_object_list(out, [f"to{i}" for i in range(ws)] if r == root else None,
                                 src=root, group=ctx.rc)
        assert out == [f"to{r}"], out


@case
def case_coalesced(ctx):
    ws, r = ctx.ws, ctx.rank
    ts = [torch.full((3,), float(r)), torch.full((5, 2), float(r + 1)), torch.full((1,), 2.0)]
    with dist._coalescing_manager(group=ctx.rc):
        for t in ts:
            dist.all_reduce(t, group=ctx.rc)
    s = sum(range(ws))
    assert_same(ts[0], torch.full((3,), float(s)), "coalesced all_reduce 0")
    assert_same(ts[1], torch.full((5, 2), float(s + ws)), "coalesced all_reduce 1")
    assert_same(ts[2], torch.full((1,), 2.0 * ws), "coalesced all_reduce 2")
    # async coalescing manager over all_gather_into_tensor and reduce_scatter_tensor
    outs = [torch.empty(ws * 4), torch.empty(ws * 2, dtype=torch.float64)]
    with dist._coalescing_manager(group=ctx.rc, async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], torch.full((4,), float(r)), group=ctx.rc)
        dist.all_gather_into_tensor(outs[1], torch.full((2,), float(r), dtype=torch.float64),
                                    group=ctx.rc)
    cm.wait()
    assert_same(outs[0], torch.arange(ws).repeat_interleave(4).float(), "coalesced ag 0")
    assert_same(outs[1], torch.arange(ws).repeat_interleave(2).double(), "coalesced ag 1")
    rs_out = [torch.empty(3), torch.empty(2)]
    with dist._coalescing_manager(group=ctx.rc, async_ops=True) as cm:
        dist.reduce_scatter_tensor(rs_out[0], torch.ones(3 * ws), op=dist.ReduceOp.AVG,
                                   group=ctx.rc)
        dist.reduce_scatter_tensor(rs_out[1], torch.full((2 * ws,), float(r)),
                                   op=dist.ReduceOp.AVG, group=ctx.rc)
    cm.wait()  # (torch's coalescing manager applies the first op to all: no mixing)
    assert_same(rs_out[0], torch.ones(3), "coalesced rs AVG 0")
    assert_same(rs_out[1], torch.full((2,), sum(range(ws)) / ws), "coalesced rs AVG 1")
    # with a device, torch brackets the ops with the group's _start/_end_coalescing
    ts = [torch.full((4,), float(r)), torch.full((6,), 1.0)]
    with dist._coalescing_manager(group=ctx.rc, device=torch.device("cpu"),
                                  async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.rc)
    cm.wait()
    assert_same(ts[0], torch.full((4,), float(ws - 1)), "device coalescing 0")
    assert_same(ts[1], torch.ones(6), "device coalescing 1")
    # the deprecated entry points still reach the backend
    ts = [torch.ones(4), torch.ones(2, 3)]
    dist.all_reduce_coalesced(ts, group=ctx.rc)
    assert_same(ts[0], torch.full((4,), float(ws)), "all_reduce_coalesced 0")
    assert_same(ts[1], torch.full((2, 3), float(ws)), "all_reduce_coalesced 1")
    # torch's layout: outl[src][i] receives rank src's input i
    outl = [[torch.empty(2), torch.empty(3)] for _ in range(ws)]
    dist.all_gather_coalesced(outl, [torch.full((2,), float(r)), torch.full((3,), -float(r))],
                              group=ctx.rc)
    for src in range(ws):
        assert_same(outl[src][0], torch.full((2,), float(src)), "all_gather_coalesced 0")
        assert_same(outl[src][1], torch.full((3,), -float(src)), "all_gather_coalesced 1")


@case
def case_futures(ctx):
    ws = ctx.ws
    t = torch.ones(1000)
    fut = dist.all_reduce(t, group=ctx.rc, async_op=True).get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    assert_same(chained.wait(), torch.full((1000,), 2.0 * ws), "then()")
    # a collective issued and waited on inside a future callback (what PowerSGD does) completes
    t2 = torch.ones(10)
    inner = fut.then(lambda f: dist.all_reduce(t2, group=ctx.rc, async_op=True)
                     .get_future().wait()[0])
    assert_same(inner.wait(), torch.full((10,), float(ws)), "collective inside callback")
    # many in flight at once, waited in reverse order
    ts = [torch.full((257,), float(i)) for i in range(20)]
    works = [dist.all_reduce(x, group=ctx.rc, async_op=True) for x in ts]
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(ts):
        assert_same(x, torch.full((257,), float(i * ws)), f"in flight {i}")
    w = dist.all_reduce(torch.ones(3), group=ctx.rc, async_op=True)
    w.wait(timeout=datetime.timedelta(seconds=10))
    assert w.is_success() and w.result()[0].sum().item() == 3 * ws


@case
def case_subgroups(ctx):
    ws, r = ctx.ws, ctx.rank
    g_all = dist.new_group(list(range(ws)), backend="ringcomm")
    g_pair = dist.new_group([0, 1], backend="ringcomm")
    g_tail = dist.new_group([ws - 2, ws - 1], backend="ringcomm")
    # two (three) groups at once: interleave async operations on all of them
    works, tensors = [], []
    for i in range(10):
        a = torch.full((100,), float(r + i))
        works.append(dist.all_reduce(a, group=g_all, async_op=True))
        tensors.append(("all", i, a))
        if r in (0, 1):
            b = torch.full((50,), float(r * 2 + i))
            works.append(dist.all_reduce(b, group=g_pair, async_op=True))
            tensors.append(("pair", i, b))
        if r in (ws - 2, ws - 1):
            c = torch.full((70,), float(r + 100 * i))
            works.append(dist.all_reduce(c, group=g_tail, async_op=True))
            tensors.append(("tail", i, c))
    for w in works:
        w.wait()
    for kind, i, x in tensors:
        if kind == "all":
            exp = sum(q + i for q in range(ws))
        elif kind == "pair":
            exp = (0 * 2 + i) + (1 * 2 + i)
        else:
            exp = (ws - 2 + 100 * i) + (ws - 1 + 100 * i)
        assert_same(x, torch.full_like(x, float(exp)), f"group {kind} step {i}")
    if r in (0, 1):
        assert dist.get_rank(g_pair) == r and dist.get_world_size(g_pair) == 2
        t = torch.tensor([float(r)])
        dist.broadcast(t, src=1, group=g_pair)  # global rank 1 is the source
        assert t.item() == 1.0
    if r in (0, 1):
        assert g_all.group_name != g_pair.group_name
    for g in (g_pair, g_tail):
        if g is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    dist.destroy_process_group(g_all)


@case
def case_group_name_and_backend(ctx):
    pg = ctx.rc
    assert dist.get_backend(pg) == "ringcomm"
    if os.environ.get("RINGCOMM_TORCH_BACKEND", "auto").lower() == "group":
        assert pg.name() == "ringcomm"
        assert type(pg).__name__ == "RingcommProcessGroup"
    else:
        # per-device c10d Backend: torch's own ProcessGroup (which names every plugin's group
        # "custom") holds ringcomm's Backend for each device
        assert type(pg) is dist.ProcessGroup, type(pg)
        assert pg.name() == "custom", pg.name()
        for device in ("cpu", "cuda"):
            be = pg._get_backend(torch.device(device))
            assert be.name() == "ringcomm"
            assert type(be).__name__ == "RingcommBackend", type(be)
    assert pg.group_name, "group name not set"
    # functional collectives resolve the group by its name
    import torch.distributed._functional_collectives as funcol
    out = funcol.all_reduce(torch.ones(4), "sum", pg)
    assert_same(funcol.wait_tensor(out) if hasattr(funcol, "wait_tensor") else out,
                torch.full((4,), float(ctx.ws)), "functional all_reduce")


@case
def case_issue_hook(ctx):
    import ringcomm.torch as rct
    seen = []
    hook = lambda op, name, seq, t: seen.append((op, name, seq))  # noqa: E731
    rct.add_issue_hook(hook)
    try:
        dist.all_reduce(torch.ones(2), group=ctx.rc)
        dist.broadcast(torch.ones(2), src=0, group=ctx.rc)
    finally:
        rct.remove_issue_hook(hook)
    assert [s[0] for s in seen] == ["allreduce", "broadcast"], seen
    assert seen[1][2] == seen[0][2] + 1


@case
def case_bad_input(ctx):
    import ringcomm
    rc = ctx.rc

    def expect_error(fn, exc, words, what):
        try:
            fn()
        except exc as e:
            msg = str(e)
            for w in words:
                assert w in msg, f"{what}: message {msg!r} lacks {w!r}"
            return
        except BaseException as e:  # noqa: BLE001
            raise AssertionError(f"{what}: raised {type(e).__name__}: {e}") from e
        raise AssertionError(f"{what}: no exception")

    # tensors not on the CPU (a CPU-only build has no CUDA tensors; "meta" stands in). With the
    # per-device c10d Backend torch dispatches by device and runs its own meta kernels, so a
    # meta tensor never reaches a backend: ringcomm's checks are called on the Backend directly.
    if os.environ.get("RINGCOMM_TORCH_BACKEND", "auto").lower() == "group":
        meta_all_reduce = lambda: dist.all_reduce(torch.empty(4, device="meta"), group=rc)  # noqa: E731
        mixed_all_gather = lambda: dist.all_gather_into_tensor(  # noqa: E731
            torch.empty(4 * ctx.ws, device="meta"), torch.ones(4), group=rc)
    else:
        be = rc._get_backend(torch.device("cpu"))
        meta_all_reduce = lambda: be.allreduce([torch.empty(4, device="meta")],  # noqa: E731
                                               dist.distributed_c10d.AllreduceOptions())
        mixed_all_gather = lambda: be._allgather_base(  # noqa: E731
            torch.empty(4 * ctx.ws, device="meta"), torch.ones(4), dist.distributed_c10d.AllgatherOptions())
    expect_error(meta_all_reduce, RuntimeError, ["ringcomm does not support", "meta"],
                 "meta tensor")
    # tensors on different devices
    expect_error(mixed_all_gather, RuntimeError, ["one device"], "mixed devices")
    # unsupported dtype
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16), group=rc),
                 RuntimeError, ["ringcomm does not support", "int16"], "int16")
    expect_error(lambda: dist.broadcast(torch.empty(4, dtype=torch.float8_e4m3fn), src=0,
                                        group=rc),
                 RuntimeError, ["ringcomm does not support", "float8"], "float8")
    # unsupported op for the dtype (bitwise on floating point): raised on every rank
    expect_error(lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND, group=rc),
                 RuntimeError, [], "BAND on float32")
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int64),
                                         op=dist._make_nccl_premul_sum(0.5), group=rc),
                 RuntimeError, ["ringcomm does not support", "PREMUL_SUM"], "PREMUL_SUM int")
    # unsupported operations
    # wrong sizes
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2), group=rc),
                 ValueError, ["all_gather_into_tensor"], "all_gather size")
    expect_error(lambda: dist.all_to_all_single(torch.empty(4), torch.empty(4), [1] * ctx.ws,
                                                [9] * ctx.ws, group=rc),
                 ValueError, ["split sizes"], "bad splits")
    # the group still works after all that
    t = torch.ones(3)
    dist.all_reduce(t, group=rc)
    assert_same(t, torch.full((3,), float(ctx.ws)), "after bad input")
    assert isinstance(ringcomm.UnsupportedError("x"), RuntimeError)


@case
def case_mismatched_collectives(ctx):
    """Different collectives / sizes on different ranks: an exception on every rank, no hang."""
    import ringcomm
    g = dist.new_group(backend="ringcomm", timeout=datetime.timedelta(seconds=10))
    t0 = time.perf_counter()
    errors = []
    for attempt in ("size", "kind"):
        try:
            if attempt == "size":
                dist.all_reduce(torch.ones(4 + ctx.rank), group=g)
            elif ctx.rank == 0:
                dist.broadcast(torch.ones(4), src=0, group=g)
            else:
                dist.all_reduce(torch.ones(4), group=g)
            errors.append(None)
        except RuntimeError as e:
            errors.append(e)
        if errors[-1] is not None:
            break  # a failed communicator may stay failed; one detected mismatch is the point
    dist.destroy_process_group(g)
    assert errors[0] is not None or (len(errors) > 1 and errors[1] is not None), \
        "mismatched collectives raised nothing"
    assert isinstance([e for e in errors if e][0], ringcomm.RingcommError)
    assert time.perf_counter() - t0 < 25, "mismatch took the whole timeout to surface"


# ---- the spawned battery ------------------------------------------------------------------------
INIT_CASES = ["threads_joined", "init_tcp", "init_store", "reinit_same_store"]


def _ringcomm_threads() -> list:
    import threading
    return [t.name for t in threading.enumerate() if t.name.startswith("ringcomm-")]


def _check_world(ws):
    t = torch.full((5,), float(dist.get_rank()))
    dist.all_reduce(t)
    assert_same(t, torch.full((5,), float(sum(range(ws)))), "world all_reduce")
    g = dist.new_group(backend="ringcomm")
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    assert_same(t, torch.full((2,), float(ws)), "subgroup after re-init")


def _battery(rank, ws, d, tcp_port, store_port):
    import ringcomm.torch  # noqa: F401 - registers the backend
    torch.set_num_threads(1)  # ranks outnumber cores: intra-op thread pools would only fight
    ctx = init_world(rank, ws, d, CASE_TIMEOUT_S)
    timeout = ctx.timeout
    assert dist.get_backend() == "ringcomm"
    results = {name: (err, seconds)
               for name, (err, _, seconds) in run_cases(ctx, CASES).items()}
    threads_before = _ringcomm_threads()
    dist.destroy_process_group()
    left = _ringcomm_threads()
    results["threads_joined"] = (
        None if threads_before and not left else
        f"rank {rank}: ringcomm threads before destroy {threads_before}, after {left}", 0.0)

    def attempt(name, fn):
        t0 = time.perf_counter()
        try:
            fn()
            results[name] = (None, time.perf_counter() - t0)
        except BaseException:  # noqa: BLE001
            results[name] = (f"rank {rank}:\n{traceback.format_exc()}", 0.0)
            if dist.is_initialized():
                dist.destroy_process_group()

    def tcp():
        dist.init_process_group("ringcomm", init_method=f"tcp://127.0.0.1:{tcp_port}",
                                rank=rank, world_size=ws, timeout=timeout)
        _check_world(ws)
        dist.destroy_process_group()

    store = dist.TCPStore("127.0.0.1", store_port, ws, is_master=rank == 0, timeout=timeout)

    def with_store():
        dist.init_process_group("ringcomm", store=store, rank=rank, world_size=ws,
                                timeout=timeout)
        _check_world(ws)
        dist.destroy_process_group()

    attempt("init_tcp", tcp)
    attempt("init_store", with_store)
    attempt("reinit_same_store", with_store)  # group names restart: incarnation keys differ
    del store
    return results


def _shm_entry(name: str) -> bool:
    return "ringcomm" in name.lower() or name.startswith("rc")


# RINGCOMM_TEST_CASES=all_reduce,barrier runs only those cases in the battery (debugging aid).


def battery_results(ws: int) -> dict:
    """Every case's every-rank error or None, the cases' longest timings and the /dev/shm entries
    the battery left, from ONE group per world size."""
    def start():
        before = ranks.shm_segments(_shm_entry)
        per_rank = ranks.run_in_dir(_battery, ws, "ringcomm-torch-test-", (free_port(), free_port()),
                                    timeout=BATTERY_TIMEOUT_S)
        leaked = ranks.lasting(ranks.shm_segments(_shm_entry) - before, _shm_entry)
        merged = {}
        for name in list(CASES) + INIT_CASES:
            errs = [res[name][0] for res in per_rank if res.get(name, (None,))[0]]
            merged[name] = "\n".join(errs) if errs else None
        merged["__timings__"] = {name: max(res[name][1] for res in per_rank)
                                 for name in per_rank[0]}
        merged["__shm_leak__"] = sorted(leaked)
        return merged
    return ranks.once(("torch_backend", ws), start, f"the world-{ws} battery of the torch backend")


@pytest.mark.timeout(BATTERY_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", list(CASES) + INIT_CASES)
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_backend(ws, name):
    fail_on_error(battery_results(ws), ws, name)


@pytest.mark.timeout(BATTERY_TIMEOUT_S + 60)
@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_no_shm_left_behind(ws):
    res = battery_results(ws)
    assert res["__shm_leak__"] == [], f"/dev/shm entries left behind: {res['__shm_leak__']}"


@pytest.mark.timeout(60)
def test_import_registers_without_loading_core():
    """`import ringcomm` does not import torch; `import ringcomm.torch` registers the backend
    without creating anything."""
    import subprocess
    import sys
    code = ("import sys, ringcomm; assert 'torch' not in sys.modules, 'ringcomm imported torch'\n"
            "import ringcomm.torch, torch.distributed as dist\n"
            "assert 'ringcomm' in dist.Backend.backend_list\n"
            "assert dist.Backend.backend_capability['ringcomm'] == ['cpu', 'cuda']\n"
            "assert 'ringcomm.torch.backend' not in sys.modules\n"
            "assert dist.is_backend_available('ringcomm')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr


@pytest.mark.timeout(60)
def test_torch_backends_entry_point(tmp_path):
    """With the package's ``torch.backends`` entry point installed, ``import torch`` alone
    registers "ringcomm". The entry point is simulated with a dist-info on PYTHONPATH."""
    import subprocess
    import sys
    info = tmp_path / "ringcomm_entry_point_probe-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ringcomm-entry-point-probe\n"
                                   "Version: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[torch.backends]\nringcomm = ringcomm.torch._register:autoload\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in sys.path if p])
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    code = ("import sys, torch, torch.distributed as dist\n"
            "assert 'ringcomm' in dist.Backend.backend_list, dist.Backend.backend_list\n"
            "assert 'ringcomm.torch.backend' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                       env=env)
    assert r.returncode == 0, r.stderr
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    code = "import torch.distributed as dist; assert 'ringcomm' not in dist.Backend.backend_list"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                       env=env)
    assert r.returncode == 0, r.stderr


EXIT_SCRIPT = r"""
import sys, tempfile, torch, torch.distributed as dist
import ringcomm.torch
d = tempfile.mkdtemp()
dist.init_process_group("ringcomm", init_method=f"file://{d}/store", rank=0, world_size=1)
t = torch.ones(8)
dist.all_reduce(t)                                   # world size 1: every op is local
assert torch.equal(t, torch.ones(8))
out = [torch.empty(8)]
dist.all_gather(out, t)
g = dist.new_group([0], backend="ringcomm")
futs = [dist.all_reduce(torch.ones(100), group=g, async_op=True).get_future().then(
        lambda f: f.value()[0].sum()) for _ in range(10)]
w = dist.all_reduce(torch.ones(4), async_op=True)   # never waited on
assert all(f.wait().item() == 100 for f in futs)
print("ok", flush=True)
# exits with the groups (and their threads) still alive: the backend shuts them down at exit
"""


@pytest.mark.timeout(60)
def test_exit_without_destroy():
    """A process that never calls destroy_process_group still exits cleanly (threads joined at
    interpreter exit: no SIGABRT) and leaves no shared memory behind."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True,
                       timeout=50)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stdout, r.stderr[-3000:])
    assert "terminate called" not in r.stderr, r.stderr[-3000:]
