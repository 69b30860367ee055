"""Every command a page cites can be run again: the script or module it names exists, and its
arguments parse.

The pages: README.md, docs/*.md, benchmarks/README.md and results/README.md. A command is a code
span or a line of a fenced block that runs `python SCRIPT ...`, `python -m ringcomm.MODULE ...`,
`bash SCRIPT ...`, a script path (`benchmarks/report/bench_tables.sh OUTDIR`) or a console
script of pyproject.toml (`ringcomm-bench ...`). Its arguments go through the script's own
argparse parser, without running anything: a Python script exposes `build_parser()`, a module run
with `-m` exposes it in itself or in its `cli` submodule (a command line whose parser depends on
its arguments exposes `parser_for(argv)` instead; a module that only has `main(argv)` is asked for
the parser its `main` builds). A shell script must exist and pass `bash -n`.

How a page writes a command it means generically:
- `a|b` (also `\\|` in a table, `<a|b>`) is a choice: each alternative is checked;
- `[--load 1]` is an optional part: checked as given;
- an upper-case word (`N`, `FILE`, `BYTES`, `<MIN>`) is a placeholder: `PLACEHOLDERS` gives the
  value it is checked with, else it is passed as written; in a path it matches any file
  (`benchmarks/probes/NAME.py`);
- `...` stands for more arguments, or for an option's value;
- env assignments (`RINGCOMM_X=1`), `chrt -f 20`, `nice -n 5`, `timeout 900` before the command,
  and redirections after it, are not the script's arguments.

A run made by a script that no longer exists is cited by the commit that holds it (`git show
COMMIT:scripts/x.py`), never as a command."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pages() -> list[Path]:
    return ([ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
            + [ROOT / "benchmarks" / "README.md", ROOT / "results" / "README.md"])


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


# Values a placeholder is checked with, where the parser types it.
PLACEHOLDERS = {"N": "4", "T": "4", "M": "1", "WORLD": "2", "BYTES": "1024", "CALLS": "1000", "S": "1", "US": "50",
                "<MIN>": "1K", "<MAX>": "1M", "EPOCH:INDEX": "0:0"}
_PLACEHOLDER = re.compile(r"^(?:<[A-Z][A-Z0-9_]*>|[A-Z][A-Z0-9_]*(?::[A-Z][A-Z0-9_]*)?(?:\.\w+)?)$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")
# Wrappers before a command: the number of arguments each takes after its options.
_WRAPPERS = {"chrt": 1, "nice": 0, "timeout": 1, "taskset": 1, "env": 0, "time": 0, "exec": 0}


@dataclass
class Command:
    page: str
    line: int
    text: str
    kind: str = ""          # "script" (a .py file), "shell" (a .sh file), "module"
    target: str = ""        # the path as written, or the module name
    args: list = field(default_factory=list)

    def __str__(self):
        return f"{self.page}:{self.line}: {self.text}"


# ---- extraction --------------------------------------------------------------------------------

def _code_texts(text: str):
    """(line number, code) for every line of a fenced block (backslash continuations joined) and
    every inline code span (which may run over a line break)."""
    out = []
    fence = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```[^\n]*$", re.S | re.M)
    for m in fence.finditer(text):
        first = text.count("\n", 0, m.start(1)) + 1
        lines = m.group(1).split("\n")
        i = 0
        while i < len(lines):
            start, buf = i, lines[i]
            while buf.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                buf = buf.rstrip()[:-1] + " " + lines[i].strip()
            out.append((first + start, buf))
            i += 1
    prose = fence.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in re.finditer(r"`([^`]+)`", prose):
        span = m.group(1)
        if "\n\n" in span:
            continue
        out.append((prose.count("\n", 0, m.start()) + 1, span.replace("\n", " ")))
    return out


def _split(code: str):
    """The shell commands of one line of code: split at `;`, `&&`, `||` and pipes, comments
    dropped, a leading `do` or `then` dropped; tokens as the shell splits them."""
    for part in re.split(r";|&&|\|\||\s\|\s", code.replace("\\|", "|")):
        try:
            tokens = shlex.split(part, comments=True)
        except ValueError:
            tokens = part.split()
        if tokens[:1] in (["do"], ["then"]):
            tokens = tokens[1:]
        if tokens:
            yield tokens


def _strip_prefix(tokens: list) -> list:
    """The command without env assignments and wrappers (`chrt -f 20`, `nice -n 5`)."""
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if _ENV.match(t):
            i += 1
        elif t in _WRAPPERS:
            i += 1
            while i < len(tokens) and tokens[i].startswith("-"):
                i += 2 if tokens[i] in ("-n", "-c", "-s", "-k") else 1
            i += _WRAPPERS[t]
        else:
            break
    return tokens[i:]


def _console_scripts() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


CONSOLE = _console_scripts()


def _classify(tokens: list, console: dict):
    """(kind, target, args) of a command this test checks, or None."""
    prefixed = _strip_prefix(tokens)
    if not prefixed:
        return None
    word, rest = prefixed[0], prefixed[1:]
    if _PYTHON.match(word):
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            if rest[0] == "-c":
                return None
            rest = rest[1:]
        if not rest:
            return None
        if rest[0] == "-m":
            if len(rest) < 2 or not rest[1].startswith("ringcomm"):
                return None  # another package's module (pytest, pip)
            return "module", rest[1], rest[2:]
        word, rest = rest[0], rest[1:]
        return ("script" if word.endswith(".py") else "shell" if word.endswith(".sh") else "other"), word, rest
    if word in ("bash", "sh"):
        rest = [t for t in rest if not t.startswith("-")]
        return ("shell", rest[0], rest[1:]) if rest else None
    if word in console:
        return "module", console[word], rest
    # a path run as a command; alone in a span it is only a file's name
    if "/" in word and re.search(r"\.(?:py|sh)$", word) and not word.startswith("/") \
            and (rest or len(prefixed) < len(tokens)):
        return ("script" if word.endswith(".py") else "shell"), word, rest
    return None


def extract(text: str, page: str = "page") -> list:
    console = CONSOLE
    found = []
    for line, code in _code_texts(text):
        for tokens in _split(code):
            c = _classify(tokens, console)
            if c:
                found.append(Command(page, line, " ".join(tokens), *c))
    return found


# ---- checking ----------------------------------------------------------------------------------

def _script_paths(target: str) -> list:
    """The files a cited path names: a placeholder component (`NAME.py`) matches any."""
    parts = []
    for part in target.split("/"):
        stem, dot, ext = part.partition(".")
        parts.append(("*" + dot + ext) if _PLACEHOLDER.match(stem) and stem.upper() == stem else part)
    pattern = "/".join(parts)
    if "*" in pattern:
        return sorted(ROOT.glob(pattern))
    p = ROOT / target
    return [p] if p.is_file() else []


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def _parser_from_main(main) -> argparse.ArgumentParser:
    """The parser `main(argv)` builds: the first ArgumentParser it asks to parse."""
    real = argparse.ArgumentParser.parse_args

    def capture(self, *a, **k):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture
    try:
        main([])
    except _Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_args = real
    raise AssertionError(f"{main.__module__}.main built no parser")


_PARSERS: dict = {}


def _load_script(path: Path):
    name = "_doc_cmd_" + re.sub(r"\W", "_", str(path.relative_to(ROOT)))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def parser_for(kind: str, target, argv=()) -> argparse.ArgumentParser:
    """The parser that `argv` meets: the script's or module's (see the module docstring)."""
    key = (kind, str(target))
    if key not in _PARSERS:
        _PARSERS[key] = _parser_source(kind, target)
    return _PARSERS[key](list(argv))


def _fixed(parser):
    return lambda argv: parser


def _parser_source(kind: str, target):
    if kind == "script":
        mod = _load_script(target)
        if hasattr(mod, "parser_for"):
            return mod.parser_for
        if not hasattr(mod, "build_parser"):
            raise AssertionError(f"{_rel(target)} has no build_parser(): expose its argparse parser")
        return _fixed(mod.build_parser())
    mods = [m for m in (target, target + ".cli") if _find(m)]
    spec = _find(target)
    if spec is not None and spec.submodule_search_locations is not None:
        main_spec = _find(target + ".__main__")
        if main_spec and 'if __name__ == "__main__"' in Path(main_spec.origin).read_text():
            mods.append(target + ".__main__")
    for name in mods:
        mod = importlib.import_module(name)
        if hasattr(mod, "parser_for"):
            return mod.parser_for
        if hasattr(mod, "build_parser"):
            return _fixed(mod.build_parser())
    for name in reversed(mods):
        main = getattr(importlib.import_module(name), "main", None)
        if callable(main):
            return _fixed(_parser_from_main(main))
    raise AssertionError(f"python -m {target}: no build_parser() and no main(argv)")


def _find(name: str):
    """The module's spec, or None (also where a parent is not a package)."""
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _takes_value(parser: argparse.ArgumentParser, option: str) -> bool:
    action = parser._option_string_actions.get(option.split("=", 1)[0])
    return action is not None and action.nargs != 0 and "=" not in option


