"""The C++ layers, checked on the sources: no #include runs from a layer to one above it.

The layers, bottom to top, are folders: csrc/include (the C ABI, installed alone), csrc/common,
csrc/kernels, csrc/transport, csrc/proto, csrc/algo, csrc/comm, bindings. A file may include files
of its own layer and of the layers below it. Every ``#include "..."`` in csrc/ and bindings/ is
resolved as the compiler does (the including file's folder first, then the include directories
CMakeLists.txt gives), and so is every ``#include <...>`` that names a file of the project; a quoted
include that names no file, and a source file outside every layer, are errors too. The checker is
tried on made-up trees (a planted upward include, a relative path, an unresolved name, a folder
of no layer) and on a copy of the real tree with an upward include planted in it, and
docs/architecture.md's folder table lists the same layers in the same order.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top: (name, folders). A file in layer i may include files of layers 0..i.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("include", ("csrc/include",)),
    ("common", ("csrc/common",)),
    ("kernels", ("csrc/kernels",)),
    ("transport", ("csrc/transport",)),
    ("proto", ("csrc/proto",)),
    ("algo", ("csrc/algo",)),
    ("device", ("csrc/device",)),
    ("comm", ("csrc/comm",)),
    ("bindings", ("bindings",)),
)
# The include directories of the targets in CMakeLists.txt, in search order.
INCLUDE_DIRS = ("csrc", "csrc/include", "bindings")
SCANNED = ("csrc", "bindings")
SOURCE_SUFFIXES = {".h", ".hpp", ".cuh", ".cpp", ".cc", ".cu", ".def", ".inc"}

_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def sources(root: Path) -> list[Path]:
    return sorted(p for top in SCANNED if (root / top).is_dir()
                  for p in (root / top).rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES)


def layer_of(root: Path, path: Path) -> int | None:
    """The index in LAYERS of the layer that holds `path`, or None."""
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:  # outside the tree
        return None
    for i, (_, folders) in enumerate(LAYERS):
        if any(rel == f or rel.startswith(f + "/") for f in folders):
            return i
    return None


def includes(path: Path) -> list[tuple[int, bool, str]]:
    """(line number, quoted, name) of every #include in `path`."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        m = _INCLUDE.match(line)
        if m:
            out.append((n, m.group(1) == '"', m.group(2).strip()))
    return out


def resolve(root: Path, src: Path, name: str, quoted: bool) -> Path | None:
    """The project file `#include` names from `src`, as the compiler finds it: for a quoted name
    the including file's folder first, then the include directories; None when it names none."""
    dirs = ([src.parent] if quoted else []) + [root / d for d in INCLUDE_DIRS]
    for d in dirs:
        cand = d / name
        if cand.is_file():
            return cand.resolve()
    return None


def check(root: Path) -> tuple[list[str], int]:
    """The problems under `root` and the number of project includes checked."""
    problems, checked = [], 0
    for src in sources(root):
        rel = src.relative_to(root).as_posix()
        mine = layer_of(root, src)
        if mine is None:
            problems.append(f"{rel}: in no layer (LAYERS in {Path(__file__).name})")
            continue
        for line, quoted, name in includes(src):
            target = resolve(root, src, name, quoted)
            if target is None:
                if quoted:
                    problems.append(f'{rel}:{line}: #include "{name}" names no file of the project')
                continue
            theirs = layer_of(root, target)
            checked += 1
            if theirs is None:
                problems.append(f"{rel}:{line}: #include of {name}, which is in no layer")
            elif theirs > mine:
                problems.append(f"{rel}:{line}: {LAYERS[mine][0]} includes {name} of {LAYERS[theirs][0]}, "
                                f"a layer above it")
    return problems, checked


def test_includes_run_downward():
    problems, checked = check(ROOT)
    assert not problems, "\n".join(problems)
    assert checked > 200, f"only {checked} project includes found: the scanner misses them"


def test_every_layer_is_a_folder_with_sources():
    for name, folders in LAYERS:
        for f in folders:
            assert any((ROOT / f).rglob("*.h")) or any((ROOT / f).rglob("*.cpp")), f"layer {name}: {f} is empty"


