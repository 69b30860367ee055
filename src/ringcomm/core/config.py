"""ringcomm's knobs: the one way Python code reads a ``RINGCOMM_*`` environment variable.

The registry is one file, csrc/common/knobs.def (name, field, type, default, accepted values,
doc, build flag per knob); C++ and Python parse every knob with the same rule, and this module
reads the registry and the values through ``ringcomm._C``. Code reads the knobs once, when the
object that uses them (a communicator, a trainer, a launch) is created, never at import, and
then uses the typed fields:

    from ringcomm.core import config
    cfg = config.read()                  # every runtime knob, parsed now (typed attributes)
    cfg.timeout, cfg.slot_bytes, cfg.algo   # 300.0, 262144, "auto" (or the environment's)
    config.knob("RINGCOMM_TIMEOUT")      # one knob by name (users, docs, the table)
    config.config()                      # {name: {"value", "default", "doc", ...}}
    python -m ringcomm.core.config       # the table: what is set, what is default

Logging: ``RINGCOMM_DEBUG=WARN|INFO|TRACE`` (default WARN). :func:`logger` returns the
``ringcomm`` Python logger set to that level, writing lines prefixed ``ringcomm[rank r/n]`` to
stderr, the same format as the C++ core's lines.
"""
import contextlib
import logging
import os
import sys
from typing import Any, Dict, Iterator, List, Mapping, Optional

__all__ = ["read", "knob", "knob_is_set", "knobs", "config", "default_timeout", "logger", "format_table",
           "format_markdown", "main", "environment"]


def _c():
    from .. import _C  # the extension loads on first use, not when ringcomm is imported
    return _C


def knobs() -> List[Dict[str, Any]]:
    """The registry: one dict per knob (name, field, type, default, choices, doc, build)."""
    return _c().knobs()


def read() -> "Knobs":
    """Every runtime knob parsed from the environment now: a ``ringcomm._C.Knobs`` whose
    read-only attributes are the registry's fields (``RINGCOMM_SLOT_BYTES`` is ``slot_bytes``),
    typed (int for int and bytes knobs, float, str; choices as spelled in the registry), each
    documented by the registry's doc. ``is_set(field)`` says whether the environment set it. A
    malformed value raises ``InvalidArgumentError`` naming the knob and what it accepts."""
    return _c().read_knobs()


def __getattr__(name):
    if name == "Knobs":  # the class, from the extension (loaded on first use, not at import)
        return _c().Knobs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def knob(name: str):
    """The current value of knob ``name`` parsed with its rule: int (int and bytes knobs, K/M/G
    suffixes accepted), float, or str (choices come back as spelled in the registry); None for an
    unset knob without a default. A malformed value raises ``InvalidArgumentError`` naming the knob
    and what it accepts; an unregistered name raises ``RingcommError``."""
    return _c().knob(name)


