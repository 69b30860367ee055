"""A type checker resolves every import of a ringcomm module, as an IDE does.

mypy (pinned in the test extra, configured in pyproject.toml) reads src/ringcomm from the files:
no ``__path__`` at run time, no ignore rule over ``ringcomm.*``; the compiled modules resolve
through their committed stubs (``src/ringcomm/_C.pyi``, ``_C_cuda.pyi``), which must say what
the built modules hold. A planted import of a module or a name that does not exist must be
reported, so the check cannot pass by seeing nothing.
"""
from __future__ import annotations

import difflib
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ringcomm

PKG_DIR = Path(ringcomm.__file__).resolve().parent
ROOT = PKG_DIR.parent.parent

# An import that does not resolve, in mypy's words.
UNRESOLVED = re.compile(r"\[import(-not-found|-untyped)?\]$|Module \"ringcomm[\w.]*\" has no attribute")


def mypy(root: Path, *files: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                        "--no-incremental", "--cache-dir", "/dev/null", *files],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stdout + r.stderr          # 2: mypy itself failed
    return [line for line in r.stdout.splitlines() if ": error:" in line]


def unresolved(errors: list[str]) -> list[str]:
    return [e for e in errors if UNRESOLVED.search(e)]


def test_every_import_of_a_ringcomm_module_resolves():
    errors = mypy(ROOT)
    assert unresolved(errors) == []


def test_a_planted_unresolved_import_is_reported(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(PKG_DIR, src / "ringcomm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "_data", "*.egg-info"))
    target = src / "ringcomm" / "training" / "tp.py"
    target.write_text(target.read_text() + "\nimport ringcomm.ddp\nfrom ringcomm.core.front import no_such_name\n"
                      "from ringcomm._C import no_such_function\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bad = unresolved(mypy(tmp_path, "src/ringcomm/training/tp.py"))
    assert any("ringcomm.ddp" in e for e in bad), bad
    assert any("no_such_name" in e for e in bad), bad
    assert any("no_such_function" in e for e in bad), bad


def test_the_package_is_typed():
    assert (PKG_DIR / "py.typed").is_file()


@pytest.mark.parametrize("module", ["_C", "_C_cuda"])
def test_compiled_module_stubs_say_what_the_module_holds(module, tmp_path):
    """Regenerate with ``pybind11-stubgen ringcomm.<module> -o src`` after changing a binding."""
    try:
        importlib.import_module(f"ringcomm.{module}")
    except ImportError:
        if module == "_C":
            raise
        pytest.skip(f"ringcomm.{module} was not built (no CUDA toolkit at build time)")
    r = subprocess.run([sys.executable, "-m", "pybind11_stubgen", f"ringcomm.{module}", "-o", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    fresh = (tmp_path / "ringcomm" / f"{module}.pyi").read_text()
    committed = (PKG_DIR / f"{module}.pyi").read_text()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                        f"src/ringcomm/{module}.pyi", "built"))
    assert fresh == committed, f"stale stub; run: pybind11-stubgen ringcomm.{module} -o src\n{diff[:4000]}"
