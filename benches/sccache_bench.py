#!/usr/bin/env python3
"""Warm sccache rebuild of the default AOT subset against a cold build (issue 9, "Benchmarks").

    . ci/setup.sh && python3 benches/sccache_bench.py [--rounds 3] [--jobs N] [--json PATH]

Stdlib only. Each round builds the AOT subset of variants.json (snapshotted from the last commit,
so edits in the tree during the run change nothing) with `flashgen build --aot --launcher
sccache` twice, each time into an empty flashgen cache:

- cold: an empty sccache cache too (a fresh private sccache server on its own port and folder);
- warm: the cache the cold build filled, another `--out`.

Reported per round: wall clock of each build, the CPU time of flashgen and everything it started
plus the sccache server's (the server does a hit's work), the warm/cold ratio, the summed wall
time of the compile steps (sccache and nvcc) and of the link steps (timed by small wrappers given
as the launcher and as FLASHGEN_NVCC, which exec the real programs), sccache's hit counts, and whether every warm `.so` equals the cold one byte
for byte. The user's caches are never touched: everything lives in one temp folder, removed at
the end, and the private sccache server is stopped.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Stand-ins that time flashgen's two steps into $STEP_LOG: nvcc times the link (`-shared`) and
# execs the real nvcc for anything else (sccache's own preprocessing runs); the launcher times the
# compile step around sccache.
TIMED_NVCC = r"""#!/bin/sh
case " $* " in *" -shared "*) ;; *) exec "{real}" "$@" ;; esac
start=$(date +%s.%N)
"{real}" "$@"
rc=$?
echo "link $start $(date +%s.%N)" >> "$STEP_LOG"
exit $rc
"""
TIMED_LAUNCHER = r"""#!/bin/sh
start=$(date +%s.%N)
"{real}" "$@"
rc=$?
echo "compile $start $(date +%s.%N)" >> "$STEP_LOG"
exit $rc
"""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu(pid):
    """CPU time of a live process and of the children it has waited for, in seconds (0 when
    gone): utime, stime, cutime, cstime of /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class Server:
    """A private sccache server: own folder, own port, no user config."""

    def __init__(self, sccache, folder):
        self.sccache = sccache
        self.env = dict(os.environ, SCCACHE_DIR=str(folder), SCCACHE_SERVER_PORT=str(free_port()),
                        SCCACHE_IDLE_TIMEOUT="0", SCCACHE_CONF="/dev/null")
        subprocess.run([sccache, "--start-server"], env=self.env, check=True,
                       stdout=subprocess.DEVNULL)
        self.pid = self.find_pid()

    def find_pid(self):
        port = self.env["SCCACHE_SERVER_PORT"]
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                env = (p / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SCCACHE_SERVER_PORT={port}".encode() in env and b"SCCACHE_START_SERVER=1" in env:
                return int(p.name)
        return None

    def stats(self):
        out = subprocess.run([self.sccache, "--show-stats", "--stats-format", "json"],
                             env=self.env, check=True, capture_output=True).stdout
        return json.loads(out)["stats"]

    def stop(self):
        subprocess.run([self.sccache, "--stop-server"], env=self.env, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flashgen", help="default: cargo build --release, target/release/flashgen")
    ap.add_argument("--sccache", default=str(ROOT / ".venv" / "bin" / "sccache"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--warm-jobs", type=int, help="jobs of the warm build [default: --jobs]")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    real_nvcc = os.environ.get("FLASHGEN_NVCC")
    if not real_nvcc:
        raise SystemExit("FLASHGEN_NVCC is not set: run `. ci/setup.sh` first")
    if args.flashgen is None:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
        args.flashgen = str(ROOT / "target" / "release" / "flashgen")
    warm_jobs = args.warm_jobs or args.jobs

    with tempfile.TemporaryDirectory(prefix="flashgen-sccache-bench-") as t:
        tmp = Path(t)
        tree = tmp / "tree"
        tree.mkdir()
        tar = subprocess.run(["git", "archive", "HEAD", "variants.json", "csrc", "include"],
                             cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=tar, check=True)
        # The timed nvcc, with nvcc's `lib` beside it as the toolchain expects, and launcher.
        wrap = tmp / "wrap"
        (wrap / "bin").mkdir(parents=True)
        (wrap / "lib").symlink_to(Path(real_nvcc).resolve().parent.parent / "lib")
        timed_nvcc, launcher = wrap / "bin" / "nvcc", wrap / "launcher"
        timed_nvcc.write_text(TIMED_NVCC.replace("{real}", str(Path(real_nvcc).resolve())))
        launcher.write_text(TIMED_LAUNCHER.replace("{real}", str(Path(args.sccache).resolve())))
        for f in (timed_nvcc, launcher):
            f.chmod(0o755)

        rows = []
        for r in range(args.rounds):
            server = Server(args.sccache, tmp / f"sccache-{r}")
            try:
                row = {"round": r}
                for kind in ("cold", "warm"):
                    steps = tmp / f"steps-{r}-{kind}.log"
                    env = dict(server.env, FLASHGEN_NVCC=str(timed_nvcc), STEP_LOG=str(steps),
                               FLASHGEN_CACHE_DIR=str(tmp / f"cache-{r}-{kind}"))
                    for k in ("FLASHGEN_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS",
                              "FLASHGEN_NVCC_LAUNCHER"):
                        env.pop(k, None)
                    jobs = args.jobs if kind == "cold" else warm_jobs
                    argv = [args.flashgen, "--config", str(tree / "variants.json"), "build",
                            "--aot", "--json", "--jobs", str(jobs), "--launcher", str(launcher),
                            "--out", str(tmp / f"out-{r}-{kind}")]
                    before = os.times()
                    server_before = proc_cpu(server.pid)
                    t0 = time.perf_counter()
                    p = subprocess.run(argv, env=env, capture_output=True)
                    wall = time.perf_counter() - t0
                    after = os.times()
                    if p.returncode != 0:
                        raise SystemExit(p.stderr.decode(errors="replace")[-4000:])
                    summary = json.loads(p.stdout)
                    sums = {"compile": 0.0, "link": 0.0}
                    for line in steps.read_text().splitlines():
                        k, a, b = line.split()
                        sums[k] += float(b) - float(a)
                    row[kind] = {
                        "wall_s": round(wall, 2),
                        "cpu_s": round(after.children_user + after.children_system
                                       - before.children_user - before.children_system
                                       + proc_cpu(server.pid) - server_before, 2),
                        "compile_steps_s": round(sums["compile"], 2),
                        "link_steps_s": round(sums["link"], 2),
                        "built": summary["built"],
                        "jobs": jobs,
                        "sha256": {i["uri"]: i["sha256"] for i in summary["instances"]},
                    }
                    if kind == "warm":
                        hits = server.stats()["cache_hits"]["counts"]
                        row["warm"]["sccache_hits"] = hits
                    log(f"round {r} {kind}: {row[kind]['wall_s']} s wall, {row[kind]['cpu_s']} s "
                        f"cpu, compile steps {row[kind]['compile_steps_s']} s, link steps "
                        f"{row[kind]['link_steps_s']} s (load {os.getloadavg()[0]:.2f})")
                row["ratio"] = round(row["warm"]["wall_s"] / row["cold"]["wall_s"], 3)
                row["same_bytes"] = row["warm"].pop("sha256") == row["cold"].pop("sha256")
                rows.append(row)
            finally:
                server.stop()
        med = statistics.median
        result = {
            "cores": os.cpu_count(),
            "rounds": rows,
            "median_cold_s": round(med(r["cold"]["wall_s"] for r in rows), 2),
            "median_warm_s": round(med(r["warm"]["wall_s"] for r in rows), 2),
            "median_ratio": round(med(r["ratio"] for r in rows), 3),
            "all_same_bytes": all(r["same_bytes"] for r in rows),
        }
        print(json.dumps(result, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
