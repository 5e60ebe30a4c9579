#!/usr/bin/env python3
"""Build-system benchmarks for flashgen (issue 2, "Benchmarks").

    . ci/setup.sh && python3 benches/build_bench.py [--runs 5] [--synthetic 10000] [--jobs N]

Stdlib only. Everything (caches, output folders, the synthetic matrix, the fake compiler, the
build.ninja files) lives in one temp folder that is removed at the end; the user's
~/.cache/flashgen is never touched (FLASHGEN_CACHE_DIR always points into the temp folder).

What is measured (wall clock of the whole `flashgen` / `ninja` process, median of --runs for
no-op runs, median of --cold-runs (default 3) for cold builds against ninja, one cold run elsewhere):

The default matrix (variants.json, csrc/, include/) and tests/fixtures/toy are copied into the
temp folder first (from the last commit, or with --tree worktree as they are), so edits landing
in the tree during the run cannot turn a no-op into a build.

1. No-op rebuild of the default matrix (variants.json):
   a. all its instances, cache filled once by the FAKE compiler (the no-op path never runs a
      compiler, so this is the real no-op cost of the full default matrix);
   b. its AOT subset, cache filled by the REAL nvcc (FLASHGEN_NVCC from ci/setup.sh); the cold
      build also gives a parallel-efficiency figure.
2. A synthetic matrix of --synthetic instances (4 axes of 10 values: int, int, enum, variant),
   compiled by a fake compiler (a /bin/sh script that writes its -o file and answers
   --version like nvcc 13.0): cold build and no-op rebuild.
3. flashgen build --jobs N against ninja -j N, two ways: (i) one edge per instance running the
   compile step's argv from `flashgen generate`'s compile_commands.json (issue 2's peer, from
   when flashgen ran one nvcc per instance), (ii) flashgen's own plan, `flashgen generate
   --ninja`'s build.ninja (compile + link per instance, the same steps flashgen runs). Cold
   (flashgen: empty FLASHGEN_CACHE_DIR and --out; ninja: no outputs, no .ninja_log, then
   --settle seconds, because on ext4 without a journal files created within ~10 s of mass
   deletion are slow to create) and no-op,
   (a) with real nvcc on tests/fixtures/toy --where fast=true --where width=64 (8 instances),
   (b) with the fake compiler on the synthetic matrix.
4. Parallel efficiency of a cold real build: (sum of per-instance nvcc wall times / jobs) /
   flashgen wall time, from `build --json` (`compile_s`, `jobs`) and the process wall clock.
5. What hashing costs (issue 23), after each no-op of 1a, 1b and 2: a rebuild after one source
   file's mtime moved (the stamp no longer matches: every key is derived again, but every cache
   object and output keeps the id it was verified with, so none is read), and a rebuild after
   every cache object's and output's ctime moved (chmod to the same mode: every object is
   re-hashed at lookup and again as it is handed out, and every output is hashed). Median of
   --runs each. --trust-only runs 1a, 1b and 2 with these rows and nothing else.
"""

import argparse
import json
import os
import shlex
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "tests" / "fixtures" / "toy"

