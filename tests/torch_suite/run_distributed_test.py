"""Run torch's own DistributedTest suite (torch/testing/_internal/distributed/distributed_test.py,
shipped in the wheel) on gloo and on ringcomm, side by side.

    python tests/torch_suite/run_distributed_test.py --world 2 --backends gloo,ringcomm \
        [-k REGEX ...] [--only NAMES_FILE] [--timeout 120] [--start spawn|fork] [--json out.json] [--list]

Each (backend, world size) runs in its own interpreter ("inner" mode, below) the way torch's
test/distributed/test_distributed_spawn.py drives the suite: environment BACKEND, WORLD_SIZE,
TEMP_DIR and INIT_METHOD=file://TEMP_DIR/, a class TestDistBackendWithSpawn(TestDistBackend,
DistributedTest._DistTestBase) whose setUp spawns WORLD_SIZE ranks (spawn start method; the ranks
re-import this file as __mp_main__, so the class is defined at module level whenever BACKEND is
set). ``--start fork`` forks the ranks instead, from the inner interpreter that has already
imported torch and compiled the suite (it has no process group and no communicator yet), which
saves each rank those imports. Every test gets DISTRIBUTED_TESTS_DEFAULT_TIMEOUT seconds (torch's own per-test timeout:
the parent kills the ranks and fails the test).

Backend "ringcomm" is registered as a plugin (``import ringcomm.torch``) and added to every
DistTestCases.backend_feature set that contains "gloo" (gpu, cuda, ddp, subgroup) and to
"plugin", and the suite's own gates on the name gloo admit it too: the module is compiled from
the wheel's file with ``BACKEND != "gloo"`` and ``require_backend_is_available({"gloo"})``
rewritten to admit "ringcomm" (GATE_REWRITES; the wheel itself is unchanged, line numbers are
kept). torch then selects the same tests for ringcomm as for gloo. Branches on the name inside
test bodies (``BACKEND == "gloo"``) and in torch's library code are left as they are.

This is a harness, not a unit test: it is not collected by the project's pytest run (no test_
prefix; tests/torch_suite/conftest.py ignores the directory) and a full run takes long.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
SUITE = "torch.testing._internal.distributed.distributed_test"


# ---- inner mode: this interpreter (and its spawned ranks) run one backend -----------------------
# The suite's gates on the literal name gloo, evaluated once when the module body runs (BACKEND is
# read from the environment at import), and what each becomes for ringcomm. Each rewrite keeps the
# line count, so tracebacks and file:line references name the wheel's own lines; the expected
# number of occurrences makes a torch whose gates changed fail loudly instead of skipping silently.
GATE_REWRITES = [
    ('BACKEND != "gloo"', '(BACKEND != "gloo" and BACKEND != "ringcomm")', 19),
    ('require_backend_is_available({"gloo"})', 'require_backend_is_available({"gloo", "ringcomm"})',
     19),
]


def _load_suite_with_gates_widened():
    """Import distributed_test.py from the installed wheel (the file itself unchanged) with the
    GATE_REWRITES applied to the source text before it is compiled, and register the module under
    its own name, so that the import below finds it."""
    import importlib.util
    spec = importlib.util.find_spec(SUITE)
    with open(spec.origin) as f:
        src = f.read()
    for old, new, expected in GATE_REWRITES:
        found = src.count(old)
        if found != expected:
            raise RuntimeError(f"{spec.origin}: {old!r} occurs {found} times, expected {expected}; "
                               "update GATE_REWRITES for this torch")
        src = src.replace(old, new)
    module = importlib.util.module_from_spec(spec)
    sys.modules[SUITE] = module
    try:
        exec(compile(src, spec.origin, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[SUITE]
        raise


def _prepare_suite():
    """Import the suite with BACKEND from the environment; return the test class."""
    backend = os.environ["BACKEND"]
    import torch
    import torch.distributed as dist  # noqa: F401
    from torch.testing._internal.common_distributed import DistTestCases
    if backend == "ringcomm":
        import ringcomm.torch  # noqa: F401  (registers the plugin backend)
        for name, members in DistTestCases.backend_feature.items():
            if "gloo" in members:
                members.add("ringcomm")
        DistTestCases.backend_feature["plugin"].add("ringcomm")
        _load_suite_with_gates_widened()
    from torch.testing._internal.distributed.distributed_test import (DistributedTest,
                                                                      TestDistBackend)

    start = os.environ.get("RINGCOMM_DT_START", "spawn")

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if start == "fork":
                # The ranks are forks of this interpreter, which has imported torch and compiled
                # the suite but created no process group and no communicator: each rank then
                # runs the test exactly as a spawned one, without importing both again.
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    TestDistBackendWithSpawn.__module__ = __name__
    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    return TestDistBackendWithSpawn


if os.environ.get("RINGCOMM_DT_INNER") == "1":
    TestDistBackendWithSpawn = _prepare_suite()


def _read_only(path: str) -> set[str]:
    """Test names, one per line; blank lines and text after '#' are ignored."""
    with open(path) as f:
        return {ln.split("#", 1)[0].strip() for ln in f} - {""}


def _selected(names: list[str], patterns: list[str], exclude: list[str],
              only: set[str] | None = None) -> list[str]:
    out = []
    for n in names:
        if only is not None and n not in only:
            continue
        if patterns and not any(re.search(p, n) for p in patterns):
            continue
        if any(re.search(p, n) for p in exclude):
            continue
        out.append(n)
    return out


def _inner(args) -> int:
    import unittest
    cls = TestDistBackendWithSpawn
    names = sorted(n for n in unittest.TestLoader().getTestCaseNames(cls))
    only = _read_only(args.only) if args.only else None
    if only is not None and only - set(names):
        print("--only names no test of the suite: " + ", ".join(sorted(only - set(names))),
              file=sys.stderr)
        return 2
    names = _selected(names, args.k, args.exclude, only)
    if args.list:
        print("\n".join(names))
        return 0
    results = {}

    class Result(unittest.TestResult):
        def _put(self, test, status, detail=""):
            name = test.id().split(".")[-1]
            results[name] = {"status": status, "detail": detail,
                             "seconds": round(time.monotonic() - self._t0, 2)}
            with open(args.json, "w") as f:   # rewritten per test: a killed run keeps its results
                json.dump(results, f, indent=0)
            sys.__stderr__.write(f"[{os.environ['BACKEND']}] {name}: {status} "
                                 f"({results[name]['seconds']} s)\n")

        def startTest(self, test):
            self._t0 = time.monotonic()
            super().startTest(test)

        def addSuccess(self, test):
            self._put(test, "pass")

        def addFailure(self, test, err):
            self._put(test, "fail", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            self._put(test, "fail", self._exc_info_to_string(err, test))

        def addSkip(self, test, reason):
            self._put(test, "skip", reason)

        def addExpectedFailure(self, test, err):
            self._put(test, "pass", "expected failure")

        def addUnexpectedSuccess(self, test):
            self._put(test, "fail", "unexpected success")

    suite = unittest.TestSuite(cls(n) for n in names)
    suite.run(Result())
    return 0


# ---- outer mode: one inner run per (backend, world size), then the comparison -------------------
def _first_line(detail: str) -> str:
    """The most telling line of a failure: the last 'Error'/'Exception' line of the rank's
    traceback, else the last non-empty line."""
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Exit|Timeout)\b", ln) or "Error:" in ln:
            return ln[:220]
    return lines[-1][:220] if lines else ""


def _run_backend(backend: str, world: int, args) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"ringcomm-dt-{backend}-{world}-")
    out_json = os.path.join(tmp, "results.json")
    env = dict(os.environ, RINGCOMM_DT_INNER="1", BACKEND=backend, WORLD_SIZE=str(world),
               TEMP_DIR=tmp, INIT_METHOD=f"file://{tmp}/",
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.timeout),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), RINGCOMM_DT_START=args.start)
    cmd = [sys.executable, HERE, "--inner", "--json", out_json]
    for p in args.k:
        cmd += ["-k", p]
    for p in args.exclude:
        cmd += ["--exclude", p]
    if args.only:
        cmd += ["--only", os.path.abspath(args.only)]
    if args.list:
        cmd.append("--list")
    log = os.path.join(args.log_dir, f"{backend}-w{world}.log") if args.log_dir else os.devnull
    t0 = time.monotonic()
    try:
        with open(log, "w") as lf:
            rc = subprocess.call(cmd, env=env, stdout=None if args.list else lf,
                                 stderr=None if args.list else lf, timeout=args.total_timeout)
    except subprocess.TimeoutExpired:
        rc = "total timeout"
    secs = time.monotonic() - t0
    results = {}
    if os.path.exists(out_json):
        with open(out_json) as f:
            results = json.load(f)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"backend": backend, "world": world, "rc": rc, "seconds": round(secs, 1),
            "results": results, "log": log}


def _counts(results: dict) -> dict:
    c = {"pass": 0, "fail": 0, "skip": 0}
    for r in results.values():
        c[r["status"]] += 1
    return c


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, action="append", help="world size (repeatable; default 2)")
    ap.add_argument("--backends", default="gloo,ringcomm")
    ap.add_argument("-k", action="append", default=[], help="regex on the test name (repeatable: any)")
    ap.add_argument("--exclude", action="append", default=[], help="regex of tests to leave out")
    ap.add_argument("--only", help="file of test names (one a line): run only these")
    ap.add_argument("--timeout", type=int, default=120, help="per-test timeout, seconds")
    ap.add_argument("--total-timeout", type=float, default=None, help="per-backend wall limit")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--log-dir", help="keep each inner run's output here")
    ap.add_argument("--list", action="store_true", help="list the selected tests and stop")
    ap.add_argument("--start", choices=("spawn", "fork"), default="spawn",
                    help="how each test starts its ranks: spawn (torch's test_distributed_spawn.py, "
                    "default) or fork (of an interpreter that has imported torch and the suite)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.inner:
        return _inner(args)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    worlds = args.world or [2]
    backends = [b for b in args.backends.split(",") if b]
    runs = []
    for w in worlds:
        for b in backends:
            if args.list:
                print(f"# {b}, world {w}:")
                _run_backend(b, w, args)
                continue
            r = _run_backend(b, w, args)
            runs.append(r)
            c = _counts(r["results"])
            print(f"{b:9s} world {w}: {c['pass']:4d} pass {c['fail']:4d} fail {c['skip']:4d} skip"
                  f"   ({r['seconds']} s, rc {r['rc']})", flush=True)
    if args.list:
        return 0
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "argv": sys.argv, "runs": runs}
    rc = 0
    for w in worlds:
        by = {r["backend"]: r["results"] for r in runs if r["world"] == w}
        if "gloo" not in by:
            continue
        for b, res in by.items():
            if b == "gloo":
                continue
            fails = [n for n, g in sorted(by["gloo"].items())
                     if g["status"] == "pass" and res.get(n, {}).get("status") == "fail"]
            skips = [n for n, g in sorted(by["gloo"].items())
                     if g["status"] == "pass" and res.get(n, {}).get("status") == "skip"]
            missing = [n for n, g in sorted(by["gloo"].items())
                       if g["status"] == "pass" and n not in res]
            print(f"\nworld {w}: gloo passes, {b} fails ({len(fails)}):")
            for n in fails:
                print(f"  {n}: {_first_line(res[n]['detail'])}")
            print(f"world {w}: gloo passes, {b} skips ({len(skips)}):")
            for n in skips:
                print(f"  {n}: {res[n]['detail'][:160]}")
            if missing:
                print(f"world {w}: gloo passes, {b} has no result ({len(missing)}): "
                      + ", ".join(missing))
            if fails or missing:
                rc = 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
