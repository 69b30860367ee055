"""Running one of ringcomm's command-line entry points as a child process from a test.

The child gets this checkout's ``src/`` first on ``PYTHONPATH`` and its own session: on a timeout
the whole process group (the CLI and every rank it spawned) is killed, so no process outlives the
call, and the test fails with the CLI's output so far.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def run_module(module: str, args, timeout: float) -> tuple[int, str]:
    """``python -m module *args``; returns (exit status, stdout and stderr together)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"python -m {module} {' '.join(args)} took over {timeout} s:\n{out}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, out
