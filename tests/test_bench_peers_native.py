"""The bench's oneCCL and Intel MPI peers (``--peers oneccl,impi``, ``pip install 'ringcomm[peers]'``).

Always: files are accepted by their package's record (a file another package overwrote is
refused, and the reason says which and how to restore it); a peer whose package is missing or
whose driver does not compile is skipped with that reason, never a crash. Where the extra is
installed: each peer's driver builds, and its phase produces checked results at 2 ranks for two
sizes of every collective it has (float32; bfloat16 where the driver names it), and a corrupted
result is caught by the check.
"""
import base64
import hashlib
import importlib.metadata as md
import os
import tempfile
from pathlib import PurePosixPath

import pytest

from ringcomm.bench import cli, phases
from ringcomm.bench.drivers import build, locate
from ringcomm.bench.harness import merge_ranks
from ringcomm.bench.peers import probe

OPS = "all_reduce,reduce_scatter,all_gather,broadcast,reduce,all_to_all"


# ---------------------------------------------------------------------------------------------
# Locating files by their package's record (in process, a fake distribution).

class _Hash:
    mode = "sha256"

    def __init__(self, data: bytes):
        self.value = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


class _Rec(PurePosixPath):
    """A RECORD entry: a path relative to site-packages, with its hash."""


class _FakeDist:
    """A wheel that installed lib/libx.so.1 into a prefix."""

    def __init__(self, prefix, data: bytes):
        self.prefix, self.version = prefix, "1.0"
        rec = _Rec("../../libx.so.1")
        rec.hash = _Hash(data)
        self.files = [rec]

    def locate_file(self, f):
        return os.path.join(self.prefix, "lib", "python3", "site-packages", str(f))


def test_dist_file_accepts_the_recorded_file_and_refuses_an_overwritten_one(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    lib = tmp_path / "lib" / "libx.so.1"
    lib.write_bytes(b"the package's bytes")
    dist = _FakeDist(str(tmp_path), b"the package's bytes")
    monkeypatch.setattr(locate, "installed", lambda name: dist if name == "fake" else None)
    assert locate.dist_file("fake", "lib/libx.so.1") == str(lib)
    lib.write_bytes(b"another package's bytes")
    with pytest.raises(locate.Missing, match="no longer fake 1.0's"):
        locate.dist_file("fake", "lib/libx.so.1")
    with pytest.raises(locate.Missing, match="installed no lib/liby.so"):
        locate.dist_file("fake", "lib/liby.so")
    with pytest.raises(locate.Missing, match="other is not installed"):
        locate.dist_file("other", "lib/libx.so.1")


def test_missing_packages_are_a_reason_not_a_crash(monkeypatch):
    real = md.distribution

    def without_intel(name):
        if name in ("oneccl-cpu", "oneccl-cpu-devel", "impi-rt", "impi-devel"):
            raise md.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(locate.md, "distribution", without_intel)
    for peer, pkg in (("oneccl", "oneccl-cpu"), ("impi", "impi-rt")):
        reason = probe(peer)
        assert reason and pkg in reason and "ringcomm[peers]" in reason, reason
        spec, why = phases.prepare(peer)
        assert spec is None and pkg in why


def test_cli_accepts_the_peers_and_tune():
    args = cli.build_parser().parse_args(["--peers", "oneccl,impi,mpi", "--tune"])
    cfg = cli.resolve(args)
    assert cfg["peers"] == ["oneccl", "impi", "mpi"] and cfg["tune"]
    for peer in phases.PHASE_PEERS:
        grid = phases.GRIDS[peer]
        assert grid and all(isinstance(v, str) for s in grid for v in s.values())
    assert len(phases.GRIDS["oneccl"]) == 18


# ---------------------------------------------------------------------------------------------
# Where the extra is installed: build, run, check.

def _installed(peer):
    reason = probe(peer)
    if reason:
        pytest.skip(f"{peer} peer unavailable here: {reason}")


@pytest.mark.parametrize("peer", ["oneccl", "impi"])
def test_driver_that_does_not_compile_skips_the_peer(peer, monkeypatch, tmp_path):
    _installed(peer)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))       # nothing cached: it must compile
    monkeypatch.setenv("CXX", "false")
    spec, why = phases.prepare(peer)
    assert spec is None and f"compiling the {peer} driver failed" in why, why


# Waiting that yields early: the test shares 2 CPUs with other work, where spinning waits crawl.
YIELDING = {"oneccl": {"CCL_WORKER_COUNT": "1", "CCL_YIELD": "sched_yield", "CCL_SPIN_COUNT": "10"},
            "impi": {"I_MPI_WAIT_MODE": "0", "I_MPI_SPIN_COUNT": "100"}}


def _phase(peer, inject="", ops=OPS, dtypes="float32,bfloat16"):
    args = cli.build_parser().parse_args(
        ["-b", "1K", "-e", "64K", "-f", "64", "--ops", ops, "-d", dtypes,
         "--time-budget", "0.002", "--min-iters", "3", "-w", "1", "--timeout", "120",
         "--inject-wrong", inject])
    cfg = cli.resolve(args)
    spec, why = phases.prepare(peer)
    assert why is None, why
    tmp = tempfile.mkdtemp(prefix="rcbench-peers-")
    notices = []
    cfg["torch_store"] = os.path.join(tmp, "store")
    assert YIELDING[peer] in phases.GRIDS[peer]
    res = phases.PhaseRunner(tmp, notices, cli.run_mpi_phase)(peer, cfg, spec, YIELDING[peer])
    assert res, notices
    return [r for r in merge_ranks(res) if r["lib"] == peer], res


@pytest.mark.parametrize("peer", ["oneccl", "impi"])
def test_peer_produces_checked_results(peer):
    _installed(peer)
    cells, res = _phase(peer)
    assert peer in res[0]["libs"] and "driver" in res[0]["libs"][peer]
    measured = [c for c in cells if "time_s" in c]
    assert {c["size"] for c in measured} >= {1024, 65536}
    assert {c["op"] for c in measured if c["dtype"] == "float32"} == set(OPS.split(","))
    for c in cells:
        assert "error" not in c, c
        if "na" in c:        # declined up front, with the reason
            assert c["dtype"] == "bfloat16" and peer in c["na"], c
        else:
            assert c["wrong"] == 0 and c["iters"] >= 3 and c["time_s"] > 0, c
    if peer == "oneccl":     # oneCCL names bfloat16 whatever the headers
        assert all("na" not in c for c in cells)


def test_corrupted_result_is_caught():
    _installed("oneccl")
    cells, _ = _phase("oneccl", inject="oneccl", ops="all_reduce,all_gather", dtypes="float32")
    assert cells and all(c.get("wrong", 0) > 0 for c in cells if "time_s" in c)


def test_build_is_cached_by_source_and_library(tmp_path, monkeypatch):
    _installed("impi")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    inst = locate.impi()
    first = build.driver("impi", inst)
    assert first.startswith(str(tmp_path)) and os.path.exists(first)
    assert build.driver("impi", inst) == first                       # cached
    cxx = build.compiler()
    assert build.target("impi", inst, cxx) == first
    inst.version += "-other"
    assert build.target("impi", inst, cxx) != first                  # a new library builds anew
