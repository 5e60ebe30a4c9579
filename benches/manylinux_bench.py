#!/usr/bin/env python3
"""Build time of the default AOT subset with nvcc's host compiler g++ against zig (`--manylinux
2_17`), in one run, alternating (issue 9: "within 10 %").

    . ci/setup.sh && python3 benches/manylinux_bench.py [--rounds 2] [--jobs 2] [--json out.json]

Stdlib only. Each build is cold: an empty FLASHGEN_CACHE_DIR and --out in a temp folder removed
at the end (the user's ~/.cache/flashgen is never touched). zig's own cache (~/.cache/zig, where
the first zig link builds its C++ runtime once) is warmed first by an untimed one-instance build,
since a user pays that once per machine, not per build. Round r builds g++ then zig when r is
odd, zig then g++ when even. Reported: the wall clock of each `flashgen build --aot --json`
process and the CPU time (user + system) of it and everything it ran (nvcc, cicc, ptxas, the host
compiler), the medians, and zig / g++. On a shared machine the CPU time is the steadier figure:
other work stretches the wall clock of both alike only when it is steady.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(binary: Path, tmp: Path, name: str, jobs: int, zig: bool, extra: list[str]) -> dict:
    cache, out = tmp / f"cache-{name}", tmp / f"out-{name}"
    env = dict(os.environ, FLASHGEN_CACHE_DIR=str(cache))
    env.pop("FLASHGEN_MANYLINUX", None)
    cmd = [str(binary), "build", "--json", "--quiet", "--jobs", str(jobs), "--out", str(out), *extra]
    if zig:
        cmd += ["--manylinux", "2_17"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    summary = json.loads(proc.stdout)
    return {"compiler": "zig" if zig else "g++", "wall_s": wall, "cpu_s": cpu, "built": summary["built"],
            "compile_s": summary["compile_s"], "load1": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "flashgen")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="flashgen-manylinux-bench-") as t:
        tmp = Path(t)
        build(args.binary, tmp, "warm-zig", 1, True,
              ["--module", "single_decode", "--where", "dtype=bf16", "--where", "head_dim=128",
               "--where", "pos_encoding=none", "--where", "variant=default", "--arch", "9.0a"])
        for r in range(1, args.rounds + 1):
            for zig in ((False, True) if r % 2 else (True, False)):
                row = build(args.binary, tmp, f"{r}-{'zig' if zig else 'gcc'}", args.jobs, zig, ["--aot"])
                row["round"] = r
                rows.append(row)
                print(f"round {r} {row['compiler']:>3}: {row['wall_s']:7.1f} s wall, {row['cpu_s']:7.1f} s CPU, "
                      f"{row['built']} instances, nvcc {row['compile_s']:7.1f} s, load {row['load1']:.1f}", flush=True)
                if args.json:
                    args.json.write_text(json.dumps({"rows": rows}, indent=1))
    out = {"rows": rows}
    for what in ("wall_s", "cpu_s"):
        med = {c: statistics.median(r[what] for r in rows if r["compiler"] == c) for c in ("g++", "zig")}
        out[f"median_{what}"] = med
        out[f"ratio_{what}"] = med["zig"] / med["g++"]
        print(f"median {what}: g++ {med['g++']:.1f} s, zig {med['zig']:.1f} s, zig / g++ = {med['zig'] / med['g++']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
