"""The all-reduce cost model (csrc/comm/cost_model.h) and the halving_doubling all-reduce
(csrc/algo/halving_doubling.cpp).

Without ranks: the model's choice as a pure function of (profile, bytes, world), against the
formulas of docs/algorithms.md written out independently here; halving_doubling's per-rank work
against the closed form the model uses; profile files (format, version, hash) and the
RINGCOMM_PROFILE / RINGCOMM_MODEL_MIN_WORLD knobs through the one selection. With ranks: ranks
that load different profiles raise MismatchError at init, every one of them; a shared profile
drives auto's choice; halving_doubling forced at 2, 3, 4, 5, 8 and 16 ranks (oversubscribed here)
with tiny slots, every dtype x op, bit for bit the ring's result (one group of ranks per world).
"""
import json
import math
import os
import subprocess
import sys

import pytest

import ringcomm
import ringcomm.core.config
from ringcomm import _C, _C_test
from ringcomm.apps.tune import write_profile
import ranks
from cost_model_cases import hd_cases, model_auto_case, profile_init_case

KiB = 1024
DEFAULT_PIECES = dict(ring=256 * KiB, far=32 * KiB)
# A machine whose ranks share 2 CPUs (this VM's tuned profile, rounded).
SHARED = {"alpha_s": 4e-6, "alpha_shared_s": 3.2e-6, "slot_s": 2.5e-6, "copy_Bps": 15e9, "reduce_Bps": 10e9,
          "ll_Bps": 18e9, "cpus": 2.0}
MANY = {"alpha_s": 1e-6, "alpha_shared_s": 3e-6, "slot_s": 0.3e-6, "copy_Bps": 10e9, "reduce_Bps": 8e9,
        "ll_Bps": 20e9, "cpus": 0.0}
# model_choose's candidates in its order, with the header in the first slot (the binding's default)
CANDIDATES = [("direct", "ll"), ("direct", "header_in_slot"), ("two_shot", "simple"), ("ring", "header_in_slot"),
              ("halving_doubling", "simple")]
PRICED = CANDIDATES + [("direct", "simple"), ("ring", "simple")]


