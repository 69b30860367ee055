"""Tables, summary lines, JSON and the plot, from the merged measurements.

Figures per cell (one library, form, collective, dtype, op and size): the count of timed calls,
and the spread of their times (each call's time = max over ranks) in µs: min, median, p90 and,
with at least 100 calls, p99; for calls that arrive apart, the median / p90 (/ p99) of the time
after the last rank's arrival; algbw = size / median, busbw = algbw * bus factor (GB/s = 1e9 B/s).
A peer's speedup = peer median / ringcomm median, ringcomm taken in the peer's form of the
collective (``spec.NATIVE_MODE``), which for equal bus factors is also ringcomm busbw / peer
busbw. The report states what was measured; it judges nothing beyond the correctness check.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .peers import PEERS
from .spec import MODE_LABEL, NATIVE_MODE, bus_factor, format_size

KiB, MiB = 1 << 10, 1 << 20


# --------------------------------------------------------------------------------------------
# Organising the merged records.

def ok(rec: dict | None) -> bool:
    return bool(rec) and "time_s" in rec and rec.get("wrong", 0) == 0


def enrich(records: list[dict], world: int) -> None:
    for r in records:
        if "time_s" in r:
            r["time_us"] = r["time_s"] * 1e6
            for k in ("min", "p90", "p99", "mean", "max", "after_p50", "after_p90", "after_p99"):
                v = r.get(f"{k}_s")
                r[f"{k}_us"] = None if v is None else v * 1e6
            r["algbw"] = r["size"] / r["time_s"] / 1e9
            r["busbw"] = r["algbw"] * bus_factor(r["op"], world)


@dataclass
class Table:
    op: str
    dtype: str
    redop: str
    sizes: list[int]
    cells: dict           # (lib, mode, size) -> record
    counts: dict          # size -> element count
    nominal: dict = None  # size -> the sweep's nominal size (chunked ops round down to world)

    @property
    def title(self) -> str:
        return f"{self.op} {self.dtype}" + (f" {self.redop}" if self.redop != "-" else "")

    def get(self, lib, mode, size):
        return self.cells.get((lib, mode, size))

    def ringcomm_modes(self) -> list[str]:
        return [m for m in ("oop", "ip") if any(k[0] == "ringcomm" and k[1] == m
                                                for k in self.cells)]

    def peers(self) -> list[str]:
        return [p for p in PEERS if any(k[0] == p for k in self.cells)]

    def memcpy(self, memcpy: dict, size) -> dict | None:
        """memcpy at this row's size (measured at the sweep's nominal sizes)."""
        return memcpy.get(size) or memcpy.get((self.nominal or {}).get(size))

    def ref_mode(self) -> str:
        modes = self.ringcomm_modes()
        return NATIVE_MODE[self.op] if NATIVE_MODE[self.op] in modes or not modes else modes[0]

    def ref(self, size) -> dict | None:
        """ringcomm's record to compare peers with: the peer's form, else the other form."""
        for mode in (NATIVE_MODE[self.op], "oop", "ip"):
            r = self.get("ringcomm", mode, size)
            if ok(r):
                return r
        return None

    def speedup(self, peer, size) -> float | None:
        p, r = self.get(peer, NATIVE_MODE[self.op], size), self.ref(size)
        if ok(p) and ok(r):
            return p["time_s"] / r["time_s"]
        return None


def build_tables(records: list[dict]) -> list[Table]:
    tables: dict[tuple, Table] = {}
    for r in records:
        key = (r["op"], r["dtype"], r["redop"])
        t = tables.get(key)
        if t is None:
            t = tables[key] = Table(r["op"], r["dtype"], r["redop"], [], {}, {}, {})
        if r["size"] not in t.counts:
            t.sizes.append(r["size"])
            t.counts[r["size"]] = r["count"]
            t.nominal[r["size"]] = r.get("nominal", r["size"])
        t.cells[(r["lib"], r["mode"], r["size"])] = r
    return list(tables.values())


# --------------------------------------------------------------------------------------------
# Text tables.

def _t(us) -> str:
    if us is None:
        return ""
    return f"{us:.2f}" if us < 1e5 else f"{us:.0f}"


def _bw(x) -> str:
    return "" if x is None else f"{x:.2f}"


def _cell_state(rec) -> str | None:
    if rec is None:
        return "-"
    if rec.get("na"):
        return "n/a"
    if rec.get("error"):
        return "ERR"
    return None


def _label(lib: str, mode: str) -> str:
    return f"ringcomm {MODE_LABEL[mode]}" if lib == "ringcomm" else f"{lib} ({MODE_LABEL[mode]})"


def table_rows(t: Table) -> list[tuple[int, str, str]]:
    """(size, library, mode) in print order: per size, ringcomm's forms, then the peers."""
    series = [("ringcomm", m) for m in t.ringcomm_modes()] + \
             [(p, NATIVE_MODE[t.op]) for p in t.peers()]
    return [(s, lib, mode) for s in t.sizes for lib, mode in series]


