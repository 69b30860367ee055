"""The push channels' walk (RINGCOMM_SLOT_WALK_BYTES, transport/shm_slots.h): a small piece starts
at a different page-multiple of its slot each time the slot comes round. The places (the pure
function, as compiled) stay within the slot, and results stay exact whatever the span, over
enough calls for every place of every slot to be used."""
import pytest

from ringcomm import _C_test
from ringcomm.core.launch import spawn

from slot_walk_cases import exact_rounds

pytestmark = pytest.mark.timeout(180)

PAGE = 4096


@pytest.mark.parametrize("span", [0, 4096, 8192, 128 << 10, 256 << 10])
@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4096, 4097, 16384, 65536, 100000, 131072, 262144])
def test_places_are_pages_apart_and_end_within_the_span(span, nbytes):
    step = -(-nbytes // PAGE) * PAGE
    places = span // step if nbytes else 0
    seen = [_C_test.slot_walk(lap, nbytes, span) for lap in range(70)]
    if places < 2:
        assert set(seen) == {0}                   # a piece the span holds once (or unknown) stays
        return
    assert seen[:places] == [k * step for k in range(places)]   # in order, a page multiple apart
    assert all(seen[lap] == seen[lap % places] for lap in range(70))
    assert max(seen) + nbytes <= span + PAGE - 1


def test_the_lap_counter_wraps_within_the_places():
    # The sender's head is a wrapping 32-bit count: lap = head / nslots stays a valid place.
    for lap in (2**32 - 1, 2**31, 12345678):
        off = _C_test.slot_walk(lap, 16384, 128 << 10)
        assert off % 16384 == 0 and off + 16384 <= 128 << 10


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("walk", ["0", "8K", "128K", "256K"])
def test_results_are_exact_at_every_span(world, walk, store_env):
    # Two slots per channel: a slot comes round every other send, so 24 rounds pass every place.
    env = {"RINGCOMM_SLOT_WALK_BYTES": walk, "RINGCOMM_NSLOTS": "2"}
    assert spawn(exact_rounds, world, args=(env, 24), timeout=150, env=store_env) == [0] * world


def test_walk_over_the_slot_is_clamped_to_it(store_env):
    env = {"RINGCOMM_SLOT_WALK_BYTES": "1G", "RINGCOMM_SLOT_BYTES": "64K", "RINGCOMM_NSLOTS": "2"}
    assert spawn(exact_rounds, 2, args=(env, 12), timeout=150, env=store_env) == [0, 0]