def arg_variants(args: list, parser: argparse.ArgumentParser) -> list:
    """The argument lists a generic command stands for (see the module docstring)."""
    out, i = [], 0
    while i < len(args):
        t = args[i]
        if re.match(r"^(?:\d?>>?|<)$", t):   # a redirection and its file
            i += 2
            continue
        if re.match(r"^(?:\d?>|<(?!.*>$))", t):      # 2>&1, >file, <file (not a <PLACEHOLDER>)
            i += 1
            continue
        if t == "...":
            if out and out[-1][0].startswith("-") and _takes_value(parser, out[-1][0]):
                out.append(["X"])
            i += 1
            continue
        t = t.strip("[]")
        if t.endswith("...") and len(t) > 3:
            t = t[:-3]
        if not t:
            i += 1
            continue
        if t.startswith("<") and t.endswith(">") and "|" in t:
            t = t[1:-1]
        alts = [PLACEHOLDERS.get(a, a) for a in t.split("|")] if "|" in t and not t.startswith("-") else \
            [PLACEHOLDERS.get(t, t)]
        out.append(alts)
        i += 1
    n = max((len(a) for a in out), default=1)
    return [[a[min(k, len(a) - 1)] for a in out] for k in range(n)]


def parse_problem(parser: argparse.ArgumentParser, args: list):
    """None if `args` parse (or ask for help), else argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as e:
        if e.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


def problems(cmds: list) -> list:
    out = []
    for c in cmds:
        if c.kind == "other":
            out.append(f"{c}: python runs {c.target}, not a .py script")
            continue
        if c.kind == "module":
            if _find(c.target) is None:
                out.append(f"{c}: no module {c.target}")
                continue
            targets = [c.target]
        else:
            targets = _script_paths(c.target)
            if not targets:
                out.append(f"{c}: no file {c.target}")
                continue
        for t in targets:
            if c.kind == "shell":
                r = subprocess.run(["bash", "-n", str(t)], capture_output=True, text=True)
                if r.returncode:
                    out.append(f"{c}: {_rel(t)} does not parse as bash: {r.stderr.strip()}")
                continue
            try:
                parser = parser_for(c.kind, t, c.args)
            except AssertionError as e:
                out.append(f"{c}: {e}")
                continue
            for args in arg_variants(c.args, parser):
                msg = parse_problem(parser_for(c.kind, t, args), args)
                if msg:
                    out.append(f"{c}: {' '.join(args)!r} does not parse: {msg}")
    return out


# ---- the tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("page", pages(), ids=_rel)
def test_cited_commands_run(page):
    cmds = extract(page.read_text(), _rel(page))
    found = problems(cmds)
    assert not found, f"{_rel(page)} cites commands that cannot run as written:\n" + "\n".join(found)


def test_pages_cite_commands():
    """The extractor sees the pages' commands (a silent extractor would pass every page)."""
    cmds = [c for p in pages() for c in extract(p.read_text(), _rel(p))]
    kinds = {c.kind for c in cmds}
    assert len(cmds) >= 60 and {"script", "module", "shell"} <= kinds, (len(cmds), kinds)


