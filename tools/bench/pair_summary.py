#!/usr/bin/env python3
"""Summary of compare_pytorch.sh's rounds: the JSON lines `train_step --json_out` appends, one per
row and round, each with tapegrad's ms/step, PyTorch's fastest variant's, their ratio, and whether
all of the row's core round-trip probes (tools/bench/core_latency.h) fell in one placement of the
CPUs ("same_phase").

For each (model, dtype, threads): the median ratio over the rounds timed in one phase, with its
range and count, and the same split by phase: "near" when the row's probes are within 2x of the
smallest probe of the whole run, else "far". Rounds whose two sides were timed in different phases
are counted and left out: on a VM whose host moves the vCPUs, one side timed with its CPUs near
and the other far compares the placements, not the code. Then the same rounds as the README's
table: tapegrad's median ms/step and each PyTorch variant's (eager with SDPA, eager with composed
attention, compile), the median ratio and its range.

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
    markdown_table(groups)


def markdown_table(groups):
    """The README's table over the one-phase rounds of each row."""
    order = {"mlp": 0, "cnn": 1, "gpt": 2}
    print()
    print("| row | threads | tapegrad ms/step | PyTorch eager (SDPA) / composed / compile "
          "| ratio to the fastest (range, rounds) |")
    print("|---|---|---|---|---|")
    for (model, dtype, threads), group in sorted(
            groups.items(), key=lambda g: (g[0][2], order.get(g[0][0], 3), g[0][1] != "f32", g[0][1])):
        same = [r for r in group if r["same_phase"]]
        if not same:
            continue

        def variant(name):
            ms = [r.get("pytorch_ms_per_step_by_variant", {}).get(name) for r in same]
            ms = [x for x in ms if isinstance(x, (int, float))]
            return f"{statistics.median(ms):.2f}" if ms else "-"

        ratios = [r["ratio"] for r in same]
        print(f"| {model} {dtype} | {threads} | "
              f"{statistics.median(r['ms_per_step'] for r in same):.2f} | "
              f"{variant('eager')} / {variant('eager_composed_attention')} / {variant('compile')} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}, "
              f"{len(ratios)}) |")


if __name__ == "__main__":
    main()
