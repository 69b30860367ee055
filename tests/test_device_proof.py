"""The device ring's protocol and kernel body (csrc/device/ring_proto.h), proved on the host: the header is
compiled by g++ against libcu++ into tests/device_proof/host_harness.cpp and run with ranks and blocks as
threads, processes, or coroutines under a deterministic scheduler. No GPU is involved.

- Every dtype x op of all_reduce, reduce_scatter, all_gather, broadcast and reduce (every root) equals the
  host ring or chain (csrc/algo/ring.cpp, csrc/algo/chain.cpp through ringcomm._C_test.AlgoSim, in
  processes) bit for bit, and numpy where numpy is exact.
- Seeded samples of schedules: no deadlock, no status record, results bit-equal, at 2-4 ranks, 2-3 slots.
- Each broken variant (flag before data, a word reset, a slot freed before it is read, a load hoisted out
  of its spin) makes the schedule search fail, for the ring and for both chains.
- A mismatched call (dtype, op, root or count differing on one rank) ends in a status record naming the
  slot header's field, or, where no rank receives a piece of it, at the next call's stale slot.
- A rank killed mid-wait: the survivors' waits end within the deadline with their status filled; the abort
  word ends them at once; a rank 200 ms late: the call completes.
The exhaustive (preemption-bounded) searches, 10,000-schedule samples and the ThreadSanitizer build run in
the second CI step: benchmarks/device/host_proof.sh."""
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from device_proof_cases import cpu_ring_outputs  # noqa: E402
from mp_cases import DTYPES, OPS, make, reference, supported  # noqa: E402
from order_ref import order_sensitive, ordered_sum  # noqa: E402
from ringcomm.core.launch import spawn  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DT = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5, "int32": 6, "int64": 7,
      "bool": 8}
OP = {"SUM": 0, "PRODUCT": 1, "MIN": 2, "MAX": 3, "AVG": 4, "BAND": 5, "BOR": 6, "BXOR": 7}
TIMEOUT_MS = 2000


def build_harness(out: Path, sanitize: bool = False) -> Path:
    """g++ builds the harness from the header; the CUDA toolkit's headers (libcu++, cuda_fp16) are required."""
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    assert (inc / "cccl" / "cuda" / "atomic").exists() or (inc / "cuda" / "atomic").exists(), \
        f"libcu++ (cuda/atomic) not found under {inc}: the CUDA toolkit's headers are needed"
    flags = ["-O1", "-g", "-fsanitize=thread"] if sanitize else ["-O1"]
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", *flags, f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'csrc' / 'include'}",
           f"-I{inc / 'cccl'}", f"-I{inc}", str(ROOT / "tests" / "device_proof" / "host_harness.cpp"), "-o", str(out),
           "-pthread"]
    subprocess.run(cmd, check=True)
    return out


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return build_harness(tmp_path_factory.mktemp("device_proof") / "harness")


def run(h, mode, **kw):
    args = [str(h), mode] + [f"{k}={v}" for k, v in kw.items()]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    fields = dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)
    return p.returncode, fields, p.stdout + p.stderr


def raw(values, dt):
    if dt == "bfloat16":
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dt == "bool":
        return np.asarray(values).astype(np.uint8)
    return np.asarray(values).astype(dt)


def esize(dt):
    return 2 if dt == "bfloat16" else np.dtype("uint8" if dt == "bool" else dt).itemsize


