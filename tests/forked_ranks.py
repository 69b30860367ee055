"""Run ``world`` ranks of a case as fork()ed children of this process and print one line
``RESULT {"status": [...], "results": [...]}``; meant to run inside a private mount namespace
whose /dev/shm is a small tmpfs (tests/small_shm.py). fork(), not multiprocessing's spawn: spawn
keeps its result queue and semaphores in /dev/shm, so in a full /dev/shm the harness itself
would fail before any rank reports. Each rank writes its result (JSON) to a file under
``out_dir``, outside /dev/shm; the parent reports every child's exit status (a signal such as
SIGBUS as such) and kills the ranks still running after ``deadline_s``.

    python forked_ranks.py TESTS_DIR STORE OUT_DIR WORLD MODULE FUNCTION DEADLINE_S
"""
import importlib
import json
import os
import signal
import sys
import time


def main(argv):
    tests_dir, store, out_dir, world, module, function, deadline_s = argv
    world, deadline_s = int(world), float(deadline_s)
    sys.path.insert(0, tests_dir)
    os.environ["RC_TEST_STORE"] = store
    case = getattr(importlib.import_module(module), function)
    pids = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                res = case(rank, world)
                with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
                    json.dump(res, f)
                code = 0
            finally:
                os._exit(code)
        pids[pid] = rank
    status = {}
    t_end = time.monotonic() + deadline_s
    while pids and time.monotonic() < t_end:
        pid, st = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.05)
            continue
        rank = pids.pop(pid)
        status[rank] = ("signal %d" % os.WTERMSIG(st)) if os.WIFSIGNALED(st) else "exit %d" % os.WEXITSTATUS(st)
    for pid, rank in pids.items():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status[rank] = "hung"
    results = []
    for rank in range(world):
        path = os.path.join(out_dir, "rank%d.json" % rank)
        results.append(json.load(open(path)) if os.path.exists(path) else None)
    print("RESULT " + json.dumps({"status": [status[r] for r in range(world)], "results": results}))


if __name__ == "__main__":
    main(sys.argv[1:])
