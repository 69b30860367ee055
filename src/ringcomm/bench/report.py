"""Tables, summary lines, verdicts, JSON and the plot, from the merged measurements.

Figures: time = median over timed iterations of (max over ranks) in µs, min likewise;
algbw = size / time, busbw = algbw * bus factor (GB/s = 1e9 B/s); a peer's speedup =
peer time / ringcomm time, ringcomm taken in the peer's form of the collective
(``harness.NATIVE_MODE``), which for equal bus factors is also ringcomm busbw / peer busbw.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .harness import MODE_LABEL, NATIVE_MODE, bus_factor, format_size
from .peers import PEERS

KiB, MiB = 1 << 10, 1 << 20


# --------------------------------------------------------------------------------------------
# Organising the merged records.

def ok(rec: dict | None) -> bool:
    return bool(rec) and "time_s" in rec and rec.get("wrong", 0) == 0


def enrich(records: list[dict], world: int) -> None:
    for r in records:
        if "time_s" in r:
            r["time_us"] = r["time_s"] * 1e6
            r["min_us"] = r["min_s"] * 1e6
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


def format_table(t: Table, world: int, memcpy: dict) -> list[str]:
    # Column groups: (group label, [(label, unit, width, fn(size) -> str)]).
    groups = [("", [("size", "(B)", 10, lambda s: str(s)),
                    ("count", "(elems)", 9, lambda s: str(t.counts[s])),
                    ("type", "", 8, lambda s: t.dtype)])]

    def rc_cols(mode):
        def val(key, fmt):
            def f(s):
                r = t.get("ringcomm", mode, s)
                st = _cell_state(r)
                if st is not None:
                    return st if key == "time_us" else ""
                return fmt(r[key])
            return f
        return (f"ringcomm {MODE_LABEL[mode]}",
                [("time", "(us)", 8, val("time_us", _t)), ("min", "(us)", 8, val("min_us", _t)),
                 ("algbw", "(GB/s)", 6, val("algbw", _bw)),
                 ("busbw", "(GB/s)", 6, val("busbw", _bw))])

    def peer_cols(peer):
        mode = NATIVE_MODE[t.op]

        def val(key):
            def f(s):
                r = t.get(peer, mode, s)
                st = _cell_state(r)
                if st is not None:
                    return st if key == "time_us" else ""
                if key == "speedup":
                    x = t.speedup(peer, s)
                    return "" if x is None else f"{x:.2f}"
                return (_t if key == "time_us" else _bw)(r[key])
            return f
        return (f"{peer} ({MODE_LABEL[mode]})",
                [("time", "(us)", 8, val("time_us")), ("busbw", "(GB/s)", 6, val("busbw")),
                 ("speedup", "(x)", 7, val("speedup"))])

    for mode in t.ringcomm_modes():
        groups.append(rc_cols(mode))
    for peer in t.peers():
        groups.append(peer_cols(peer))

    def mem(s):
        m = t.memcpy(memcpy, s)
        return "" if m is None else _bw(m["gbps"])

    def frac(s):
        m, r = t.memcpy(memcpy, s), t.ref(s)
        if m is None or r is None:
            return ""
        return f"{100 * r['busbw'] / m['gbps']:.0f}"

    def check(s):
        bad = []
        for (lib, mode, size), r in t.cells.items():
            if size == s and r.get("wrong"):
                bad.append(f"{lib}{'' if mode == NATIVE_MODE[t.op] else '/' + mode}:"
                           f"{r['wrong']}")
        return "FAIL " + ",".join(bad) if bad else "ok"

    groups.append(("memcpy", [("bw", "(GB/s)", 6, mem), ("rc/mem", "(%)", 6, frac)]))
    groups.append(("", [("check", "", 5, check)]))

    # Header: group labels centred over their columns, then labels, then units.
    line1, line2, line3 = [], [], []
    for label, cols in groups:
        width = sum(w for _, _, w, _ in cols) + 2 * (len(cols) - 1)
        line1.append(label.center(width) if label else " " * width)
        line2.append("  ".join(c[0].rjust(c[2]) for c in cols))
        line3.append("  ".join(c[1].rjust(c[2]) for c in cols))
    factor = bus_factor(t.op, world)
    out = [f"# {t.title}    ({world} ranks; busbw factor {factor:.3g}; peers in "
           f"{MODE_LABEL[NATIVE_MODE[t.op]]} form, speedup = peer time / ringcomm "
           f"{MODE_LABEL[t.ref_mode()]} time)",
           "#" + "   ".join(line1)[1:].rstrip(),
           "#" + "   ".join(line2)[1:], "#" + "   ".join(line3)[1:]]
    for s in t.sizes:
        row = []
        for _, cols in groups:
            row.append("  ".join(fn(s).rjust(w) for _, _, w, fn in cols))
        out.append(" " + "   ".join(row)[1:])
    reasons = {}
    for (lib, mode, _), r in t.cells.items():
        why = r.get("na") or r.get("error")
        if why:
            reasons.setdefault(f"{lib} {MODE_LABEL[mode]}: {'n/a' if r.get('na') else 'ERR'}: "
                               f"{why}", None)
    out.extend(f"#   {line[:200]}" for line in list(reasons)[:6])
    return out


# --------------------------------------------------------------------------------------------
# Summary and verdicts.

@dataclass
class Target:
    kind: str            # "faster" | "busbw" (speedup >= bound) | "latency" (rc/peer time <= bound)
    lo: int | None       # sizes >= lo
    hi: int | None       # sizes <= hi
    bound: float

    def range_text(self) -> str:
        return f"<={format_size(self.hi)}" if self.hi is not None else f">={format_size(self.lo)}"

    def sizes(self, sizes):
        return [s for s in sizes if (self.lo is None or s >= self.lo)
                and (self.hi is None or s <= self.hi)]


# The benchmark's targets: all_reduce, float32, sum; ratios measured in the same run.
TARGETS = {
    2: {"gloo": [Target("faster", None, 64 * KiB, 20.0), Target("busbw", MiB, None, 4.0)],
        "mpi": [Target("latency", None, 4 * KiB, 1.5), Target("busbw", 64 * KiB, None, 1.0),
                Target("busbw", 16 * MiB, None, 1.5)]},
    4: {"gloo": [Target("busbw", MiB, None, 4.0)]},
}
# Ranges reported (without a target) where none is defined.
DEFAULT_RANGES = [Target("faster", None, 64 * KiB, 0.0), Target("busbw", MiB, None, 0.0)]
RS_AG_TARGET = 0.8       # reduce_scatter / all_gather busbw >= 0.8 x all_reduce's at >= 1 MiB


def _judge(t: Table, peer: str, target: Target) -> dict:
    sizes = target.sizes(t.sizes)
    pairs = [(s, t.speedup(peer, s)) for s in sizes]
    pairs = [(s, x) for s, x in pairs if x is not None]
    res = {"kind": target.kind, "range": target.range_text(), "bound": target.bound,
           "sizes": [s for s, _ in pairs]}
    if not pairs:
        res.update(value=None, met=None)
        return res
    if target.kind == "latency":                       # worst = largest rc/peer time ratio
        s, x = min(pairs, key=lambda p: p[1])
        value = 1.0 / x
        met = value <= target.bound
    else:                                              # worst = smallest speedup
        s, value = min(pairs, key=lambda p: p[1])
        met = value >= target.bound
    res.update(value=value, worst_size=s, met=met if target.bound else None)
    return res


def _judge_text(j: dict, peer: str, has_bound: bool) -> str:
    if j["value"] is None:
        return f"not measured at {j['range']}"
    v, where = j["value"], format_size(j["worst_size"])
    if j["kind"] == "latency":
        text = f"latency {v:.2f}x {peer}'s at {j['range']} (worst at {where}"
        return text + (f"; target <= {j['bound']:g}x)" if has_bound else ")")
    what = "faster" if j["kind"] == "faster" else "busbw"
    text = f"{v:.1f}x {what} at {j['range']} (worst at {where}"
    return text + (f"; target >= {j['bound']:g}x)" if has_bound else ")")


def verdicts(tables: list[Table], world: int) -> list[dict]:
    """One verdict per peer on all_reduce float32 sum, plus reduce_scatter/all_gather vs all_reduce."""
    out = []
    ar = next((t for t in tables if (t.op, t.dtype, t.redop) == ("all_reduce", "float32", "sum")),
              None)
    if ar is not None:
        for peer in ar.peers():
            targets = TARGETS.get(world, {}).get(peer)
            has_bound = targets is not None
            judged = [_judge(ar, peer, tg) for tg in (targets or DEFAULT_RANGES)]
            parts = [_judge_text(j, peer, has_bound) for j in judged]
            if not has_bound:
                status = f"no target for {peer} at {world} ranks"
            elif any(j["met"] is None for j in judged):
                status = "INCOMPLETE"
            else:
                status = "MET" if all(j["met"] for j in judged) else "NOT MET"
            out.append({"peer": peer, "checks": judged, "status": status,
                        "text": f"vs {peer}: " + ", ".join(parts) + f": {status}"})
    # reduce_scatter and all_gather busbw within 20% of all_reduce's (out-of-place, >= 1 MiB).
    for op in ("reduce_scatter", "all_gather"):
        other = next((t for t in tables if t.op == op and t.dtype == "float32"
                      and t.redop in ("sum", "-")), None)
        if ar is None or other is None:
            continue
        ratios = []
        for s in other.sizes:
            a, b = ar.get("ringcomm", "oop", s), other.get("ringcomm", "oop", s)
            if s >= MiB and ok(a) and ok(b):
                ratios.append((s, b["busbw"] / a["busbw"]))
        if not ratios:
            out.append({"peer": f"{op}/all_reduce", "status": "INCOMPLETE",
                        "text": f"{op} busbw / all_reduce busbw at >=1 MiB: not measured"})
            continue
        s, v = min(ratios, key=lambda p: p[1])
        status = "MET" if v >= RS_AG_TARGET else "NOT MET"
        out.append({"peer": f"{op}/all_reduce", "value": v, "worst_size": s,
                    "status": status,
                    "text": f"{op} busbw / all_reduce busbw (ringcomm out-of-place) at >=1 MiB: "
                            f"{v:.2f}x (worst at {format_size(s)}; target >= {RS_AG_TARGET:g}x): "
                            f"{status}"})
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
    vds = verdicts(tables, world)
    if vds:
        lines.append("# verdicts (targets: all_reduce float32 sum; ringcomm in the peer's "
                     "form; worst size in each range):")
        lines.extend(f"#   {v['text']}" for v in vds)
    wrong = sum(r.get("wrong", 0) for r in records)
    errors = sum(1 for r in records if r.get("error"))
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"
                 + (f"   ({errors} measurements raised errors; see ERR cells)" if errors else ""))
    return lines, {"avg_busbw": avg, "ceiling": cdata, "verdicts": vds, "wrong": wrong,
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
           "verdicts": summary_data["verdicts"], "wrong": summary_data["wrong"],
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
