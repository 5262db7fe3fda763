#!/usr/bin/env python3
"""Summary of compare_pytorch.sh's rounds: the JSON lines `train_step --json_out` appends, one per
row and round, each with tapegrad's ms/step, PyTorch's fastest variant's, their ratio, and whether
all of the row's core round-trip probes (tools/bench/core_latency.h) fell in one placement of the
CPUs ("same_phase").

For each (model, dtype, threads): the median ratio over the rounds timed in one phase, with its
range and count, and the same split by phase: "near" when the row's probes are within 2x of the
smallest probe of the whole run, else "far". Rounds whose two sides were timed in different phases
are counted and left out: on a VM whose host moves the vCPUs, one side timed with its CPUs near
and the other far compares the placements, not the code.

  tools/bench/pair_summary.py ROWS.jsonl
"""
import json
import math
import statistics
import sys


def fmt(ratios):
    if not ratios:
        return "-"
    return (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}, "
            f"n={len(ratios)})")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = []
    with open(sys.argv[1]) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            if "ratio" not in r:
                continue  # no PyTorch line for this row
            if not isinstance(r.get("core_ns"), list) or not isinstance(r.get("same_phase"), bool):
                sys.exit(f"{sys.argv[1]} line {number}: not a train_step --json_out row")
            rows.append(r)
    probes = [ns for r in rows for ns in r["core_ns"] if isinstance(ns, (int, float))]
    nearest = min(probes) if probes else math.nan

    def near(r):
        own = [ns for ns in r["core_ns"] if isinstance(ns, (int, float))]
        return not own or max(own) <= 2 * nearest

    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["dtype"], r["threads"]), []).append(r)
    print(f"smallest core round trip {nearest:.0f} ns; near = within 2x of it")
    print(f"{'row':<12} {'threads':>7}  {'ratio, one phase':<24} {'near':<24} {'far':<24} "
          f"{'phases differ':>13}  best PyTorch variants")
    for (model, dtype, threads), group in sorted(groups.items(), key=lambda g: g[0][::-1]):
        same = [r for r in group if r["same_phase"]]
        variants = sorted({r["pytorch_best"] for r in same})
        print(f"{model + ' ' + dtype:<12} {threads:>7}  {fmt([r['ratio'] for r in same]):<24} "
              f"{fmt([r['ratio'] for r in same if near(r)]):<24} "
              f"{fmt([r['ratio'] for r in same if not near(r)]):<24} "
              f"{len(group) - len(same):>13}  {','.join(variants) or '-'}")


if __name__ == "__main__":
    main()
