"""Several runs of ``torch_apart.py`` summed up: per size and peer, the median over the runs of each
quantile (µs) and of each ratio to DeepSpeed's op, for the call and for the part after the last
arrival. The issue-style figure "median of the runs' ratios" is the ratio column; beside it, in how
many runs that peer's call p50 was above DeepSpeed's (ratio > 1). The files must be runs of one
command: runs that differ in what torch_apart.py records of its command (ranks, dtype, load,
sizes, peers, calls, warm-up, OMP threads, each rank's CPUs, the RINGCOMM_ settings, and its
arguments but --json where it records them) are refused.

    python benchmarks/probes/apart_summary.py results/2026-12-05/direct_call/apart_*.json
"""
from __future__ import annotations

import argparse
import json

import numpy as np


def summarize(docs: list[dict]) -> list[str]:
    lines = [f"{len(docs)} runs; the median over them of each figure; call | after, p50 / p90 / p99",
             "", "| size | peer | call µs | after µs | call ratio | after ratio | runs lost (call p50) |",
             "|---|---|---|---|---|---|---|"]
    fmt = lambda v: " / ".join(f"{x:.2f}" if x < 10 else f"{x:.1f}" for x in v)  # noqa: E731
    for size in docs[0]["summary"]:
        for peer in docs[0]["peers"]:
            rows = [d["summary"][size] for d in docs]
            q = {k: np.median([r[peer][k] for r in rows], axis=0) for k in ("call", "after")}
            key = "ratio" if peer == "ringcomm" else f"ratio_{peer}"
            ratio = {k: np.median([r[key][k] for r in rows], axis=0) for k in ("call", "after")} \
                if all(key in r for r in rows) else None
            lost = f"{sum(r[key]['call'][0] > 1 for r in rows)} of {len(rows)}" if ratio else ""
            lines.append(f"| {int(size)} | {peer} | {fmt(q['call'])} | {fmt(q['after'])} | "
                         + (f"{fmt(ratio['call'])} | {fmt(ratio['after'])} |" if ratio else " | |") + f" {lost} |")
    return lines


# What a torch_apart.py JSON records of the command that made it.
COMMAND_KEYS = ("world_size", "dtype", "load", "sizes", "peers", "calls", "warmup", "omp_threads", "cpus", "env")


def command_of(doc: dict) -> dict:
    """The run's command as far as its JSON records it; its arguments without --json and its file."""
    out = {k: doc.get(k) for k in COMMAND_KEYS}
    if "argv" in doc:
        cut = {i for i, w in enumerate(doc["argv"]) if w == "--json"}
        out["argv"] = [w for i, w in enumerate(doc["argv"]) if not ({i, i - 1} & cut or w.startswith("--json="))]
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="torch_apart.py --json outputs, one per run")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    docs = []
    for f in a.files:
        with open(f) as fh:
            docs.append(json.load(fh))
    if any(d["peers"] != docs[0]["peers"] or list(d["summary"]) != list(docs[0]["summary"]) for d in docs):
        p.error("the runs differ in their peers or sizes")
    first = command_of(docs[0])
    for f, d in zip(a.files, docs):
        diff = [k for k, v in command_of(d).items() if first.get(k) != v]
        if diff:
            p.error(f"{f} is a run of another command than {a.files[0]}: they differ in {', '.join(diff)}")
    print("\n".join(summarize(docs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
