"""ringcomm under torchft's real Manager and lighthouse on 127.0.0.1, by both routes
(ringcomm.torchft's ProcessGroupRingcomm, and ringcomm's torch.distributed backend in torchft's
ProcessGroupWrapper: ringcomm.torchft.ProcessGroupRingcommC10d): two replica groups of one rank
train a tiny model (tests/torchft_replica.py). Undisturbed, and with a replica killed (between steps, in the
all_reduce's header exchange, while its data moves) and restarted, training ends bit-equal to the
same run on torchft's ProcessGroupGloo; a survivor's failing step raises within 2 s of the death.
Every death is run on both routes.
Skipped where the ``ft`` extra is not installed (except the check that both groups say what to
install without it)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
_NO_TORCHFT = ""
try:
    from torchft._torchft import LighthouseServer
except ImportError as e:
    LighthouseServer = None
    _NO_TORCHFT = f"torchft is not installed (pip install 'ringcomm[ft]'): {e}"

needs_torchft = pytest.mark.skipif(LighthouseServer is None, reason=_NO_TORCHFT)

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
STEPS = 5
LIMIT_S = 90


def _env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra or {})
    return env


_LIVE = []  # processes started by the running test


@pytest.fixture(autouse=True)
def _reap():
    """Kill what a failed or interrupted test left running."""
    yield
    while _LIVE:
        p = _LIVE.pop()
        if p.poll() is None:
            p.kill()
            p.wait()


def _start(out: Path, name: str, spec: dict, env=None) -> subprocess.Popen:
    path = out / f"{name}.json"
    path.write_text(json.dumps(dict(spec, out=str(out))))
    with open(out / f"{name}.log", "w") as log:
        p = subprocess.Popen([sys.executable, str(HERE / "torchft_replica.py"), str(path)],
                             env=_env(env), stdout=log, stderr=subprocess.STDOUT)
    _LIVE.append(p)
    return p


def _wait(p: subprocess.Popen, out: Path, name: str, deadline: float) -> int:
    try:
        return p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail(f"{name} did not finish in time; its log:\n{(out / f'{name}.log').read_text()[-4000:]}")


def _log(out: Path, name: str) -> str:
    return (out / f"{name}.log").read_text()[-4000:]


# Small slots: the large all_reduce takes thousands of hand-offs, so the replica that kills itself
# just after posting it dies while its data still moves.
SLOW_DATA = {"RINGCOMM_SLOT_BYTES": "1K", "RINGCOMM_NSLOTS": "2"}


def _train(out: Path, backend: str, die=(), ddp=True, big=False):
    """Two replicas training STEPS steps under one lighthouse; replica 1 dies as the first entry
    of ``die`` says and is restarted, the restarted replica dies as the next one says, and so on;
    the last one trains to the end. Returns (final state dicts of both, replica 0's events, the
    last death's time)."""
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=10000,
                                  quorum_tick_ms=50, heartbeat_timeout_ms=1000)
    try:
        spec = {"backend": backend, "lighthouse": lighthouse.address(), "steps": STEPS,
                "ddp": ddp, "big": big}
        deadline = time.monotonic() + LIMIT_S
        env = SLOW_DATA if big else None
        survivor = _start(out, "replica0", dict(spec, replica=0), env)
        dies = list(die)
        name = "replica1"
        for k in range(len(dies) + 1):
            victim = _start(out, name, dict(spec, replica=1, die=dies[k] if k < len(dies) else None),
                            env)
            rc = _wait(victim, out, name, deadline)
            if k < len(dies):
                assert rc == -9, f"{name} should have died (rc {rc}):\n{_log(out, name)}"
            else:
                assert rc == 0, _log(out, name)
            name = f"replica1_restarted{k + 1}"
        assert _wait(survivor, out, "replica0", deadline) == 0, _log(out, "replica0")
    finally:
        lighthouse.shutdown()
    finals = [torch.load(out / f"final_{r}.pt") for r in range(2)]
    events = json.loads((out / "events_0.json").read_text())
    death = out / "death_1.json"
    return finals, events, json.loads(death.read_text())["time"] if death.exists() else None


def _assert_bit_equal(a, b, what):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs (max |diff| {(a[k] - b[k]).abs().max()})"


@pytest.fixture(scope="module")
def gloo_reference(tmp_path_factory):
    """The undisturbed run on torchft's ProcessGroupGloo, through torchft's DDP."""
    finals, events, _ = _train(tmp_path_factory.mktemp("gloo"), "gloo")
    _assert_bit_equal(finals[0], finals[1], "gloo replicas")
    assert events == []
    return finals[0]


