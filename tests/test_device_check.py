"""benchmarks/device/: the staging of device_check.sh and the hand-off probe's script, run here (no GPU)
as they are, with their stage commands, the probe binary and nvidia-cuda-mps-control replaced through
their documented overrides (DEVICE_CHECK_CMD_<STAGE>, DEVICE_CHECK_BUDGET_<STAGE>, BIN, PATH); the
probe itself compiled by nvcc for sm_80 and sm_90."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEVICE = ROOT / "benchmarks" / "device"
STAGES = ["build", "probe", "ring", "graph", "bench", "cpu"]

# A stand-in for nvidia-cuda-mps-control: `-d` starts a daemon in a session of its own (as the real
# one does, so a stage's `timeout` cannot kill it); `quit` on stdin stops it unless FAKE_MPS_STUBBORN
# is set, in which case it ignores both quit and SIGTERM.
FAKE_MPS = """#!/usr/bin/env bash
if [ "${1:-}" = -d ]; then
  setsid "$0" --serve < /dev/null > /dev/null 2>&1 &
  exit 0
fi
if [ "${1:-}" = --serve ]; then
  echo $$ > "$CUDA_MPS_PIPE_DIRECTORY/fake.pid"
  [ -n "${FAKE_MPS_STUBBORN:-}" ] && trap '' TERM
  while :; do sleep 0.1; done
