"""Reads the SASS source page that Nsight Compute exports (`ncu -i REP --page source --csv
--print-source sass`, as benches/ncu_hopper_prefill.sh writes it) and prints where the warps
were sampled: the stall reasons over the whole kernel, the instructions holding the most samples
with their two main reasons, and the global loads and stores that request more L2 sectors than
their bytes need.

    python3 benches/ncu_stalls.py NAME.sass.csv [--top N] [--range FIRST LAST]

--range sums the samples of instructions FIRST..LAST (row numbers as printed), to price one
stretch of code, e.g. a loop's GEMM issue against its softmax.
"""

from __future__ import annotations

import argparse
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--range", type=int, nargs=2, action="append", default=[], metavar=("FIRST", "LAST"))
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv, newline="")))
    header_at = next((i for i, r in enumerate(rows[:5]) if SAMPLES in r), None)
    if header_at is None:
        print(f"{a.csv}: no '{SAMPLES}' column: export the source page with --print-source sass", file=sys.stderr)
        return 2
    col = {name: i for i, name in enumerate(rows[header_at])}
    data = rows[header_at + 1:]
    reasons = [n for n in rows[header_at] if n.startswith("stall_") and "Not Issued" not in n]

    def get(r: list[str], name: str) -> float:
        return number(r[col[name]]) if name in col else 0.0

    total = sum(get(r, SAMPLES) for r in data) or 1.0
    print(f"{len(data)} instructions, {total:.0f} samples")
    by_reason = {k: sum(get(r, k) for r in data) for k in reasons}
    for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {k[6:]:18s} {v:8.0f} {100 * v / total:5.1f} %")
    print(f"top {a.top} instructions (row, samples, share, instruction, main reasons):")
    order = sorted(range(len(data)), key=lambda i: -get(data[i], SAMPLES))[: a.top]
    for i in order:
        r = data[i]
        main2 = sorted(((get(r, k), k[6:]) for k in reasons), reverse=True)[:2]
        print(f"  {i:5d} {get(r, SAMPLES):7.0f} {100 * get(r, SAMPLES) / total:5.1f} %  "
              f"{r[col['Source']].strip()[:64]:64s} {main2[0][1]} {main2[0][0]:.0f}, {main2[1][1]} {main2[1][0]:.0f}")
    excess = "L2 Theoretical Sectors Global Excessive"
    worst = sorted((i for i in range(len(data)) if get(data[i], excess) > 0), key=lambda i: -get(data[i], excess))
    if worst:
        print(f"global accesses with excessive sectors ({sum(get(data[i], excess) for i in worst):.0f} in all):")
        for i in worst[:8]:
            r = data[i]
            print(f"  {i:5d} {get(r, excess):10.0f} of {get(r, 'L2 Theoretical Sectors Global'):10.0f}  "
                  f"{r[col['Source']].strip()[:70]}")
    for first, last in a.range:
        s = sum(get(data[i], SAMPLES) for i in range(first, last + 1))
        print(f"rows {first}..{last}: {s:.0f} samples, {100 * s / total:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
