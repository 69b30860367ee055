"""Build ringcomm._C (and ringcomm._C_test, the tests' hooks) with CMake (`pip install .` / `pip install -e .`).

Environment: RINGCOMM_CUDA=auto|1|0 (default auto: CUDA sources are built when a toolkit is
found), RINGCOMM_BUILD_JOBS (parallel build jobs, default: CPU count), RINGCOMM_BUILD_TYPE
(default Release). torch is not needed to build. The CMake build folder, build/setup-cmake, is
kept between builds, so that a wheel built after an editable install compiles only what changed.

The CMake build also copies the package data into the package's _data/ folder (CMakeLists.txt):
the C ABI header (csrc/include/ringcomm/abi.h, parsed by ringcomm.core.tables at import) and the torch
c10d trampoline's source (bindings/torch/trampoline.cpp, compiled just in time by ringcomm.torch).
A wheel gets them beside its modules; an editable install (built in place) in src/ringcomm/_data,
where the source tree's modules look for them.
"""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name, optional=False):
        super().__init__(name, sources=[], optional=optional)


class CMakeBuild(build_ext):
    def run(self):
        # In place (an editable install, `setup.py build_ext --inplace`) setuptools builds the
        # modules elsewhere and copies only them into the source package; the package data goes
        # straight to the source package. run() is the last moment `inplace` says so.
        self.package_dir = ROOT / "src" / "ringcomm" if self.inplace else None
        super().run()

    def build_extension(self, ext):
        # ringcomm._C_test (always), ringcomm._C_cuda and ringcomm._C_cuda_test (when a CUDA
        # toolkit is found) come out of the same CMake run as ringcomm._C; they are listed as
        # extensions only so that setuptools copies them into the source tree for editable
        # installs (the CUDA ones as optional: skipped when they were not built).
        if ext.name == "ringcomm._C_test":
            return
        # ---- CUDA ----
        if ext.name in ("ringcomm._C_cuda", "ringcomm._C_cuda_test", "ringcomm._C_cuda_fake"):
            return
        # ---- end CUDA ----
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = ROOT / "build" / "setup-cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        cuda = os.environ.get("RINGCOMM_CUDA", "auto").lower()
        cuda = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}.get(cuda, cuda)
        cfg = os.environ.get("RINGCOMM_BUILD_TYPE", "Release")
        args = [
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out.parent}",
            f"-DRINGCOMM_PACKAGE_DIR={self.package_dir or out.parent}",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DRINGCOMM_CUDA={cuda}",
        ]
        subprocess.run(["cmake", str(ROOT), *args], cwd=build_dir, check=True)
        jobs = os.environ.get("RINGCOMM_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "--build", ".", "--parallel", jobs], cwd=build_dir, check=True)


setup(
    ext_modules=[CMakeExtension("ringcomm._C"),
                 CMakeExtension("ringcomm._C_test"),
                 CMakeExtension("ringcomm._C_cuda", optional=True),  # CUDA: see build_extension
                 CMakeExtension("ringcomm._C_cuda_test", optional=True),
                 CMakeExtension("ringcomm._C_cuda_fake", optional=True)],
    cmdclass={"build_ext": CMakeBuild},
)
