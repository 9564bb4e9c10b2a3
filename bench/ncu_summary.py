#!/usr/bin/env python3
"""Where one engine run's GPU time goes: per kernel name, the launches and the total time, from
ncu's CSV of gpu__time_duration.sum (scripts/gpu_perf.sh with KILN_PERF_NCU=1).

  python3 bench/ncu_summary.py NCU.csv RUNS [TOP]   # RUNS: engine runs the CSV covers
"""
import collections
import csv
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, runs = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    rows = [r for r in csv.reader(open(path, newline="")) if len(r) > 10]
    if not rows:
        sys.exit(f"{path}: no ncu rows")
    hdr = rows[0]
    name, value, unit = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    per = collections.defaultdict(lambda: [0, 0.0])
    for r in rows[1:]:
        us = float(r[value].replace(",", "")) * scale.get(r[unit], 1e-3)
        k = r[name].split("(")[0][:110]
        per[k][0] += 1
        per[k][1] += us
    total = sum(t for _, t in per.values())
    print(f"{sum(c for c, _ in per.values()) // runs} kernels, {total / runs:.0f} us of GPU time per run")
    for k, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {t / runs:9.0f} us {100 * t / total:5.1f}% {c // runs:4d}x  {k}")


if __name__ == "__main__":
    main()
