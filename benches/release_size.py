"""What a wheel's kernels weigh, per module and backend, and what the whole matrix would weigh
at those rates (issue 24's size budget): reads the wheel's manifest and matrix, nothing else.

    python3 benches/release_size.py dist/flashgen-*.whl
"""

from __future__ import annotations

import collections
import json
import sys
import zipfile


def main(path: str) -> None:
    z = zipfile.ZipFile(path)
    manifest = json.loads(z.read("flashgen/_aot/manifest.json"))
    matrix = json.loads(z.read("flashgen/_data/matrix.json"))
    rows = {r["uri"]: r for r in manifest["instances"]}

    def group(r: dict) -> tuple[str, str]:
        return r["module"], str(r["params"].get("backend", "-"))

    size: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    other = 0
    for info in z.infolist():
        name = info.filename.rsplit("/", 1)[-1]
        if info.filename.startswith("flashgen/_aot/") and name.endswith(".so"):
            g = group(rows[name[:-3]])
            size[g] += info.compress_size
            count[g] += 1
        else:
            other += info.compress_size
    full = collections.Counter(group(i) for i in matrix["instances"])
    print(f"{path}: {z.fp.seek(0, 2) / 2**20:.2f} MiB, {sum(count.values())} instances, "
          f"targets {', '.join(t['target'] for t in manifest['runs_on'])}")
    print(f"{'module':22} {'backend':9} {'here':>5} {'KiB each':>9} {'matrix':>7} {'MiB at this rate':>17}")
    total = 0.0
    for g in sorted(full):
        each = size[g] / count[g] / 1024 if count[g] else float("nan")
        est = each * full[g] / 1024 if count[g] else float("nan")
        total += est if count[g] else 0.0
        print(f"{g[0]:22} {g[1]:9} {count[g]:5} {each:9.1f} {full[g]:7} {est:17.1f}")
    print(f"everything else (binary, sources, loader): {other / 2**20:.2f} MiB")
    print(f"the whole matrix at these rates: {total:.1f} MiB of kernels, {total + other / 2**20:.1f} MiB "
          "in one wheel")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
