"""Splitting a process group on the ringcomm backend, side by side with gloo, at world 4:
``Backend.supports_splitting`` (what torch checks), ``dist.split_group`` (pairs, a split leaving
a rank out, a split of a split), DeviceMesh (2, 2) through split_group on a device-bound default
group and through new_group on an unbound one, and the eager connect torch runs for
``init_process_group(device_id=...)``. On ringcomm alone (gloo has no abort to compare with):
the split group is a communicator of its own over the sub-ranks (collectives interleaved with the
parent's, abort and shutdown that leave the parent working) and its errors.

How torch's split paths are reached on this CPU-only torch is explained in split_cases.py.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ranks import run_on_gloo_and_ringcomm  # noqa: E402

import split_cases as cases  # noqa: E402

WORLD = 4


@pytest.fixture(scope="module")
def observed():
    return run_on_gloo_and_ringcomm(cases.all_cases, WORLD, lambda b: (b,), timeout=150)


# Where gloo 2.13 fails and ringcomm keeps torch's documented contract instead: split_group
# (and DeviceMesh, which calls it without options) deep-copies the parent backend's options;
# gloo's options cannot be copied ("cannot pickle"), ringcomm's can, so those calls split.
GLOO_DEVIATIONS = {"default_options": "split"}

COMPARED = ["supports_splitting", "default_options", "no_accelerator", "eager_connect", "split_pairs",
            "split_pairs_bound", "split_three", "split_of_split", "parent_after", "mesh_split",
            "mesh_new_group"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key", COMPARED)
def test_equal_to_gloo(observed, key):
    for rank in range(WORLD):
        g, r = observed["gloo"][rank][key], observed["ringcomm"][rank][key]
        if isinstance(g, dict) and "backend" in g:   # the one field that names the backend
            assert (g["backend"], r["backend"]) == ("gloo", "ringcomm")
            g, r = ({k: v for k, v in d.items() if k != "backend"} for d in (g, r))
        if key in GLOO_DEVIATIONS:
            assert "cannot pickle" in g, g
            g = GLOO_DEVIATIONS[key]
        if key == "mesh_split":
            assert "cannot pickle" in g, g
            g = observed["gloo"][rank]["mesh_new_group"]   # the same mesh, made by new_group
        assert r == g, (rank, key, g, r)


@pytest.mark.timeout(300)
def test_values(observed):
    """What the comparison compares (gloo's behaviour, spelled out)."""
    obs = observed["ringcomm"]
    assert all(o["supports_splitting"] for o in obs)
    assert "No device associated with the default pg" in obs[0]["no_accelerator"]
    for rank, o in enumerate(obs):
        pair = [0, 1] if rank < 2 else [2, 3]
        assert o["split_pairs"] == {
            "member": True, "rank": rank % 2, "size": 2, "ranks": pair,
            "all_reduce": [float(sum(p + 1 for p in pair))] * 3,
            "all_gather": [float(p) for p in pair], "broadcast": float(pair[0]),
            "async_future": [2.0, 2.0], "backend": "ringcomm"}
        assert o["split_pairs_bound"] == "cpu:0"
        if rank < 3:
            assert o["split_three"]["ranks"] == [0, 1, 2]
            assert o["split_three"]["all_reduce"] == [6.0] * 3
        else:
            assert o["split_three"] == {"member": False}
        assert o["split_of_split"]["ranks"] == [rank] and o["split_of_split"]["size"] == 1
        assert o["parent_after"] == [6.0, 6.0]
        for mesh in ("mesh_split", "mesh_new_group"):
            rep, shard = o[mesh]["rep"], o[mesh]["shard"]
            assert rep[0] == [rank % 2, rank % 2 + 2] and rep[1] == float(2 * (rank % 2) + 2)
            assert shard[0] == [rank // 2 * 2, rank // 2 * 2 + 1]


@pytest.mark.timeout(300)
def test_ringcomm_split_is_its_own_communicator(observed):
    import torch
    for rank in range(WORLD):
        o = observed["ringcomm"][rank]["ringcomm"]
        assert o["child_type"] == "RingcommBackend"
        # the split [[0, 3], [1, 2]]
        assert o["child_comm"] == (0 if rank < 2 else 1, 2, True)
        assert o["cuda_is_cpu_backend"] and o["cuda_is_cpu_backend_2"]
        assert o["interleaved"] == ([3.0] * 4, [6.0] * 4)
        assert o["nocolor"] is None
        assert "Backend ringcomm is missing implementation of merge" in o["merge"], o["merge"]
        assert "must be distinct group ranks in [0, 4)" in o["bad_ranks"], o["bad_ranks"]
        if rank in (0, 1):
            assert o["abort"] == "aborted"
        else:
            name, msg, seconds = o["abort"]
            assert "rank 0 aborted process group" in msg, msg   # rank 0 of the pair
            assert seconds < 1.5, seconds
        assert o["parent_after_abort"] == [4.0, 4.0]
        assert o["after_shutdown"].startswith("ClosedError: ringcomm: allreduce on a process "
                                              "group that was shut down"), o["after_shutdown"]
        assert o["split_after_shutdown"].startswith("ClosedError"), o["split_after_shutdown"]
        if not torch.cuda.is_available():
            assert o["eager_cuda"].startswith("UnsupportedError: ringcomm: CUDA unavailable"), \
                o["eager_cuda"]
        assert o["parent_last"] == 4.0
