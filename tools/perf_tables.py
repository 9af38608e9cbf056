"""The performance tables of docs/PERFORMANCE.md and README.md, from one results file per device.

    python tools/perf_tables.py docs/bench/h100.json              # print the tables
    python tools/perf_tables.py docs/bench/h100.json --write      # make it the current device: rewrite
                                                                  # the generated blocks of the docs
    python tools/perf_tables.py --check                           # exit 1 if a generated block is stale

A results file is what ``python -m baracuda_ops --json F`` writes: device, torch, date, the copy
bandwidth of the run and one record per (case, implementation). A record may carry its own
``copy_gbps`` and ``date`` (a file gathered from several runs on one device type); its
``fraction_of_copy`` is then against its own run's copy.

Generated blocks sit between ``<!-- perf_tables: begin KIND source=FILE -->`` and
``<!-- perf_tables: end -->``; KIND is ``header`` (device, dates, copy bandwidth), ``summary``
(one row per op: ranges of fraction of copy and of the speed-up over each peer) or
``family=NAME`` (one row per case). The source named in each block is the file it was made from.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "PERFORMANCE.md"]
PEER_ORDER = ["eager", "torch.compile", "liger", "quack"]
LATENCY_BOUND_US = 2.0  # a case whose floor (bytes / copy bandwidth) is shorter is bound by latency, not bandwidth
BLOCK = re.compile(r"(<!-- perf_tables: begin (\S+) source=(\S+) -->\n)(.*?)(<!-- perf_tables: end -->)", re.S)


def load(path: Path) -> dict:
    d = json.loads(path.read_text())
    for r in d["results"]:
        r.setdefault("copy_gbps", d["copy_gbps"])
        r.setdefault("date", d["date"])
    return d


def _cases(d: dict, family: str | None = None) -> dict[str, dict[str, dict]]:
    """case name -> impl -> record, in the file's order."""
    by: dict[str, dict[str, dict]] = {}
    for r in d["results"]:
        if family is None or r["family"] == family:
            by.setdefault(r["name"], {})[r["impl"]] = r
    return by


def _peers(by: dict[str, dict[str, dict]]) -> list[str]:
    found = {i for v in by.values() for i in v if i != "baracuda"}
    return sorted(found, key=lambda p: (PEER_ORDER.index(p) if p in PEER_ORDER else len(PEER_ORDER), p))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def families(d: dict) -> list[str]:
    return list(dict.fromkeys(r["family"] for r in d["results"]))


def header(d: dict) -> str:
    dates = sorted({r["date"] for r in d["results"]})
    copies = [r["copy_gbps"] for r in d["results"]]
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    copy = f"{min(copies):.0f}" if round(min(copies)) == round(max(copies)) else f"{min(copies):.0f}–{max(copies):.0f}"
    return (f"Current device: **{d['device']}**, torch {d['torch']}, measured {when}; device copy bandwidth "
            f"{copy} GB/s (read + write) measured in the same process as each case.\n")


def family_table(d: dict, family: str) -> str:
    """One row per case: our time, GB/s, fraction of copy, each peer's time and our speed-up over it."""
    by = _cases(d, family)
    peers = _peers(by)
    lines = [_row(["case", "ours ms", "GB/s", "of copy"] + [f"{p} ms" for p in peers] + [f"× {p}" for p in peers]),
             "|" + "---|" * (4 + 2 * len(peers))]
    for name, v in by.items():
        o = v["baracuda"]
        mark = lambda r: "" if r["graph"] else "*"
        cells = [name, f"{o['ms']:.4f}{mark(o)}", f"{o['gbps']:.0f}", f"{o['fraction_of_copy']:.2f}"]
        cells += [f"{v[p]['ms']:.4f}{mark(v[p])}" if p in v else "—" for p in peers]
        cells += [f"{v[p]['ms'] / o['ms']:.2f}" if p in v else "—" for p in peers]
        lines.append(_row(cells))
    return "\n".join(lines) + "\n"


def _span(xs: list[float], fmt: str) -> str:
    if not xs:
        return "—"
    lo, hi = format(min(xs), fmt), format(max(xs), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def summary_table(d: dict) -> str:
    """One row per op (its latency-bound cases apart): ranges over its cases. The speed-ups
    leave out peers timed without a CUDA graph (`*` in the family tables)."""
    by = _cases(d)
    peers = _peers(by)
    groups: dict[str, list[dict[str, dict]]] = {}
    for name, v in by.items():
        op = name.split(" ")[0]
        o = v["baracuda"]
        floor_us = o["fraction_of_copy"] * o["ms"] * 1e3
        latency = floor_us < LATENCY_BOUND_US
        groups.setdefault(f"{op}, floor under {LATENCY_BOUND_US:g} µs" if latency else op, []).append(v)
    lines = [_row(["op", "cases", "fraction of copy", "ours µs"] + [f"× {p}" for p in peers]),
             "|" + "---|" * (4 + len(peers))]
    for label, vs in groups.items():
        ours = [v["baracuda"] for v in vs]
        cells = [label, str(len(vs)), _span([o["fraction_of_copy"] for o in ours], ".2f"),
                 _span([o["ms"] * 1e3 for o in ours], ".1f")]
        # A peer timed without a CUDA graph carries host overhead: left out of the ranges.
        cells += [_span([v[p]["ms"] / v["baracuda"]["ms"] for v in vs if p in v and v[p]["graph"]], ".2f")
                  for p in peers]
        lines.append(_row(cells))
    return "\n".join(lines) + "\n"


def render(kind: str, d: dict) -> str:
    if kind == "header":
        return header(d)
    if kind == "summary":
        return summary_table(d)
    if kind.startswith("family="):
        return family_table(d, kind.split("=", 1)[1])
    raise ValueError(f"perf_tables: unknown block kind {kind!r}")


def regenerate(text: str, source: str | None = None) -> str:
    """`text` with every generated block made again from its source (or from `source`, which
    then becomes every block's source)."""

    def block(m: re.Match) -> str:
        src = source or m.group(3)
        begin = f"<!-- perf_tables: begin {m.group(2)} source={src} -->\n"
        return begin + render(m.group(2), load(ROOT / src)) + m.group(5)

    return BLOCK.sub(block, text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="?", help="a results file, e.g. docs/bench/h200.json")
    p.add_argument("--family", help="print only this family's table")
    p.add_argument("--write", action="store_true", help="make JSON the current device's results in the docs")
    p.add_argument("--check", action="store_true", help="exit 1 if a generated block differs from its source")
    a = p.parse_args()
    if a.check:
        stale = [str(f.relative_to(ROOT)) for f in DOCS if regenerate(f.read_text()) != f.read_text()]
        for f in stale:
            print(f"stale generated table in {f}: run python tools/perf_tables.py --write with its results file")
        return 1 if stale else 0
    if not a.json:
        p.error("a results file is needed unless --check")
    if a.write:
        src = Path(a.json).resolve().relative_to(ROOT).as_posix()
        for f in DOCS:
            f.write_text(regenerate(f.read_text(), src))
        return 0
    d = load(Path(a.json))
    print(header(d))
    for fam in [a.family] if a.family else families(d):
        print(f"{fam}\n\n{family_table(d, fam)}")
    if not a.family:
        print(summary_table(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
