"""What a call writes to file descriptor 2 (the C++ core's log lines go there, not through
sys.stderr), for tests that read the INFO line a communicator logs when it connects."""
import os
import tempfile


def capture_fd2(fn):
    """Run fn() with fd 2 redirected to a temporary file; returns (fn's result, the text written)."""
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        result = fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    return result, log.read().decode(errors="replace")
