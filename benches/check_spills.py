#!/usr/bin/env python3
"""Register spills over every prefill instance of variants.json, for each of its architectures.

    python3 benches/check_spills.py [--jobs N] [--out DIR] [--flashgen BIN] [--all] [FILTER ...]

Generates the instances with `flashgen generate` (FILTERs are its own: `--module GLOB`,
`--where AXIS=GLOB`; default `--module '*_prefill*'`), compiles each one's device code only
(`nvcc -fatbin`, the generated command otherwise unchanged, plus `-Xptxas -v`) N at a time
(default 2: the machines this runs on are shared), then lists every kernel that spills with
benches/ptxas_spills.py and exits 1 if any does. The ptxas reports are kept in DIR/ptxas/ (default
build/spills). nvcc: FLASHGEN_NVCC, else the project venv's (`. ci/setup.sh`).
Every prefill instance on both architectures takes about 480 x 2 ptxas runs: ~40 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ptxas_spills  # noqa: E402


def find_nvcc() -> str:
    env = os.environ.get("FLASHGEN_NVCC")
    if env:
        return env
    hits = sorted(ROOT.glob(".venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc"))
    if hits:
        return str(hits[0])
    found = shutil.which("nvcc")
    if found:
        return found
    sys.exit("check_spills: no nvcc (set FLASHGEN_NVCC or run `. ci/setup.sh`)")


def main(argv: list[str]) -> int:
    jobs, out, flashgen, show_all, filters = 2, ROOT / "build" / "spills", None, False, []
    it = iter(argv)
    for a in it:
        if a == "--jobs":
            jobs = int(next(it))
        elif a == "--out":
            out = Path(next(it))
        elif a == "--flashgen":
            flashgen = next(it)
        elif a == "--all":
            show_all = True
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            filters.append(a)
    if not filters:
        filters = ["--module", "*_prefill*"]
    flashgen = flashgen or os.environ.get("FLASHGEN_BIN") or str(ROOT / "target" / "release" / "flashgen")
    if not Path(flashgen).exists():
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    nvcc = find_nvcc()
    gen = out / "generated"
    reports = out / "ptxas"
    reports.mkdir(parents=True, exist_ok=True)
    for old in reports.glob("*.txt"):  # a report per instance of this run only
        old.unlink()
    subprocess.run([flashgen, "--config", str(ROOT / "variants.json"), "generate", "--out", str(gen), *filters],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "FLASHGEN_NVCC": nvcc})
    commands = json.loads((gen / "compile_commands.json").read_text())

    def compile_one(cmd: dict) -> tuple[str, int, str]:
        args = list(cmd["arguments"])
        args[0] = nvcc
        args[args.index("-c")] = "-fatbin"  # device code only: no host compile
        name = Path(cmd["output"]).stem
        args[args.index("-o") + 1] = str(out / f"{name}.fatbin")
        args += ["-Xptxas", "-v"]
        p = subprocess.run(args, cwd=cmd["directory"], capture_output=True, text=True)
        (reports / f"{name}.txt").write_text(p.stderr)
        Path(out / f"{name}.fatbin").unlink(missing_ok=True)
        return name, p.returncode, p.stderr

    t0 = time.time()
    failed = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for i, (name, rc, err) in enumerate(pool.map(compile_one, commands), 1):
            if rc != 0:
                failed.append(name)
                print(f"FAILED {name}:\n{err[-2000:]}", file=sys.stderr)
            print(f"\r{i}/{len(commands)} instances, {time.time() - t0:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    files = sorted(str(p) for p in reports.glob("*.txt"))
    rc = ptxas_spills.main(files + (["--all"] if show_all else []))
    return 1 if failed or rc else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
