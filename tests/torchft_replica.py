"""One torchft replica group of one rank, run as a process by tests/test_torchft.py:

    python tests/torchft_replica.py RUN_JSON

RUN_JSON names the process group ("ringcomm": ringcomm.torchft's; "ringcomm-c10d": ringcomm's
torch.distributed backend in torchft's ProcessGroupWrapper; "gloo": torchft's), the replica
number, the lighthouse, the number of steps and an optional death: {"step": S, "where": W} with W one of
  "between"  after step S committed, before the next quorum (a kill between steps);
  "header"   before step S's gradient all_reduce, while the peer waits in it for this rank's header;
  "data"     in step S's gradient all_reduce while its data moves (a large gradient).
The replica trains a tiny model under torchft's Manager (min_replica_size=2, synchronous quorum,
torchft's DDP, OptimizerWrapper, checkpoints over the process group with PGTransport), so every
committed step has both replicas with the same data: a run ends with the weights of an
undisturbed one. It writes the final state dict and a JSON of events (a step whose collective
failed: when and with which error) to the run's directory.
"""
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.nn as nn
import torch.nn.functional as F


def _die(out_dir, replica, delay_s=0.0):
    def kill():
        if delay_s:
            time.sleep(delay_s)
        with open(os.path.join(out_dir, f"death_{replica}.json"), "w") as f:
            json.dump({"time": time.time()}, f)
        os.kill(os.getpid(), signal.SIGKILL)
    if delay_s:
        threading.Thread(target=kill, daemon=True).start()
    else:
        kill()


def model_for(big: bool) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    if big:
        # outside the forward (its gradient is zeros): a 64 MiB all_reduce, several times longer
        # than the peer's delay before it dies, without changing the small model's numerics
        model.pad = nn.Parameter(torch.zeros(16 << 20))
    return model


def main(run_path: str) -> None:
    from torchft import Manager
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    run = json.load(open(run_path))
    r, out_dir = run["replica"], run["out"]
    die = run.get("die")
    timeout = timedelta(seconds=run.get("timeout_s", 10))
    if run["backend"] == "ringcomm":
        from ringcomm.torchft import ProcessGroupRingcomm
        pg = ProcessGroupRingcomm(timeout=timeout)
    elif run["backend"] == "ringcomm-c10d":
        from ringcomm.torchft import ProcessGroupRingcommC10d
        pg = ProcessGroupRingcommC10d(timeout=timeout)
    else:
        pg = ProcessGroupGloo(timeout=timeout)

    big = run.get("big", False)
    model = model_for(big)
    # the pad (zeros, zero gradients) is all_reduced but neither trained nor checkpointed
    params = [p for n, p in model.named_parameters() if n != "pad"]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)

    def weights():
        return {k: v for k, v in model.state_dict().items() if k != "pad"}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"], strict=False)
        opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": weights(), "optim": opt.state_dict()}

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=pg, min_replica_size=2, load_state_dict=load_state_dict, state_dict=state_dict,
        replica_id=f"replica_{r}", store_addr="127.0.0.1", store_port=store.port, rank=0,
        world_size=1, lighthouse_addr=run["lighthouse"], hostname="127.0.0.1",
        use_async_quorum=False, timeout=timeout, quorum_timeout=timedelta(seconds=60),
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
    )
    # torchft's DDP (its comm hook: Manager.allreduce of each bucket), or the Manager's allreduce
    # of each gradient after backward. A failed all_reduce under torchft 0.2.0's DDP ends the
    # backward with an AssertionError (its comm hook asserts on the callback chain that
    # _ManagedWork.wait builds only on success), so runs that kill a replica use the second.
    use_ddp = run.get("ddp", True)
    net = DistributedDataParallel(manager, model) if use_ddp else model
    optimizer = OptimizerWrapper(manager, opt)
    events = []
    tried = set()
    while manager.current_step() < run["steps"]:
        optimizer.zero_grad()            # the quorum (and healing, for a restarted replica)
        step = manager.current_step()
        g = torch.Generator().manual_seed(1000 * step + r)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        out = net(x)
        loss = F.mse_loss(out, y)
        if big:
            loss = loss + model.pad.sum() * 0.0
        dying = die is not None and step == die["step"] and step not in tried
        loss.backward()                          # with torchft's DDP: the gradient all_reduce
        if not use_ddp:
            if dying and die["where"] == "header":
                _die(out_dir, r, delay_s=0.3)     # the peer waits in the all_reduce's header exchange
                time.sleep(5.0)
            if dying and die["where"] == "data":
                time.sleep(0.3)                   # the peer waits in the first all_reduce
            works = [manager.allreduce(p.grad) for p in model.parameters()]
            if dying and die["where"] == "data":
                _die(out_dir, r, delay_s=die.get("delay_s", 0.005))   # while the large one moves
            for w in works:
                t = time.time()
                if not w.wait() and not any(e["step"] == step for e in events):
                    err = manager.errored().original_exception
                    events.append({"step": step, "waited": t, "raised": time.time(),
                                   "error": f"{type(err).__name__}: {err}"})
        tried.add(step)
        optimizer.step()             # should_commit
        if die and die["where"] == "between" and step == die["step"] and manager.current_step() > step:
            _die(out_dir, r)
    torch.save(weights(), os.path.join(out_dir, f"final_{r}.pt"))
    with open(os.path.join(out_dir, f"events_{r}.json"), "w") as f:
        json.dump(events, f)
    manager.shutdown(wait=False)
    pg.shutdown()




