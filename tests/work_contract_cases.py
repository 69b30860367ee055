"""Rank bodies of test_torch_work_contract.py: the same code runs on "gloo" and "ringcomm", and
records what torch's Work contract lets a caller observe (the future's state when wait() returns
or raises, is_completed / is_success / exception / result, then-callbacks), so that the test can
compare the two backends observation by observation."""
from __future__ import annotations

import datetime
import threading
import time

import torch
import torch.distributed as dist


def _ops(rank: int, world: int, group=None):
    """name -> fn(async_op) issuing one collective of every kind on ``group``; the tensors it
    fills are returned with the work so the result can be checked."""
    def t(v=1.0, n=4):
        return torch.full((n,), float(v))

    def allreduce(a):
        x = t(rank + 1)
        return dist.all_reduce(x, async_op=a, group=group), [x]

    def broadcast(a):
        x = t(rank + 5)
        return dist.broadcast(x, src=0, async_op=a, group=group), [x]

    def reduce(a):
        x = t(rank + 1)
        return dist.reduce(x, dst=0, async_op=a, group=group), [x] if rank == 0 else []

    def all_gather(a):
        outs = [t(0) for _ in range(world)]
        return dist.all_gather(outs, t(rank), async_op=a, group=group), outs

    def all_gather_into_tensor(a):
        out = t(0, 4 * world)
        return dist.all_gather_into_tensor(out, t(rank), async_op=a, group=group), [out]

    def reduce_scatter(a):
        out = t(0)
        return dist.reduce_scatter(out, [t(rank + p) for p in range(world)], async_op=a,
                                   group=group), [out]

    def reduce_scatter_tensor(a):
        out = t(0)
        return dist.reduce_scatter_tensor(out, t(rank, 4 * world), async_op=a, group=group), [out]

    def all_to_all(a):
        outs = [t(0) for _ in range(world)]
        return dist.all_to_all(outs, [t(rank * 10 + p) for p in range(world)], async_op=a,
                               group=group), outs

    def all_to_all_single(a):
        out = t(0, 4 * world)
        return dist.all_to_all_single(out, t(rank, 4 * world), async_op=a, group=group), [out]

    def gather(a):
        outs = [t(0) for _ in range(world)] if rank == 0 else None
        return dist.gather(t(rank), outs, dst=0, async_op=a, group=group), outs or []

    def scatter(a):
        out = t(0)
        ins = [t(p + 3) for p in range(world)] if rank == 0 else None
        return dist.scatter(out, ins, src=0, async_op=a, group=group), [out]

    def barrier(a):
        return dist.barrier(async_op=a, group=group), []

    def sendrecv(a):
        # rank 0 sends to rank 1 (others idle): the receiving side carries the value
        x = t(rank + 7)
        if rank == 0:
            w = dist.isend(x, 1, group=group) if a else dist.send(x, 1, group=group)
        elif rank == 1:
            w = dist.irecv(x, 0, group=group) if a else dist.recv(x, 0, group=group)
        else:
            w = None
        return w, [x]

    return {f.__name__: f for f in (allreduce, broadcast, reduce, all_gather,
                                      all_gather_into_tensor, reduce_scatter,
                                      reduce_scatter_tensor, all_to_all, all_to_all_single,
                                      gather, scatter, barrier, sendrecv)}


# gloo 2.13's works without getFuture
_NO_FUTURE_IN_GLOO = ("reduce_scatter", "reduce_scatter_tensor", "sendrecv", "sendrecv_recv")


def _value_shape(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape))
    if isinstance(v, (list, tuple)):
        return ("list", len(v))
    return (type(v).__name__,)