def test_include_dirs_are_cmakes():
    """INCLUDE_DIRS is the set CMakeLists.txt gives its targets, so includes resolve as they build."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    given = set()
    for args in re.findall(r"target_include_directories\(([^)]*)\)", cmake):
        given.update(w for w in args.split()[1:] if w not in {"PUBLIC", "PRIVATE", "INTERFACE"})
    # the project's own folders; the CUDA toolkit's (${...}) and the test-only fake runtime's
    # (tests/, which no scanned file may include) are not part of the layers
    project = {w for w in given if not w.startswith("${") and not w.startswith("tests/")}
    assert project == set(INCLUDE_DIRS)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


_CLEAN = {
    "csrc/include/ringcomm/abi.h": "#pragma once\n#include <stdint.h>\n",
    "csrc/common/errors.h": '#pragma once\n#include "ringcomm/abi.h"\n',
    "csrc/kernels/k.h": '#pragma once\n#include "common/errors.h"\n',
    "csrc/transport/t.h": '#pragma once\n#include "kernels/k.h"\n#include "t_part.h"\n',
    "csrc/transport/t_part.h": "#pragma once\n",
    "csrc/proto/p.h": '#pragma once\n#include "transport/t.h"\n',
    "csrc/algo/a.h": '#pragma once\n#include "proto/p.h"\n',
    "csrc/comm/c.h": '#pragma once\n#include "algo/a.h"\n#include <vector>\n',
    "csrc/comm/c.cpp": '#include "comm/c.h"\n// #include "bindings_only.h" (a comment, not an include)\n',
    "bindings/b.h": '#pragma once\n#include "comm/c.h"\n',
    "bindings/test/t.cpp": '#include "b.h"\n#include "t_local.h"\n',
    "bindings/test/t_local.h": "#pragma once\n",
}


def test_checker_passes_a_clean_tree(tmp_path):
    problems, checked = check(_tree(tmp_path, _CLEAN))
    assert problems == []
    assert checked == 11


@pytest.mark.parametrize("planted, line, want", [
    (("csrc/algo/a.h", '#include "comm/c.h"\n'), 3, "algo includes comm/c.h of comm"),
    (("csrc/kernels/k.h", '#include <transport/t.h>\n'), 3, "kernels includes transport/t.h of transport"),
    (("csrc/algo/a.h", '#include "../comm/c.h"\n'), 3, "algo includes ../comm/c.h of comm"),
    (("csrc/include/ringcomm/abi.h", '#include "common/errors.h"\n'), 3, "include includes common/errors.h"),
    (("csrc/transport/t.h", '  #  include "proto/p.h"\n'), 4, "transport includes proto/p.h of proto"),
])
def test_checker_finds_a_planted_upward_include(tmp_path, planted, line, want):
    rel, text = planted
    files = dict(_CLEAN)
    files[rel] += text
    problems, _ = check(_tree(tmp_path, files))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{rel}:{line}: {want}"), problems


def test_checker_finds_unresolved_names_and_folders_of_no_layer(tmp_path):
    files = dict(_CLEAN)
    files["csrc/comm/c.cpp"] += '#include "comm/missing.h"\n'
    files["csrc/extra/x.h"] = '#pragma once\n'
    problems, _ = check(_tree(tmp_path, files))
    assert problems == ['csrc/comm/c.cpp:3: #include "comm/missing.h" names no file of the project',
                        f"csrc/extra/x.h: in no layer (LAYERS in {Path(__file__).name})"]


def test_a_planted_upward_include_in_the_real_tree_fails(tmp_path):
    for top in ("csrc", "bindings"):
        shutil.copytree(ROOT / top, tmp_path / top)
    ctx = tmp_path / "csrc/algo/context.h"
    ctx.write_text(ctx.read_text() + '#include "comm/trace.h"\n')
    problems, _ = check(tmp_path)
    n = len(ctx.read_text().splitlines())
    assert problems == [f"csrc/algo/context.h:{n}: algo includes comm/trace.h of comm, a layer above it"]


def test_architecture_page_lists_the_layers():
    """docs/architecture.md's folder table lists the C++ layers bottom to top, as LAYERS does."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start, end = "<!-- include-layers", "<!-- /include-layers -->"
    assert start in page and end in page, "docs/architecture.md lost its include-layers table"
    rows = [line for line in page[page.index(start):page.index(end)].splitlines() if line.startswith("| `")]
    shown = [re.match(r"\| `([^`]+)`", row).group(1).rstrip("/") for row in rows]
    shown = [f for f in shown if f.startswith(("csrc/", "bindings"))]
    layer_folders = [f for _, folders in LAYERS for f in folders]
    # A row may name a folder inside its layer's (csrc/include/ringcomm/ for csrc/include).
    as_layers = [[w for w in layer_folders if s == w or s.startswith(w + "/")] for s in shown]
    assert as_layers == [[w] for w in layer_folders], shown
