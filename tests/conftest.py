"""Shared test fixtures: every test must leave no ringcomm segment in /dev/shm and no child
process behind."""
import multiprocessing
import os

import pytest


def _segments():
    try:
        return {f for f in os.listdir("/dev/shm") if f.startswith("ringcomm-")}
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True)
def no_leaks():
    before = _segments()
    yield
    leaked = _segments() - before
    assert not leaked, f"shared-memory segments left in /dev/shm: {sorted(leaked)}"
    alive = [p for p in multiprocessing.active_children()]
    assert not alive, f"child processes left running: {alive}"