def _observe_success(w, outs, future_first: bool) -> dict:
    """Observations of one async work that succeeds. ``future_first``: get_future() and a
    then-callback before wait() (a DDP comm hook's order) or only after it (torchft's)."""
    obs = {}
    ran = threading.Event()
    fut = chained = None
    if future_first:
        fut = w.get_future()
        chained = fut.then(lambda f: (ran.set(), f.value())[1])
    obs["wait"] = w.wait()
    obs["is_completed"] = w.is_completed()
    obs["is_success"] = w.is_success()
    obs["exception_none"] = w.exception() is None
    if future_first:
        obs["fut_done_at_wait"] = fut.done()
        obs["then_ran_at_wait"] = ran.is_set()
        obs["chained_done_at_wait"] = chained.done()
    late = w.get_future()
    obs["late_fut_done"] = late.done()
    v = late.wait()
    obs["value_shape"] = _value_shape(v)
    res = w.result()
    obs["result_len"] = len(res)
    obs["value_is_result"] = (isinstance(v, list) and len(v) == len(res)
                              and all(a is b or torch.equal(a, b) for a, b in zip(v, res)))
    # a callback added after completion runs inline, at once
    inline = []
    late.then(lambda f: inline.append(1))
    obs["late_then_inline"] = inline == [1]
    obs["values"] = [o.tolist() for o in outs]
    return obs


def success_cases(rank: int, world: int) -> dict:
    """Every collective: sync, and async with the future taken before / after wait()."""
    out = {}
    for name, op in _ops(rank, world).items():
        w, outs = op(False)
        out[(name, "sync")] = {"returned_none": w is None, "values": [o.tolist() for o in outs]}
        for first in (True, False):
            w, outs = op(True)
            if w is None:
                continue
            if name in _NO_FUTURE_IN_GLOO:
                # gloo's works of these have no future ("Work::getFuture not implemented"):
                # only the work's own methods are compared
                w.wait()
                out[(name, "async")] = {"is_completed": w.is_completed(),
                                        "is_success": w.is_success(),
                                        "values": [o.tolist() for o in outs]}
                break
            out[(name, "future_first" if first else "future_after")] = _observe_success(
                w, outs, first)
    # wait(timeout) on a work that completes in time returns True
    x = torch.ones(4)
    w = dist.all_reduce(x, async_op=True)
    out[("allreduce", "wait_timeout_ok")] = w.wait(datetime.timedelta(seconds=30))
    # wait(timeout) that expires first: raises, the work stays pending, a later wait() completes
    # it (rank 1 joins late)
    x = torch.ones(4)
    if rank == 0:
        w = dist.all_reduce(x, async_op=True)
        f = w.get_future()
        obs = {}
        try:
            w.wait(datetime.timedelta(milliseconds=100))
            obs["raised"] = False
        except RuntimeError:
            obs["raised"] = True
        obs["is_completed"] = w.is_completed()
        obs["fut_done"] = f.done()
        obs["wait"] = w.wait()
        obs["fut_done_after"] = f.done()
        obs["value"] = f.value()[0].tolist()
        out[("allreduce", "wait_timeout_expired")] = obs
    else:
        time.sleep(0.5)
        dist.all_reduce(x)
    # many works with futures taken first: every one is complete when its wait returns
    works = []
    for i in range(200):
        y = torch.full((8,), float(i))
        wk = dist.all_reduce(y, async_op=True)
        works.append((wk, wk.get_future()))
    not_done = 0
    for wk, f in works:
        wk.wait()
        not_done += not f.done()
    out[("allreduce", "200_future_first_not_done")] = not_done
    not_done = 0
    for i in range(200):
        y = torch.full((8,), float(i))
        wk = dist.all_reduce(y, async_op=True)
        wk.wait()
        not_done += not wk.get_future().done()
    out[("allreduce", "200_future_after_not_done")] = not_done
    return out


def _exc_obs(e: BaseException) -> dict:
    return {"is_runtime_error": isinstance(e, RuntimeError)}


def _future_wait_obs(fut, wait_msg, raised: str, same_message: str) -> dict:
    """What ``fut.wait()`` shows: {raised: whether it raised} and, when it raised, {same_message:
    whether its message contains `wait_msg`}, the message the work's own wait() raised with (None
    where that wait() returned)."""
    try:
        fut.wait()
        return {raised: False}
    except Exception as e:  # noqa: BLE001
        return {raised: True, same_message: wait_msg is not None and wait_msg in str(e)}


