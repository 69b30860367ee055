"""RINGCOMM_INTER=mpi: the hierarchical communicator with mpi4py between the (fake) nodes, ranks
started by mpiexec. Skipped where mpi4py or mpiexec is missing. Kept apart from test_hier.py so
that file stays within its time budget."""
import os
import shutil
import sys
import tempfile

import pytest

pytest.importorskip("torch")
import ringcomm  # noqa: E402
import ringcomm.hier  # noqa: E402,F401 - the package under test must import


@pytest.mark.timeout(240)
def test_mpi_engine():
    """RINGCOMM_INTER=mpi under mpiexec: 4 ranks as 2 nodes x 2, the flat suite (torch inputs)."""
    import json
    import subprocess
    pytest.importorskip("mpi4py")
    # the mpich wheel's launcher sits beside this interpreter (a venv's bin/, active or not)
    bin_dir = os.path.dirname(sys.executable)
    mpiexec = shutil.which("mpiexec", path=bin_dir) or shutil.which("mpiexec") or shutil.which("mpirun")
    assert mpiexec is not None, "mpi4py is installed but no mpiexec: pip install mpich"
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.dirname(os.path.dirname(os.path.abspath(ringcomm.__file__)))
    d = tempfile.mkdtemp(prefix="rc-hier-mpi-")
    try:
        store, out = os.path.join(d, "store"), os.path.join(d, "out")
        os.makedirs(out)
        code = (f"import sys; sys.path[:0] = [{here!r}, {src!r}]; import hier_cases; "
                f"hier_cases.mpi_main({store!r}, {out!r}, 2)")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, here, os.environ.get("PYTHONPATH", "")]))
        p = subprocess.run([mpiexec, "-n", "4", sys.executable, "-c", code], env=env,
                           capture_output=True, text=True, timeout=220)
        assert p.returncode == 0, p.stderr[-4000:]
        res = []
        for r in range(4):
            with open(os.path.join(out, f"rank{r}.json")) as f:
                res.append(json.load(f))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    for r in res:
        assert "error" not in r, r["error"]
        assert r["engine"] == "mpi"
        f = r["suite"]["failures"] + r["extra"]
        assert not f, "\n".join(f[:30])
        b = r["bytes"]
        assert b["stats"]["all_reduce"] == {"all_reduce": {"calls": 1, "bytes": b["M"] // 2}}, b
    assert all(r["suite"]["digests"] == res[0]["suite"]["digests"] for r in res)