def test_module_without_torchft(tmp_path):
    """ringcomm.torchft imports where torchft is missing; constructing either group says what to
    install."""
    code = ("import sys; sys.modules['torchft'] = None\n"
            "import ringcomm.torchft as m\n"
            "for cls in (m.ProcessGroupRingcomm, m.ProcessGroupRingcommC10d):\n"
            "    try:\n        cls()\n    except ImportError as e:\n"
            "        print(cls.__name__, 'ImportError:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    for line, name in zip(lines, ("ProcessGroupRingcomm", "ProcessGroupRingcommC10d")):
        assert line.startswith(f"{name} ImportError:") and "ringcomm[ft]" in line, r.stdout


def test_one_module_behind_the_public_path():
    """ringcomm.torchft names the groups of ringcomm.torch.torchft, the one module that writes
    them."""
    import ringcomm.torch.torchft as impl
    import ringcomm.torchft as public
    for name in public.__all__:
        assert getattr(public, name) is getattr(impl, name), name
    assert set(public.__all__) == set(impl.__all__)


@needs_torchft
def test_collectives_work_contract_and_abort(tmp_path):
    """Every collective torchft uses, against gloo on the same inputs; futures complete when
    wait() returns; wait(timeout) raises and leaves the call pending; abort() makes the peer's
    pending call raise within 1 s; a new configure() works; set_timeout() bounds later waits."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    deadline = time.monotonic() + LIMIT_S
    ps = [_start(tmp_path, f"rank{r}", {"mode": "collectives", "replica": r, "port": store.port})
          for r in range(2)]
    for r, p in enumerate(ps):
        assert _wait(p, tmp_path, f"rank{r}", deadline) == 0, _log(tmp_path, f"rank{r}")
    res = [json.loads((tmp_path / f"collectives_{r}.json").read_text()) for r in range(2)]
    for r in range(2):
        for name, c in res[r]["checks"].items():
            assert c["future_done_after_wait"], (r, name)
            assert c["equal_to_gloo"], (r, name)
            assert c.get("future_value_is_outputs") in (None, True), (r, name)
        assert res[r]["errored_after_configure"] == "None"
        assert res[r]["after_configure"] == [3.0, 3.0, 3.0]
    assert "aborted on rank 0" in res[0]["errored"]
    assert res[1]["peer_raised"] is not None and "aborted on rank 0" in res[1]["peer_raised"], res[1]
    assert res[1]["peer_raised_after_s"] < 1.3, res[1]   # rank 0 aborts 0.3 s after rank 1 waits
    assert res[1]["future_holds_error"]
    assert "aborted on rank 0" in res[1]["errored"]
    assert res[1]["short_wait"] == "TimeoutError" and res[1]["future_pending_after_short_wait"], res[1]
    assert res[1]["long_wait"] is True and res[1]["future_done_after_long_wait"], res[1]
    assert res[1]["set_timeout_raised"] == "TimeoutError", res[1]
    assert 0.25 < res[1]["set_timeout_after_s"] < 1.2, res[1]


# The two routes: ringcomm.torchft's ProcessGroupRingcomm (ringcomm's plain API), and ringcomm's
# torch.distributed backend inside torchft's ProcessGroupWrapper
# (ringcomm.torchft.ProcessGroupRingcommC10d).
ROUTES = ["ringcomm", "ringcomm-c10d"]


@needs_torchft
@pytest.mark.parametrize("route", ROUTES)
def test_undisturbed_equals_gloo(tmp_path, gloo_reference, route):
    finals, events, _ = _train(tmp_path, route)
    assert events == []
    for r in range(2):
        _assert_bit_equal(finals[r], gloo_reference, f"{route} replica {r} vs gloo")


# Deaths per run: between steps at step 1, then (the restarted replica) in the all_reduce's header
# exchange at step 3; or while the data of step 2's large all_reduce moves.
DEATHS = {"between,header": [{"step": 1, "where": "between"}, {"step": 3, "where": "header"}],
          "data": [{"step": 2, "where": "data"}]}


# A death between steps or in the header exchange on both routes (each maps the error its own
# way); the death while data moves, where detection is the core's and the route only relays the
# same error, on the torch.distributed route.
KILLS = [pytest.param(where, route, id=f"{where}-{route}")
         for where, routes in (("between,header", ROUTES), ("data", ["ringcomm-c10d"]))
         for route in routes]


@needs_torchft
@pytest.mark.parametrize("where,route", KILLS)
def test_replica_killed_and_restarted(tmp_path, gloo_reference, where, route):
    """Replica 1 dies (as DEATHS says) and is restarted; a restarted replica heals from replica 0
    over the process group (PGTransport: send/recv). min_replica_size=2, so only steps both
    replicas took commit and the run ends with the undisturbed run's weights. A death between
    steps meets no collective (the survivor's next quorum waits for the replacement); a death in
    a collective fails the survivor's step, within 2 s."""
    dies = DEATHS[where]
    finals, events, death = _train(tmp_path, route, die=dies, ddp=False, big=where == "data")
    for r in range(2):
        _assert_bit_equal(finals[r], gloo_reference, f"{route} replica {r} vs gloo")
    in_call = dies[-1]
    assert len(events) == 1 and events[0]["step"] == in_call["step"], events
    ev = events[0]
    assert ev["error"].startswith("PeerFailureError"), ev
    assert ("header" in ev["error"]) == (in_call["where"] == "header"), ev
    # Killed while its data moves, the peer leaves the survivor waiting on either side of the
    # slots they share: for the peer's data, or for a slot the peer has not freed.
    data_wait = "waiting for data" in ev["error"] or "waiting for a free slot" in ev["error"]
    assert data_wait == (in_call["where"] == "data"), ev
    assert ev["raised"] - death < 2.0, (ev, death)