FAKE_NVCC = r"""#!/bin/sh
# A fake nvcc for benchmarks: copies a stub shared object (built once with cc, exporting every
# entry point the benchmarked matrices declare, since flashgen checks them) to its -o file, and
# answers --version like nvcc 13.0.
if [ "$1" = "--version" ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Cuda compilation tools, release 13.0, V13.0.88"
  exit 0
fi
out=
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out=$2; shift; fi
  shift
done
[ -n "$out" ] || { echo "fake nvcc: no -o" >&2; exit 1; }
cp "$(dirname "$0")/stub.so" "$out"
"""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.flashgen = str(Path(args.flashgen).resolve())
        self.ninja = args.ninja
        self.real_nvcc = os.environ.get("FLASHGEN_NVCC")
        self.fake_nvcc = tmp / "fakecuda" / "bin" / "nvcc"
        self.fake_nvcc.parent.mkdir(parents=True)
        self.fake_nvcc.write_text(FAKE_NVCC)
        self.fake_nvcc.chmod(0o755)
        # Other people edit csrc/ and include/ while this runs: take a snapshot, so that a
        # "no-op" run sees exactly the tree its cache was filled from.
        # By default the snapshot is of the last commit (a half-edited working tree may not
        # compile); --tree worktree takes the files as they are now.
        self.tree = tmp / "tree"
        self.tree.mkdir()
        paths = ["variants.json", "csrc", "include", str(TOY.relative_to(ROOT))]
        if args.tree == "head":
            self.commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                         capture_output=True, text=True, check=True).stdout.strip()
            tar = subprocess.run(["git", "archive", "HEAD", *paths], cwd=ROOT,
                                 capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(self.tree)], input=tar, check=True)
        else:
            self.commit = "working tree"
            for p in paths:
                src, dst = ROOT / p, self.tree / p
                if src.is_dir():
                    shutil.copytree(src, dst)
                else:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
        self.toy = self.tree / TOY.relative_to(ROOT)
        self.build_stub()
        self.rows = []  # (metric, flashgen, peer, goal, met)
        self.details = []  # (name, value)

    def build_stub(self):
        """The fake compiler's output: a real ELF shared object that exports every entry point of
        the default matrix, the toy fixture and the synthetic matrix."""
        names = {"syn_entry"}
        for cfg in (self.tree / "variants.json", self.toy / "variants.json"):
            for m in json.loads(cfg.read_text())["modules"].values():
                names.update(m["entry_points"])
        src = self.fake_nvcc.parent / "stub.c"
        src.write_text("".join(f"int {n}(void) {{ return 0; }}\n" for n in sorted(names)))
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(src.with_suffix(".so")), str(src)], check=True)

    # -- running -----------------------------------------------------------------------------

    def env(self, nvcc, cache):
        e = dict(os.environ)
        e["FLASHGEN_NVCC"] = str(nvcc)
        e["FLASHGEN_CACHE_DIR"] = str(cache)
        for k in ("FLASHGEN_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_CCBIN"):
            e.pop(k, None)
        return e

    def run(self, argv, env, cwd=ROOT, capture=False):
        """Runs argv; returns (wall seconds, stdout text or None)."""
        t0 = time.perf_counter()
        p = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(
                f"command failed ({p.returncode}): {shlex.join(map(str, argv))}\n"
                + p.stderr.decode(errors="replace")[-4000:]
            )
        return wall, (p.stdout.decode() if capture else None)

    def fg(self, config, *rest):
        return [self.flashgen, "--config", str(config), *rest]

    def median_runs(self, argv, env, cwd=ROOT, n=None):
        n = n or self.args.runs
        times = [self.run(argv, env, cwd)[0] for _ in range(n)]
        return statistics.median(times), times

    def add(self, metric, flashgen, peer, goal, met):
        self.rows.append((metric, flashgen, peer, goal, met))

    def note(self, name, value):
        self.details.append((name, value))
        log(f"  {name}: {value}")

    # -- inputs ------------------------------------------------------------------------------

    def synthetic_matrix(self, n):
        """A toy module whose 4 axes (int, int, enum, variant) expand to about n instances."""
        per = max(2, round(n ** 0.25))
        d = self.tmp / "synth"
        (d / "csrc").mkdir(parents=True)
        vdir = d / "include" / "syn" / "variants"
        vdir.mkdir(parents=True)
        variants = {}
        for v in range(per):
            name = f"v{v}"
            (vdir / f"{name}.cuh").write_text(
                f"#pragma once\n#include <syn/common.cuh>\n"
                f"template <typename P> struct V{v} {{ static constexpr int id = {v}; }};\n"
            )
            variants[name] = {
                "header": f"syn/variants/{name}.cuh",
                "struct": f"V{v}",
                "params": [{"name": f"p{v}", "type": "float"}] if v % 2 else [],
            }
        (d / "include" / "syn" / "common.cuh").write_text("#pragma once\n#include <cstdint>\n")
        (d / "csrc" / "syn.cu").write_text(
            "#include <flashgen_instance.cuh>\n#include <syn/common.cuh>\n"
            'extern "C" int syn_entry() { return A + B; }\n'
        )
        cfg = {
            "archs": ["8.0"],
            "nvcc_flags": ["-O3", "-std=c++17", "-Xcompiler=-fvisibility=hidden"],
            "variants": variants,
            "modules": {
                "syn": {
                    "source": "syn.cu",
                    "entry_points": ["syn_entry"],
                    "axes": [
                        {"name": "a", "type": "int", "values": list(range(1, per + 1))},
                        {"name": "b", "type": "int", "values": [16 * (i + 1) for i in range(per)]},
                        {"name": "mode", "type": "enum", "values": [f"m{i}" for i in range(per)]},
                        {"name": "variant", "type": "variant", "values": list(variants)},
                    ],
                    "aot": {"include": [{"a": [1]}], "exclude": []},
                }
            },
        }
        (d / "variants.json").write_text(json.dumps(cfg, indent=1))
        return d / "variants.json", per ** 4

    def write_ninja(self, config, gen_dir, filters, nvcc, cache):
        """`flashgen generate --out gen_dir` then build.ninja over its compile_commands.json.

        Each edge runs the exact argv flashgen would run; inputs are the source, the generated
        header and every file under the tree's include/ and csrc/ (what flashgen hashes)."""
        t, _ = self.run(self.fg(config, "generate", "--out", str(gen_dir), *filters),
                        self.env(nvcc, cache))
        cmds = json.loads((gen_dir / "compile_commands.json").read_text())
        tree = Path(config).resolve().parent
        deps = sorted(
            str(p) for sub in ("include", "csrc") for p in (tree / sub).rglob("*") if p.is_file()
        )
        esc = lambda s: s.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")
        lines = ["ninja_required_version = 1.5", "rule nvcc", "  command = $cmd", ""]
        for c in cmds:
            argv = c["arguments"]
            out = c["output"]
            src = argv[argv.index("-o") - 1]  # the source
            inc = next(a[2:] for a in argv if a.startswith("-I"))  # generated header's folder
            implicit = [str(Path(inc) / "flashgen_instance.cuh")] + deps
            cmd = shlex.join(argv).replace("$", "$$")
            lines.append(f"build {esc(out)}: nvcc {esc(src)} | "
                         + " ".join(esc(p) for p in implicit))
            lines.append(f"  cmd = {cmd}")
        (gen_dir / "build.ninja").write_text("\n".join(lines) + "\n")
        return [c["output"] for c in cmds], t

    def ninja_clean(self, gen_dir, outputs):
        for o in outputs:
            try:
                os.unlink(o)
            except FileNotFoundError:
                pass
        for f in (".ninja_log", ".ninja_deps"):
            try:
                (gen_dir / f).unlink()
            except FileNotFoundError:
                pass

    # -- the benchmarks ----------------------------------------------------------------------

    def default_setup(self, nvcc, name):
        """The default matrix's config, a cache and an output folder of their own (``name``), the
        environment that compiles with ``nvcc``, and the job count."""
        cfg = self.tree / "variants.json"
        cache, out = self.tmp / f"c-default-{name}", self.tmp / f"o-default-{name}"
        return cfg, cache, out, self.env(nvcc, cache), str(self.args.jobs)

    def default_matrix_noop(self):
        log("== 1a. default matrix, all instances, no-op (cache filled by the fake compiler)")
        cfg, cache, out, env, jobs = self.default_setup(self.fake_nvcc, "fake")
        t_cold, text = self.run(self.fg(cfg, "build", "--out", str(out), "-j", jobs, "--json"),
                                env, capture=True)
        s = json.loads(text)
        n = s["built"] + s["cached"]
        self.note("default matrix instances", n)
        self.note("default matrix cold build, fake compiler (s)", f"{t_cold:.3f}")
        argv = self.fg(cfg, "build", "--out", str(out), "-j", jobs, "--quiet")
        med, times = self.median_runs(argv, env)
        self.note("default matrix no-op runs (s)", " ".join(f"{x:.4f}" for x in times))
        self.add(f"no-op rebuild, default matrix ({n} inst., fake-filled cache)",
                 f"{med:.3f} s", "", "< 0.2 s", med < 0.2)
        self.hashing_cost(f"default matrix ({n} inst., fake)", cfg, env, out, cache, argv)
        if not self.args.trust_only:
            self.phases("default", cfg, env, out)

    def default_aot_real(self):
        log("== 1b. default matrix AOT subset with the real nvcc: cold, then no-op")
        cfg, cache, out, env, jobs = self.default_setup(self.real_nvcc, "real")
        argv = self.fg(cfg, "build", "--out", str(out), "-j", jobs, "--aot")
        t_cold, text = self.run(argv + ["--json"], env, capture=True)
        s = json.loads(text)
        n = s["built"]
        self.efficiency(f"default AOT subset ({n} inst., real nvcc, -j{jobs})", s, t_cold)
        med, times = self.median_runs(argv + ["--quiet"], env)
        self.note("default AOT no-op runs (s)", " ".join(f"{x:.4f}" for x in times))
        self.add(f"no-op rebuild, default matrix AOT subset ({n} inst., real nvcc)",
                 f"{med:.3f} s", "", "< 0.2 s", med < 0.2)
        self.hashing_cost(f"default AOT subset ({n} inst., real nvcc)", cfg, env, out, cache,
                          argv + ["--quiet"])

    def hashing_cost(self, label, cfg, env, out, cache, argv):
        """Section 5: the slow path without and with re-hashing every object and output."""
        objects = sorted((cache / "objects").rglob("*.so"))
        outputs = sorted(out.glob("*.so"))
        total = sum(p.stat().st_size for p in objects) + sum(p.stat().st_size for p in outputs)
        source = next(p for p in sorted((cfg.parent / "include").rglob("*")) if p.is_file())
        self.note(f"{label}: objects, outputs, bytes", f"{len(objects)} {len(outputs)} {total}")

        def move_source_mtime():
            st = source.stat()
            os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))

        def move_every_ctime():
            before = objects[0].stat().st_ctime_ns
            for p in objects + outputs:
                os.chmod(p, stat.S_IMODE(p.stat().st_mode))
            assert objects[0].stat().st_ctime_ns != before, "chmod did not move the ctime"

        for what, prepare in (("source mtime", move_source_mtime), ("every ctime", move_every_ctime)):
            times = []
            for _ in range(self.args.runs):
                prepare()
                times.append(self.run(argv, env)[0])
            self.note(f"{label}: rebuild after {what} moved, runs (s)",
                      " ".join(f"{x:.4f}" for x in times))
            med = statistics.median(times)
            if what == "source mtime":
                metric = f"rebuild after a source's mtime moved (keys again, nothing re-hashed), {label}"
            else:
                metric = (f"rebuild after every object's and output's ctime moved (all re-hashed, "
                          f"{total / 2**20:.1f} MiB), {label}")
            self.add(metric, f"{med:.3f} s", "", "", True)
        after, _ = self.median_runs(argv, env)
        self.note(f"{label}: no-op after those (s)", f"{after:.4f}")

    def efficiency(self, label, s, t_process):
        jobs = s["jobs"]
        eff_proc = s["compile_s"] / jobs / t_process
        eff_int = s["compile_s"] / jobs / s["wall_s"]
        self.note(f"{label}: compile_s / jobs / wall", f"compile_s={s['compile_s']:.2f} "
                  f"jobs={jobs} wall_s(internal)={s['wall_s']:.2f} process={t_process:.2f} "
                  f"-> {eff_proc:.3f} (internal {eff_int:.3f})")
        self.add(f"parallel efficiency, {label}", f"{eff_proc:.3f}", "", ">= 0.95",
                 eff_proc >= 0.95)

    def phases(self, name, cfg, env, out):
        """Splits a no-op build into what each verb adds, to find where the time goes."""
        gen = self.tmp / f"g-phase-{name}"
        self.run(self.fg(cfg, "generate", "--out", str(gen)), env)
        steps = [
            ("--version (process start)", [self.flashgen, "--version"]),
            ("describe (load + expand + JSON)", self.fg(cfg, "describe")),
            ("doctor (load + toolchain)", self.fg(cfg, "doctor", "--json")),
            ("list-variants --json (+ headers, keys, cache lookups)",
             self.fg(cfg, "list-variants", "--json")),
            ("generate, unchanged (+ header compare, compile_commands)",
             self.fg(cfg, "generate", "--out", str(gen))),
            ("build, no-op (+ header compare, lookups, place, manifest)",
             self.fg(cfg, "build", "--out", str(out), "-j", str(self.args.jobs), "--quiet")),
        ]
        for label, argv in steps:
            med, _ = self.median_runs(argv, env)
            self.note(f"phase [{name}] {label}", f"{med:.4f} s")

    def synthetic(self):
        n_req = self.args.synthetic
        log(f"== 2. synthetic matrix (~{n_req} instances), fake compiler")
        cfg, n = self.synthetic_matrix(n_req)
        self.note("synthetic instances", n)
        jobs = str(self.args.jobs)
        cache, out = self.tmp / "c-syn", self.tmp / "o-syn"
        env = self.env(self.fake_nvcc, cache)
        argv = self.fg(cfg, "build", "--out", str(out), "-j", jobs, "--quiet")
        t_cold, _ = self.run(argv, env)
        med, times = self.median_runs(argv, env)
        self.note("synthetic cold build (s)", f"{t_cold:.3f}")
        self.note("synthetic no-op runs (s)", " ".join(f"{x:.4f}" for x in times))
        self.add(f"no-op rebuild, synthetic ({n} inst.)", f"{med:.3f} s", "", "< 2 s", med < 2.0)
        self.hashing_cost(f"synthetic ({n} inst., fake)", cfg, env, out, cache, argv)
        if self.args.trust_only:
            return
        self.phases("synthetic", cfg, env, out)
        self.vs_ninja(f"synthetic ({n} inst., fake compiler)", cfg, [], self.fake_nvcc, "syn")

    def toy_vs_ninja(self):
        log("== 3a. toy fixture, fast=true width=64 (8 instances), real nvcc, vs ninja")
        filters = ["--where", "fast=true", "--where", "width=64"]
        # Warm the page cache for nvcc, cicc, ptxas and g++ with one throwaway compile.
        warm = self.tmp / "warm"
        self.run(self.fg(self.toy / "variants.json", "build", "--out", str(warm / "o"), "-j", "1",
                         "--quiet", "--where", "fast=false", "--where", "width=32",
                         "--where", "dtype=f16", "--where", "mode=sum",
                         "--where", "variant=plain"),
                 self.env(self.real_nvcc, warm / "c"))
        self.vs_ninja("toy (8 inst., real nvcc)", self.toy / "variants.json", filters,
                      self.real_nvcc, "toy", efficiency=True)

    def vs_ninja(self, label, cfg, filters, nvcc, tag, efficiency=False):
        jobs = str(self.args.jobs)
        gen = self.tmp / f"ninja-{tag}"
        outputs, t_gen = self.write_ninja(cfg, gen, filters, nvcc, self.tmp / f"c-gen-{tag}")
        self.note(f"{label}: flashgen generate (headers + compile_commands), not in ninja's time",
                  f"{t_gen:.3f} s")
        ninja_argv = [self.ninja, "-C", str(gen), "-j", jobs]
        # (ii) flashgen's own plan: the same two steps per instance as flashgen build.
        plan = self.tmp / f"plan-{tag}"
        self.run(self.fg(cfg, "generate", "--ninja", "--out", str(plan), *filters),
                 self.env(nvcc, self.tmp / f"c-plan-{tag}"))
        plan_argv = [self.ninja, "-C", str(plan), "-j", jobs]
        fg_cold, fg_noop, nj_cold, nj_noop, pl_cold = [], [], [], [], []
        for r in range(self.args.cold_runs):
            cache, out = self.tmp / f"c-vs-{tag}-{r}", self.tmp / f"o-vs-{tag}-{r}"
            env = self.env(nvcc, cache)
            argv = self.fg(cfg, "build", "--out", str(out), "-j", jobs, *filters)
            # Alternate who goes first, so neither always gets the warmer page cache.
            order = ["ninja", "plan", "flashgen"]
            if r % 2:
                order.reverse()
            for who in order:
                if who == "ninja":
                    self.ninja_clean(gen, outputs)
                    time.sleep(self.args.settle)
                    nj_cold.append(self.run(ninja_argv, env)[0])
                elif who == "plan":
                    subprocess.run([self.ninja, "-C", str(plan), "-t", "clean"], check=True,
                                   stdout=subprocess.DEVNULL)
                    self.ninja_clean(plan, [])
                    time.sleep(self.args.settle)
                    pl_cold.append(self.run(plan_argv, env)[0])
                elif efficiency:
                    t, text = self.run(argv + ["--json"], env, capture=True)
                    fg_cold.append(t)
                    s = json.loads(text)
                    assert s["built"] == len(outputs), (s["built"], len(outputs))
                    if r == 0:
                        self.efficiency(f"{label}, -j{jobs}", s, t)
                else:  # no 10k-entry JSON summary through a pipe: check the output instead
                    fg_cold.append(self.run(argv + ["--quiet"], env)[0])
                    built = sum(1 for _ in out.glob("*.so"))
                    assert built == len(outputs), (built, len(outputs))
            missing = [o for o in outputs if not os.path.exists(o)]
            assert not missing, f"ninja did not build {missing[:3]}"
            # No-op: interleaved, median.
            for _ in range(self.args.runs):
                fg_noop.append(self.run(argv + ["--quiet"], env)[0])
                nj_noop.append(self.run(ninja_argv, env)[0])
        med = statistics.median
        self.note(f"{label}: cold flashgen runs (s)", " ".join(f"{x:.3f}" for x in fg_cold))
        self.note(f"{label}: cold ninja runs (s)", " ".join(f"{x:.3f}" for x in nj_cold))
        self.note(f"{label}: cold ninja-on-plan runs (s)", " ".join(f"{x:.3f}" for x in pl_cold))
        self.note(f"{label}: no-op flashgen runs (s)", " ".join(f"{x:.4f}" for x in fg_noop))
        self.note(f"{label}: no-op ninja runs (s)", " ".join(f"{x:.4f}" for x in nj_noop))
        # Median decides; the min is shown too (on a shared machine noise only adds time).
        a, b = med(fg_cold), med(nj_cold)
        self.note(f"{label}: cold ninja + flashgen generate, median (s)", f"{b + t_gen:.3f}")
        self.add(f"cold build vs ninja, {label}, -j{jobs}",
                 f"{a:.3f} s (min {min(fg_cold):.3f})",
                 f"{b:.3f} s (min {min(nj_cold):.3f}; +generate {b + t_gen:.3f})",
                 "flashgen <= ninja", a <= b)
        c = med(pl_cold)
        self.add(f"cold build vs ninja on flashgen's plan (generate --ninja), {label}, -j{jobs}",
                 f"{a:.3f} s (min {min(fg_cold):.3f})", f"{c:.3f} s (min {min(pl_cold):.3f})",
                 "flashgen <= ninja", a <= c)
        a, b = med(fg_noop), med(nj_noop)
        self.add(f"no-op vs ninja, {label}", f"{a:.4f} s (min {min(fg_noop):.4f})",
                 f"{b:.4f} s (min {min(nj_noop):.4f})", "flashgen <= ninja", a <= b)

    # -- report ------------------------------------------------------------------------------

    def table(self):
        head = ("metric", "flashgen", "peer (ninja)", "goal", "met?")
        rows = [head] + [(m, f, p or "-", g, "yes" if ok else "NO") for m, f, p, g, ok in self.rows]
        w = [max(len(r[i]) for r in rows) for i in range(5)]
        fmt = lambda r: "| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |"
        lines = [fmt(head), "|" + "|".join("-" * (x + 2) for x in w) + "|"]
        lines += [fmt(r) for r in rows[1:]]
        return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flashgen", default=None,
                    help="the binary to time [default: `cargo build --release`, then "
                    "target/release/flashgen]")
    ap.add_argument("--ninja", default=None, help="default: .venv/bin/ninja, else PATH")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=5, help="no-op runs per median")
    ap.add_argument("--cold-runs", type=int, default=3, help="cold builds per side vs ninja")
    ap.add_argument("--synthetic", type=int, default=10000)
    ap.add_argument("--settle", type=float, default=12.0,
                    help="seconds to wait after deleting ninja's outputs, before its cold run")
    ap.add_argument("--skip-real", action="store_true", help="skip everything that runs nvcc")
    ap.add_argument("--tree", choices=["head", "worktree"], default="head",
                    help="snapshot variants.json, csrc/, include/ and the toy fixture from the "
                    "last commit (default) or the working tree")
    ap.add_argument("--trust-only", action="store_true",
                    help="only the no-op rows of 1a, 1b and 2, each with section 5's rows")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args()

    if args.flashgen is None:
        log("cargo build --release (so the binary matches the tree)")
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
        args.flashgen = str(ROOT / "target" / "release" / "flashgen")
    if args.ninja is None:
        venv = ROOT / ".venv" / "bin" / "ninja"
        args.ninja = str(venv) if venv.is_file() else shutil.which("ninja")
    if not args.ninja:
        raise SystemExit("ninja not found: run `. ci/setup.sh` (installs PyPI ninja into .venv)")
    if not args.skip_real and not os.environ.get("FLASHGEN_NVCC"):
        raise SystemExit("FLASHGEN_NVCC is not set: run `. ci/setup.sh` first (or --skip-real)")

    with tempfile.TemporaryDirectory(prefix="flashgen-build-bench-") as t:
        b = Bench(args, Path(t))
        ninja_version = subprocess.run([args.ninja, "--version"], capture_output=True,
                                       text=True).stdout.strip()
        log(f"machine: {os.cpu_count()} cores; jobs {args.jobs}; ninja {ninja_version}; "
            f"nvcc {b.real_nvcc}; sources: {b.commit}")
        b.note("load average at start (1/5/15 min)", " ".join(f"{x:.2f}" for x in os.getloadavg()))
        b.default_matrix_noop()
        if not args.skip_real:
            b.default_aot_real()
        b.synthetic()
        if not args.skip_real and not args.trust_only:
            b.toy_vs_ninja()
        b.note("load average at end (1/5/15 min)", " ".join(f"{x:.2f}" for x in os.getloadavg()))
        table = b.table()
        print(table)
        if args.json:
            Path(args.json).write_text(json.dumps({
                "cores": os.cpu_count(), "jobs": args.jobs, "ninja": ninja_version,
                "sources": b.commit,
                "rows": [dict(zip(("metric", "flashgen", "peer", "goal", "met"), r))
                         for r in b.rows],
                "details": dict(b.details),
            }, indent=1))


if __name__ == "__main__":
    main()