fi
read -r cmd
if [ "$cmd" = quit ] && [ -z "${FAKE_MPS_STUBBORN:-}" ]; then kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/fake.pid")"; fi
exit 0
"""


def _fake_mps_path(tmp_path: Path) -> str:
    bindir = tmp_path / "fakebin"
    bindir.mkdir(exist_ok=True)
    f = bindir / "nvidia-cuda-mps-control"
    f.write_text(FAKE_MPS)
    f.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def _daemons(pipe_root: Path) -> list:
    """pids of fake daemons whose pipe folder lies under pipe_root."""
    out = []
    for pid in subprocess.run(["pgrep", "-f", "nvidia-cuda-mps-control --serve"], capture_output=True,
                              text=True).stdout.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=" + str(pipe_root).encode()) for e in env):
            out.append(int(pid))
    return out


def _script(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text("#!/usr/bin/env bash\n" + body)
    p.chmod(0o755)
    return str(p)


def _run_check(tmp_path: Path, results: Path, cmds: dict, budgets: dict | None = None, args=(), extra=None):
    env = dict(os.environ, RESULTS=str(results), PATH=_fake_mps_path(tmp_path), TMPDIR=str(tmp_path))
    env.pop("OUT", None)
    for s, c in cmds.items():
        env[f"DEVICE_CHECK_CMD_{s}"] = c
    for s, b in (budgets or {}).items():
        env[f"DEVICE_CHECK_BUDGET_{s}"] = str(b)
    env.update(extra or {})
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(DEVICE / "device_check.sh"), *args], env=env, capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path))
    return r, time.monotonic() - t0


def _state(results: Path) -> dict:
    return {ln.split()[0]: ln.split()[1:] for ln in (results / "state").read_text().splitlines() if ln.strip()}


def test_stages_and_budgets_fit_five_minutes():
    r = subprocess.run(["bash", str(DEVICE / "device_check.sh"), "--list"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    rows = [ln.split(None, 2) for ln in r.stdout.splitlines()]
    assert [(s, int(b)) for s, b, _ in rows] == [("build", 40), ("probe", 50), ("ring", 70), ("graph", 40),
                                                  ("bench", 60), ("cpu", 40)]
    assert sum(int(b) for _, b, _ in rows) <= 300
    assert all(c == f"bash benchmarks/device/device_check.sh --run-stage {s}" for s, _, c in rows)
    assert subprocess.run(["bash", str(DEVICE / "device_check.sh"), "--bogus"], capture_output=True).returncode == 2


def test_stages_record_results_kill_overruns_and_a_rerun_repeats_only_failures(tmp_path):
    results = tmp_path / "res"
    log = tmp_path / "runs.log"
    ok = _script(tmp_path, "ok.sh", f'echo "$0 $STAGE_OUT $DEVICE_CHECK_STAGE_BUDGET" >> {log}; '
                                    'echo fine > "$STAGE_OUT/out.txt"; echo done\n')
    fail = _script(tmp_path, "fail.sh", f'echo "$0" >> {log}; echo broken; exit 3\n')
    hang = _script(tmp_path, "hang.sh", f'echo "$0" >> {log}; sleep 60\n')
    # A stage that starts an MPS daemon of its own (through lib.sh, as the real stages do) and overruns.
    mps_hang = _script(tmp_path, "mps_hang.sh",
                       f'echo "$0" >> {log}; cd {ROOT}; . benchmarks/device/lib.sh; mps_start "$DEVICE_CHECK_MPS_DIR"; '
                       'sleep 60\n')
    cmds = dict(build=ok, probe=fail, ring=hang, graph=ok, bench=mps_hang, cpu=ok)
    r, took = _run_check(tmp_path, results, cmds, budgets=dict(ring=2, bench=2),
                         extra=dict(FAKE_MPS_STUBBORN="1"))
    assert r.returncode == 1, r.stdout + r.stderr
    st = _state(results)
    assert {s: v[0] for s, v in st.items()} == dict(build="ok", probe="failed", ring="timeout", graph="ok",
                                                   bench="timeout", cpu="ok"), st
    assert st["probe"][1] == "3"
    assert float(st["ring"][2]) <= 2.5 and float(st["bench"][2]) <= 2.5, st   # killed at the budget
    assert took < 20, took
    # Each stage's results are in its own folder, as it wrote them.
    assert (results / "build" / "out.txt").read_text() == "fine\n"
    assert "broken" in (results / "probe" / "console.txt").read_text()
    summary = (results / "summary.txt").read_text()
    assert "probe: failed (exit 3)" in summary and "ring: timeout" in summary
    # The daemon that the killed stage left (it ignores quit and TERM) was stopped after the stage.
    assert "an MPS daemon outlived the stage" in summary, summary
    assert _daemons(tmp_path) == []
    first = log.read_text().splitlines()
    assert len(first) == 6 and first[0] == f"{ok} {results / 'build'} 40", first   # the stage's own budget
    # The rerun: everything would pass now; only the three stages that did not pass run again.
    log.write_text("")
    cmds = dict(build=ok, probe=ok, ring=ok, graph=ok, bench=ok, cpu=ok)
    r, _ = _run_check(tmp_path, results, cmds)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = [ln.split()[1].rsplit("/", 1)[1] for ln in log.read_text().splitlines()]
    assert ran == ["probe", "ring", "bench"], ran
    assert all(v[0] == "ok" for v in _state(results).values())
    assert "build: ok in an earlier run, not repeated" in (results / "summary.txt").read_text()
    # --fresh forgets the state; stage names pick stages.
    log.write_text("")
    r, _ = _run_check(tmp_path, results, cmds, args=("--fresh", "graph", "cpu"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [ln.split()[1].rsplit("/", 1)[1] for ln in log.read_text().splitlines()] == ["graph", "cpu"]
    assert set(_state(results)) == {"graph", "cpu"}


def test_term_to_the_check_ends_the_running_stage_and_its_daemon_at_once(tmp_path):
    results = tmp_path / "res"
    pidfile = tmp_path / "stage.pid"
    stage = _script(tmp_path, "stage.sh", f'cd {ROOT}; . benchmarks/device/lib.sh; mps_start "$DEVICE_CHECK_MPS_DIR"; '
                                          f'sleep 120 & echo $! > {pidfile}; wait\n')
    env = dict(os.environ, RESULTS=str(results), PATH=_fake_mps_path(tmp_path), DEVICE_CHECK_CMD_build=stage,
               TMPDIR=str(tmp_path))
    p = subprocess.Popen(["bash", str(DEVICE / "device_check.sh"), "build"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and _daemons(tmp_path)):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.1)
    sleeper = int(pidfile.read_text())
    t0 = time.monotonic()
    p.terminate()
    p.wait(timeout=20)
    assert time.monotonic() - t0 < 8
    assert _daemons(tmp_path) == []
    assert not os.path.exists(f"/proc/{sleeper}") or "Z" in Path(f"/proc/{sleeper}/stat").read_text().split()[2]
    assert "build" not in _state(results)          # not recorded as ok: a rerun runs it


def test_stage_that_does_not_fit_the_total_shrinks_or_is_recorded_and_rerun(tmp_path):
    results = tmp_path / "res"
    ok = _script(tmp_path, "ok.sh", "true\n")
    slow = _script(tmp_path, "slow.sh", "sleep 2\n")
    cmds = dict(build=slow, probe=ok, ring=ok, graph=ok, bench=ok, cpu=ok)
    budgets = dict(build=3, probe=1, ring=1, graph=1, bench=1, cpu=30)
    out = tmp_path / "out"
    r, _ = _run_check(tmp_path, results, cmds, budgets, extra=dict(TOTAL_BUDGET="14", OUT=str(out)))
    assert r.returncode == 1, r.stdout + r.stderr
    st = _state(results)
    assert st["cpu"][0] == "skipped" and all(st[s][0] == "ok" for s in STAGES[:-1]), st
    assert "cpu: not run" in r.stdout
    # A runner's folder gets the archive, the summary and the state.
    assert {"device_check.tgz", "summary.txt", "state"} <= set(os.listdir(out))
    # The rerun runs only cpu; with about 14 s left of the total and a budget of 20 it runs with those.
    r, _ = _run_check(tmp_path, results, cmds, dict(budgets, cpu=20), extra=dict(TOTAL_BUDGET="14"))
    assert r.returncode == 0 and _state(results)["cpu"][0] == "ok", r.stdout
    # (the stages before it take a second or so on a busy machine: the seconds left then are fewer)
    m = re.search(r"cpu: its budget shrinks from 20 s to the (\d+) s left", r.stdout)
    assert m and 10 <= int(m.group(1)) <= 14 and "build: ok in an earlier run" in r.stdout, r.stdout


def test_handoff_script_runs_each_way_under_its_limit_and_stops_its_mps_daemon(tmp_path):
    """handoff_probe.sh with a stand-in probe (BIN): the kernel way first, every way in a process of
    its own under WAY_LIMIT (a way that hangs is killed and recorded, the next ones still run),
    without and then with an MPS daemon of its own that is gone afterwards, also when the script
    is stopped by TERM mid-run."""
    probe = _script(tmp_path, "probe.sh", 'echo "way $1 mps=${CUDA_MPS_PIPE_DIRECTORY:-none}"\n'
                                          '[ "$1" = memop-dev ] && sleep 60\n'
                                          'echo "RESULT way=$1 stream=$2 reps_ok=5"\n')
    out = tmp_path / "out"
    env = dict(os.environ, PATH=_fake_mps_path(tmp_path), BIN=probe, OUT=str(out), WAY_LIMIT="1",
               MPS_DIR=str(tmp_path / "mps"))
    r = subprocess.run(["bash", str(DEVICE / "handoff_probe.sh")], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr    # the hanging way makes it fail
    for name, mps in (("handoff_no_mps.txt", False), ("handoff_mps.txt", True)):
        text = (out / name).read_text()
        ways = [ln.split()[1] for ln in text.splitlines() if ln.startswith("way ")]
        assert ways == ["kernel", "memop-dev", "memop-host", "event"], text
        assert "RESULT way=memop-dev stream=nonblocking killed_after_s=1" in text
        assert text.count("reps_ok=5") == 3
        under = [ln for ln in text.splitlines() if ln.startswith("way ")]
        assert all((str(tmp_path / "mps" / "pipe") in ln) == mps for ln in under), under
    assert _daemons(tmp_path) == []
    # Stopped by TERM while the MPS daemon runs: the trap stops the daemon.
    slow = _script(tmp_path, "slow.sh", 'case "${CUDA_MPS_PIPE_DIRECTORY:-}" in */mps/pipe) sleep 60 ;; esac\n')
    out = tmp_path / "out2"
    env.update(BIN=slow, WAY_LIMIT="30", OUT=str(out))
    p = subprocess.Popen(["bash", str(DEVICE / "handoff_probe.sh")], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 40
    while not (out / "handoff_mps.txt").exists() or not _daemons(tmp_path):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(p.pid, 15)
    p.wait(timeout=30)
    assert _daemons(tmp_path) == []


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_handoff_probe_compiles(tmp_path, arch):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        pytest.skip("nvcc not found")
    r = subprocess.run([nvcc, "-O2", "-std=c++17", f"-arch={arch}", "-Xcompiler", "-Wall,-Wextra",
                        "-o", str(tmp_path / "probe"), str(DEVICE / "handoff_probe.cu")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "warning" not in r.stderr.lower(), r.stderr[-4000:]
    # Arguments are checked before anything touches the GPU.
    for bad in ([], ["nosuchway"], ["kernel", "sideways"]):
        assert subprocess.run([str(tmp_path / "probe"), *bad], capture_output=True, timeout=30).returncode == 2


# ---- the stages' Python programs: their arguments as the stages pass them, and their logic on CPU tensors ----
def _load(name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"device_{name}", DEVICE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stage_commands() -> list:
    """The python command lines of device_check.sh's stages (continuation lines joined)."""
    text = (DEVICE / "device_check.sh").read_text().replace("\\\n", " ")
    return [ln.split("benchmarks/device/", 1)[1].split(">")[0].split("||")[0].split()
            for ln in text.splitlines() if "$PY benchmarks/device/" in ln]


