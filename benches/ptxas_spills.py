#!/usr/bin/env python3
"""Reads `nvcc -Xptxas -v` reports and lists the kernels that spill (registers, stack, spill bytes).

    python3 benches/ptxas_spills.py REPORT.txt [...] [--all] [--filter REGEX]

A report is the stderr of an nvcc/ptxas run with -Xptxas -v (several architectures may be mixed:
each kernel is listed with the sm_XX its 'Compiling entry function' line names). Names are
demangled with c++filt when it is there and shortened to their template arguments. Prints one
line per kernel with spills (every kernel with --all; --filter keeps the kernels whose short name
matches REGEX, e.g. '^(prefill|rope)'), a summary per architecture, and exits 1 when any kept
kernel spills. benches/check_spills.sh runs it over every prefill instance.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

COMPILING = re.compile(r"Compiling entry function '(\S+)' for '(sm_\w+)'")
PROPS = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")


def demangle(names: list[str]) -> dict[str, str]:
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def short(name: str) -> str:
    """flashgen::prefill::prefill_kernel<...>(args) -> prefill_kernel<...> without namespaces."""
    name = name.split("(")[0] if "(" in name and not name.startswith("void ") else name
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)
    for ns in ("flashgen::prefill::", "flashgen::decode::", "flashgen::", "(anonymous namespace)::"):
        name = name.replace(ns, "")
    return name.replace("__nv_bfloat16", "bf16").replace(", ", ",")


def parse(text: str) -> list[dict]:
    rows: list[dict] = []
    arch: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if m := COMPILING.search(line):
            arch[m.group(1)] = m.group(2)
        elif m := PROPS.search(line):
            current = {"mangled": m.group(1), "arch": arch.get(m.group(1), "?")}
        elif current is not None and (m := FRAME.search(line)):
            current.update(stack=int(m.group(1)), stores=int(m.group(2)), loads=int(m.group(3)))
        elif current is not None and (m := USED.search(line)) and "stack" in current:
            current["regs"] = int(m.group(1))
            rows.append(current)
            current = None
    return rows


def main(argv: list[str]) -> int:
    show_all = "--all" in argv
    filt = None
    files = []
    it = iter(argv)
    for a in it:
        if a == "--all":
            continue
        if a == "--filter":
            filt = next(it)
            continue
        files.append(a)
    if not files:
        print(__doc__, file=sys.stderr)
        return 2
    rows = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            rows += parse(fh.read())
    names = demangle(sorted({r["mangled"] for r in rows}))
    seen = set()
    uniq = []
    for r in rows:  # one line per (kernel, arch): a report may name a kernel more than once
        key = (r["mangled"], r["arch"])
        if key in seen:
            continue
        seen.add(key)
        r["name"] = short(names.get(r["mangled"], r["mangled"]))
        if filt is None or re.search(filt, r["name"]):
            uniq.append(r)
    spilling = [r for r in uniq if r["stores"] or r["loads"]]
    for r in sorted(uniq if show_all else spilling, key=lambda r: (r["arch"], r["name"])):
        print(f"{r['arch']:7} regs {r['regs']:3} stack {r['stack']:4} spill st {r['stores']:4} ld {r['loads']:4}  {r['name']}")
    for a in sorted({r["arch"] for r in uniq}):
        n = [r for r in uniq if r["arch"] == a]
        s = [r for r in n if r["stores"] or r["loads"]]
        print(f"{a}: {len(n)} kernels, {len(s)} with spills")
    return 1 if spilling else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
