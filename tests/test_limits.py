"""Size limits that keep the sources readable: no source file in csrc/, bindings/ or src/ over 700
lines, and the shm transport's implementation files (csrc/transport/shm*.cpp, one concern each)
under 500."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".cpp", ".h", ".cu", ".cuh", ".hpp", ".c"}


def _lines(p):
    return len(p.read_text(errors="replace").splitlines())


def _sources(*dirs):
    for d in dirs:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES and "build" not in p.relative_to(ROOT).parts:
                yield p


def test_no_source_file_over_700_lines():
    files = list(_sources("csrc", "bindings", "src"))
    assert len(files) > 50, "the sources were not found"
    big = {str(p.relative_to(ROOT)): n for p in files if (n := _lines(p)) > 700}
    assert not big, f"source files over 700 lines: {big}"


def test_shm_transport_files_under_500_lines():
    files = sorted((ROOT / "csrc" / "transport").glob("shm*.cpp"))
    # configuration, segment, liveness, waits, slots, header board, doorbell, the Channel adapter
    assert len(files) >= 7, [p.name for p in files]
    big = {p.name: n for p in files if (n := _lines(p)) >= 500}
    assert not big, f"shm transport files of 500 lines or more: {big}"
