"""CUDA reliability on a real GPU (skipped without one; benchmarks/device/gpu_check.sh runs them):

- a peer that dies while this rank depends on its GPU work raises PeerFailureError naming the
  operation, the rank and the peer, and never leaves this rank's stream blocked;
- a close that cannot drain retires its pinned slots (still registered and mapped) and a later
  communicator never gets their pages;
- send/recv on the internal stream: torch's allocator never hands a dropped tensor's memory out
  while the transfer uses it.
The host-side bookkeeping behind the last two is tested without a GPU in
tests/test_cuda_bookkeeping.py.
"""
import pytest

import ringcomm.cuda as rcc
from ringcomm.core.launch import spawn

import cuda_reliability_cases as cases

needs_gpu = pytest.mark.skipif(not rcc.is_available(), reason=f"CUDA unavailable: {rcc.unavailable_reason()}")


@needs_gpu
@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["auto", "host"])
def test_gpu_dead_peer_never_blocks_the_stream(mode, store_env):
    pytest.importorskip("torch")
    env = dict(store_env, RINGCOMM_CUDA_P2P=mode, RINGCOMM_LIVENESS_MS="50")
    res = spawn(cases.dead_peer_leaves_stream_usable, 2, timeout=120, env=env, may_die=[1])
    out = res[0]
    assert out["warm_ok"], out
    kind, msg = out["error"]
    assert kind == "PeerFailureError", out
    assert "all_reduce" in msg and "rank 0" in msg and "rank 1" in msg, msg
    assert out["seconds"] < 20.0, out
    assert out["synced"], f"torch.cuda.synchronize() still blocked 30 s after the peer died: {out}"
    assert out["usable"], out


@needs_gpu
@pytest.mark.timeout(150)
def test_gpu_undrained_close_retires_pins_and_a_new_communicator_never_reuses_them(store_env):
    pytest.importorskip("torch")
    env = dict(store_env, RINGCOMM_CUDA_P2P="host", RINGCOMM_CUDA_CLOSE_WAIT="0.3")
    res = spawn(cases.retired_pins_are_never_reused, 2, timeout=120, env=env)
    for r, out in enumerate(res):
        assert out["first_ok"] and out["second_ok"], (r, out)
        assert out["before"] and all(s == "live" for _, s in out["before"]), (r, out)
        assert ("host", "live") in out["before"], (r, out)
        assert len(out["after"]) == len(out["before"]) and all(s == "retired" for _, s in out["after"]), (r, out)
        assert out["still_mapped"], (r, out)
        assert out["live2"] > 0 and not out["overlap"], (r, out)
        assert out["left2"] == 0, (r, out)      # a drained close releases everything it pinned


@needs_gpu
@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["auto", "host"])
def test_gpu_send_recv_memory_not_reused_early(mode, store_env):
    pytest.importorskip("torch")
    env = dict(store_env, RINGCOMM_CUDA_P2P=mode)
    res = spawn(cases.p2p_memory_not_reused_early, 2, timeout=120, env=env)
    assert res[0] == {"send_reused": False}, res[0]
    assert res[1] == {"send_bytes_ok": True, "recv_reused": False, "recv_released": True,
                      "recv_no_stray_write": True}, res[1]


@needs_gpu
@pytest.mark.timeout(120)
def test_gpu_info_line_names_the_control_planes_liveness_and_wait(store_env):
    env = dict(store_env, RINGCOMM_DEBUG="INFO")
    for rank, text in enumerate(spawn(cases.info_line_names_liveness_and_wait, 2, timeout=100, env=env)):
        line = next((ln for ln in text.splitlines() if "transport cuda_ipc" in ln), "")
        assert "control plane: liveness: rank" in line and "pid probe" in line, text
        assert "wait " in line and "then futex" in line, text