def format_table(t: Table, world: int, memcpy: dict) -> list[str]:
    """One row per (size, library): the count of timed calls, min / median / p90 (/ p99) µs,
    algbw, busbw, a peer's speedup, this size's memcpy bandwidth and the correctness check."""
    with_p99 = any(r.get("p99_s") is not None for r in t.cells.values())

    def measured(key, fmt):
        return lambda s, lib, mode, r, first: "" if _cell_state(r) else fmt(r.get(key))

    def calls(s, lib, mode, r, first):
        return _cell_state(r) or str(r["iters"])

    def speedup(s, lib, mode, r, first):
        x = None if lib == "ringcomm" or _cell_state(r) else t.speedup(lib, s)
        return "" if x is None else f"{x:.2f}"

    def mem(s, lib, mode, r, first):
        m = t.memcpy(memcpy, s) if first else None
        return "" if m is None else _bw(m["gbps"])

    def check(s, lib, mode, r, first):
        if _cell_state(r):
            return ""
        return f"FAIL {r['wrong']}" if r.get("wrong") else "ok"

    # (label, unit, width, fn(size, lib, mode, record, first row of its size) -> text)
    cols = [("size", "(B)", 10, lambda s, lib, mode, r, first: str(s) if first else ""),
            ("elems", "", 9, lambda s, lib, mode, r, first: str(t.counts[s]) if first else ""),
            ("library", "", -22, lambda s, lib, mode, r, first: _label(lib, mode)),
            ("calls", "", 7, calls),
            ("min", "(us)", 9, measured("min_us", _t)),
            ("median", "(us)", 9, measured("time_us", _t)),
            ("p90", "(us)", 9, measured("p90_us", _t))]
    if with_p99:
        cols.append(("p99", "(us)", 9, measured("p99_us", _t)))
    if any(r.get("after_p50_s") is not None for r in t.cells.values()):
        # calls that arrive apart: the part after the last rank's arrival (harness.after_arrival)
        cols += [("after p50", "(us)", 9, measured("after_p50_us", _t)),
                 ("after p90", "(us)", 9, measured("after_p90_us", _t))]
        if with_p99:
            cols.append(("after p99", "(us)", 9, measured("after_p99_us", _t)))
    cols += [("algbw", "(GB/s)", 7, measured("algbw", _bw)),
             ("busbw", "(GB/s)", 7, measured("busbw", _bw)),
             ("speedup", "(x)", 7, speedup),
             ("memcpy", "(GB/s)", 7, mem),
             ("check", "", -7, check)]

    def line(cells):
        return "  ".join(c.ljust(-w) if w < 0 else c.rjust(w) for c, (_, _, w, _) in zip(cells, cols))

    factor = bus_factor(t.op, world)
    out = [f"# {t.title}    ({world} ranks; busbw = algbw x {factor:.3g}; peers in "
           f"{MODE_LABEL[NATIVE_MODE[t.op]]} form; speedup = peer median / ringcomm "
           f"{MODE_LABEL[t.ref_mode()]} median)",
           "#" + line([c[0] for c in cols])[1:].rstrip(),
           "#" + line([c[1] for c in cols])[1:].rstrip()]
    prev = None
    for s, lib, mode in table_rows(t):
        r = t.get(lib, mode, s)
        out.append(line([fn(s, lib, mode, r, s != prev) for _, _, _, fn in cols]).rstrip())
        prev = s
    reasons = {}
    for (lib, mode, _), r in t.cells.items():
        why = r.get("na") or r.get("error")
        if why:
            reasons.setdefault(f"{_label(lib, mode)}: {'n/a' if r.get('na') else 'ERR'}: "
                               f"{why}", None)
    out.extend(f"#   {why[:200]}" for why in list(reasons)[:6])
    return out


