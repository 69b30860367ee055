"""The package's layers and size limits, checked on the source with standard tools.

The layers are import-linter contracts in pyproject.toml (``lint-imports``): the applications
over the training wrappers over the back ends over the core, the back ends independent of each
other, the plain API never importing the torch backend. Here: the contracts hold, a planted
upward import breaks them (so a contract that sees no imports cannot pass), no chain of imports
leads from a module back to itself (grimp's graph, the one import-linter builds), the package
folder keeps at most twelve tracked entries, no source file under src/ is longer than 700 lines,
and docs/architecture.md's layer table names the contracts' packages.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp   # import-linter's graph (the test extra)
import pytest

import ringcomm

PKG_DIR = Path(ringcomm.__file__).resolve().parent
SRC_DIR = PKG_DIR.parent
ROOT = SRC_DIR.parent
PYPROJECT = ROOT / "pyproject.toml"
MAX_LINES = 700
MAX_ENTRIES = 12
SOURCE_SUFFIXES = (".py", ".pyi", ".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh")



def lint_imports(src: Path) -> subprocess.CompletedProcess:
    """import-linter's CLI on the package found under ``src`` with the project's contracts."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--config", str(PYPROJECT), "--no-cache"],
                          cwd=src, env=env, capture_output=True, text=True, timeout=240)


def contracts() -> list[dict]:
    import tomllib
    return tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]


def test_import_linter_contracts_hold():
    r = lint_imports(SRC_DIR)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and f"{len(contracts())} kept" in r.stdout, r.stdout


@pytest.mark.parametrize("planted", [
    ("core/errors.py", "from ringcomm.training import memory as _m\n"),       # core -> wrappers
    ("cuda/buffers.py", "from ringcomm.hier import topology as _t\n"),        # back end -> back end
    ("hier/topology.py", "import ringcomm.torch.core as _tc\n"),              # plain API -> torch
])
def test_a_planted_upward_import_breaks_a_contract(tmp_path, planted):
    copy = tmp_path / "src"
    shutil.copytree(PKG_DIR, copy / "ringcomm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "_data", "*.egg-info"))
    path, line = planted
    target = copy / "ringcomm" / path
    target.write_text(target.read_text() + "\n" + line)
    r = lint_imports(copy)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout + r.stderr
    assert path.replace("/", ".").removesuffix(".py") in r.stdout.replace("\n", " ").replace("ringcomm.", ""), r.stdout


def test_no_import_cycle():
    graph = grimp.build_graph("ringcomm", cache_dir=None)
    # grimp records ``from .. import _C`` (a compiled module, no .py file) as an import of the
    # package itself, whose __init__ only re-exports the core: it takes part in no cycle.
    graph.remove_module("ringcomm")
    cycles = []
    for m in sorted(graph.modules):
        for t in sorted(graph.find_modules_directly_imported_by(m)):
            if t != m and graph.chain_exists(importer=t, imported=m):
                back = graph.find_shortest_chain(importer=t, imported=m)
                cycles.append(" -> ".join((m, *back)))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_module_lies_in_a_layer_of_the_contract():
    layers = next(c for c in contracts() if c["type"] == "layers")["layers"]
    packages = {p.strip() for layer in layers for p in re.split(r"[|:]", layer)}
    graph = grimp.build_graph("ringcomm", cache_dir=None)
    outside = [m for m in graph.modules
               if m != "ringcomm" and not any(m == p or m.startswith(p + ".") for p in packages)]
    assert outside == []


def test_the_package_folder_holds_at_most_twelve_entries():
    listed = subprocess.run(["git", "ls-files", "--", "."], cwd=PKG_DIR, capture_output=True,
                            text=True)
    if listed.returncode != 0 or not listed.stdout:
        pytest.skip("not a git checkout: the tracked entries cannot be listed")
    entries = sorted({line.split("/", 1)[0] for line in listed.stdout.splitlines()})
    assert len(entries) <= MAX_ENTRIES, entries


def test_no_module_is_shadowed_by_an_attribute_of_its_package():
    """``import ringcomm.x.y as m`` gives the module, never a same-named function or object."""
    import importlib
    import types
    graph = grimp.build_graph("ringcomm", cache_dir=None)
    for name in sorted(graph.modules):
        parent, _, leaf = name.rpartition(".")
        if not parent or leaf == "__main__":
            continue
        try:
            pkg = importlib.import_module(parent)
        except ImportError as e:          # only an optional dependency may be missing
            assert e.name in ("torch", "torchft", "cupy", "mpi4py"), e
            continue
        attr = getattr(pkg, leaf, None)
        assert attr is None or isinstance(attr, types.ModuleType), f"{parent}.{leaf} is {attr!r}"


def test_source_files_at_most_700_lines():
    long = []
    for path in sorted(SRC_DIR.rglob("*")):
        if path.suffix in SOURCE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
            with path.open("rb") as f:
                n = sum(1 for _ in f)
            if n > MAX_LINES:
                long.append(f"{path.relative_to(SRC_DIR)}: {n} lines")
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_architecture_page_names_the_contracts_layers():
    """docs/architecture.md's layer table lists, top to bottom, the packages of the layers
    contract, so the page a reader opens first cannot drift from the rules the checks enforce."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start, end = "<!-- layer-folders", "<!-- /layer-folders -->"
    assert start in page and end in page, "docs/architecture.md lost its layer-folders table"
    rows = [line for line in page[page.index(start):page.index(end)].splitlines()
            if line.startswith("| ") and not line.startswith("| layer ")]
    shown = [sorted(re.findall(r"`(ringcomm[\w.]*)`", row.split("|")[2])) for row in rows]
    layers = next(c for c in contracts() if c["type"] == "layers")["layers"]
    declared = [sorted(p.strip() for p in re.split(r"[|:]", layer)) for layer in layers]
    assert shown == declared
    for row in rows:
        for folder in re.findall(r"`src/(ringcomm/[\w/.]+)`", row):
            assert (SRC_DIR / folder).exists(), row