def test_stage_programs_parse_the_stage_arguments():
    cmds = _stage_commands()
    assert sorted({c[0] for c in cmds}) == ["device_bench.py", "graph_check.py", "ring_check.py"], cmds
    for c in cmds:
        mod = _load(c[0][:-3])
        args = [a.replace('"$STAGE_OUT/', "/tmp/").replace('"', "").replace("$w", "2") for a in c[1:]]
        ns = mod.build_parser().parse_args(args)
        assert ns.device == "cuda"
    ring = _load("ring_check").build_parser().parse_args(["-b", "1K", "-e", "256M"])
    assert (ring.b, ring.e) == (1024, 256 << 20)


def test_ring_check_on_cpu_tensors(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "ring.json"
    r = subprocess.run([sys.executable, str(DEVICE / "ring_check.py"), "--device", "cpu", "--world", "3", "-b", "1K",
                        "-e", "64K", "-f", "8", "--colls", "all_reduce,reduce_scatter,all_gather", "--iters", "3",
                        "--matrix-dtypes", "float32,bfloat16,int8", "--matrix-ops", "SUM,MAX", "--json", str(out)],
                       capture_output=True, text=True, timeout=240, cwd=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "every output bit-exact" in r.stdout.splitlines()[-1]
    rows = json.loads(out.read_text())["rows"]
    sweep = [(x["coll"], x["bytes"]) for x in rows if x["kind"] == "sweep"]
    assert sweep == [(c, n) for c in ("all_reduce", "reduce_scatter", "all_gather") for n in (1024, 8192, 65536)]
    assert all(x["exact_all_ranks"] and x["busbw_gbps"] > 0 and x["iters"] >= 3 for x in rows if x["kind"] == "sweep")
    assert len([x for x in rows if x["kind"] == "matrix"]) == 6


def test_ring_check_compares_bits_not_values():
    torch = pytest.importorskip("torch")
    rc = _load("ring_check")
    a = torch.tensor([0.0, 1.0, float("nan")])
    assert rc.same_bits(torch, a, a.clone())
    assert not rc.same_bits(torch, a, torch.tensor([-0.0, 1.0, float("nan")]))   # equal values, other bits
    assert not rc.same_bits(torch, a, a[:2])
    x = rc.inputs(torch, 1, 4096, "bfloat16")
    assert x.dtype == torch.bfloat16 and x.numel() == 2048 and rc.same_bits(torch, x, rc.inputs(torch, 1, 4096, "bfloat16"))
    assert not rc.same_bits(torch, x, rc.inputs(torch, 0, 4096, "bfloat16"))


def test_graph_check_on_cpu_tensors(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "graph.json"
    r = subprocess.run([sys.executable, str(DEVICE / "graph_check.py"), "--device", "cpu", "--replays", "200",
                        "--count", "1024", "--timeout", "4", "--json", str(out)],
                       capture_output=True, text=True, timeout=240, cwd=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    res = {x["scenario"]: x for x in json.loads(out.read_text())}
    assert set(res) == {"graph", "late", "kill"} and all(x["ok"] for x in res.values()), res
    assert all(x["mismatches"] == 0 and x["replays"] == 200 for x in res["graph"]["ranks"])
    assert res["late"]["ranks"][0]["call_s"] >= 0.15   # rank 0 waited for the late rank
    k = res["kill"]["ranks"][0]
    assert k["error"] in ("PeerFailureError", "TimeoutError") and k["error_s"] <= 4, k
    assert res["kill"]["ranks"][1] is None             # rank 1 was killed


def test_device_bench_on_cpu_tensors(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(DEVICE / "device_bench.py"), "--device", "cpu", "-np", "2", "-b", "1K",
                        "-e", "64K", "-f", "8", "--gloo-max", "8K", "--iters", "5", "--time-per-size", "0.01",
                        "--json", str(out)], capture_output=True, text=True, timeout=240, cwd=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [x["bytes"] for x in rows] == [1024, 8192, 65536]
    assert all(x["ok"] and x["ringcomm_s"] > 0 and x["floor_s"] > 0 and x["roof_s"] > 0 for x in rows)
    assert ["gloo_s" in x for x in rows] == [True, True, False]    # gloo up to --gloo-max only
    assert all(x["pool_bytes"] >= 4 * 1024 for x in rows)
    # roof: 2 n S bytes at the measured copy rate
    assert all(abs(x["roof_s"] - 2 * 2 * x["bytes"] / (x["copy_gbps"] * 1e9)) <= 1e-9 + 1e-6 * x["roof_s"] for x in rows)


def test_cpu_stage_plans_sixteen_ranks_beside_mpich_and_deepspeed():
    """The cpu stage's settings of cpu_scale_check.sh, read from device_check.sh, give a plan of 16 then
    2 ranks bound to cores, each beside gloo, MPICH and DeepSpeed, within the stage's budget."""
    text = (DEVICE / "device_check.sh").read_text()
    body = text[text.index("stage_cpu() {"):].split("\n}\n", 1)[0].replace("\\\n", " ")
    env = dict(os.environ, CPU_SCALE_CORES="16")
    for k in ("CPU_SCALE_WORLDS", "CPU_SCALE_BINDS", "BENCH_TIMEOUT"):
        env[k] = re.search(k + r'=("([^"]*)"|(\S+))', body).group(2 if f'{k}="' in body else 3)
    plan = subprocess.run(["bash", str(DEVICE / "cpu_scale_check.sh"), "--dry-run"], env=env, capture_output=True,
                          text=True, timeout=30)
    assert plan.returncode == 0, plan.stderr
    runs = [ln for ln in plan.stdout.splitlines() if "ringcomm.bench" in ln]
    assert [(ln.split("-np ")[1].split()[0], ln.split("--bind ")[1].split()[0]) for ln in runs] == \
        [("16", "core"), ("2", "core")]
    assert all("--peers gloo,mpi,deepspeed" in ln for ln in runs)
    assert 2 * int(env["BENCH_TIMEOUT"]) <= 40 - 4
