"""Markdown tables for docs/PERFORMANCE.md from `python -m baracuda_ops --json` files.

    python tools/perf_tables.py docs/bench/FILE.json [--copy-gbps N] [--family rms_norm]

One row per case: our time, achieved GB/s, fraction of the copy bandwidth, each
peer's time and our speed-up over it (peer ms / our ms; > 1 means we are faster).
`--copy-gbps` recomputes the fractions against another copy measurement (for a
file whose own copy figure is known to be wrong; say so where you use it).
"""

import argparse
import json


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("json")
    p.add_argument("--copy-gbps", type=float)
    p.add_argument("--family")
    a = p.parse_args()
    d = json.load(open(a.json))
    copy = a.copy_gbps or d["copy_gbps"]
    by: dict[str, dict[str, dict]] = {}
    for r in d["results"]:
        if a.family and r["family"] != a.family:
            continue
        by.setdefault(r["name"], {})[r["impl"]] = r
    peers = sorted({i for v in by.values() for i in v if i != "baracuda"}, key=["eager", "torch.compile", "liger"].index)
    head = ["case", "ours ms", "GB/s", "of copy"] + [f"{q} ms" for q in peers] + [f"× {q}" for q in peers]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, v in by.items():
        o = v["baracuda"]
        mark = lambda r: "" if r["graph"] else "*"
        row = [name, f"{o['ms']:.4f}", f"{o['gbps']:.0f}", f"{o['gbps'] / copy:.2f}"]
        row += [f"{v[q]['ms']:.4f}{mark(v[q])}" if q in v else "—" for q in peers]
        row += [f"{v[q]['ms'] / o['ms']:.2f}" if q in v else "—" for q in peers]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
