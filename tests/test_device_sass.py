"""nvcc builds the device ring kernel (csrc/device/ring_kernel.cu) for sm_80 and sm_90, and the SASS that
cuobjdump prints keeps every spin loop's system-scope acquire load inside the loop; the build with the load
hoisted out of its spin (RC_RING_BROKEN=4) fails the same check. float32 SUM only here (RC_RING_SASS_SUBSET:
the spin loops are the same code in every pair); every pair of the production build is checked by
benchmarks/device/host_proof.sh. cuobjdump and nvdisasm come from the pip packages nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm (the test extra) or the toolkit; a missing tool fails the test."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "device_proof"))
import sass_check  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def nvcc():
    found = shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    assert Path(found).exists(), "nvcc not found: the SASS check needs the CUDA toolkit"
    return found


def build(out, arch, broken=0):
    subprocess.run([nvcc(), "-std=c++17", "-O3", "--fmad=false", "-cubin", f"-arch={arch}", "-DRC_RING_SASS_SUBSET",
                    f"-DRC_RING_BROKEN={broken}", f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'csrc' / 'include'}",
                    str(ROOT / "csrc" / "device" / "ring_kernel.cu"), "-o", str(out)], check=True)
    return out


@pytest.mark.timeout(600)
def test_spin_loops_keep_their_system_scope_load(tmp_path):
    cubins = [build(tmp_path / f"ring_{a}.cubin", a) for a in ("sm_80", "sm_90")]
    kernels, loops, fails = sass_check.check(cubins)
    assert kernels == 2 and loops >= 2 * 2 and not fails, (kernels, loops, fails)
    hoisted = build(tmp_path / "hoisted.cubin", "sm_80", broken=4)
    kernels, loops, fails = sass_check.check([hoisted])
    assert kernels == 1 and fails, "the hoisted-load build passed the SASS check"
