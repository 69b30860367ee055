"""The README and docs/ stay usable: the README is short, every relative link resolves,
docs/knobs.md is the registry's generated text, every file and function docs/architecture.md
names exists, no work history (issue numbers, session names, verdicts against internal
targets, dates, before/after wording) appears in the README or docs/, and every results/ file
they cite exists."""
import re
from pathlib import Path

import pytest

from ringcomm import _C_test
from ringcomm.core import config

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 300


def _doc_files():
    return [README] + sorted(DOCS.glob("*.md"))


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _strip_code(text: str) -> str:
    """The text without fenced code blocks (commands and outputs quoted verbatim)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


# ---- README ----------------------------------------------------------------------------------

def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; at most {README_MAX_LINES}: move detail to docs/"


SECOND_STEP = "bash benchmarks/device/host_proof.sh"


def test_readme_test_command_is_the_ci_command():
    """The README's "Tests" steps are, line for line, the commands .ci/run runs after its set-up
    (``set``, ``cd`` and comments): a fresh venv, the installs and the test command."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    # the second step, after the README's command: the device protocol's long host proof
    assert ci[-1] == SECOND_STEP, ci
    ci = ci[:-1]
    assert ci[0].startswith("python3 -m venv") and ci[-1].startswith("pip install"), ci
    assert "pytest" in ci[-1], ".ci/run must end with its install and test command on one line"
    readme = README.read_text()
    tests = readme[readme.index("## Tests\n"):]
    block = re.search(r"^```bash\n(.*?)^```", tests, flags=re.S | re.M)
    assert block, "README.md's Tests section must give its steps in a bash block"
    assert block.group(1).splitlines() == ci


