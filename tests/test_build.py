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


@pytest.mark.parametrize("name", ["_C", "_C_test", "_C_cuda", "_C_cuda_test", "_C_cuda_fake"])
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
    """ringcomm._C_test is the test build of ringcomm._C (every name of it, over the core with
    RINGCOMM_TEST_HOOKS) plus what only the tests use; the production module has none of that."""
    from ringcomm import _C, _C_test
    product = {n for n in dir(_C) if not n.startswith("__")}
    hooks = {n for n in dir(_C_test) if not n.startswith("__")} - product
    assert product <= set(dir(_C_test)), product - set(dir(_C_test))
    assert {"set_last_seq", "forge_next_header", "test_knobs"} <= hooks, hooks
    assert not [n for n in hooks if hasattr(_C, "_" + n)]
    assert not [n for n in dir(_C) if "test" in n.lower()]
    assert not [n for n in dir(_C.Communicator) if "test" in n.lower() or "forge" in n]
    # Both modules' classes live in one process: the test build's are its own (module_local).
    assert _C_test.Communicator is not _C.Communicator and _C_test.Knobs is not _C.Knobs
    assert {k["name"] for k in _C_test.test_knobs()} == {
        "RINGCOMM_TEST_ATTACH_PAUSE_MS", "RINGCOMM_TEST_PIDNS", "RINGCOMM_TEST_CMA_DENY", "RINGCOMM_TEST_CMA_EXIT",
        "RINGCOMM_TEST_STORE_COST"}


# What the test build adds, by the names it compiles into a module: the test knobs, the hook's
# functions and the test bindings. A stripped module keeps its strings (the knob names, the
# bindings' names, messages) but only its dynamic symbols.
_TEST_STRINGS = (b"RINGCOMM_TEST_", b"forge_next_header", b"test_knobs", b"set_last_seq", b"tests/hooked_build.py")
_TEST_SYMBOLS = ("test_hooks", "TestKnobs", "test_knob_table", "CommCoreTestAccess", "sync_entry_stats",
                 "next_header_hook")


def _symbols(nm: str, path: str) -> str:
    """Every symbol name of the module, demangled: its full table, or only the dynamic one where
    the module is stripped."""
    full = subprocess.run([nm, "-C", "--defined-only", path], capture_output=True, text=True, timeout=60)
    if full.returncode == 0 and full.stdout.strip():
        return full.stdout
    dyn = subprocess.run([nm, "-D", "-C", "--defined-only", path], capture_output=True, text=True, timeout=60)
    assert dyn.returncode == 0 and "PyInit_" in dyn.stdout, dyn.stderr
    return dyn.stdout


def test_product_module_holds_no_test_knob_or_hook():
    """ringcomm._C, read as a file: none of the test build's names, in its bytes or its symbols;
    ringcomm._C_test holds them (what the check looks for is there to find)."""
    from ringcomm import _C, _C_test
    nm = shutil.which("nm")
    assert nm is not None, "nm (binutils) is needed to read the modules' symbols"
    with open(_C.__file__, "rb") as f:
        product = f.read()
    with open(_C_test.__file__, "rb") as f:
        test = f.read()
    assert [s for s in _TEST_STRINGS if s in product] == []
    assert [s for s in _TEST_STRINGS if s not in test] == []
    assert b"RINGCOMM_TEST_PIDNS" in test and b"RINGCOMM_TEST_ATTACH_PAUSE_MS" in test
    syms = _symbols(nm, _C.__file__)
    assert [s for s in _TEST_SYMBOLS if s in syms] == []
    assert "PyInit__C" in syms


def test_cuda_test_hooks_live_only_in_the_cuda_test_module():
    try:
        from ringcomm import _C_cuda, _C_cuda_test
    except ImportError:
        pytest.skip("ringcomm was built without CUDA")
    hooks = [n for n in dir(_C_cuda_test) if not n.startswith("__")]
    assert "reduce_emulated" in hooks and "plan_channels" in hooks, hooks
    both = [n for n in hooks if hasattr(_C_cuda, n) or hasattr(_C_cuda, "_" + n)]
    assert not both, both


def test_fake_cuda_runtime_lives_only_in_the_fake_module():
    """ringcomm._C_cuda_fake links the production CUDA objects with the fake runtime
    (tests/fake_cuda/); ringcomm._C_cuda holds none of the fake, the fake module none of the real
    runtime (which loads libcuda.so). The modules are stripped: their bytes are what is read."""
    try:
        from ringcomm import _C_cuda, _C_cuda_fake
    except ImportError:
        pytest.skip("ringcomm was built without CUDA")
    with open(_C_cuda.__file__, "rb") as f:
        real = f.read()
    with open(_C_cuda_fake.__file__, "rb") as f:
        fake = f.read()
    assert b"fake runtime error" in fake and b"fake runtime error" not in real
    assert b"libcuda.so" in real and b"libcuda.so" not in fake
    # The production code is in both: the device ring's messages.
    assert b"the device ring's watchdog" in real and b"the device ring's watchdog" in fake
