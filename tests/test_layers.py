"""The package's layers (``ringcomm._layers``) and size limits, checked on the source.

Every module under src/ringcomm is parsed with ast; every import counts, at module level and
inside functions, relative and absolute, and ``importlib.import_module`` with a literal name.
Checked: every module has a layer and sits in its layer's folder; no chain of imports leads from a module back to itself; each
layer imports only from its own layer and those below; the core imports a back end only where
``_layers.CORE_TO_BACK_END`` says it chooses it, and no back end imports another; no source file
under src/ is longer than 700 lines. The checker itself is tested on small made-up sources, so a
broken resolver cannot pass the real checks by seeing no imports.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ringcomm
from ringcomm import _layers

PKG_DIR = Path(ringcomm.__file__).resolve().parent
SRC_DIR = PKG_DIR.parent
MAX_LINES = 700
SOURCE_SUFFIXES = (".py", ".pyi", ".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh")
# The compiled extensions (ringcomm._C, ringcomm._C_cuda) import no module of the package.
COMPILED = re.compile(r"^_C(_\w+)?$")


# ---------------------------------------------------------------------------------------------
# The checker: modules, their imports, cycles.

def find_modules(pkg_dir: Path, package: str, folders=()) -> dict[str, tuple[Path, bool]]:
    """{dotted name: (path, is a package's __init__)} for every .py file under pkg_dir. A file
    under one of ``folders`` (the layer folders on the package's __path__) is a module of the
    package itself: ``core/front.py`` is ``<package>.front``; the folder's own __init__.py is
    ``<package>.<folder>``. A name found twice raises (one file would shadow the other)."""
    mods = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = list(path.relative_to(pkg_dir).with_suffix("").parts)
        if len(rel) > 2 and rel[0] in folders or len(rel) == 2 and rel[0] in folders and rel[1] != "__init__":
            rel.pop(0)
        parts = [package, *rel]
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        name = ".".join(parts)
        if name in mods:
            raise ValueError(f"{name} is both {mods[name][0]} and {path}")
        mods[name] = (path, is_pkg)
    return mods


def _absolute(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    if level - 1 > len(base) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(module: str, source: str, is_pkg: bool, package: str, known) -> list[tuple[str, int]]:
    """[(imported module, line)] for every import of the package's modules in ``source``:
    module level and inside functions; ``from X import y`` names module X.y where y is a module,
    else X; literal ``importlib.import_module(...)`` calls too. Names that are neither a known
    module nor a compiled extension come back as they are (``unresolved`` reports them)."""
    out = []

    def add(target, line):
        if target == package or target.startswith(package + "."):
            if not COMPILED.match(target.rsplit(".", 1)[-1]):
                out.append((target, line))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_pkg, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known or COMPILED.match(alias.name) else base, node.lineno)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                name = arg.value
                if name.startswith("."):
                    level = len(name) - len(name.lstrip("."))
                    name = _absolute(module, is_pkg, level, name.lstrip(".") or None)
                add(name, node.lineno)
    return out


def _is_import_module(func) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id == "import_module")


def import_graph(pkg_dir: Path, package: str, folders=()) -> dict[str, list[tuple[str, int]]]:
    """{module: [(imported module, line)]}, a module's imports of itself left out."""
    mods = find_modules(pkg_dir, package, folders)
    graph = {}
    for name, (path, is_pkg) in mods.items():
        found = imports_of(name, path.read_text(encoding="utf-8"), is_pkg, package, mods)
        graph[name] = sorted({(t, line) for t, line in found if t != name})
    return graph


def unresolved(graph) -> list[str]:
    return [f"{m}:{line} imports {t}, which is no module of the package"
            for m, edges in graph.items() for t, line in edges if t not in graph]


def find_cycles(graph) -> list[list[tuple[str, int]]]:
    """One cycle per strongly connected component of more than one module, as
    [(module, line of its import of the next one)], the last importing the first."""
    succ = {m: sorted({t for t, _ in edges if t in graph}) for m, edges in graph.items()}
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    counter = 0
    for root in graph:                      # Tarjan, iteratively (no recursion limit)
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(set(comp))
    cycles = []
    for comp in comps:
        start = min(comp)
        # shortest path start -> ... -> start inside the component (BFS)
        prev, frontier, end = {}, [start], None
        while frontier and end is None:
            nxt = []
            for v in frontier:
                for w in succ[v]:
                    if w not in comp:
                        continue
                    if w == start:
                        end = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if end is not None:
                    break
            frontier = nxt
        path = [end]
        while path[-1] != start:
            path.append(prev[path[-1]])
        path.reverse()
        lines = {(m, t): line for m, edges in graph.items() for t, line in edges}
        cycles.append([(m, lines[(m, path[(i + 1) % len(path)])]) for i, m in enumerate(path)])
    return cycles


def cycle_text(cycle) -> str:
    return " -> ".join(f"{m} (line {line})" for m, line in cycle) + f" -> {cycle[0][0]}"


def layer_violations(graph, layers=_layers) -> list[str]:
    bad = []
    for m, edges in graph.items():
        lm = layers.layer_of(m)
        for t, line in edges:
            lt = layers.layer_of(t)
            if lm is None or lt is None:
                continue                       # reported by test_every_module_has_a_layer
            if lt > lm:
                bad.append(f"{m}:{line} (layer {lm}, {layers.LAYER_NAMES[lm]}) imports {t} "
                           f"(layer {lt}, {layers.LAYER_NAMES[lt]})")
            elif lt == lm == 0:
                bm, bt = layers.back_end_of(m), layers.back_end_of(t)
                if bt is None or bm == bt:
                    continue
                if bm is not None:
                    bad.append(f"{m}:{line}: the {bm} back end imports another back end, {t}")
                elif (m[len(layers.PACKAGE) + 1:], bt) not in layers.CORE_TO_BACK_END:
                    bad.append(f"{m}:{line}: the core imports the {bt} back end ({t}); the core "
                               f"chooses a back end only at _layers.CORE_TO_BACK_END's points")
    return bad


# ---------------------------------------------------------------------------------------------
# The package.

FOLDERS = tuple(_layers.LAYER_FOLDERS.values())
MAX_ENTRIES = 12


@pytest.fixture(scope="module")
def graph():
    return import_graph(PKG_DIR, _layers.PACKAGE, FOLDERS)


def test_the_package_has_its_modules(graph):
    assert {"ringcomm", "ringcomm.api", "ringcomm.host", "ringcomm.bench.cli",
            "ringcomm.torch.backend", "ringcomm.train.cli"} <= set(graph)
    assert sum(len(edges) for edges in graph.values()) > 100


def test_every_module_has_a_layer(graph):
    assert [m for m in graph if _layers.layer_of(m) is None] == []
    for names in _layers.LAYERS.values():       # and every name in the table is a module
        for name in names:
            assert f"{_layers.PACKAGE}.{name}" in graph, f"_layers names {name}, no such module"


def test_every_module_sits_in_its_layers_folder(graph):
    misplaced = []
    for m, (path, _) in find_modules(PKG_DIR, _layers.PACKAGE, FOLDERS).items():
        folder = _layers.folder_of(m)
        rel = path.relative_to(PKG_DIR).parts
        if m[len(_layers.PACKAGE) + 1:] in FOLDERS:
            continue                                   # a layer folder's own docstring module
        first = rel[0] if len(rel) > 1 else ""
        if _layers.back_end_of(m) is not None:         # a back end: its own subpackage or file
            ok = first in ("", _layers.back_end_of(m))
        else:
            ok = first == folder
        if not ok:
            misplaced.append(f"{m} is {path.relative_to(PKG_DIR)}, its layer's folder is {folder!r}/")
    assert not misplaced, "\n".join(misplaced)


def test_layer_folders_are_on_the_package_path_and_name_their_layer():
    import importlib
    for layer, folder in _layers.LAYER_FOLDERS.items():
        assert str(PKG_DIR / folder) in ringcomm.__path__
        doc_module = importlib.import_module(f"{_layers.PACKAGE}.{folder}")
        assert doc_module.__path__ == []               # no second name for the folder's modules
        assert doc_module.__doc__.startswith(f"Layer {layer}, ")
        assert f"ringcomm.{folder}.<name>" in doc_module.__doc__
    with pytest.raises(ImportError):
        importlib.import_module("ringcomm.core.front")
    for back_end in ("cuda", "hier", "torch"):
        doc = importlib.import_module(f"ringcomm.{back_end}").__doc__ or ""
        assert "back end" in doc and "import" in doc, f"ringcomm.{back_end}'s docstring names no layer"


def test_the_package_folder_holds_at_most_twelve_entries():
    import subprocess
    listed = subprocess.run(["git", "ls-files", "--", "."], cwd=PKG_DIR, capture_output=True,
                            text=True)
    if listed.returncode != 0 or not listed.stdout:
        pytest.skip("not a git checkout: the tracked entries cannot be listed")
    entries = sorted({line.split("/", 1)[0] for line in listed.stdout.splitlines()})
    assert len(entries) <= MAX_ENTRIES, entries


def test_every_import_resolves(graph):
    assert unresolved(graph) == []


def test_no_import_cycle(graph):
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycle_text(c) for c in cycles)


def test_each_layer_imports_only_its_own_and_below(graph):
    bad = layer_violations(graph)
    assert not bad, "\n".join(bad)


def test_source_files_at_most_700_lines():
    long = []
    for path in sorted(SRC_DIR.rglob("*")):
        if path.suffix in SOURCE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
            with path.open("rb") as f:
                n = sum(1 for _ in f)
            if n > MAX_LINES:
                long.append(f"{path.relative_to(SRC_DIR)}: {n} lines")
    assert not long, f"files over {MAX_LINES} lines: {long}"


# ---------------------------------------------------------------------------------------------
# The checker on made-up sources: it sees what it must see.

def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_checker_sees_every_kind_of_import(tmp_path):
    root = _fake_package(tmp_path, {
        "__init__.py": "from . import a\n",
        "a.py": "import pkg.sub.b\nfrom ._C import x\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from ..c import name\n    from . import d\n",
        "sub/d.py": "import importlib\nm = importlib.import_module('..c', __package__)\n",
        "c.py": "def g():\n    from .sub import b\n    import importlib\n"
                "    importlib.import_module('pkg.a')\n",
    })
    g = import_graph(root, "pkg")
    targets = {m: {t for t, _ in edges} for m, edges in g.items()}
    assert targets["pkg"] == {"pkg.a"}
    assert targets["pkg.a"] == {"pkg.sub.b"}                  # the compiled _C is a leaf
    assert targets["pkg.sub.b"] == {"pkg.c", "pkg.sub.d"}     # inside a function, relative
    assert targets["pkg.sub.d"] == {"pkg.c"}                  # import_module, relative
    assert targets["pkg.c"] == {"pkg.sub.b", "pkg.a"}
    cycles = find_cycles(g)
    assert len(cycles) == 1
    members = {m for m, _ in cycles[0]}
    assert members <= {"pkg.a", "pkg.sub.b", "pkg.c"} and len(members) >= 2
    text = cycle_text(cycles[0])
    assert text.count("->") == len(cycles[0]) and "line" in text
    assert unresolved(g) == []


def test_checker_reports_unknown_modules_and_layer_breaks(tmp_path):
    root = _fake_package(tmp_path, {
        "__init__.py": "", "core.py": "from .apps import run\n", "apps.py": "from . import core\n",
        "bad.py": "from .nowhere import x\n",
    })
    g = import_graph(root, "pkg")
    assert unresolved(g) == ["pkg.bad:1 imports pkg.nowhere, which is no module of the package"]

    class Layers:
        PACKAGE = "pkg"
        LAYER_NAMES = {0: "core", 2: "applications"}
        CORE_TO_BACK_END = {}

        @staticmethod
        def layer_of(m):
            return {"pkg.core": 0, "pkg.apps": 2}.get(m)

        @staticmethod
        def back_end_of(m):
            return None

    bad = layer_violations(g, Layers)
    assert bad == ["pkg.core:1 (layer 0, core) imports pkg.apps (layer 2, applications)"]
    assert [len(c) for c in find_cycles(g)] == [2]


def test_checker_reads_layer_folders_as_the_package(tmp_path):
    root = _fake_package(tmp_path, {
        "__init__.py": "", "lib/__init__.py": '"""doc"""\n', "lib/a.py": "from . import b\n",
        "lib/b.py": "", "apps/__init__.py": "", "apps/tool/__init__.py": "",
        "apps/tool/cli.py": "from pkg.a import x\nfrom ..b import y\n",
    })
    g = import_graph(root, "pkg", ("lib", "apps"))
    assert set(g) == {"pkg", "pkg.lib", "pkg.apps", "pkg.a", "pkg.b", "pkg.tool", "pkg.tool.cli"}
    assert {t for t, _ in g["pkg.a"]} == {"pkg.b"}
    assert {t for t, _ in g["pkg.tool.cli"]} == {"pkg.a", "pkg.b"}
    (root / "b.py").write_text("")                     # the same name beside the folder: refused
    with pytest.raises(ValueError, match="pkg.b is both"):
        find_modules(root, "pkg", ("lib", "apps"))


def test_back_end_rule():
    g = {"ringcomm.api": [("ringcomm.hier", 50)], "ringcomm.host": [("ringcomm.torch.extension", 53)],
         "ringcomm.hier.gloo_engine": [("ringcomm.torch.core", 9), ("ringcomm.work", 8)],
         "ringcomm.hier": [], "ringcomm.torch.extension": [], "ringcomm.torch.core": [],
         "ringcomm.work": []}
    bad = layer_violations(g)
    assert len(bad) == 2, bad
    assert bad[0].startswith("ringcomm.host:53: the core imports the torch back end")
    assert bad[1].startswith("ringcomm.hier.gloo_engine:9: the hier back end imports another")


def test_architecture_page_shows_the_folders_as_declared():
    """docs/architecture.md's folder table says what _layers.py says: each layer's folders and
    modules, so the page a reader opens first cannot drift from the rules the checks enforce."""
    page = (SRC_DIR.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    start, end = "<!-- layer-folders", "<!-- /layer-folders -->"
    assert start in page and end in page, "docs/architecture.md lost its layer-folders table"
    rows = [line for line in page[page.index(start):page.index(end)].splitlines()
            if line.startswith("| ") and not line.startswith("| layer ")]
    seen = {}
    for row in rows:
        layer, folders, modules, _ = [c.strip() for c in row.strip("|").split("|")]
        number = int(layer.split()[0])
        names = {m.strip() for m in modules.split(",")}
        dirs = set(re.findall(r"`src/ringcomm/([\w/]+)/`", folders))
        if "back ends" in layer:
            assert names == set(_layers.BACK_ENDS), row
            assert dirs == {b for b in _layers.BACK_ENDS if (PKG_DIR / b).is_dir()}, row
        else:
            assert dirs == {_layers.LAYER_FOLDERS[number]}, row
            expected = set(_layers.LAYERS[number]) - set(_layers.BACK_ENDS) - {"_layers"}
            assert names == expected, f"{row}: _layers says {sorted(expected)}"
        seen.setdefault(number, set()).update(names)
    assert set(seen) == set(_layers.LAYERS)