def out_sizes(coll, world, count, root=0):
    """Elements of each rank's output in the harness's outputs (and the CPU reference's)."""
    if coll in ("ar", "bc"):
        return [count] * world
    if coll == "ag":
        return [count * world] * world
    if coll == "rd":
        return [count if r == root else 0 for r in range(world)]
    return [count // world + (1 if r < count % world else 0) for r in range(world)]


def out_slices(coll, world, count, root=0):
    sizes = out_sizes(coll, world, count, root)
    offs = np.cumsum([0] + sizes)
    return [slice(offs[r], offs[r + 1]) for r in range(world)]


def test_every_dtype_op_equals_the_host_ring_and_numpy(harness, tmp_path, store_env):
    world, count, slot_bytes = 3, 150, 64
    cases, meta = [], []
    for dt in DTYPES:
        for op in OPS:
            if not supported(dt, op):
                continue
            ins = [raw(make(dt, count, r, 3, op), dt) for r in range(world)]
            blob = b"".join(x.tobytes() for x in ins)
            for coll in ("ar", "rs", "rd") + (("ag", "bc") if op == "MAX" else ()):
                root = len(cases) % world if coll in ("bc", "rd") else 0  # every root comes up
                cases.append((coll, DT[dt], OP[op], count, esize(dt), blob, root))
                meta.append((coll, dt, op, ins))
    # float SUM in the ring's (the chain's) order of additions, on data whose sums depend on it
    for dt in ("float32", "float64", "float16"):
        ins = [order_sensitive(count, r, dt) for r in range(world)]
        blob = b"".join(x.tobytes() for x in ins)
        cases.append(("ar", DT[dt], OP["SUM"], count, esize(dt), blob, 0))
        meta.append(("ar-order", dt, "SUM", ins))
        for root in range(world):
            cases.append(("rd", DT[dt], OP["SUM"], count, esize(dt), blob, root))
            meta.append(("rd-order", dt, "SUM", ins))
    cpu = spawn(cpu_ring_outputs, world, (cases, slot_bytes), timeout=200, env=store_env)
    fails = []
    for i, ((coll, dtc, opc, cnt, es, blob, root), (mcoll, dt, op, ins)) in enumerate(zip(cases, meta)):
        (tmp_path / "in.bin").write_bytes(blob)
        rc, f, text = run(harness, "run", world=world, count=cnt, dtype=dtc, op=opc, coll=coll, root=root,
                          slot_bytes=slot_bytes, lanes=2, slots=2, timeout_ms=TIMEOUT_MS,
                          **{"in": tmp_path / "in.bin", "out": tmp_path / "o.bin"})
        if rc != 0:
            fails.append(f"{coll} {dt} {op}: harness failed: {text}")
            continue
        got = (tmp_path / "o.bin").read_bytes()
        want_cpu = b"".join(cpu[r][i] for r in range(world))
        if got != want_cpu:
            fails.append(f"{mcoll} {dt} {op} root {root}: differs from the host ring or chain")
        # numpy, where it is exact (small integers; AVG divides inexactly, its bits are the ring's above)
        nd = np.uint16 if dt == "bfloat16" else np.uint8 if dt == "bool" else np.dtype(dt)
        g = np.frombuffer(got, nd)
        if mcoll == "ar-order":
            want = ordered_sum(ins)
            if not np.array_equal(g[:cnt].view(np.uint8), want.view(np.uint8)):
                fails.append(f"{mcoll} {dt}: differs from the ring-order numpy sum")
            continue
        if mcoll == "rd-order":
            # the chain root+1 -> ... -> root: in[p] + (... + (in[root+2] + in[root+1])), in that order
            acc = ins[(root + 1) % world]
            for k in range(2, world + 1):
                acc = (ins[(root + k) % world] + acc).astype(acc.dtype)
            if not np.array_equal(g.view(np.uint8), acc.view(np.uint8)):
                fails.append(f"{mcoll} {dt} root {root}: differs from the chain-order numpy sum")
            continue
        if op == "AVG":
            continue
        vals = [(x.astype(np.uint32) << 16).view(np.float32) if dt == "bfloat16" else x.astype(bool) if dt == "bool"
                else x for x in ins]
        red = reference(vals, dt, op, world)
        full = (np.concatenate([raw(v, dt) for v in vals]) if coll == "ag" else raw(vals[root], dt) if coll == "bc"
                else raw(red, dt))
        for r, sl in enumerate(out_slices(coll, world, cnt, root)):
            if sl.stop == sl.start:
                continue  # reduce: nothing on a rank other than the root
            part = full if coll != "rs" else full[out_slices("rs", world, cnt)[r]]
            if not np.array_equal(g[sl].view(np.uint8), part.view(np.uint8)):
                fails.append(f"{coll} {dt} {op}: rank {r} differs from numpy")
                break
    assert not fails, "\n".join(fails[:20])


def _inputs(tmp_path, world, count, dtype=np.float32):
    x = (np.arange(world * count) * 7 % 13 + 1).astype(dtype)
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    return x.reshape(world, count)


@pytest.mark.parametrize("world,slots,lanes,count,coll,root", [
    (2, 2, 1, 24, "ar", 0), (3, 2, 1, 36, "ar", 0), (3, 3, 2, 40, "ar", 0), (4, 2, 1, 40, "ar", 0),
    (3, 2, 1, 29, "rs", 0), (3, 2, 1, 10, "ag", 0), (4, 3, 2, 18, "ag", 0),
    (2, 2, 1, 16, "bc", 1), (3, 2, 1, 21, "bc", 2), (4, 3, 2, 40, "bc", 1),
    (2, 3, 1, 16, "rd", 0), (3, 2, 1, 21, "rd", 1), (4, 2, 2, 40, "rd", 3)])
def test_sampled_schedules_finish_with_the_same_bits(harness, tmp_path, world, slots, lanes, count, coll, root):
    """A seeded sample of schedules (switches before every flag and slot access), two calls back to back."""
    x = _inputs(tmp_path, world, count)
    kw = dict(world=world, slots=slots, lanes=lanes, count=count, coll=coll, root=root, slot_bytes=16,
              timeout_ms=TIMEOUT_MS, calls=2, **{"in": tmp_path / "in.bin"})
    rc, f, text = run(harness, "run", out=tmp_path / "o.bin", **kw)
    assert rc == 0, text
    got = np.frombuffer((tmp_path / "o.bin").read_bytes(), np.float32)
    if coll == "ar":
        assert np.array_equal(got, np.tile(x.sum(0), world))
    elif coll == "ag":
        assert np.array_equal(got, np.tile(x.reshape(-1), world))
    elif coll == "bc":
        assert np.array_equal(got, np.tile(x[root], world))
    else:  # rs: the chunks rank after rank; rd: the root's output only
        assert np.array_equal(got, x.sum(0))
    rc, f, text = run(harness, "sched", search="random:1500:11", expect=tmp_path / "o.bin", **kw)
    assert rc == 0 and f["failures"] == "0" and f["schedules"] == "1500", text


@pytest.mark.parametrize("coll,root", [("ar", 0), ("bc", 1), ("rd", 2)])
@pytest.mark.parametrize("broken,name", [(1, "flag before data"), (2, "word reset"), (3, "slot freed before read"),
                                         (4, "load hoisted out of its spin")])
def test_each_broken_variant_is_caught(harness, tmp_path, broken, name, coll, root):
    """The same header built with one defect: the schedule search must find a failing schedule."""
    world, count = 3, 64
    _inputs(tmp_path, world, count)
    kw = dict(world=world, slots=2, count=count, coll=coll, root=root, slot_bytes=16, timeout_ms=TIMEOUT_MS, calls=2,
              **{"in": tmp_path / "in.bin"})
    rc, f, text = run(harness, "run", out=tmp_path / "o.bin", **kw)
    assert rc == 0, text
    rc, f, text = run(harness, "sched", search="random:3000:5", stop_on_fail=1, expect=tmp_path / "o.bin", broken=broken,
                      **kw)
    assert rc == 1 and f["failures"] != "0", f"{name} was not caught: {text}"
    rc, f, text = run(harness, "sched", search="random:300:5", expect=tmp_path / "o.bin", **kw)
    assert rc == 0, f"the correct build failed the same search: {text}"


FIELD = {"seq": 1, "dtype": 4, "op": 5, "root": 6, "count": 7}


@pytest.mark.parametrize("coll,root,skew,field", [
    ("ar", 0, "1:dtype:1", "dtype"), ("ar", 0, "2:op:3", "op"), ("ar", 0, "0:count:60", "count"),
    ("rs", 0, "1:count:50", "count"), ("ag", 0, "2:count:10", "count"), ("bc", 0, "1:root:2", "root"),
    ("bc", 1, "1:count:40", "count"), ("rd", 0, "2:root:1", "root"), ("rd", 0, "1:op:4", "op"),
    ("rd", 2, "0:dtype:6", "dtype")])
def test_mismatched_call_is_named_by_its_slot_header(harness, tmp_path, coll, root, skew, field):
    """One rank calls with another dtype, op, root or count: a rank that receives a piece of it records a
    mismatch naming that field (the ranks left waiting time out); nothing passes."""
    _inputs(tmp_path, 3, 64)
    rc, f, text = run(harness, "run", world=3, count=64, slot_bytes=16, coll=coll, root=root, skew=skew,
                      timeout_ms=300, **{"in": tmp_path / "in.bin"})
    assert rc == 1 and f"reason=3,field={FIELD[field]}," in f["status"], text


def test_call_nobody_receives_is_caught_by_the_next(harness, tmp_path):
    """Two ranks that each take themselves for the broadcast's root receive nothing in that call (its two
    pieces fit the slots): the next call on the lane finds the stale slot (sequence) and fails."""
    _inputs(tmp_path, 2, 8)
    kw = dict(world=2, count=8, slot_bytes=16, coll="bc", root=0, skew="1:root:1", timeout_ms=300,
              **{"in": tmp_path / "in.bin"})
    rc, f, text = run(harness, "run", calls=1, **kw)
    assert rc == 0, text
    rc, f, text = run(harness, "run", calls=2, **kw)
    assert rc == 1 and f"reason=3,field={FIELD['seq']}," in f["status"], text


def test_killed_rank_ends_survivors_waits_within_the_deadline(harness, tmp_path):
    """Rank 2 never comes, rank 1 (a process) is killed while it waits: rank 0's waits end by the deadline,
    each survivor's status record names the wait (reason timeout), and nothing hangs."""
    _inputs(tmp_path, 3, 64)
    deadline_ms = 300
    t0 = time.monotonic()
    rc, f, text = run(harness, "run", ranks="procs", world=3, count=64, slot_bytes=16, timeout_ms=deadline_ms,
                      absent=2, kill="1:100", **{"in": tmp_path / "in.bin"})
    assert rc == 1, text
    assert "rank=0," in f["status"] and "reason=1," in f["status"], text
    assert int(f["end0_ms"]) < deadline_ms + 250, text
    assert time.monotonic() - t0 < 10, text


def test_abort_word_ends_every_wait(harness, tmp_path):
    _inputs(tmp_path, 3, 64)
    rc, f, text = run(harness, "run", ranks="procs", world=3, count=64, slot_bytes=16, timeout_ms=60000, absent=2,
                      abort_ms=100, **{"in": tmp_path / "in.bin"})
    assert rc == 1 and "reason=2," in f["status"], text
    assert int(f["end0_ms"]) < 2000 and int(f["end1_ms"]) < 2000, text


@pytest.mark.parametrize("ranks", ["procs", "threads"])
def test_rank_200ms_late_completes(harness, tmp_path, ranks):
    x = _inputs(tmp_path, 3, 48)
    expect = np.tile(x.sum(0), 3)
    (tmp_path / "e.bin").write_bytes(expect.tobytes())
    rc, f, text = run(harness, "run", ranks=ranks, world=3, count=48, slot_bytes=16, lanes=2, timeout_ms=5000,
                      late="1:200", expect=tmp_path / "e.bin", **{"in": tmp_path / "in.bin"})
    assert rc == 0 and f["result"] == "equal" and f["status"] == "none", text
    assert int(f["elapsed_ms"]) >= 200, text
