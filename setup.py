"""Build ringcomm._C (and ringcomm._C_test, the tests' hooks) with CMake (`pip install .` / `pip install -e .`).

Environment: RINGCOMM_CUDA=auto|1|0 (default auto: CUDA sources are built when a toolkit is
found), RINGCOMM_BUILD_JOBS (parallel build jobs, default: CPU count), RINGCOMM_BUILD_TYPE
(default Release). torch is not needed to build.
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
    def build_extension(self, ext):
        # ringcomm._C_test (always), ringcomm._C_cuda and ringcomm._C_cuda_test (when a CUDA
        # toolkit is found) come out of the same CMake run as ringcomm._C; they are listed as
        # extensions only so that setuptools copies them into the source tree for editable
        # installs (the CUDA ones as optional: skipped when they were not built).
        if ext.name == "ringcomm._C_test":
            return
        # ---- CUDA ----
        if ext.name in ("ringcomm._C_cuda", "ringcomm._C_cuda_test"):
            return
        # ---- end CUDA ----
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        cuda = os.environ.get("RINGCOMM_CUDA", "auto").lower()
        cuda = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}.get(cuda, cuda)
        cfg = os.environ.get("RINGCOMM_BUILD_TYPE", "Release")
        args = [
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out.parent}",
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
                 CMakeExtension("ringcomm._C_cuda_test", optional=True)],
    cmdclass={"build_ext": CMakeBuild},
)
