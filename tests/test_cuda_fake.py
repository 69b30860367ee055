"""The production CUDA communicator over a fake CUDA runtime (tests/fake_cuda/): the same host
objects as ringcomm._C_cuda, linked with a runtime that records every call instead of libcudart.
No GPU is involved and no kernel runs (the ring kernel's body is proved by tests/test_device_proof.py);
what is checked is what the host path asks of the runtime.

RINGCOMM_CUDA_P2P=device, two (or three) rank processes:
- all_reduce, reduce_scatter, all_gather, and broadcast and reduce at every root: exactly one kernel
  launch per call, on the communicator's own stream, joined to the caller's by an event record and a
  stream wait each way; no query or synchronize, no allocation or registration, nothing on the legacy
  default stream;
- under capture: nothing queried or synchronized; the launch belongs to the graph; its replays touch
  only the regions registered at init and the captured call's own buffers;
- a host-ordered collective under capture raises UnsupportedError and leaves the communicator usable;
- a status record written as a kernel's failing lane writes it becomes, without any wait, the typed
  error naming op, rank, peer, step and sequence (errored(), the Work's wait), the abort word is set,
  and the peer's watchdog sets its own abort word;
- a peer process that dies makes the watchdog set the abort word and report PeerFailureError;
- no header exchange: a fused call posts no header (the board's post counter), a host-ordered call
  after fused ones posts one and pairs up; a mismatch status record on one rank is MismatchError on
  every rank (2 and 3 ranks); a call fused on some ranks and run on the host path (or rejected) on
  others raises on every rank at once, and the communicator is broken.
Default mode: an all_reduce under capture raises (it would wait on the host).
The fake's topology (device count, P2P, MPS, SMs, occupancy): the setup each one gets, the ring
launch's grid within the SM budget, the refusal of grids that could not all be resident, every ring
kernel loaded at init and none by a call; ringcomm.cuda's in-flight guard queries nothing while the
call's stream captures.
Communicators sharing one fake GPU under MPS, through the node's GPU ledger (transport/gpu_ledger.h):
the second gets what the first left, a third is refused naming the holders, closing one frees its
blocks, a dead process's entry is reclaimed, inits at once never over-commit, blocks taken between a
rank's read and its reservation refuse on every rank; no ledger file outlives its communicators."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The rank processes import it; this process only checks that it was built.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ringcomm._C_cuda_fake") is None,
                                reason="ringcomm._C_cuda_fake is built only where CMake finds the CUDA toolkit "
                                       "(no GPU needed)")

HERE = Path(__file__).resolve().parent
RANK = HERE / "fake_cuda" / "rank.py"
QUERIES = {"cudaStreamQuery", "cudaStreamSynchronize", "cudaEventQuery"}
SETUP = {"cudaMalloc", "cudaHostAlloc", "cudaHostRegister", "cudaIpcOpenMemHandle"}
ERR = {1: "InvalidArgument", 2: "Timeout", 3: "PeerFailure", 4: "Mismatch", 5: "Unsupported"}


def start(tmp_path, scenario, mode="device", world=2, env_extra=None, rank_env=None, ledger=None):
    """The rank processes of one communicator. env_extra: variables for every rank (None: unset);
    rank_env(r): a rank's own; ledger: the GPU ledgers' directory (default: DIR/ledger, of this
    communicator alone, so that tests running at once do not share the fake GPU's ledger)."""
    env = dict(os.environ, RINGCOMM_CUDA_P2P=mode, RINGCOMM_CUDA_SLOT_BYTES="4096", RINGCOMM_CUDA_NSLOTS="2",
               RINGCOMM_CUDA_RING_LANES="2", RINGCOMM_CUDA_WATCHDOG_US="200", RINGCOMM_CUDA_CLOSE_WAIT="2",
               RINGCOMM_CUDA_LEDGER_DIR=str(ledger or tmp_path / "ledger"))
    Path(env["RINGCOMM_CUDA_LEDGER_DIR"]).mkdir(parents=True, exist_ok=True)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    for k, v in (env_extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return [subprocess.Popen([sys.executable, str(RANK), str(r), str(world), str(tmp_path), scenario],
                             env=dict(env, **(rank_env(r) if rank_env else {})),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]


def ledgers(d):
    """The GPU ledger files in directory d."""
    return sorted(f.name for f in Path(d).iterdir() if f.name.startswith("ringcomm-gpu-"))


def run(tmp_path, scenario, mode="device", world=2, results=None, env_extra=None, rank_env=None):
    """Runs one communicator's ranks to their end; its GPU ledger is gone after (every rank closed,
    or died)."""
    procs = start(tmp_path, scenario, mode, world, env_extra, rank_env)
    logs = [p.communicate(timeout=60)[0] for p in procs]
    assert not ledgers(tmp_path / "ledger"), "a GPU ledger outlived its communicator:\n" + "\n".join(logs)
    outs = []
    for r in range(world) if results is None else results:
        f = tmp_path / f"out_{r}.json"
        assert f.exists(), f"rank {r} wrote no result:\n" + "\n".join(logs)
        outs.append(json.loads(f.read_text()))
    return outs


def within(ranges, lo, hi):
    return any(a <= lo and hi <= b for a, b in ranges)


def ring_pointers(launch, esize=4):
    """The ranges a ring launch touches: its registered regions and the caller's buffers."""
    n = launch["count"] * esize
    slots = launch["nlanes"] * launch["nslots"] * launch["slot_stride"]
    return {"self": (launch["self"], launch["self"] + 1), "right": (launch["right"], launch["right"] + 1),
            "left": (launch["left"], launch["left"] + 1),
            "recv_slots": (launch["recv_slots"], launch["recv_slots"] + slots),
            "send_slots": (launch["send_slots"], launch["send_slots"] + slots),
            "state": (launch["state"], launch["state"] + 1), "status": (launch["status"], launch["status"] + 1),
            "abort": (launch["abort"], launch["abort"] + 4)}, {"in": (launch["in"], launch["in"] + n),
                                                              "out": (launch["out"], launch["out"] + n)}


@pytest.fixture(scope="module")
def device_run(tmp_path_factory):
    return run(tmp_path_factory.mktemp("fake_device"), "device")


def check_one_launch(rank, out, op):
    """The eager call `op` of one rank: one ring launch between the two event joins, no host wait."""
    calls, launches = out["eager"][op]["calls"], out["eager"][op]["launches"]
    names = [c["name"] for c in calls]
    assert [lch["kernel"] for lch in launches] == ["ring"], (rank, names)
    assert out["eager"][op]["posted"] == 0, "a fused call posted a header (a host round trip)"
    assert not QUERIES & set(names), (rank, names)
    assert not SETUP & set(names), (rank, names)
    assert all(c["stream"] != 0 for c in calls if c["stream"] != 2**64 - 1), "the legacy default stream"
    caller = out["caller"]
    ring = launches[0]["stream"]
    assert ring != caller
    seq = [(c["name"], c["stream"]) for c in calls if c["name"] != "cudaStreamIsCapturing"]
    assert seq == [("cudaEventRecord", caller), ("cudaStreamWaitEvent", ring), ("launch ring", ring),
                   ("cudaEventRecord", ring), ("cudaStreamWaitEvent", caller)], (rank, seq)
    regs, _ = ring_pointers(launches[0])
    for what, (lo, hi) in regs.items():
        assert within(out["registered"], lo, hi), (rank, op, what)
    return launches[0]


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_one_launch_and_no_host_wait(device_run, op):
    for rank, out in enumerate(device_run):
        check_one_launch(rank, out, op)


def test_broadcast_and_reduce_are_one_launch_at_every_root(tmp_path):
    """broadcast and reduce run on the device ring (its chain) too: one launch per call, the root passed."""
    outs = run(tmp_path, "rooted")
    for rank, out in enumerate(outs):
        assert sorted(out["eager"]) == ["broadcast/0", "broadcast/1", "reduce/0", "reduce/1"]
        for key in out["eager"]:
            op, root = key.split("/")
            launch = check_one_launch(rank, out, key)
            assert (launch["coll"], launch["root"], launch["count"]) == ({"broadcast": 4, "reduce": 5}[op], int(root),
                                                                         1000), (rank, key, launch)
            assert launch["header_dtype"] == 0 and launch["header_op"] == 0, (rank, key, launch)
            if op == "broadcast":
                assert launch["out"] == out["buffers"]["out"], (rank, key, launch)
            else:
                assert (launch["in"], launch["out"]) == (out["buffers"]["in"], out["buffers"]["out"]), (rank, key)


def test_host_path_call_after_fused_ones_exchanges_once(device_run):
    # Three fused calls posted nothing; the barrier's exchange pairs up on every rank (the board
    # counts exchanges), so it completes without a mismatch.
    for out in device_run:
        assert out["barrier_posted"] == 1
        assert out["barrier_errored"] is None


def test_capture_queries_nothing_and_replays_touch_registered_buffers(device_run):
    for rank, out in enumerate(device_run):
        cap = out["captured"]
        assert out["captured_work_done"], "a captured call's Work waits for nothing"
        during = [c for c in cap["calls"] if c["capturing"]]
        assert during, "the capture recorded nothing"
        assert not [c["name"] for c in during if c["name"] in QUERIES | SETUP], during
        (launch,) = cap["launches"]
        assert launch["kernel"] == "ring"
        # The launch is a node of the caller's capture: the ring's stream joined it through the event.
        assert [c["graph"] for c in cap["calls"] if c["name"] == "launch ring"] == [cap["graph"]]
        assert out["replays"] == [1, 1, 1]
        assert len(out["replayed"]) == 3
        buffers = out["buffers"]
        for rep in out["replayed"]:
            assert rep["replay"] and rep["kernel"] == "ring"
            regs, user = ring_pointers(rep)
            for what, (lo, hi) in regs.items():
                assert within(out["registered"], lo, hi), (rank, what)
            assert user["in"][0] == buffers["in2"] and user["out"][0] == buffers["out2"]


def test_host_path_under_capture_raises(device_run, tmp_path):
    for out in device_run:
        name, msg = out["host_capture_error"]
        assert name == "UnsupportedError", (name, msg)
        assert "gather" in msg and "captured" in msg and "RINGCOMM_CUDA_P2P=device" in msg
        assert out["after_capture_ok"], "the refused call broke the communicator"
    for out in run(tmp_path, "host", mode="auto"):
        name, msg = out["host_capture_error"]
        assert name == "UnsupportedError" and "all_reduce" in msg, (name, msg)
        assert out["errored"] is None
        assert not [c for c in out["capture_calls"] if c["capturing"] and c["name"] in QUERIES]


def test_status_record_becomes_typed_error_without_a_wait(device_run):
    r0, r1 = device_run
    code, msg = r0["errored"]
    assert ERR[code] == "Mismatch", msg
    for part in ("all_reduce", "rank 0", "peer 1", "step 2", "lane 1", "sequence 7", "expected 11", "saw 13",
                 "mismatched slot header (dtype)"):
        assert part in msg, (part, msg)
    assert r0["errored_after_s"] < 2.0
    assert r0["abort_word"] == 1
    assert r0["work_done"] and r0["wait_error"][0] == "MismatchError", r0["wait_error"]
    # The peer learns it from the control plane: its watchdog stops its kernels and breaks it too.
    assert r1["errored"] is not None and r1["abort_word"] == 1, r1
    assert r1["wait_error"] is not None


def test_dead_peer_sets_abort_word(tmp_path):
    (r0,) = run(tmp_path, "dead", results=(0,))  # rank 1 exits without closing
    code, msg = r0["errored"]
    assert ERR[code] == "PeerFailure", msg
    assert r0["abort_word"] == 1
    assert r0["errored_after_s"] < 5.0


# ---- the setup chosen at init (RINGCOMM_CUDA_P2P=device*), its grid, and every kernel loaded ----

DEFAULT_GEOMETRY = {"RINGCOMM_CUDA_SLOT_BYTES": None, "RINGCOMM_CUDA_NSLOTS": None, "RINGCOMM_CUDA_RING_LANES": None}


def setup_run(tmp_path, world=2, mode="device", **env):
    rank_env = env.pop("rank_env", None)
    return run(tmp_path, "setup" if mode != "refused" else "refused", mode="device" if mode == "refused" else mode,
               world=world, env_extra=dict(DEFAULT_GEOMETRY, **env), rank_env=rank_env)


def check_loaded_at_init(out):
    """Every ring kernel is loaded (cudaFuncGetAttributes) before the first call, none by a call."""
    kernels = out["ring_kernels"]
    # One kernel per (dtype, op) pair the dispatch supports (the same 50 pairs as the reduce kernel).
    assert len(kernels) == len(set(kernels)) == 50, len(kernels)
    loaded = [k for name, k in out["setup_kernel_calls"] if name == "cudaFuncGetAttributes"]
    assert sorted(loaded) == sorted(kernels)
    sized = {k for name, k in out["setup_kernel_calls"] if name != "cudaFuncGetAttributes"}
    assert sized == set(kernels), "the occupancy is the least over every kernel"
    assert out["setup_legacy_stream"] == [], "setup used the legacy default stream"
    for name, c in out["calls"].items():
        assert not c["kernel_calls"], (name, c["kernel_calls"])
        assert not QUERIES & set(c["names"]), (name, c["names"])


@pytest.mark.parametrize("topology", ["one-gpu", "mps", "mps-3", "separate", "forced-spin"])
def test_setup_per_topology(tmp_path, topology):
    """The setup detected from the fake topology (4 SMs x 2 resident ring blocks by default), the
    signalling and geometry it chooses, and the ring launch's grid (its SM budget applied)."""
    if topology == "one-gpu":      # two contexts time-share one GPU: spins, 1 block, 2 slots of 8 MiB
        outs = setup_run(tmp_path)
        want = ("one GPU shared without MPS", "spin", 1, 2, 8 << 20, 8)
    elif topology == "mps":        # grids run at once: 8 resident blocks shared by 2 ranks
        outs = setup_run(tmp_path, FAKE_CUDA_MPS="1")
        want = ("one GPU shared under MPS", "flags", 4, 4, 2 << 20, 4)
    elif topology == "mps-3":      # 3 ranks: a budget of 8 // 3 = 2 blocks caps the 4 lanes
        outs = setup_run(tmp_path, world=3, FAKE_CUDA_MPS="1")
        want = ("one GPU shared under MPS", "flags", 2, 4, 2 << 20, 2)
    elif topology == "separate":   # a GPU per rank, P2P: the whole GPU is the rank's budget
        outs = setup_run(tmp_path, FAKE_CUDA_DEVICES="2", FAKE_CUDA_P2P="1",
                         rank_env=lambda r: {"FAKE_CUDA_DEVICE": str(r)})
        want = ("separate GPUs", "flags", 4, 4, 2 << 20, 8)
    else:                          # device-spin under MPS: few, large slots; the budget still shared
        outs = setup_run(tmp_path, mode="device-spin", FAKE_CUDA_MPS="1", RINGCOMM_CUDA_MAX_BLOCKS="3")
        want = ("one GPU shared under MPS", "spin", 1, 2, 8 << 20, 3)
    setup, signalling, blocks, nslots, slot_bytes, budget = want
    for rank, out in enumerate(outs):
        st = out["setup"]
        assert (st["setup"], st["signalling"], st["blocks"], st["nslots"], st["slot_bytes"], st["budget"]) == want, st
        assert setup in st["why"] and ("spins" if signalling == "spin" else "flags") in st["why"], st["why"]
        for name in ("all_reduce", "all_gather", "broadcast"):
            ((kernel, grid, slots, stride),) = out["calls"][name]["grids"]
            assert (kernel, grid, slots) == ("ring", blocks, nslots), (rank, name, out["calls"][name])
            assert stride >= slot_bytes
        check_loaded_at_init(out)
    if topology == "separate":
        why = outs[0]["setup"]["why"]
        assert "GPU 3066616b: 1 rank(s)" in why and "GPU 3166616b: 1 rank(s)" in why, why


@pytest.mark.parametrize("case", ["over-budget", "no-room"])
def test_setup_refuses_grids_that_cannot_all_be_resident(tmp_path, case):
    """Every rank refuses at init, naming the grids and the knobs, instead of deadlocking later."""
    if case == "over-budget":      # 2 x 6 blocks asked under MPS, 8 resident: refused
        outs = setup_run(tmp_path, mode="refused", FAKE_CUDA_MPS="1", RINGCOMM_CUDA_MAX_BLOCKS="6",
                         RINGCOMM_CUDA_RING_LANES="6")
        words = ("2 ring grid(s) of 6 blocks cannot all be resident", "8 resident blocks", "RINGCOMM_CUDA_MAX_BLOCKS")
    else:                          # 3 ranks at once on 1 SM x 2 blocks: not one block each
        outs = setup_run(tmp_path, mode="refused", world=3, FAKE_CUDA_MPS="1", FAKE_CUDA_SMS="1")
        words = ("no ring block fits the SM budget", "3 grid(s) at once", "2 resident blocks")
    for out in outs:
        name, msg = out["create_error"]
        assert name == "InvalidArgumentError", (name, msg)
        for w in words:
            assert w in msg, (w, msg)


def test_python_guard_queries_nothing_under_capture(tmp_path):
    """ringcomm.cuda's in-flight guard (over the fake core): while the caller's stream captures,
    neither a held Work nor the stream is queried, the captured call holds nothing, and a
    collective that takes the host path raises a clear UnsupportedError; afterwards the guard
    lets go of the finished Work again."""
    for out in run(tmp_path, "pyguard"):
        assert out["held_before"] == 1
        during = [c["name"] for c in out["capture_calls"] if c["capturing"]]
        assert "cudaStreamIsCapturing" in during
        assert not QUERIES & set(during), during
        assert out["capture_launches"] == ["ring"]
        assert out["held_captured"] == 1, "a captured call's arrays belong to the graph"
        name, msg = out["host_capture_error"]
        assert name == "UnsupportedError" and "gather" in msg and "captured" in msg, (name, msg)
        assert out["held_after"] == 1, "the eager Work before the capture is let go, the new one held"
        assert "cudaEventQuery" in out["after_calls"]
        assert out["errored"] is None


@pytest.mark.parametrize("world", [2, 3])
def test_kernel_mismatch_is_mismatch_error_on_every_rank(tmp_path, world):
    outs = run(tmp_path, "status_mismatch", world=world)
    for rank, out in enumerate(outs):
        assert out["errored"] is not None, f"rank {rank} never learnt of the mismatch"
        code, msg = out["errored"]
        assert ERR[code] == "Mismatch", (rank, msg)
        assert out["errored_after_s"] < 2.0, (rank, out["errored_after_s"])
        assert out["abort_word"] == 1, rank
        assert out["wait_error"] is not None and out["wait_error"][0] == "MismatchError", (rank, out["wait_error"])
        if rank == 0:
            for part in ("all_reduce", "rank 0", f"peer {world - 1}", "mismatched slot header", "expected 40",
                         "saw 48"):
                assert part in msg, (part, msg)
        else:  # the others name the rank whose kernel found it (directly, or through a rank it told)
            assert "rank 0" in msg and "mismatched slot header" in msg, (rank, msg)
        # The device path does not keep the host path's contract: the communicator is broken.
        name, after = out["after"]
        assert name == "RingcommError" and "unusable after an earlier failure" in after, (rank, name, after)


def call_outcome_ok(out, fused):
    """What a rank's own call of a mismatched pair may do. A rank learns of the mismatch from the first
    rank to see it (at once, through its abort), so its own call may come after it knows: then the call
    is refused (a fused one before its launch) with the MismatchError itself or with RingcommError
    "unusable after an earlier failure" / "not run: the communicator failed earlier" naming it. Otherwise a fused call launches and returns (the error
    comes without a wait), and a host-path call raises MismatchError from its header wait."""
    err = out["call_error"]
    if err is not None and ("unusable after an earlier failure" in err[1] or "failed earlier" in err[1]):
        return err[0] == "RingcommError" and "without a header exchange" in err[1] and out["launched"] == []
    if fused and err is None:
        return out["launched"] == ["ring"] and out["wait_error"][0] == "MismatchError"
    return err is not None and err[0] == "MismatchError" and out["launched"] == []


@pytest.mark.parametrize("world", [2, 3])
def test_rank_on_host_path_beside_fused_rank_errors_on_both(tmp_path, world):
    """world 2: all_reduce (fused) on rank 0, gather (host path) on rank 1; world 3: an all_gather of
    unequal contributions, fused on rank 1 only (its part is the output's equal share)."""
    outs = run(tmp_path, "mixed", world=world)
    fused = {0} if world == 2 else {1}
    for rank, out in enumerate(outs):
        assert out["errored"] is not None, f"rank {rank} hangs"
        code, msg = out["errored"]
        assert ERR[code] == "Mismatch", (rank, msg)
        assert "without a header exchange" in msg, (rank, msg)
        assert out["errored_after_s"] < 4.0, (rank, out["errored_after_s"])  # the timeout is 5 s
        assert call_outcome_ok(out, rank in fused), (rank, out["launched"], out["call_error"], out["wait_error"])
        assert out["after"] is not None and "unusable after an earlier failure" in out["after"][1], (rank, out["after"])
    # Some host-path rank saw the fused rank's note itself (not only a peer's abort).
    saw = re.compile(r"^ringcomm: \w+ \(seq 2\) on rank \d: rank \d ran this call on the device ring without a header "
                     r"exchange while this rank called \w+\(.*\) on the host-ordered path")
    assert any(o["call_error"] and o["call_error"][0] == "MismatchError" and saw.match(o["call_error"][1])
               for r, o in enumerate(outs) if r not in fused), [o["call_error"] for o in outs]


def test_rejected_arguments_beside_fused_calls(tmp_path):
    """Rank 1's all_reduce fails its own argument check (it joins as a rejection, on the host path)
    while rank 0's fuses: rank 1 raises its own InvalidArgumentError, rank 0 MismatchError (from its
    launch, or without a wait after it), both at once, and both communicators are broken (no header
    exchange came before rank 0's launch)."""
    r0, r1 = run(tmp_path, "mixed", env_extra={"MIXED": "rejected"})
    assert r1["launched"] == [] and r1["call_error"][0] == "InvalidArgumentError", r1["call_error"]
    code, msg = r0["errored"]
    assert ERR[code] == "Mismatch" and "rank 1 failed" in msg and "rejected its arguments" in msg, msg
    assert r0["errored_after_s"] < 4.0
    assert call_outcome_ok(r0, True), (r0["launched"], r0["call_error"], r0["wait_error"])
    for out in (r0, r1):
        assert out["errored"] is not None
        assert out["after"] is not None and "unusable after an earlier failure" in out["after"][1], out["after"]


# ---- communicators sharing one GPU: the node's GPU ledger (transport/gpu_ledger.h) ----

# Under MPS, 6 SMs x 2 resident ring blocks: 12 blocks for every grid of the GPU at once.
SHARED = dict(DEFAULT_GEOMETRY, FAKE_CUDA_MPS="1", FAKE_CUDA_SMS="6")


def entries(ledger):
    """The fake GPU's ledger entries: (pid, blocks) of each, [] when there is no ledger."""
    files = ledgers(ledger)
    assert len(files) <= 1, files
    if not files:
        return []
    lines = (Path(ledger) / files[0]).read_text().split("\n")
    return sorted((int(x.split()[0]), int(x.split()[4])) for x in lines if x.strip())


class Group:
    """One communicator's ranks in scenario "ledger": they init, run one call, and hold the ring's
    blocks until end() tells them to close or to exit without closing."""

    def __init__(self, tmp_path, name, ledger, world=2, **env):
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.world = world
        self.procs = start(self.dir, "ledger", world=world, env_extra=dict(SHARED, **env), ledger=ledger)

    def outs(self, timeout=60):
        import time
        t0 = time.monotonic()
        files = [self.dir / f"out_{r}.json" for r in range(self.world)]
        while not all(f.exists() for f in files):
            dead = [p for p in self.procs if p.poll() not in (None, 0)]
            assert not dead and time.monotonic() - t0 < timeout, "\n".join(p.communicate()[0] for p in self.procs)
            time.sleep(0.01)
        return [json.loads(f.read_text()) for f in files]

    def blocks(self):
        outs = self.outs()
        assert all("setup" in o for o in outs), outs
        assert len({o["setup"]["blocks"] for o in outs}) == 1, outs
        return outs[0]["setup"]["blocks"], outs

    def end(self, how="close"):
        (self.dir / "end.tmp").write_text(how)
        (self.dir / "end.tmp").rename(self.dir / "end")
        for p in self.procs:
            out = p.communicate(timeout=60)[0]
            assert p.returncode == 0, out


def test_communicators_on_one_gpu_share_its_blocks(tmp_path):
    """Under MPS the GPU's 12 resident blocks are shared by every communicator there: the first
    takes its 2 x 4 lanes, the second what is left (2 x 2), a third is refused naming the holders;
    closing one frees its blocks for the next, and a dead process's entry is reclaimed."""
    ledger = tmp_path / "ledger"
    groups = []
    try:
        a = Group(tmp_path, "a", ledger)
        groups.append(a)
        blocks_a, outs_a = a.blocks()
        assert blocks_a == 4
        pids_a = sorted(o["pid"] for o in outs_a)
        assert entries(ledger) == [(p, 4) for p in pids_a]
        b = Group(tmp_path, "b", ledger)
        groups.append(b)
        blocks_b, outs_b = b.blocks()
        assert blocks_b == 2, outs_b[0]["setup"]
        why = outs_b[0]["setup"]["why"]
        assert "ledger" in why and "12 resident blocks" in why and "leaves 4 of them" in why, why
        assert f"pid {pids_a[0]} (rank" in why, why
        pids_b = sorted(o["pid"] for o in outs_b)
        # A third finds nothing left: refused on every rank, naming every holder.
        c = Group(tmp_path, "c", ledger)
        for o in c.outs():
            name, msg = o["create_error"]
            assert name == "InvalidArgumentError", (name, msg)
            assert "no ring block fits" in msg and "leaves 0 of them" in msg, msg
            for pid, n in [(p, 4) for p in pids_a] + [(p, 2) for p in pids_b]:
                assert f"pid {pid} (rank " in msg and f"): {n} blocks" in msg, (pid, msg)
        c.end()
        assert sorted(entries(ledger)) == sorted([(p, 4) for p in pids_a] + [(p, 2) for p in pids_b])
        # Closing A frees its 8 blocks: D gets 2 x 4.
        a.end("close")
        groups.remove(a)
        assert entries(ledger) == [(p, 2) for p in pids_b]
        d = Group(tmp_path, "d", ledger)
        groups.append(d)
        assert d.blocks()[0] == 4
        # B's processes die holding their blocks: the next init reclaims them (12 - D's 8 = 2 x 2).
        b.end("die")
        groups.remove(b)
        e = Group(tmp_path, "e", ledger)
        groups.append(e)
        assert e.blocks()[0] == 2
        assert not {p for p, _ in entries(ledger)} & set(pids_b)
    finally:
        for g in groups:
            g.end("close")
    assert not ledgers(ledger)


def test_concurrent_inits_do_not_over_commit(tmp_path):
    """Two communicators initialising at once on a GPU that cannot hold both at full width: the
    ledger's entries never exceed its 12 blocks, and each communicator that came up holds what it
    plans with; a loser of the race is refused on every rank, never over-committed."""
    ledger = tmp_path / "ledger"
    groups = [Group(tmp_path, "x", ledger), Group(tmp_path, "y", ledger)]
    try:
        held = 0
        for g in groups:
            outs = g.outs()
            if all("setup" in o for o in outs):
                held += 2 * outs[0]["setup"]["blocks"]
            else:
                for o in outs:
                    name, msg = (o.get("create_error") or o.get("connect_error"))
                    assert name == "InvalidArgumentError" and "ledger" in msg, (name, msg)
        assert 0 < held <= 12
        assert sum(n for _, n in entries(ledger)) == held
    finally:
        for g in groups:
            g.end("close")
    assert not ledgers(ledger)


def test_blocks_taken_between_info_and_create_refuse_on_every_rank(tmp_path):
    """Another communicator reserves after the ranks read the ledger and before they reserve the
    grid they agreed on: the rank that finds too little left reserves nothing, and every rank
    refuses at connect naming it and the holders; the entry the other rank made goes with it."""
    import time
    from ringcomm import _C_cuda_fake as fake
    ledger = tmp_path / "ledger"
    g = Group(tmp_path, "a", ledger, PAUSE_BEFORE_CREATE="1")
    try:
        t0 = time.monotonic()
        while len(list(g.dir.glob("info_[01]"))) < 2 and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        # Both ranks saw 12 blocks free and will plan 2 x 4; 6 go to another holder now.
        assert fake.ledger_reserve(str(ledger), b"0fake-gpu-uuid-0", 99, True, 6, 12)[0]
        (g.dir / "go").write_text("")
        outs = g.outs()
        failed = set()
        for o in outs:
            name, msg = o["connect_error"]
            assert name == "InvalidArgumentError" and "could not reserve the ring's 4 block(s)" in msg, (name, msg)
            assert f"pid {os.getpid()} (rank 0 of 1): 6 blocks" in msg, msg
            failed.add(re.search(r"rank (\d) could not reserve", msg).group(1))
        assert len(failed) == 1, outs
        g.end("close")
        assert entries(ledger) == [(os.getpid(), 6)], "the refused communicator left an entry"
    finally:
        fake.ledger_release(str(ledger), b"0fake-gpu-uuid-0", 99)
        if any(p.poll() is None for p in g.procs):
            g.end("close")
    assert not ledgers(ledger)


LEDGER_RESERVER = r"""
import sys, time
from pathlib import Path
from ringcomm import _C_cuda_fake as fake
d, when = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, when - time.time()))
ok, held, holders = fake.ledger_reserve(d + "/ledger", b"0fake-gpu-uuid-0", 1, True, 3, 12)
Path(d, f"res_{sys.argv[3]}.tmp").write_text(str(int(ok)))
Path(d, f"res_{sys.argv[3]}.tmp").rename(Path(d, f"res_{sys.argv[3]}"))  # whole when the test sees it
while not Path(d, "end").exists():
    time.sleep(0.005)
fake.ledger_release(d + "/ledger", b"0fake-gpu-uuid-0", 1)
"""


def test_ledger_reservations_at_once_never_exceed_the_gpu(tmp_path):
    """Eight processes reserve 3 of 12 blocks at the same instant under the ledger's lock: exactly
    four get them; a process's own entries (not an MPS client) count against it alone; a
    released or dead holder's blocks are free again."""
    import time
    from ringcomm import _C_cuda_fake as fake
    (tmp_path / "ledger").mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]))
    when = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", LEDGER_RESERVER, str(tmp_path), str(when), str(i)], env=env)
             for i in range(8)]
    try:
        t0 = time.monotonic()
        while len(list(tmp_path.glob("res_[0-7]"))) < 8 and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        got = [int((tmp_path / f"res_{i}").read_text()) for i in range(8)]
        assert sum(got) == 4, got
        assert sum(n for _, n in entries(tmp_path / "ledger")) == 12
    finally:
        (tmp_path / "end").write_text("")
        for p in procs:
            p.wait(timeout=60)
    assert not ledgers(tmp_path / "ledger")
    # Without MPS a process's context is its own: only its own entries share the blocks.
    d, u = str(tmp_path / "ledger"), b"0fake-gpu-uuid-0"
    assert fake.ledger_reserve(d, u, 1, False, 8, 12)[0]
    ok, held, holders = fake.ledger_reserve(d, u, 2, False, 5, 12)
    assert not ok and held == 8 and f"pid {os.getpid()} (rank 0 of 1): 8 blocks" in holders, holders
    assert fake.ledger_look(d, u, True, 2)[0] == 0, "an MPS client does not share a context with it"
    fake.ledger_release(d, u, 1)
    assert fake.ledger_reserve(d, u, 2, False, 5, 12)[0]
    fake.ledger_release(d, u, 2)
    assert not ledgers(d)
    # A dead holder's entry (its process gone, or its pid reused) is dropped by the next access.
    p = Path(fake.ledger_path(d, u))
    ns = int(os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]"))
    p.write_text("999999999 1 1 1 12 0 2 %d\n%d 1 1 1 12 0 2 %d\n" % (ns, os.getpid(), ns))
    assert fake.ledger_look(d, u, True, 7) == (0, "")
    assert not ledgers(d), "an empty ledger is removed"
    # A holder in another PID namespace cannot be checked from here: it is kept.
    p.write_text("999999999 1 1 1 12 0 2 %d\n" % (ns + 1))
    assert fake.ledger_look(d, u, True, 7) == (12, "pid 999999999 (rank 0 of 2): 12 blocks")
    p.unlink()
