"""Run a case's ranks with /dev/shm a tmpfs of a given size: a private mount namespace
(unshare -m) mounts it, and tests/forked_ranks.py forks the ranks inside. Skips the calling test
where unshare(1) or private mount namespaces are not available."""
import json
import os
import shutil
import subprocess
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def run_with_dev_shm(size: str, module: str, function: str, world: int, store: str, tmp_path,
                     deadline_s: float, timeout_s: float) -> dict:
    """{"status": [per rank "exit N" | "signal N" | "hung"], "results": [per rank JSON or None]}."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    mount = f"mount -t tmpfs -o size={size} tmpfs /dev/shm"
    probe = subprocess.run([unshare, "-m", "sh", "-c", mount], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("private mount namespaces are not permitted here: " + probe.stderr.decode(errors="replace"))
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    r = subprocess.run([unshare, "-m", "sh", "-c", mount + ' && exec "$0" "$@"', sys.executable,
                        os.path.join(TESTS_DIR, "forked_ranks.py"), TESTS_DIR, store, str(out_dir), str(world),
                        module, function, str(deadline_s)],
                       capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    got = json.loads(lines[-1][len("RESULT "):])
    got["stderr"] = r.stderr[-3000:]
    return got