def collectives(run_path: str) -> None:
    """Every collective of ProcessGroupRingcomm at world 2 against torch's gloo on the same
    inputs, the Work contract (future complete when wait() returns; a future asked for first
    completes on its own), then abort: the peer's pending call raises, errored() reports it, and
    a configure() on a new prefix works again."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import (AllgatherOptions, AllreduceCoalescedOptions,
                                                    AllreduceOptions, AllToAllOptions,
                                                    BroadcastOptions, ReduceScatterOptions)
    from ringcomm.torchft import ProcessGroupRingcomm

    run = json.load(open(run_path))
    r, out_dir = run["replica"], run["out"]
    store = dist.TCPStore("127.0.0.1", run["port"], is_master=False, wait_for_workers=False)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), r, 2, timedelta(seconds=10))
    pg = ProcessGroupRingcomm(timeout=timedelta(seconds=10))
    pg.configure(f"127.0.0.1:{run['port']}/torchft/1/0", "replica", r, 2, quorum_id=1)
    checks = {}

    def both(name, call):
        """call(group) -> (work, outputs): run on gloo then on ringcomm, compare the outputs.
        A name ending in "future_first" takes the future before any wait() and waits on it
        alone (the group's completion thread completes it), through a then() callback."""
        wg, og = call(gloo)
        wg.wait()
        wr, orr = call(pg)
        if name.endswith("future_first"):
            f = wr.get_future()
            # the callback asks the work for its future again, inside the completion
            chained = f.then(lambda fut: [t * 2 for t in fut.value()] if wr.get_future() is fut else None)
            doubled = chained.wait()
            done = f.done()
            assert all(torch.equal(d, t * 2) for d, t in zip(doubled, orr))
            assert wr.wait() is True
        else:
            assert wr.wait() is True
            f = wr.get_future()
            done = f.done()
        same = all(torch.equal(a, b) for a, b in zip(og, orr))
        value = f.value()
        checks[name] = {"future_done_after_wait": done, "equal_to_gloo": same,
                        "future_value_is_outputs": all(v is o for v, o in zip(value, orr))
                        if isinstance(value, list) and value else None}

    def data(seed, n=1000):
        return torch.randn(n, generator=torch.Generator().manual_seed(seed * 10 + r))

    for opname in ("SUM", "AVG", "MAX"):
        def call(g, opname=opname):
            t = [data(1)]
            o = AllreduceOptions()
            o.reduceOp = getattr(dist.ReduceOp, opname)
            return g.allreduce(t, o), t
        both(f"allreduce_{opname}", call)

    def allreduce_future_first(g):
        t = [data(2)]
        return g.allreduce(t, AllreduceOptions()), t
    both("allreduce_future_first", allreduce_future_first)

    def coalesced(g):
        t = [data(3, 10), data(4, 7)]
        return g.allreduce_coalesced(t, AllreduceCoalescedOptions()), t
    both("allreduce_coalesced", coalesced)

    def allgather(g):
        outs = [[torch.empty(5), torch.empty(5)]]
        return g.allgather(outs, [data(5, 5)], AllgatherOptions()), outs[0]
    both("allgather", allgather)

    def broadcast(g):
        t = [data(6)]
        o = BroadcastOptions()
        o.rootRank = 1
        return g.broadcast(t, o), t
    both("broadcast", broadcast)

    # uneven splits must agree pairwise: rank 0 sends 2 rows to 0 and 4 to 1; rank 1 sends 4 to 0
    # and 2 to 1; so rank 0 receives 2 + 4 and rank 1 receives 4 + 2
    def alltoall_pairs(g):
        out = torch.empty(6, 2)
        ins = [2, 4] if r == 0 else [4, 2]
        outs = [2, 4] if r == 0 else [4, 2]
        return g.alltoall_base(out, data(7, 12).reshape(6, 2), outs, ins, AllToAllOptions()), [out]
    both("alltoall_base", alltoall_pairs)

    # gloo has no reduce_scatter: compare with the sum of both ranks' inputs, computed here
    def rs_expected(seed, n):
        full = sum(torch.randn(n, generator=torch.Generator().manual_seed(seed * 10 + k)) for k in range(2))
        return full.chunk(2)[r]
    o = ReduceScatterOptions()
    out = [torch.empty(4)]
    ins = data(8, 8)
    w = pg.reduce_scatter(out, [list(ins.chunk(2))], o)
    w.wait()
    checks["reduce_scatter"] = {"future_done_after_wait": w.get_future().done(),
                                "equal_to_gloo": torch.equal(out[0], rs_expected(8, 8))}
    out = [torch.empty(4)]
    w = pg.reduce_scatter_tensor_coalesced(out, [data(8, 8)], o)
    w.wait()
    checks["reduce_scatter_tensor_coalesced"] = {"future_done_after_wait": w.get_future().done(),
                                                 "equal_to_gloo": torch.equal(out[0], rs_expected(8, 8))}
    out = [torch.empty(10)]
    w = pg.allgather_into_tensor_coalesced(out, [data(9, 5)], AllgatherOptions())
    w.wait()
    checks["allgather_into_tensor_coalesced"] = {
        "future_done_after_wait": w.get_future().done(),
        "equal_to_gloo": torch.equal(out[0], torch.cat([torch.randn(5, generator=torch.Generator().manual_seed(90 + k)) for k in range(2)]))}
    # point to point, as torchft's PGTransport uses it (tags, several tensors in flight)
    if r == 0:
        ws = [pg.send([torch.arange(3.0) + k], 1, tag=k) for k in range(3)]
        for w in ws:
            w.wait()
        checks["send_recv"] = {"future_done_after_wait": all(w.get_future().done() for w in ws), "equal_to_gloo": True}
    else:
        got = [torch.empty(3) for _ in range(3)]
        ws = [pg.recv([got[k]], 0, tag=k) for k in (2, 0, 1)]
        for w in ws:
            w.wait()
        checks["send_recv"] = {"future_done_after_wait": all(w.get_future().done() for w in ws),
                               "equal_to_gloo": all(torch.equal(got[k], torch.arange(3.0) + k) for k in range(3))}
    w = pg.barrier()
    w.wait()
    checks["barrier"] = {"future_done_after_wait": w.get_future().done(), "equal_to_gloo": True}

    # wait(timeout): rank 0 joins the barrier 0.5 s late; rank 1's 0.1 s wait raises
    # ringcomm.TimeoutError and leaves the call (and its future) pending; a later wait() completes
    result = {"checks": checks}
    if r == 0:
        time.sleep(0.5)
        pg.barrier().wait()
    else:
        w = pg.barrier()
        try:
            w.wait(timedelta(seconds=0.1))
            result["short_wait"] = None
        except Exception as e:  # noqa: BLE001 - the test checks its type
            result["short_wait"] = type(e).__name__
        result["future_pending_after_short_wait"] = not w.get_future().done()
        result["long_wait"] = w.wait()
        result["future_done_after_long_wait"] = w.get_future().done()

    # abort: rank 1 waits in an all_reduce rank 0 never joins; rank 0 aborts
    if r == 0:
        time.sleep(0.3)
        t0 = time.time()
        pg.abort()
        result["errored"] = repr(pg.errored())
    else:
        t = torch.ones(4)
        w = pg.allreduce([t], AllreduceOptions())
        f = w.get_future()
        t0 = time.time()
        try:
            w.wait()
            result["peer_raised"] = None
        except Exception as e:  # noqa: BLE001 - the test checks its type and message
            result["peer_raised"] = f"{type(e).__name__}: {e}"
        result["peer_raised_after_s"] = time.time() - t0
        result["future_holds_error"] = f.done() and _raises(f.wait)
        result["errored"] = repr(pg.errored())
    # a new quorum: a fresh communicator on a new prefix
    pg.configure(f"127.0.0.1:{run['port']}/torchft/2/0", "replica", r, 2, quorum_id=2)
    result["errored_after_configure"] = repr(pg.errored())
    t = torch.full((3,), float(r + 1))
    pg.allreduce([t], AllreduceOptions()).wait()
    result["after_configure"] = t.tolist()

    # set_timeout bounds the waits that follow: rank 1 waits in a barrier rank 0 never joins
    if r == 1:
        pg.set_timeout(timedelta(seconds=0.3))
        t0 = time.time()
        try:
            pg.barrier().wait()
            result["set_timeout_raised"] = None
        except Exception as e:  # noqa: BLE001 - the test checks its type
            result["set_timeout_raised"] = type(e).__name__
        result["set_timeout_after_s"] = time.time() - t0
    else:
        time.sleep(1.5)
    pg.shutdown()
    with open(os.path.join(out_dir, f"collectives_{r}.json"), "w") as f:
        json.dump(result, f)


def _raises(fn) -> bool:
    try:
        fn()
    except Exception:  # noqa: BLE001
        return True
    return False


if __name__ == "__main__":
    (collectives if json.load(open(sys.argv[1])).get("mode") == "collectives" else main)(sys.argv[1])
