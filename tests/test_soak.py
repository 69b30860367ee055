"""The soak script (tests/soak.py) for ~20 s at 2 and 3 ranks: random collectives, every
result checked against numpy, communicators re-created with random slot knobs every few seconds;
and a check that its checker fails on a corrupted result and that the printed replay command
reruns that call. Slow: marked ``slow``, which the default run deselects (pyproject.toml's
addopts); ``python -m pytest -m slow tests/test_soak.py`` runs it."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ringcomm

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SOAK = ROOT / "tests" / "soak.py"


def run_soak(args, timeout):
    # The ranks import the same ringcomm as this test.
    env = dict(os.environ)
    src = str(Path(ringcomm.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, str(SOAK), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_soak(world, tmp_path):
    out = tmp_path / "soak.json"
    r = run_soak(["--minutes", "0.33", "--world", str(world), "--seed", str(100 + world),
                  "--epoch-seconds", "5,8", "--report-every", "10", "--json", str(out)], timeout=200)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["ok"] and res["errors"] == 0 and not res["failures"] and not res["exceptions"]
    assert res["segments_left"] == [] and res["children_left"] == []
    assert res["epochs"] >= 2, res                   # communicators were re-created with new knobs
    assert res["collectives"] >= 20 and res["bytes"] > 0, res
    assert set(res["maxrss_mib"]) == {str(r) for r in range(world)}
    assert "# result: PASS" in r.stdout


@pytest.mark.timeout(240)
def test_soak_reports_a_wrong_result_with_its_replay(tmp_path):
    out = tmp_path / "soak.json"
    r = run_soak(["--minutes", "0.5", "--world", "2", "--seed", "7", "--epoch-seconds", "5,8",
                  "--inject-error", "12", "--json", str(out)], timeout=200)
    assert r.returncode == 1, r.stdout[-6000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["errors"] == 1 and not res["ok"]
    f = res["failures"][0]
    assert f["seed"] == 7 and f["index"] >= 12 and "element" in f["what"]
    assert "FIRST FAILURE" in r.stdout and "# result: FAIL" in r.stdout
    assert res["segments_left"] == [] and res["children_left"] == []
    # The replay command reruns exactly that call (uncorrupted: it passes).
    m = re.search(r"--replay (\d+):(\d+)", res["replay"])
    assert m and (int(m.group(1)), int(m.group(2))) == (f["epoch"], f["index"])
    args = res["replay"].split()[2:]
    r2 = run_soak(args, timeout=120)
    assert r2.returncode == 0, r2.stdout[-6000:] + r2.stderr[-3000:]
    assert f"epoch {f['epoch']} call {f['index'] + 1}" in r2.stdout