def test_extraction_reads_every_form():
    text = ("Run `python -m ringcomm.bench -np 2\n--ops all_reduce` (a span over a line break),\n"
            "| a | `RINGCOMM_X=0\\|1 python benchmarks/ab/arrival_skew.py -np 2\\|4` |\n"
            "```bash\n"
            "chrt -f 20 python benchmarks/ab/cpu_threads_ab.py --threads 2 \\\n"
            "    --sizes 1M   # a comment\n"
            "ringcomm-bench --quick; bash benchmarks/device/device_check.sh\n"
            "OUT=DIR benchmarks/report/bench_tables.sh OUTDIR > log.txt\n"
            "pip install -e . && python -m pytest -q\n"
            "```\n")
    got = [(c.kind, c.target, c.args) for c in extract(text)]
    assert got == [
        ("script", "benchmarks/ab/cpu_threads_ab.py", ["--threads", "2", "--sizes", "1M"]),
        ("module", "ringcomm.bench.cli", ["--quick"]),
        ("shell", "benchmarks/device/device_check.sh", []),
        ("shell", "benchmarks/report/bench_tables.sh", ["OUTDIR", ">", "log.txt"]),
        ("module", "ringcomm.bench", ["-np", "2", "--ops", "all_reduce"]),
        ("script", "benchmarks/ab/arrival_skew.py", ["-np", "2|4"]),
    ], got