def failure_cases(rank: int, world: int, timeout_s: float) -> dict:
    """Collectives that fail: rank 0 issues them on groups whose other ranks never join, so each
    fails by the group's timeout. One group per collective (a group whose op timed out is not
    reused); the async ones run concurrently, and each sync one in a thread of its own, so the
    whole case costs about one timeout."""
    names = ["allreduce", "broadcast", "all_gather", "all_to_all_single", "barrier",
             "sendrecv_recv"]
    td = datetime.timedelta(seconds=timeout_s)
    groups = {(n, m): dist.new_group(list(range(world)), timeout=td)
              for n in names for m in ("future_first", "future_after", "sync")}
    wt = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    out = {}
    pending = []
    sync_threads = []

    def run_sync(key, issue):
        try:
            issue(False)
            out[key] = {"raised": False}
        except Exception as e:  # noqa: BLE001
            out[key] = {"raised": True, **_exc_obs(e)}
    if rank == 0:
        for (n, m), g in groups.items():
            if n == "sendrecv_recv":
                x = torch.zeros(4)
                issue = (lambda a, x=x, g=g: dist.irecv(x, 1, group=g) if a
                         else dist.recv(x, 1, group=g))
            else:
                issue = (lambda a, n=n, g=g: _ops(rank, world, g)[n](a)[0])
            if m == "sync":
                sync_threads.append(threading.Thread(target=run_sync, args=((n, m), issue)))
                sync_threads[-1].start()
                continue
            w = issue(True)
            fut = chained = None
            ran = threading.Event()
            if m == "future_first" and n not in _NO_FUTURE_IN_GLOO:
                fut = w.get_future()
                chained = fut.then(lambda f: (ran.set(), f.value())[1])
            pending.append(((n, m), w, fut, chained, ran))
        for key, w, fut, chained, ran in pending:
            obs = {}
            wait_msg = None
            try:
                w.wait()
                obs["raised"] = False
            except Exception as e:  # noqa: BLE001
                obs["raised"] = True
                obs.update(_exc_obs(e))
                wait_msg = str(e)
            obs["is_completed"] = w.is_completed()
            obs["is_success"] = w.is_success()
            obs["exception_set"] = w.exception() is not None
            if fut is not None:
                obs["fut_done_at_raise"] = fut.done()
                obs["then_ran_at_raise"] = ran.is_set()
                obs["chained_done_at_raise"] = chained.done()
            if key[0] in _NO_FUTURE_IN_GLOO:
                out[key] = obs
                continue
            f = w.get_future()
            obs["late_fut_done"] = f.done()
            obs.update(_future_wait_obs(f, wait_msg, "fut_raised", "fut_same_message"))
            out[key] = obs
        for t in sync_threads:
            t.join()
    dist.barrier(group=wt)
    return out


class _HookState:
    def __init__(self, world):
        self.world = world
        self.calls = 0


def _chained_hook(state, bucket):
    """A DDP comm hook chaining ``then``: all-reduce, then divide by the world size."""
    state.calls += 1
    buf = bucket.buffer()
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def divide(f):
        return f.value()[0].div_(state.world)
    return fut.then(divide).then(lambda f: f.value())


def ddp_hook_case(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    state = _HookState(world)
    ddp.register_comm_hook(state, _chained_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        opt.zero_grad()
        ddp(torch.randn(4, 8, generator=g)).sum().backward()
        opt.step()
    return {"calls": state.calls,
            "params": [p.detach().clone() for p in ddp.parameters()]}


def all_cases(rank: int, world: int, timeout_s: float) -> dict:
    """One rank group runs every case (success, failure, the DDP hook) in one go."""
    return {"success": success_cases(rank, world),
            "failure": failure_cases(rank, world, timeout_s),
            "ddp": ddp_hook_case(rank, world)}
