#!/usr/bin/env python3
"""Where a program's GPU time goes, from Nsight Compute's CSV of kernel durations.

On the GPU machine (ncu serialises the kernels and times each one; one metric keeps it fast):

    ncu --metrics gpu__time_duration.sum --csv --print-units base --log-file k.csv PROGRAM ARGS

Here: `python3 tools/gpu/ncu_summary.py k.csv [other.csv] [--top 25]` prints, per CSV, the
kernels grouped by name (templates and arguments cut off), with their count, total time and share
of the total, largest first (several CSVs, e.g. tapegrad's step and PyTorch's, one after another).
"""

import argparse
import collections
import csv
import re
import sys


def short_name(name):
    """'void tg::cuda::(anonymous)::LayerNormKernel<float, 4>(...)' -> 'LayerNormKernel'."""
    name = name.replace("(anonymous namespace)", "anonymous")
    name = re.sub(r"\(.*$", "", name)        # arguments
    depth, out = 0, []
    for ch in name:                            # template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    name = name.split(" ")[-1]                 # return type
    return name.split("::")[-1] or name


def load(path):
    """{short kernel name: [count, nanoseconds]} from ncu's --csv output."""
    totals = collections.defaultdict(lambda: [0, 0.0])
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # skip ncu's ==PROF== lines
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1.0)
        entry = totals[short_name(row["Kernel Name"])]
        entry[0] += 1
        entry[1] += value * scale
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for path in args.csv:
        totals = load(path)
        all_ns = sum(ns for _, ns in totals.values())
        count = sum(c for c, _ in totals.values())
        print(f"== {path}: {count} kernels, {all_ns / 1e6:.2f} ms of GPU time")
        ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])
        for name, (c, ns) in ranked[: args.top]:
            print(f"  {ns / 1e6:9.3f} ms {100 * ns / all_ns:5.1f}% {c:6d}x  {name[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
