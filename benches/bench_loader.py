"""Loader and wheel benchmarks (issue 3): prints a table of figures against their goals.

Sections (default: all that can run here):
  startup   fresh process, warm cache: `import flashgen` to the first kernel done, CUDA context
            creation excluded (GPU)                                   goal < 20 ms
  overhead  host time per tiny single_decode call, against a bare ctypes call of the same kernel
            and a bare torch op, in the same run (GPU)               goal < 5 us added
  wrapper   host time per batch_decode call: BatchDecodeWithPagedKVCacheWrapper.run(), the
            functional call and a bare ctypes call (GPU)        goal run() <= the functional call
  jit       cold JIT of one not-precompiled instance through the loader, against nvcc alone on
            the same command (no GPU needed: set FLASHGEN_CUDA_ARCH_LIST)
                                                                     goal < 5 % added
            and, on a GPU, the first call of that instance, compile included
                                                                     goal < 10 s
  wheel     wheel size per precompiled instance, with and without fatbin compression (builds
            the AOT subset twice with the flashgen binary in FLASHGEN_BIN)

Run with the wheel installed (PYTHONPATH=<site>) or from the source tree (PYTHONPATH=python with
FLASHGEN_BIN=target/release/flashgen):  python3 benches/bench_loader.py [section ...]
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS: list[tuple[str, str, str, str]] = []


def row(metric: str, value: str, peer: str = "", goal: str = "") -> None:
    ROWS.append((metric, value, peer, goal))
    print(f"  {metric}: {value}  {peer}  {goal}", flush=True)


def have_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# ------------------------------------------------------------------------------------ startup

STARTUP = r"""
import time, torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()  # context first
q = torch.randn(32, 128, dtype=torch.bfloat16, device="cuda")
k = torch.randn(1024, 8, 128, dtype=torch.bfloat16, device="cuda")
t0 = time.perf_counter()
import flashgen
o = flashgen.single_decode(q, k, k)
torch.cuda.synchronize()
print(time.perf_counter() - t0)
"""


def bench_startup(env: dict[str, str]) -> None:
    times = []
    for _ in range(7):
        out = subprocess.run([sys.executable, "-c", STARTUP], env=env, check=True,
                             capture_output=True, text=True).stdout
        times.append(float(out.strip().splitlines()[-1]))
    row("import flashgen -> first kernel done (warm, precompiled)",
        f"{statistics.median(times) * 1e3:.1f} ms (median of 7; min {min(times) * 1e3:.1f})",
        goal="< 20 ms")


# ----------------------------------------------------------------------------------- overhead

def per_call(fn, n: int = 3000) -> float:
    """Host seconds per call of ``fn`` (median of 7 rounds of n, after 200 warm-up calls)."""
    import torch

    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def bench_overhead() -> None:
    import torch

    import flashgen
    from flashgen import _loader

    q = torch.randn(8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(16, 8, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    o = torch.empty_like(q)
    a, b, c = (torch.randn(8, 128, device="cuda") for _ in range(3))

    loaded = _loader.load("single_decode", {"dtype": "bf16", "head_dim": 128, "pos_encoding": "none",
                                            "variant": "default"})
    lib = loaded.kernels
    from flashgen._kernels import SingleDecodeArgs

    ws_bytes = lib.workspace_size("single_decode", SingleDecodeArgs(
        num_qo_heads=8, num_kv_heads=8, kv_len=16, head_dim=128, dtype_code=loaded.codes["dtype"],
        variant_code=loaded.codes["variant"]))
    ws = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    # The bare peer: the same entry point with a prepared arguments struct, so what it costs
    # is the ctypes call and the C entry's launch of the kernel.
    args = SingleDecodeArgs(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=None, stream=stream,
        additional_params=None, workspace=ws.data_ptr(), workspace_bytes=ws.numel(),
        num_qo_heads=8, num_kv_heads=8, kv_len=16, head_dim=128, q_stride_h=128,
        k_stride_n=8 * 128, k_stride_h=128, v_stride_n=8 * 128, v_stride_h=128, o_stride_h=128,
        dtype_code=loaded.codes["dtype"], variant_code=loaded.codes["variant"],
        sm_scale=128 ** -0.5)
    bare, addr = lib.entry("single_decode"), ctypes.addressof(args)
    status = bare(addr)
    assert status == 0, f"bare call: status {status}: {lib.last_error()}"

    def api() -> None:
        flashgen.single_decode(q, k, v, out=o)

    def ctypes_call() -> None:
        bare(addr)

    def torch_op() -> None:
        torch.add(a, b, out=c)

    t_api, t_bare, t_torch = per_call(api), per_call(ctypes_call), per_call(torch_op)
    row("per call: flashgen.single_decode(out=)", f"{t_api * 1e6:.2f} us")
    row("per call: bare ctypes call of the same kernel (its entry point, prepared struct)",
        f"{t_bare * 1e6:.2f} us")
    row("per call: torch.add(out=) (bare torch op)", f"{t_torch * 1e6:.2f} us")
    row("added by the API over the bare kernel call", f"{(t_api - t_bare) * 1e6:.2f} us",
        f"over torch.add: {(t_api - t_torch) * 1e6:+.2f} us", "< 5 us")


def bench_wrapper_overhead() -> None:
    """batch_decode's host time per call: the engine wrapper's run(), the functional call and a
    bare ctypes call of the same entry point with the same prepared struct."""
    import torch

    import flashgen

    batch, pages = 4, 16
    q = torch.randn(batch, 8, 128, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(batch * pages, 2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    indptr = torch.arange(0, batch * pages + 1, pages, dtype=torch.int32, device="cuda")
    indices = torch.arange(batch * pages, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), 16, dtype=torch.int32, device="cuda")
    o = torch.empty_like(q)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    w = flashgen.BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(indptr, indices, last, 8, 8, 128, 16, q_data_type=torch.bfloat16)
    w.run(q, cache, out=o)
    (plan,) = w._plans.values()
    # The bare peer: the planned struct with the call's pointers written in.
    args = plan.args_type.from_buffer_copy(plan.template)
    for name, value in (("q", q), ("paged_kv", cache), ("kv_indptr", indptr), ("kv_indices", indices),
                        ("kv_last_page_len", last), ("o", o)):
        setattr(args, name, value.data_ptr())
    args.stream = torch.cuda.current_stream().cuda_stream
    args.workspace, args.workspace_bytes = ws.data_ptr(), ws.numel()
    bare, addr = plan.fn, ctypes.addressof(args)
    assert bare(addr) == 0, plan.loaded.kernels.last_error()

    t_run = per_call(lambda: w.run(q, cache, out=o))
    t_fn = per_call(lambda: flashgen.batch_decode(q, cache, indptr, indices, last, out=o))
    t_bare = per_call(lambda: bare(addr))
    row("per call: BatchDecodeWithPagedKVCacheWrapper.run(out=)", f"{t_run * 1e6:.2f} us")
    row("per call: flashgen.batch_decode(out=)", f"{t_fn * 1e6:.2f} us")
    row("per call: bare ctypes call of the same batch_decode entry point", f"{t_bare * 1e6:.2f} us")
    row("added by run() over the bare call", f"{(t_run - t_bare) * 1e6:.2f} us",
        f"functional: {(t_fn - t_bare) * 1e6:.2f} us", "<= the functional call's")


# ---------------------------------------------------------------------------------------- jit

JIT_PARAMS = {"dtype": "bf16", "head_dim": 64, "variant": "sigmoid"}


def flashgen_bin() -> str:
    try:
        from flashgen import _install

        return str(_install.binary())
    except Exception:  # noqa: BLE001 - fall back to the source tree's binary
        return os.environ.get("FLASHGEN_BIN", str(ROOT / "target/release/flashgen"))


def bench_jit(env: dict[str, str], gpu: bool) -> None:
    from flashgen import _install

    cache = tempfile.mkdtemp(prefix="flashgen-bench-jit-")
    try:
        env = dict(env, FLASHGEN_CACHE_DIR=cache)
        # The loader, in a fresh process with an empty cache: lookup, compile, verify, install.
        script = (
            "import time, flashgen\nfrom flashgen import _loader\nt0 = time.perf_counter()\n"
            f"l = _loader.load('single_decode', {JIT_PARAMS!r})\n"
            "print(time.perf_counter() - t0, l.source)\n"
        )
        # nvcc alone, on the command flashgen generates for that instance.
        gen = Path(cache) / "gen"
        where = [a for k, v in JIT_PARAMS.items() for a in ("--where", f"{k}={v}")]
        subprocess.run([flashgen_bin(), "--config", str(_install.variants_json()), "generate",
                        "--out", str(gen), "--module", "single_decode", *where],
                       env=env, check=True, capture_output=True)
        argv = json.loads((gen / "compile_commands.json").read_text())[0]["arguments"]
        jit, nvcc = [], []
        for _ in range(3):  # interleaved, each JIT into an empty cache
            for entry in Path(cache).iterdir():
                if entry.name != "gen":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            out = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()
            jit.append(float(out[0]))
            source = out[1]
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            nvcc.append(time.perf_counter() - t0)
        t_jit, t_nvcc = statistics.median(jit), statistics.median(nvcc)
        row(f"cold JIT of single_decode {JIT_PARAMS} ({source})", f"{t_jit:.2f} s",
            f"nvcc alone {t_nvcc:.2f} s: {100 * (t_jit / t_nvcc - 1):+.1f} %", "< 5 % added")
        if gpu:
            shutil.rmtree(cache)
            os.makedirs(cache)
            first = (
                "import time, torch\ntorch.cuda.init(); torch.empty(1, device='cuda')\n"
                "q = torch.randn(32, 64, dtype=torch.bfloat16, device='cuda')\n"
                "k = torch.randn(1024, 8, 64, dtype=torch.bfloat16, device='cuda')\n"
                "t0 = time.perf_counter()\nimport flashgen\n"
                "o = flashgen.single_decode(q, k, k, variant='sigmoid', sigmoid_bias=0.0)\n"
                "torch.cuda.synchronize()\nprint(time.perf_counter() - t0)\n"
            )
            out = subprocess.run([sys.executable, "-c", first], env=env, check=True,
                                 capture_output=True, text=True).stdout
            row("first call of a not-precompiled instance, compile included",
                f"{float(out.strip().splitlines()[-1]):.2f} s", "FlashInfer 0.3.1 JIT: 21.4 s",
                "< 10 s")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# -------------------------------------------------------------------------------------- wheel

def bench_wheel(env: dict[str, str]) -> None:
    binary = os.environ.get("FLASHGEN_BIN", str(ROOT / "target/release/flashgen"))
    sizes = {}
    with tempfile.TemporaryDirectory(prefix="flashgen-bench-wheel-") as tmp:
        for label, extra in (("compressed", []), ("uncompressed", ["--no-compress"])):
            out = subprocess.run([binary, "--config", str(ROOT / "variants.json"), "build-wheel",
                                  "--quiet", "--out", f"{tmp}/{label}", "--build-dir",
                                  f"{tmp}/build-{label}", "--binary", binary, *extra],
                                 env=env, check=True, capture_output=True, text=True).stdout
            wheel = Path(out.strip().splitlines()[-1])
            with zipfile.ZipFile(wheel) as z:
                sos = [i for i in z.infolist() if i.filename.startswith("flashgen/_aot/")
                       and i.filename.endswith(".so")]
            sizes[label] = (wheel.stat().st_size, len(sos), sum(i.compress_size for i in sos),
                            sum(i.file_size for i in sos))
    for label, (total, n, packed, raw) in sizes.items():
        row(f"wheel, fatbin {label}: {n} instances",
            f"{total / 2**20:.2f} MiB in all; {packed / n / 2**10:.0f} KiB per instance in the "
            f"zip ({raw / n / 2**10:.0f} KiB unpacked)")


def main() -> None:
    sections = sys.argv[1:] or ["startup", "overhead", "wrapper", "jit", "wheel"]
    gpu = have_gpu()
    env = dict(os.environ)
    print(f"flashgen loader benchmarks ({'GPU' if gpu else 'no GPU'}): {' '.join(sections)}")
    for s in sections:
        if s in ("startup", "overhead", "wrapper") and not gpu:
            print(f"  {s}: skipped (no GPU)")
            continue
        {"startup": lambda: bench_startup(env), "overhead": bench_overhead, "wrapper": bench_wrapper_overhead,
         "jit": lambda: bench_jit(env, gpu), "wheel": lambda: bench_wheel(env)}[s]()
    print("\n| metric | flashgen | peer / ratio | goal |\n| --- | --- | --- | --- |")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