def knob_is_set(name: str) -> bool:
    """True when the environment sets knob ``name`` (to a non-empty value)."""
    return _c().knob_is_set(name)


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """Inside the block the process's environment holds ``env`` (knobs are read when a
    communicator is created, so one created inside reads them); afterwards every variable is as
    it was (set to its old value, or unset)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def default_timeout() -> float:
    """``RINGCOMM_TIMEOUT``: the seconds any single wait may take when no ``timeout=`` is given."""
    return read().timeout


def config() -> Dict[str, Dict[str, Any]]:
    """``{name: {"value", "default", "set", "type", "choices", "doc", "build"}}`` for every knob;
    "value" is the parsed current value (a malformed one raises, naming the knob)."""
    out = {}
    for k in knobs():
        out[k["name"]] = {"value": knob(k["name"]), "default": k["default"], "set": knob_is_set(k["name"]),
                          "type": k["type"], "choices": list(k["choices"]), "doc": k["doc"],
                          "build": bool(k["build"])}
    return out


def format_table(cfg: Optional[Dict[str, Dict[str, Any]]] = None) -> str:
    """The knob table as text: name, value, whether it is set or the default, doc."""
    cfg = config() if cfg is None else cfg
    rows = [("knob", "value", "source", "meaning")]
    for name, e in cfg.items():
        value = "" if e["value"] is None else str(e["value"])
        if e["set"]:
            source = "set"
        else:
            source = "default" if e["default"] != "" else "unset"
        if e["build"]:
            source += " (build)"
        rows.append((name, value, source, e["doc"]))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}" for r in rows)


MARKDOWN_COMMAND = "python -m ringcomm.core.config --markdown > docs/knobs.md"


def _md_cell(text: str) -> str:
    """A table cell: pipes escaped, newlines folded."""
    return " ".join(str(text).split()).replace("|", "\\|")


def format_markdown(registry: Optional[List[Dict[str, Any]]] = None) -> str:
    """docs/knobs.md: every knob of the registry (name, type, default, accepted values, doc) as
    markdown, runtime knobs first, then build knobs; ``registry`` defaults to :func:`knobs`.
    Depends on the registry alone (not on the environment), so the file is reproducible."""
    registry = knobs() if registry is None else registry
    out = [
        "# Environment knobs",
        "",
        f"<!-- Generated from the knob registry (csrc/common/knobs.def) by `{MARKDOWN_COMMAND}`;",
        "     tests/test_docs.py checks that this file equals the generated text. Do not edit by hand. -->",
        "",
        "Every tunable is an environment variable `RINGCOMM_<NAME>`, declared once in the registry",
        "`csrc/common/knobs.def`, one line per knob. From it come the C++ struct `rc::Knobs` (one typed",
        "field per runtime knob, named `<name>` in lower case: `RINGCOMM_SLOT_BYTES` is `slot_bytes`) and",
        "its Python view `ringcomm.core.config.read()`; `ringcomm.core.config.knob(name)` reads one knob by name.",
        "Each communicator (or trainer, or launch) reads the knobs once, when it is created, never at",
        "import: every runtime knob is parsed then, and a malformed value raises `InvalidArgumentError`",
        "naming the knob and what it accepts. `RINGCOMM_CPU_ISA` is read once per process, at its first",
        "reduction. Byte sizes take K/M/G suffixes (binary: `256K` = 262144); choices are",
        "case-insensitive.",
        "`python -m ringcomm.core.config` prints each knob's current value and whether it is set or the",
        "default; `ringcomm.core.config.config()` returns the same as a dict.",
        "",
    ]
    for build, title in ((False, "Runtime knobs"), (True, "Build knobs (read by setup.py)")):
        rows = [k for k in registry if bool(k["build"]) == build]
        if not rows:
            continue
        out += [f"## {title}", "", "| knob | type | default | accepted values | meaning |", "|---|---|---|---|---|"]
        for k in rows:
            default = f"`{k['default']}`" if k["default"] != "" else "unset"
            choices = ", ".join(f"`{c}`" for c in k["choices"])
            out.append(f"| `{k['name']}` | {k['type']} | {default} | {_md_cell(choices)} | {_md_cell(k['doc'])} |")
        out.append("")
    return "\n".join(out)


# ---- logging ---------------------------------------------------------------------------------
_LEVELS = {"WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": logging.DEBUG}


def logger(rank: int, world_size: int, knobs: Optional["Knobs"] = None) -> logging.LoggerAdapter:
    """The ``ringcomm`` logger at the level of ``RINGCOMM_DEBUG`` (``knobs.debug``; read now when
    ``knobs`` is None; TRACE = logging.DEBUG), its lines prefixed ``ringcomm[rank r/n]``. Also
    sets the C++ core's cached level."""
    debug = (read() if knobs is None else knobs).debug
    level = _LEVELS[debug]
    _c().set_log_level(debug)
    log = logging.getLogger("ringcomm")
    if not any(getattr(h, "_ringcomm", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        h._ringcomm = True
        log.addHandler(h)
        log.propagate = False
    log.setLevel(level)
    return _RankAdapter(log, {"prefix": f"ringcomm[rank {rank}/{world_size}]"})


class _RankAdapter(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        return f"{self.extra['prefix']} {msg}", kwargs


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m ringcomm.core.config``: print every knob, its current value and whether it is set."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m ringcomm.core.config",
                                description="ringcomm's environment knobs: current values and defaults")
    p.add_argument("--json", action="store_true", help="print config() as JSON")
    p.add_argument("--markdown", action="store_true",
                   help=f"print the registry as docs/knobs.md ({MARKDOWN_COMMAND})")
    a = p.parse_args(argv)
    if a.markdown:
        sys.stdout.write(format_markdown())
        return 0
    try:
        cfg = config()
    except ValueError as e:  # a malformed knob: say which, without a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        import json
        print(json.dumps(cfg, indent=1, sort_keys=True))
    else:
        print(format_table(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
