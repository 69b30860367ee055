"""The two kinds of install carry the package data the runtime reads: the C ABI header
(csrc/include/ringcomm/abi.h, parsed by ringcomm.core.tables at import) and the torch c10d
trampoline's source (bindings/torch/trampoline.cpp, compiled just in time by ringcomm.torch), both
copied by the build into the package's _data/ folder (setup.py, CMakeLists.txt).

- An editable install (or the CMake build into src/ringcomm) leaves them in src/ringcomm/_data,
  untracked, byte for byte the sources, where the modules of the source tree look.
- A wheel holds them beside its modules, with every layer folder's modules; installed into a
  fresh environment, it imports and runs without the source tree.

The wheel is built from this checkout in the CMake build folder setup.py keeps
(build/setup-cmake), so after the editable install of the README's command it reuses that
build's objects; RINGCOMM_CUDA=off keeps the CUDA module out of it.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ringcomm
from ringcomm.core import tables

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "ringcomm"
# (source in the repository, its copy in the package)
DATA = [("csrc/include/ringcomm/abi.h", "_data/include/ringcomm/abi.h"),
        ("bindings/torch/trampoline.cpp", "_data/torch/trampoline.cpp"),
        ("bindings/torch/offer_point.h", "_data/torch/offer_point.h")]


def _from_source_tree() -> bool:
    return Path(ringcomm.__file__).resolve().parent == PKG


def test_the_runtime_reads_the_packaged_copies():
    pkg = Path(ringcomm.__file__).resolve().parent
    assert Path(tables.DATA_DIR) == pkg / "_data"
    assert Path(tables.ABI_HEADER) == pkg / DATA[0][1]
    pytest.importorskip("torch")
    from ringcomm.torch import extension
    assert Path(extension.SOURCE) == pkg / DATA[1][1]
    assert Path(extension.HEADER) == Path(tables.ABI_HEADER)
    assert Path(extension.INCLUDE, "ringcomm", "abi.h") == Path(tables.ABI_HEADER)


def test_editable_layout_holds_the_package_data_untracked():
    if not _from_source_tree():
        pytest.skip("ringcomm is imported from an installed wheel, not the source tree")
    for src, copy in DATA:
        assert (PKG / copy).read_bytes() == (ROOT / src).read_bytes(), copy
    listed = subprocess.run(["git", "ls-files", "--", "_data"], cwd=PKG, capture_output=True,
                            text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    assert listed.stdout == ""                              # copies, never tracked
    ignored = subprocess.run(["git", "check-ignore", "-q", str(PKG / DATA[0][1])], cwd=ROOT)
    assert ignored.returncode == 0                          # and ignored, so never added


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # One build job: the other test worker runs timing-sensitive tests meanwhile.
    env = dict(os.environ, RINGCOMM_CUDA="off", RINGCOMM_BUILD_JOBS="1")
    env.pop("PYTHONPATH", None)
    # setuptools ships whatever an earlier build left in its staging folders: start them empty,
    # so the wheel holds exactly the tracked modules (a module moved away must not linger).
    for stale in [*ROOT.glob("build/lib*"), *ROOT.glob("build/bdist*")]:
        shutil.rmtree(stale, ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                        "--no-build-isolation", "--disable-pip-version-check", "-w", str(out)],
                       cwd=str(out), env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    wheels = sorted(out.glob("ringcomm-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.timeout(1800)
def test_wheel_holds_the_package_data_and_every_layer(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for src, copy in DATA:
        assert f"ringcomm/{copy}" in names, copy
        assert zipfile.ZipFile(wheel).read(f"ringcomm/{copy}") == (ROOT / src).read_bytes()
    tracked = subprocess.run(["git", "ls-files", "--", "*.py"], cwd=PKG, capture_output=True,
                             text=True)
    if tracked.returncode == 0 and tracked.stdout:
        modules = {f"ringcomm/{p}" for p in tracked.stdout.split()}
    else:
        modules = {f"ringcomm/{p.relative_to(PKG).as_posix()}" for p in PKG.rglob("*.py")
                   if "__pycache__" not in p.parts}
    assert {"ringcomm/core/tables.py", "ringcomm/training/ddp.py", "ringcomm/bench/cli.py",
            "ringcomm/torch/torchft.py", "ringcomm/torchft.py"} <= modules
    assert sorted(modules - names) == []
    assert sorted({n for n in names if n.endswith(".py")} - modules) == []   # nothing stale
    assert any(n.startswith("ringcomm/_C.") and n.endswith(".so") for n in names), sorted(names)
    # The bench peers' drivers, compiled on first use from the installed package.
    assert {f"ringcomm/bench/drivers/{f}" for f in ("oneccl.cpp", "impi.cpp", "driver.h")} <= names
    assert not any("include/ringcomm" in n and not n.startswith("ringcomm/_data/") for n in names)


def _site_dirs() -> list[str]:
    """This interpreter's site directories: the system's or the venv's (and the system's, where
    the venv includes them), and the user's where it is on sys.path."""
    import site
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if d in sys.path and os.path.isdir(d)]


@pytest.mark.timeout(1800)
def test_wheel_installed_apart_imports_and_runs(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # The wheel's dependencies (numpy; torch for the torch back end) come from this interpreter's
    # site directories, whether it is a system Python or itself a venv: the fresh venv lists them
    # in a .pth file. Plain path lines are appended after the venv's own site-packages and their
    # own .pth files are not read, so an editable ringcomm there never reaches the fresh venv.
    child_site = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                                capture_output=True, text=True, check=True, env=env,
                                timeout=120).stdout.strip()
    (Path(child_site) / "parent_site.pth").write_text("".join(f"{d}\n" for d in _site_dirs()))
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                        "--force-reinstall", str(wheel)],
                       env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    code = ("import ringcomm, ringcomm.core.tables, ringcomm.bench.cli, ringcomm.training.ddp, ringcomm.core.host\n"
            "from pathlib import Path\n"
            "print(Path(ringcomm.__file__).resolve().parent)\n"
            "print(len(ringcomm.core.tables.DTYPES), Path(ringcomm.core.tables.ABI_HEADER).is_file())\n"
            "c = ringcomm.init(rank=0, world_size=1)\n"
            "import numpy as np\n"
            "x = np.ones(4, np.float32); c.all_reduce(x); print(float(x.sum())); c.close()\n"
            "try:\n    from ringcomm.torch import extension\nexcept ImportError:\n"
            "    print('no torch')\nelse:\n"
            "    print(Path(extension.SOURCE).resolve().parent.parent.parent == "
            "Path(ringcomm.__file__).resolve().parent, Path(extension.SOURCE).is_file())\n")
    r = subprocess.run([str(py), "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    where, counts, total, trampoline = r.stdout.splitlines()
    assert Path(where).is_relative_to(venv), where            # the wheel's copy, not the tree
    assert counts.split()[1] == "True" and int(counts.split()[0]) > 0
    assert float(total) == 4.0
    # torch reaches the fresh venv wherever this interpreter has it: the torch back end's
    # trampoline source is then the wheel's copy.
    assert trampoline == ("True True" if importlib.util.find_spec("torch") else "no torch"), trampoline
    r = subprocess.run([str(py), "-m", "ringcomm.bench", "--help"], env=env, capture_output=True,
                       text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr[-3000:]
