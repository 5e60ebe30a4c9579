"""What a release's kernels weigh, per module and backend, and what the whole matrix would weigh
at those rates (issue 24's size budget). Give it one wheel, or a release's wheels (the core and
its kernel wheels, whose sizes are added per instance); it reads their manifests and the core's
matrix, nothing else.

    python3 benches/release_size.py dist/flashgen-*.whl
    python3 benches/release_size.py dist/flashgen-0.1.0-*.whl dist/flashgen_kernels_*.whl
"""

from __future__ import annotations

import collections
import json
import os
import sys
import zipfile


def main(paths: list[str]) -> None:
    size: collections.Counter = collections.Counter()
    uris: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    matrix = None
    other = 0
    for path in paths:
        z = zipfile.ZipFile(path)
        names = z.namelist()
        if "flashgen/_data/matrix.json" in names:
            matrix = json.loads(z.read("flashgen/_data/matrix.json"))
            # The wheel keeps each module's instances in a file of their own.
            matrix.setdefault("instances", [row for m in matrix["modules"]
                                            for row in json.loads(z.read(f"flashgen/_data/instances/{m}.json"))])
        manifest_name = next(n for n in names if n.endswith("/_aot/manifest.json"))
        manifest = json.loads(z.read(manifest_name))
        package = manifest_name.split("/")[0]
        rows = {r["uri"]: r for r in manifest["instances"]}
        for m in manifest.get("module_rows") or {}:  # and each module's manifest rows
            rows.update((r["uri"], r) for r in json.loads(z.read(f"{package}/_aot/rows/{m}.json")))
        print(f"{os.path.basename(path)}: {os.path.getsize(path) / 2**20:.2f} MiB, "
              f"{len(rows)} instances, targets {', '.join(t['target'] for t in manifest['runs_on']) or '-'}")
        for info in z.infolist():
            name = info.filename.rsplit("/", 1)[-1]
            if "/_aot/" in info.filename and name.endswith(".so"):
                r = rows[name[:-3]]
                g = (r["module"], str(r["params"].get("backend", "-")))
                size[g] += info.compress_size
                uris[g].add(r["uri"])
            else:
                other += info.compress_size
    if matrix is None:
        print("no core wheel given (it holds the matrix): no extrapolation")
        return
    full = collections.Counter((i["module"], str(i["params"].get("backend", "-"))) for i in matrix["instances"])
    print(f"{'module':22} {'backend':9} {'here':>5} {'KiB each':>9} {'matrix':>7} {'MiB at this rate':>17}")
    total = 0.0
    for g in sorted(full):
        n = len(uris[g])
        each = size[g] / n / 1024 if n else float("nan")
        est = each * full[g] / 1024 if n else float("nan")
        total += est if n else 0.0
        print(f"{g[0]:22} {g[1]:9} {n:5} {each:9.1f} {full[g]:7} {est:17.1f}")
    print(f"everything else (binary, sources, loader, metadata): {other / 2**20:.2f} MiB")
    print(f"the whole matrix at these rates: {total:.1f} MiB of kernels, {total + other / 2**20:.1f} MiB in all")


if __name__ == "__main__":
    main(sys.argv[1:])