# --------------------------------------------------------------------------------------------
# Summary.

def speedup_ranges(tables: list[Table]) -> list[dict]:
    """Per table and peer: the smallest and largest speedup over the sizes both measured."""
    out = []
    for t in tables:
        for peer in t.peers():
            pairs = [(s, t.speedup(peer, s)) for s in t.sizes]
            pairs = [(s, x) for s, x in pairs if x is not None]
            if not pairs:
                continue
            lo, hi = min(pairs, key=lambda p: p[1]), max(pairs, key=lambda p: p[1])
            out.append({"table": t.title, "peer": peer, "sizes": len(pairs),
                        "min": lo[1], "min_size": lo[0], "max": hi[1], "max_size": hi[0]})
    return out


def avg_busbw(records: list[dict]) -> dict[str, dict]:
    acc: dict[str, list[float]] = {}
    for r in records:
        if ok(r):
            acc.setdefault(f"{r['lib']} {MODE_LABEL[r['mode']]}", []).append(r["busbw"])
    return {k: {"mean_gbps": sum(v) / len(v), "rows": len(v)} for k, v in acc.items()}


def ceiling_lines(tables: list[Table], memcpy: dict) -> tuple[list[str], list[dict]]:
    lines, data = [], []
    for t in tables:
        big = [s for s in t.sizes if s >= MiB and t.ref(s) is not None
               and t.memcpy(memcpy, s) is not None]
        if not big:
            continue
        s = max(big)
        r, m = t.ref(s), t.memcpy(memcpy, s)
        data.append({"table": t.title, "size": s, "busbw": r["busbw"], "memcpy_gbps": m["gbps"],
                     "fraction": r["busbw"] / m["gbps"], "mode": r["mode"]})
        lines.append(f"#   {t.title:<26} at {format_size(s):>8}: ringcomm busbw {r['busbw']:6.2f} "
                     f"GB/s = {100 * r['busbw'] / m['gbps']:3.0f}% of memcpy "
                     f"{m['gbps']:.2f} GB/s")
    return lines, data


def summary(records: list[dict], tables: list[Table], memcpy: dict, world: int) -> tuple[list[str], dict]:
    lines = []
    avg = avg_busbw(records)
    if avg:
        lines.append("# avg bus bandwidth (GB/s, mean over every measured row): " + ", ".join(
            f"{k} {v['mean_gbps']:.3f}" for k, v in avg.items()))
    clines, cdata = ceiling_lines(tables, memcpy)
    if clines:
        lines.append("# ceiling (single-process memcpy in this run; large-message busbw as a "
                     "fraction of it):")
        lines.extend(clines)
    ranges = speedup_ranges(tables)
    if ranges:
        lines.append("# speedup over the sizes (peer median / ringcomm median; > 1: ringcomm "
                     "faster), smallest .. largest:")
        width = max(len(x["table"]) for x in ranges)
        for x in ranges:
            lines.append(f"#   {x['table']:<{width}}  vs {x['peer']:<9} {x['min']:8.2f}x at "
                         f"{format_size(x['min_size']):>8} .. {x['max']:8.2f}x at "
                         f"{format_size(x['max_size']):>8}")
    wrong = sum(r.get("wrong", 0) for r in records)
    errors = sum(1 for r in records if r.get("error"))
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"
                 + (f"   ({errors} measurements raised errors; see ERR cells)" if errors else ""))
    return lines, {"avg_busbw": avg, "ceiling": cdata, "speedup": ranges, "wrong": wrong,
                   "errors": errors}