def test_checker_catches_bad_paths_and_flags():
    good = ("`python benchmarks/ab/arrival_skew.py -np N --separator none|gloo [--load 1] --json FILE`\n"
            "`python benchmarks/report/check_model.py --profile P --json ... --out /dev/null`\n"
            "`python -m ringcomm.bench -np 2 -b 1K -e 64K`; `python -m ringcomm.core.config --markdown`\n"
            "`python benchmarks/probes/NAME.py --help`; `python benchmarks/ab/ab_compare.py --paired A.json -- B.json`\n")
    assert problems(extract(good)) == []
    bad = ["`python scripts/bind_tails.py -np 2`",                            # a script that moved
           "`python benchmarks/ab/arrival_skew.py --budget 0.2`",             # a flag it lacks
           "`python benchmarks/ab/arrival_skew.py --separator gloo|barrier`",  # one choice it lacks
           "`python benchmarks/ab/cpu_threads_ab.py --threads two`",          # a value of the wrong type
           "`python -m ringcomm.bench --no-such-flag`",                       # a module's bad flag
           "`python -m ringcomm.nothing_here`",                               # no such module
           "`ringcomm-bench -np`",                                            # a console script, no value
           "`bash benchmarks/device/no_such_check.sh`",                       # no such shell script
           "`python benchmarks/ab/ab_compare.py A.json B.json`"]              # a parser's own check
    for line in bad:
        assert len(problems(extract(line))) == 1, line


def test_a_script_without_a_parser_is_named(tmp_path, monkeypatch):
    script = tmp_path / "benchmarks" / "x.py"
    script.parent.mkdir()
    script.write_text("import sys\nif __name__ == '__main__':\n    print(sys.argv)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = problems(extract("`python benchmarks/x.py --a`"))
    assert len(found) == 1 and "build_parser" in found[0], found
