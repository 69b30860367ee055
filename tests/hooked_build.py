"""Run this process's ringcomm over the test build of the core (ringcomm._C_test).

ringcomm._C_test binds everything ringcomm._C binds, over the core compiled with
RINGCOMM_TEST_HOOKS (the test knobs of csrc/common/test_knobs.def, the forged-header hook). A
rank that needs a hook calls ``use()`` first, before anything loads ringcomm._C (``import
ringcomm`` does not); from then on every ``from ringcomm import _C`` of the library gets the test
build. Ranks only: the pytest process keeps the product module."""
import sys


def use():
    """Make ringcomm._C the test build in this process; raises where ringcomm._C is loaded already."""
    import ringcomm
    from ringcomm import _C_test
    loaded = sys.modules.get("ringcomm._C")
    if loaded is not None and loaded is not _C_test:
        raise RuntimeError("hooked_build.use(): ringcomm._C is loaded already; call it first in a fresh process")
    sys.modules["ringcomm._C"] = _C_test
    ringcomm._C = _C_test
    return _C_test