def render(meta_lines: list[str], records: list[dict], memcpy: dict, world: int) -> tuple[str, dict]:
    tables = build_tables(records)
    out = list(meta_lines)
    for t in tables:
        out.append("#")
        out.extend(format_table(t, world, memcpy))
    out.append("#")
    sum_lines, sum_data = summary(records, tables, memcpy, world)
    out.extend(sum_lines)
    return "\n".join(out) + "\n", {"tables": tables, **sum_data}


# --------------------------------------------------------------------------------------------
# JSON and plot.

def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_json(path: str, meta: dict, records: list[dict], memcpy: dict, summary_data: dict) -> None:
    tables = []
    for t in summary_data["tables"]:
        rows = []
        for s in t.sizes:
            libs = {}
            for (lib, mode, size), r in t.cells.items():
                if size == s:
                    libs[f"{lib}/{MODE_LABEL[mode]}"] = r
            m = t.memcpy(memcpy, s)
            rows.append({"size": s, "count": t.counts[s], "nominal_size": t.nominal.get(s, s),
                         "memcpy_gbps": m["gbps"] if m else None,
                         "speedup": {p: t.speedup(p, s) for p in t.peers()}, "libs": libs})
        tables.append({"op": t.op, "dtype": t.dtype, "redop": t.redop,
                       "bus_factor": bus_factor(t.op, meta["world_size"]), "rows": rows})
    doc = {"meta": meta,
           "memcpy": [{"size": s, **v} for s, v in sorted(memcpy.items())],
           "tables": tables,
           "avg_busbw": summary_data["avg_busbw"], "ceiling": summary_data["ceiling"],
           "speedup": summary_data["speedup"], "wrong": summary_data["wrong"],
           "errors": summary_data["errors"]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=_jsonable)


_STYLE = {("ringcomm", "oop"): ("tab:blue", "-", "o"), ("ringcomm", "ip"): ("tab:cyan", "-", "s"),
          ("gloo", None): ("tab:red", "-", "^"), ("mpi", None): ("tab:green", "-", "v"),
          ("nccl", None): ("tab:purple", "-", "D")}


def plot(path: str, tables: list[Table], memcpy: dict, world: int, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    n = len(tables)
    ncols = min(3, n) or 1
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.0 * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    for ax, t in zip(axes.flat, tables):
        series = [("ringcomm", m) for m in t.ringcomm_modes()] + \
                 [(p, NATIVE_MODE[t.op]) for p in t.peers()]
        for lib, mode in series:
            pts = [(s, t.get(lib, mode, s)) for s in t.sizes]
            pts = [(s, r["busbw"]) for s, r in pts if ok(r) and r["busbw"] > 0]
            if not pts:
                continue
            color, ls, marker = _STYLE.get((lib, mode), _STYLE.get((lib, None), ("k", "-", ".")))
            label = f"{lib} {MODE_LABEL[mode]}" if lib == "ringcomm" else lib
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, color=color, marker=marker,
                    markersize=4, label=label)
        mem = [(s, t.memcpy(memcpy, s)["gbps"]) for s in t.sizes
               if t.memcpy(memcpy, s) is not None]
        if mem:
            ax.plot([p[0] for p in mem], [p[1] for p in mem], "--", color="black",
                    label="memcpy (1 process)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_size(int(v))
                                                   .replace(" ", "")))
        ax.set_xlabel("size (bytes, full tensor)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{t.title}, {world} ranks", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        for label in ax.get_xticklabels():
            label.set_rotation(45)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