def hd_work(n):
    """halving_doubling's work for rank 0, counted from the algorithm's description (P the largest
    power of two <= n, q = n - P extra ranks fold into ranks 0..q-1; chunk k is owned by k mod P)."""
    P = 1 << (n.bit_length() - 1)
    q = n - P
    owners = [k if k < P else k - P for k in range(n)]
    steps, sent, recv = 0, 0, 0
    if q:
        steps, sent, recv = 2, n, n
    for d in (P >> i for i in range(1, P.bit_length())):                    # halving: P/2 .. 1
        held = lambda m: sum(1 + (w < q) for w in range(P) if w % (2 * d) == m)   # noqa: E731
        steps += 1
        sent += held(0) * sum(1 for o in owners if o // d == 1)
        recv += held(d) * sum(1 for o in owners if o // d == 0)
    for d in (1 << i for i in range(P.bit_length() - 1)):                   # doubling: 1 .. P/2
        steps += 1
        sent += sum(1 for o in owners if o // d == 0)
        recv += sum(1 for o in owners if o // d == 1)
    return {"steps": steps, "sent": sent, "received": recv, "combined": owners.count(0)}


def py_seconds(p, algo, proto, M, n, ring=256 * KiB, far=32 * KiB, depth=16):
    """docs/algorithms.md's cost formulas."""
    cdiv = lambda a, b: math.ceil(a / b) if a > 0 else 0   # noqa: E731
    refills = lambda slots: max(0, cdiv(slots, depth) - 1)   # noqa: E731
    S = C = R = L = E = 0.0
    shared = p["cpus"] > 0 and n > p["cpus"]
    if proto == "ll":
        H, L, R = 1, n * M, (n - 1) * M
    elif algo == "direct":
        H = 1 if proto == "header_in_slot" else 2
        S, C, R = (n - 1) * max(1, cdiv(M, far)), (n - 1) * M, (n - 1) * M
        E = refills(cdiv(M, far))
    elif algo == "two_shot":
        pieces = cdiv(M / n, far)
        # the reduced chunk's reads by N - 1 peers priced as copies only with a CPU per rank
        H, S, C, R = 3, 2 * (n - 1) * pieces, ((2 * n - 1) if shared else 3 * (n - 1)) / n * M, (n - 1) / n * M
        E = max(0, pieces - 1) + pieces * refills(n - 1)
    elif algo == "ring":
        H = 2 * (n - 1) + (0 if proto == "header_in_slot" else 1)
        S, C, R = 2 * (n - 1) * cdiv(M / n, ring), (2 * n - 1) / n * M, (n - 1) / n * M
        E = 2 * (n - 1) * max(0, cdiv(M / n, ring) - 1)
    else:
        w = hd_work(n)
        H = w["steps"] + 1
        S = max(w["steps"], cdiv(w["sent"] * M / n, far))
        C, R = (w["sent"] + w["received"]) * M / n, w["combined"] * (n - 1) * M / n
        E = max(0, cdiv(S, depth) - w["steps"])
    f = n / p["cpus"] if shared else 1.0
    lat = (H + E) * p["alpha_shared_s"] * f if shared else H * p["alpha_s"]
    return lat + f * (S * p["slot_s"] + C / p["copy_Bps"] + R / p["reduce_Bps"] + L / p["ll_Bps"])


def py_choose(p, M, n, ll=4 * KiB):
    best = None
    for algo, proto in CANDIDATES:
        if proto == "ll" and not 0 < M <= ll:
            continue
        s = py_seconds(p, algo, proto, M, n)
        if best is None or s < best[0]:
            best = (s, (algo, proto))
    return best[1]


SIZES = [0, 1, 64, 1 * KiB, 4 * KiB, 4 * KiB + 4, 16 * KiB, 64 * KiB, 256 * KiB, 1 << 20, 4 << 20, 16 << 20, 1 << 30]
WORLDS = [2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 32, 64, 100, 128]


@pytest.fixture
def knobs(monkeypatch):
    for k in ("RINGCOMM_ALGO", "RINGCOMM_PROFILE", "RINGCOMM_MODEL_MIN_WORLD", "RINGCOMM_LL_MAX_BYTES",
              "RINGCOMM_HEADER_IN_SLOT", "RINGCOMM_SLOT_BYTES", "RINGCOMM_FAR_SLOT_BYTES"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_halving_doubling_work_matches_its_plan_and_closed_form():
    for n in range(2, 70):
        assert _C_test.hd_work(0, n) == _C_test.hd_work_rank0(n) == hd_work(n), n
        works = [_C_test.hd_work(r, n) for r in range(n)]
        # every unit sent is received; every chunk combined once; rank 0 carries the most
        assert sum(w["sent"] for w in works) == sum(w["received"] for w in works), n
        assert sum(w["combined"] for w in works) == n, n
        assert max(w["steps"] for w in works) == works[0]["steps"], n
        P = 1 << (n.bit_length() - 1)
        assert works[0]["steps"] == 2 * int(math.log2(P)) + (2 if n > P else 0), n


@pytest.mark.parametrize("params", [SHARED, MANY], ids=["shared", "many"])
def test_model_choice_is_the_documented_formula(params):
    for n in WORLDS:
        for M in SIZES:
            for algo, proto in PRICED:
                got = _C_test.model_seconds(algo, proto, M, n, params=params)
                assert got == pytest.approx(py_seconds(params, algo, proto, M, n), rel=1e-9), (algo, proto, M, n)
            assert _C._model_choose(M, n, 4 * KiB, params=params) == py_choose(params, M, n), (M, n)
            assert _C._model_choose(M, n, 0, params=params)[1] != "ll"


def test_model_choices_at_landmarks():
    # Many cores: LL for tiny messages, the log-depth algorithm in the middle at many ranks, the
    # ring for large ones; ranks sharing 2 CPUs: every step a round of switches, so the ring's
    # 2N-1 steps lose wherever latency dominates.
    assert _C._model_choose(1 * KiB, 64, 4 * KiB, params=MANY) == ("direct", "ll")
    assert _C._model_choose(16 * KiB, 64, 4 * KiB, params=MANY) == ("halving_doubling", "simple")
    assert _C._model_choose(64 << 20, 64, 4 * KiB, params=MANY) == ("ring", "header_in_slot")
    assert _C._model_choose(16 << 20, 8, 4 * KiB, params=SHARED) == ("ring", "header_in_slot")
    assert _C._model_choose(64 << 20, 64, 4 * KiB, False, params=MANY) == ("ring", "simple")
    for n in (8, 16):
        assert all(_C._model_choose(M, n, 4 * KiB, params=SHARED)[0] != "ring" for M in SIZES if M <= 64 * KiB)
        step = SHARED["alpha_shared_s"] * n / SHARED["cpus"]
        assert _C_test.model_seconds("ring", "simple", 0, n, params=SHARED) == pytest.approx((2 * n - 1) * step)
        # the first piece travels with the header: one step fewer
        assert _C_test.model_seconds("ring", "header_in_slot", 0, n, params=SHARED) == pytest.approx((2 * n - 2) * step)
    # the ring's latency grows with N, halving_doubling's with log N
    ring = [_C_test.model_seconds("ring", "simple", 64, n, params=MANY) for n in (8, 64)]
    hd = [_C_test.model_seconds("halving_doubling", "simple", 64, n, params=MANY) for n in (8, 64)]
    assert ring[1] / ring[0] > 7 and hd[1] / hd[0] < 2.5


def test_pieces_cost_rounds_only_where_ranks_share_cpus():
    # A ring chunk in two pieces against one: 2(N-1) more slots, and where ranks share the CPUs
    # a round of switches for each later piece; the two-shot a round per later iteration and per
    # outbox-full within one.
    n, M = 8, 8 * 512 * KiB
    for p, rounds in ((SHARED, True), (MANY, False)):
        f = n / p["cpus"] if rounds else 1.0
        two = _C_test.model_seconds("ring", "simple", M, n, params=p, ring_piece=256 * KiB)
        one = _C_test.model_seconds("ring", "simple", M, n, params=p, ring_piece=512 * KiB)
        extra = 2 * (n - 1) * (p["slot_s"] * f + (p["alpha_shared_s"] * f if rounds else 0))
        assert two - one == pytest.approx(extra, rel=1e-9), p
        shallow = _C_test.model_seconds("two_shot", "simple", M, n, params=p, far_depth=2)
        deep = _C_test.model_seconds("two_shot", "simple", M, n, params=p, far_depth=16)
        # 16 iterations of a 512 KiB chunk's 32 KiB pieces, each sending N - 1 = 7 phase-1 pieces:
        # 4 outbox-fulls of 2 (3 rounds after the first) against one of 16
        assert shallow - deep == pytest.approx(16 * 3 * p["alpha_shared_s"] * f if rounds else 0, rel=1e-9, abs=1e-15)
        # the iterations run in lockstep: each after the first waits for a round
        half = _C_test.model_seconds("two_shot", "simple", M // 2, n, params=p, far_depth=16)
        lockstep = 8 * p["alpha_shared_s"] * f if rounds else 0
        copied = ((2 * n - 1) if rounds else 3 * (n - 1)) / n * M / 2
        work = f * (8 * 2 * (n - 1) * p["slot_s"] + copied / p["copy_Bps"]
                    + ((n - 1) / n * M / 2) / p["reduce_Bps"])
        assert deep - half == pytest.approx(lockstep + work, rel=1e-9), p


def test_defaults_keep_the_measured_thresholds_below_the_model_world(knobs):
    """2-4 ranks: auto is the size rule (tests/test_select.py's table); from 5 ranks the model."""
    dflt = _C._default_profile()
    assert _C._profile() == dflt and dflt["source"] == "defaults"
    for n in (5, 8, 16, 64):
        for M in SIZES:
            want = _C._model_choose(M, n, 4 * KiB, M > 0, params=dflt["params"])
            assert _C._select("all_reduce", M, n)[:2] == want, (M, n)
    knobs.setenv("RINGCOMM_MODEL_MIN_WORLD", "2")
    for M in SIZES:
        assert _C._select("all_reduce", M, 2)[:2] == _C._model_choose(M, 2, 4 * KiB, M > 0)
    knobs.setenv("RINGCOMM_MODEL_MIN_WORLD", "1")
    with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_MODEL_MIN_WORLD"):
        _C._select("all_reduce", 64, 8)


def test_forced_halving_doubling_and_cuda(knobs):
    knobs.setenv("RINGCOMM_ALGO", "halving_doubling")
    for n in (2, 3, 8):
        for M in (1, 4 * KiB, 1 << 20):
            assert _C._select("all_reduce", M, n) == ("halving_doubling", "simple", "cached")
            assert _C._select("all_reduce", M, n, "cuda")[:2] == ("ring", "simple")
        assert _C._select("broadcast", 1 << 20, n)[:2] == ("chain", "header_in_slot")
        assert _C._select("broadcast", 1 << 20, n, "cuda")[:2] == ("chain", "simple")
    assert ringcomm.core.config.knob("RINGCOMM_ALGO") == "halving_doubling"


def test_profile_file_round_trip_and_refusals(knobs, tmp_path):
    path = str(tmp_path / "p.json")
    doc = write_profile(path, SHARED, {"note": "test"})
    assert doc["version"] == _C.PROFILE_VERSION and doc["format"] == "ringcomm-profile"
    loaded = _C._load_profile(path)
    assert loaded["params"] == SHARED and loaded["hash"] == doc["hash"] == _C._profile(SHARED)["hash"]
    assert _C._profile(MANY)["hash"] != doc["hash"]
    knobs.setenv("RINGCOMM_PROFILE", path)
    assert _C._profile()["source"] == path and _C._profile()["hash"] == doc["hash"]
    knobs.setenv("RINGCOMM_MODEL_MIN_WORLD", "2")
    for n in (2, 8, 16):
        for M in (64, 64 * KiB, 4 << 20):
            assert _C._select("all_reduce", M, n)[:2] == _C._model_choose(M, n, 4 * KiB, params=SHARED)

    def refused(mutate, match):
        d = json.load(open(path))
        mutate(d)
        bad = str(tmp_path / "bad.json")
        with open(bad, "w") as f:
            json.dump(d, f)
        with pytest.raises(ringcomm.InvalidArgumentError, match=match):
            _C._load_profile(bad)
        knobs.setenv("RINGCOMM_PROFILE", bad)
        with pytest.raises(ringcomm.InvalidArgumentError, match="RINGCOMM_PROFILE"):
            _C._select("all_reduce", 64, 8)
        knobs.setenv("RINGCOMM_PROFILE", path)

    refused(lambda d: d["params"].update(alpha_s=1e-3), "hash")
    refused(lambda d: d.update(version=2), "version")
    refused(lambda d: d["params"].pop("slot_s"), "slot_s")
    refused(lambda d: d.update(format="other"), "not a ringcomm profile")
    with pytest.raises(ringcomm.InvalidArgumentError, match="cannot be read"):
        _C._load_profile(str(tmp_path / "missing.json"))


def test_check_model_rejudges_saved_runs_with_the_current_model(tmp_path):
    """benchmarks/report/check_model.py --from judges a saved run by the choices saved with it, and with
    --rechoose by the choices the model makes now from the run's saved profile (here: the formula
    restated above)."""
    root = os.path.join(os.path.dirname(__file__), "..")
    saved = os.path.join(root, "results", "2026-12-02", "model_check", "model_check_r2.json")
    with open(saved) as f:
        doc = json.load(f)
    units = {"B": 1, "KiB": KiB, "MiB": KiB * KiB}

    def choices(*extra):
        out = tmp_path / "judged.md"
        script = os.path.join(root, "benchmarks", "report", "check_model.py")
        r = subprocess.run([sys.executable, script, "--from", saved,
                            "--out", str(out), *extra], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, RINGCOMM_LL_MAX_BYTES="4K"))
        assert r.returncode == 0, r.stderr[-3000:]
        rows = [ln.split("|")[1:4] for ln in out.read_text().splitlines() if ln.split("|")[1:2] != []
                and ln.split("|")[1].strip().isdigit()]
        got = {}
        for w, size, pick in rows:
            num, unit = size.split()
            got[(int(w), int(num) * units[unit])] = pick.strip()
        return got

    saved_choice = {(int(w), int(s)): c for w, runs in doc["raw"].items() for s, c in runs["choice"].items()}
    assert choices() == saved_choice
    params = doc["profile"]["params"]
    now = {key: "/".join(py_choose(params, key[1], key[0])) for key in saved_choice}
    assert choices("--rechoose") == now


@pytest.mark.timeout(300)
def test_tune_measures_a_profile_the_core_loads(tmp_path):
    """`python -m ringcomm.apps.tune --quick` on this machine: 2 spawned ranks and one process's kernels
    give a profile file the core reads back, with every parameter in a physical range."""
    out = tmp_path / "tuned.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGCOMM_")}
    r = subprocess.run([sys.executable, "-m", "ringcomm.apps.tune", "--quick", "-o", str(out)], env=env,
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert _C._load_profile(str(out))["hash"] == doc["hash"] and doc["hash"] in r.stdout
    p = doc["params"]
    assert list(p) == list(_C.PROFILE_PARAMS)
    assert p["cpus"] == len(os.sched_getaffinity(0))
    for k in ("alpha_s", "alpha_shared_s", "slot_s"):
        assert 1e-9 < p[k] < 1e-2, (k, p)
    for k in ("copy_Bps", "reduce_Bps", "ll_Bps"):
        assert 1e8 < p[k] < 1e13, (k, p)
    m = doc["measured"]["allreduce_2ranks_s"]
    # every timing measured; their order is the machine's (on a loaded machine a larger LL call can
    # come out no slower than a smaller one), so only the derivations below are checked exactly
    assert all(math.isfinite(v) and v > 0 for v in m.values()), m
    # alpha_s: the ring's three hand-offs at 64 bytes less LL's one, halved (floored at a twentieth
    # of the LL call); alpha_shared_s: a whole 4-byte LL call on one CPU
    assert p["alpha_s"] == pytest.approx(max((m["ring_64"] - m["64"]) / 2, m["64"] / 20), rel=1e-12), m
    assert p["alpha_shared_s"] == pytest.approx(doc["measured"]["allreduce_2ranks_one_cpu_s"]["4"], rel=1e-12)


@pytest.mark.timeout(120)
def test_ranks_with_different_profiles_raise_at_init(tmp_path, store_env):
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    ha = write_profile(a, SHARED)["hash"]
    hb = write_profile(b, dict(SHARED, alpha_s=5e-6))["hash"]
    for paths, sub in (([a, b], "differ"), ([a, None], "one-unset")):
        res = ranks.run(profile_init_case, 2, (paths, sub), timeout=100, env=store_env)
        for rank, (kind, msg) in enumerate(res):
            assert kind == "MismatchError", (paths, rank, kind, msg)
            assert ha in msg and "RINGCOMM_PROFILE" in msg, msg
            assert (hb if paths[1] else _C._default_profile()["hash"]) in msg, msg
    res = ranks.run(profile_init_case, 2, ([a, a], "same"), timeout=100, env=store_env)
    assert res == [("ok", ha), ("ok", ha)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [4, 8])
def test_a_shared_profile_drives_auto(world, tmp_path, store_env):
    path = str(tmp_path / "p.json")
    params = dict(MANY, slot_s=20e-6)   # dear slots: halving_doubling (4 slots, not 6) at 64 KiB
    write_profile(path, params)
    sizes = [64, 16 * KiB, 64 * KiB, 1 << 20]
    res = ranks.run(model_auto_case, world, (path, sizes), timeout=100, env=store_env)
    seen = set()
    for rows in res:
        for nbytes, algo, proto, equal in rows:
            want = _C._model_choose(nbytes, world, 4 * KiB, params=params)
            assert (algo, proto) == want, (nbytes, algo, proto, want)
            assert equal, f"auto's {algo} differs bitwise from the ring at {nbytes} B"
            seen.add((algo, proto))
    # the ring runs with its first piece in the slot, as the model priced it
    assert {"halving_doubling", "direct"} <= {a for a, _ in seen} and ("ring", "header_in_slot") in seen, seen


@pytest.mark.timeout(400)
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8, 16])
def test_halving_doubling_is_bit_identical_to_the_ring(world, store_env):
    pytest.importorskip("torch")   # the bfloat16 cases
    results = ranks.run(hd_cases, world, timeout=380, env=store_env)
    ranks.assert_no_failures(results)
