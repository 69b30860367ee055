"""Properties of the built extension modules themselves."""
import importlib
import shutil
import subprocess

import pytest

# libstdc++ runtime internals that must never be exported by our modules: where a toolchain links
# the C++ runtime statically, an exported copy gets half-bound to the libstdc++.so that torch loaded
# first and number formatting crashes (seen on a CUDA image; CMakeLists.txt: --exclude-libs).
_RUNTIME_PREFIXES = ("_ZNSt6locale", "_ZNKSt7num_put", "_ZNSt7num_put", "_ZNKSt7codecvt", "_ZNSt7codecvt",
                     "_ZNSo9_M_insert", "_ZNSt8ios_base")


@pytest.mark.parametrize("name", ["_C", "_C_test", "_C_cuda", "_C_cuda_test"])
def test_module_exports_no_cxx_runtime(name):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found")
    try:
        mod = importlib.import_module(f"ringcomm.{name}")
    except ImportError:
        pytest.skip(f"ringcomm.{name} was not built")
    out = subprocess.run([nm, "-D", "--defined-only", mod.__file__], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    syms = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
    assert any(s.startswith("PyInit_") for s in syms), syms[:20]
    leaked = [s for s in syms if s.startswith(_RUNTIME_PREFIXES)]
    assert not leaked, leaked[:20]


def test_test_hooks_live_only_in_the_test_module():
    """What only the tests use is bound in ringcomm._C_test; the production module has none of it."""
    from ringcomm import _C, _C_test
    hooks = [n for n in dir(_C_test) if not n.startswith("__")]
    assert "set_last_seq" in hooks and "forge_next_header" in hooks, hooks
    both = [n for n in hooks if hasattr(_C, n) or hasattr(_C, "_" + n)]
    assert not both, both
    assert not [n for n in dir(_C) if "test" in n.lower()]
    assert not [n for n in dir(_C.Communicator) if "test" in n.lower() or "forge" in n]


def test_cuda_test_hooks_live_only_in_the_cuda_test_module():
    try:
        from ringcomm import _C_cuda, _C_cuda_test
    except ImportError:
        pytest.skip("ringcomm was built without CUDA")
    hooks = [n for n in dir(_C_cuda_test) if not n.startswith("__")]
    assert "reduce_emulated" in hooks and "plan_channels" in hooks, hooks
    both = [n for n in hooks if hasattr(_C_cuda, n) or hasattr(_C_cuda, "_" + n)]
    assert not both, both