# ---- links -----------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _relative_links(path: Path):
    for target in _LINK.findall(_strip_code(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, in-page anchors
        yield target.split("#", 1)[0]


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_relative_links_resolve(path):
    missing = [t for t in _relative_links(path) if not (path.parent / t).exists()]
    assert not missing, f"{_rel(path)} links to files that do not exist: {missing}"


def test_link_checker_sees_links(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("[a](x.md) ![b](img/y.png) [c](https://e.org) [d](#top) [e](z.md#sec)\n"
                   "```\n[f](in_code.md)\n```\n")
    assert list(_relative_links(doc)) == ["x.md", "img/y.png", "z.md"]


# ---- knobs -----------------------------------------------------------------------------------

def test_knobs_md_is_generated_from_the_registry():
    want = config.format_markdown()
    have = (DOCS / "knobs.md").read_text()
    assert have == want, (f"docs/knobs.md differs from the knob registry; regenerate it: "
                          f"{config.MARKDOWN_COMMAND}")


def test_knobs_md_names_every_knob():
    text = (DOCS / "knobs.md").read_text()
    for k in config.knobs():
        assert f"| `{k['name']}` |" in text, k["name"]


# Environment variables the docs may name that are not runtime knobs of the product: the test
# build's knobs (csrc/common/test_knobs.def) and its compile definition.
NOT_KNOBS = {"RINGCOMM_TEST_HOOKS"} | {k["name"] for k in _C_test.test_knobs()}


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_docs_name_only_registered_knobs(path):
    """A knob renamed or removed in the registry must not live on in the prose."""
    reg = {k["name"] for k in config.knobs()}
    named = set(re.findall(r"RINGCOMM_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    unknown = sorted(named - reg - NOT_KNOBS)
    assert not unknown, f"{_rel(path)} names knobs the registry does not have: {unknown}"


# ---- architecture.md's names -----------------------------------------------------------------

_SRC_EXT = r"(?:py|pyi|cpp|cc|h|hpp|cu|cuh|c|sh|toml|txt)"
_PATH = re.compile(rf"^(?:src|csrc|bindings|tests|scripts|benchmarks|examples|docs)/[\w./-]*?(?:\.{_SRC_EXT}|/)$")
_QUALIFIED = re.compile(rf"^((?:src|csrc|bindings)/[\w./-]+\.{_SRC_EXT})::([A-Za-z_][\w]*(?:(?:::|\.)[A-Za-z_]\w*)*)$")


_BARE_MEMBER = re.compile(r"^([A-Z]\w*)::([A-Za-z_]\w*)$")  # `Class::method` without a path


def _code_spans(text: str):
    return re.findall(r"`([^`\n]+)`", _strip_code(text))


def _defines(source: str, name: str, python: bool) -> bool:
    """Whether `source` defines (or, for a C++ member, declares a body of) `name`."""
    if python:
        return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", source, re.M) is not None
    return re.search(rf"\b{re.escape(name)}\s*\(", source) is not None or \
        re.search(rf"\b(?:class|struct)\s+{re.escape(name)}\b", source) is not None


def architecture_problems(text: str, root: Path) -> list:
    problems = []
    for span in _code_spans(text):
        m = _QUALIFIED.match(span)
        if m:
            path, name = m.group(1), m.group(2)
            f = root / path
            if not f.is_file():
                problems.append(f"{span}: no file {path}")
                continue
            source = f.read_text(errors="replace")
            parts = re.split(r"::|\.", name)
            python = f.suffix == ".py"
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                if python or last:
                    ok = _defines(source, part, python)
                else:  # a C++ class or namespace qualifier: named in the file
                    ok = re.search(rf"\b{re.escape(part)}\b", source) is not None
                if not ok:
                    problems.append(f"{span}: {part!r} is not defined in {path}")
            continue
        m = _BARE_MEMBER.match(span)
        if m:
            cls, meth = m.groups()
            sources = [f.read_text(errors="replace") for d in ("csrc", "bindings") if (root / d).is_dir()
                       for f in (root / d).rglob("*") if f.suffix in (".h", ".hpp", ".cpp", ".cu")]
            if not any(f"{cls}::{meth}" in src or (re.search(rf"\b(?:class|struct)\s+{cls}\b", src)
                                                   and re.search(rf"\b{meth}\s*\(", src)) for src in sources):
                problems.append(f"{span}: no C++ class {cls} with a member {meth} in csrc/ or bindings/")
            continue
        if _PATH.match(span) and not (root / span).exists():
            problems.append(f"{span}: no such file or directory")
    return problems


def test_architecture_names_exist():
    text = (DOCS / "architecture.md").read_text()
    spans = _code_spans(text)
    assert sum(bool(_QUALIFIED.match(s)) for s in spans) >= 20, "architecture.md should trace a call by name"
    problems = architecture_problems(text, ROOT)
    assert not problems, "docs/architecture.md names what does not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_named_files_and_functions_exist(path):
    """Every doc, like architecture.md: a named repository path or qualified function exists."""
    problems = architecture_problems(path.read_text(), ROOT)
    assert not problems, f"{_rel(path)} names what does not exist:\n" + "\n".join(problems)


def test_architecture_checker_catches_stale_names(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "a.cpp").write_text("void Foo::bar(int x) {}\nclass Foo;\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("class C:\n    def run(self):\n        pass\n")
    good = "`csrc/a.cpp::Foo::bar` `src/m.py::C.run` `csrc/a.cpp` `csrc/` `Foo::bar` `path::name`"
    assert architecture_problems(good, tmp_path) == []
    bad = "`csrc/a.cpp::Foo::baz` `csrc/b.cpp::f` `src/m.py::C.stop` `csrc/gone.h` `Foo::baz` `Bar::bar`"
    assert len(architecture_problems(bad, tmp_path)) == 6


# ---- no history ------------------------------------------------------------------------------

# Work history belongs in git and CHANGELOG.md. Measurements keep their date and command.
HISTORY_PATTERNS = [
    (r"\b[Ii]ssues? #?\d+", "an issue number"),
    (r"\bsessions?\b", "a work session"),
    (r"\bthe brief\b", "the brief"),
    (r"\bitems? \d+(?: and \d+)? of\b", "items of a work order"),
    (r"[\w/.]-s\d+\b(?!-)", "a run folder named by session"),
    (r"\bNOT MET\b|\bNOT met\b", "a verdict against internal targets"),
    (r"^#+ .*(?:[Kk]nown gaps|[Tt]he plan\b|[Nn]ext steps|[Nn]ot built|[Ww]hat was not done)",
     "a notebook section"),
]


def history_hits(text: str) -> list:
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for pat, what in HISTORY_PATTERNS:
            if re.search(pat, line):
                hits.append(f"line {lineno} ({what}): {line.strip()[:120]}")
    return hits


# A page says how things work now; a figure's date lives in the results folder it cites
# (results/YYYY-MM-DD/...), and the story of how it got there lives in CHANGELOG.md.
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
          r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
NOW_PATTERNS = [
    (r"\b\d{4}-\d{2}-\d{2}\b", "a date"),
    (rf"\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?\b(?:, \d{{4}})?|\b\d{{1,2}} {_MONTH}\b|\b{_MONTH} \d{{4}}\b",
     "a date"),
    (r"\b\d{1,2}:\d{2}(?::\d{2})?(?:[-\u2013]\d{1,2}:\d{2})? UTC\b", "a time of day"),
    (r"(?i)\bno longer\b", "before/after wording"),
    (r"(?i)\bused to\b", "before/after wording"),
    (r"(?i)\bpreviously\b", "before/after wording"),
    (r"(?i)\bbefore this change\b", "before/after wording"),
    (r"(?i)\bwas changed\b", "before/after wording"),
    (r"(?i)\bwe changed\b", "before/after wording"),
]
# A citation of a results file: the path (relative or from the root) carries the run's date.
_RESULTS_PATH = re.compile(r"(?:\.\./)*\bresults/[\w.,/{}*-]*")


def now_hits(text: str) -> list:
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        bare = _RESULTS_PATH.sub("", line)
        for pat, what in NOW_PATTERNS:
            m = re.search(pat, bare)
            if m:
                hits.append(f"line {lineno} ({what}: {m.group(0)!r}): {line.strip()[:120]}")
    return hits


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_docs_say_how_things_work_now(path):
    hits = now_hits(path.read_text())
    assert not hits, (f"{_rel(path)} dates or narrates (dates belong in a results/ citation, history in "
                      f"CHANGELOG.md):\n" + "\n".join(hits))


def _assert_precise(hits, flagged, fine):
    """`hits` flags every line of `flagged` and none of `fine`."""
    for line in flagged:
        assert hits(line), line
    for line in fine:
        assert not hits(line), line


def test_now_patterns_are_precise():
    flagged = ["Measured 2026-12-02 on a VM", "run on December 3", "Dec 4, 2026", "4 December 2026",
               "in November 2026", "at 06:51 UTC", "06:51-06:54 UTC", "ringcomm no longer registers",
               "It used to spin", "Previously the ring", "before this change the header",
               "the default was changed", "We changed the slot size"]
    fine = ["[np2_b2b.txt](../results/2026-12-02/tables/np2_b2b.txt)", "`results/2026-12-04/device/`",
            "results/2026-12-03/model_check/profile_epyc.json", "16 MiB", "1-2 MiB", "x86-64",
            "the longer wait", "the ranks use the slots", "sizes 2^10 to 2^26", "May raise",
            "a 2-vCPU VM", "p90/p50 of 1.4-1.9", "RINGCOMM_SPIN_US=50", "the model makes now"]
    _assert_precise(now_hits, flagged, fine)


_CITED = re.compile(r"(?:\.\./)*\bresults/[\w./-]*[\w/]")


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_cited_results_exist(path):
    """Every results/ path a page names (outside brace or glob patterns) exists."""
    missing = []
    for m in _CITED.finditer(path.read_text()):
        token, after = m.group(0), path.read_text()[m.end():m.end() + 1]
        if after in "{*":
            continue
        target = (path.parent / token) if token.startswith("../") else (ROOT / token.lstrip("./"))
        if not target.exists():
            missing.append(token)
    assert not missing, f"{_rel(path)} cites results that do not exist: {missing}"


def test_results_index_lists_every_run():
    """results/README.md has a row per run folder (results/DATE/RUN/), and each row's folder exists."""
    index = (ROOT / "results" / "README.md").read_text()
    listed = set(re.findall(r"\[`?(\d{4}-\d{2}-\d{2}/[\w.-]+)/?`?\]", index))
    runs = {f"{d.name}/{r.name}" for d in (ROOT / "results").iterdir() if d.is_dir() for r in d.iterdir()
            if r.is_dir()}
    assert runs <= listed, f"results/README.md lists no row for: {sorted(runs - listed)}"
    assert listed <= runs, f"results/README.md lists folders that do not exist: {sorted(listed - runs)}"


@pytest.mark.parametrize("path", _doc_files(), ids=_rel)
def test_no_history_in_readme_and_docs(path):
    hits = history_hits(path.read_text())
    assert not hits, f"{_rel(path)} carries history (it belongs in git or CHANGELOG.md):\n" + "\n".join(hits)


def test_history_patterns_are_precise():
    flagged = ["fixed in issue 4", "Issue 14's targets", "measured in session 1", "items 2 and 3 of the brief",
               "see results/2026-12-01-s7/", "target: NOT MET", "### Known gaps and the plan",
               "## What was not done (next steps)", "### Not built: the two-shot"]
    fine = ["an issue hook sees the collectives", "ranks that issue random collectives",
            "np2_b2b.json", "-s 4", "results/2026-12-02/tables/np4_b2b.txt", "the first 2 items",
            "x86-64", "sm_80, sm_90", "RINGCOMM_SPIN_US=2", "it was not met"]
    _assert_precise(history_hits, flagged, fine)
