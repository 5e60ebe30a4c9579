"""What serving engines call, timed through the public API in one run (bf16, head_dim 128, 32
query heads over 8 KV heads, median of --iters runs, the L2 flushed before each):

  pages   batch_decode 64 x 4096 and 128 x 8192, and batch_prefill_paged over 16 causal
          requests of 512..4096 tokens, at page sizes 16, 32 and 64 (shuffled pages)
                                                     goal: 32 and 64 within 3 % of page 16
  sinks   the attention_sink variant against default: batch_decode 64 x 4096, single_prefill
          causal 8192, the paged batch above           goal: within 3 % of default
  fp8     batch_decode 128 x 8192, page 16, with an fp8_e4m3 cache against bf16, and the fp8
          bytes' share of the read ceiling (a device copy's bytes read and written per second)
                                                     goal: >= 1.8x bf16, >= 90 % of the ceiling
          the paged batch above (page 16) with an fp8_e4m3 cache against bf16, on the backend
          the loader picks and on the portable one  goal: within 10 % of bf16
          the same requests ragged (q, k, v packed), fp8_e4m3 k and v against bf16 (no goal)

    python3 benches/bench_serving.py [pages] [sinks] [fp8] [--iters N] [--json PATH]

A section whose API this flashgen lacks (no attention_sink variant, no fp8 cache) says so and is
skipped. Instances compile on first use (the JIT) when the installation does not ship them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

import torch

import flashgen
from _timing import FLUSH_BYTES, Timer

DEV = "cuda"
DT = torch.bfloat16
HQ, HKV, D = 32, 8, 128
PREFILL_LENS = [512 + (3584 * i) // 15 for i in range(16)]
ROWS: list[dict[str, Any]] = []


def row(case: str, seconds: float, extra: str = "", goal: str = "", met: str = "", **data: Any) -> None:
    ROWS.append({"case": case, "us": seconds * 1e6, "goal": goal, "met": met, **data})
    print(f"{case:58s} {seconds * 1e6:10.1f} us  {extra:28s} {goal:34s} {met}", flush=True)


def paged_cache(lens: list[int], page_size: int, gen: torch.Generator) -> tuple[Any, ...]:
    """A cache holding these requests in shuffled pages, its page table and its bytes of K/V."""
    npages = [-(-n // page_size) for n in lens]
    total = sum(npages)
    cache = torch.randn(total, 2, page_size, HKV, D, device=DEV, dtype=DT, generator=gen)
    indices = torch.randperm(total, device=DEV, generator=gen).to(torch.int32)
    indptr = torch.tensor([0] + torch.tensor(npages).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lens, npages)], dtype=torch.int32, device=DEV)
    kv_bytes = sum(lens) * HKV * D * 2 * cache.element_size()
    return cache, indptr, indices, last, kv_bytes


def decode_call(batch: int, kv_len: int, page_size: int, gen: torch.Generator,
                **kw: Any) -> tuple[Callable[..., Any], int]:
    cache, indptr, indices, last, kv_bytes = paged_cache([kv_len] * batch, page_size, gen)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=DT, generator=gen)
    o = torch.empty_like(q)

    def call(**more: Any) -> Any:
        return flashgen.batch_decode(q, cache, indptr, indices, last, out=o, **(kw | more))

    return call, kv_bytes + 2 * q.nbytes


def prefill_call(page_size: int, gen: torch.Generator, fp8: Any = None, **kw: Any) -> Callable[..., Any]:
    """The 16-request paged batch; ``fp8``: its cache stored in that type (a quarter of the values,
    k_scale and v_scale 4)."""
    cache, indptr, indices, last, _ = paged_cache(PREFILL_LENS, page_size, gen)
    if fp8 is not None:
        cache = (cache * 0.25).to(fp8)
        kw = {**kw, "k_scale": 4.0, "v_scale": 4.0}
    qo = torch.tensor([0] + torch.tensor(PREFILL_LENS).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    q = torch.randn(sum(PREFILL_LENS), HQ, D, device=DEV, dtype=DT, generator=gen)
    o = torch.empty_like(q)

    def call(**more: Any) -> Any:
        return flashgen.batch_prefill_paged(q, qo, cache, indptr, indices, last, causal=True, out=o, **(kw | more))

    return call


def ragged_call(gen: torch.Generator, fp8: Any = None, **kw: Any) -> Callable[..., Any]:
    """The same 16 requests with q, k and v packed along tokens (``flashgen.batch_prefill``);
    ``fp8``: k and v stored in that type, as in prefill_call."""
    lens = torch.tensor([0] + torch.tensor(PREFILL_LENS).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    q = torch.randn(sum(PREFILL_LENS), HQ, D, device=DEV, dtype=DT, generator=gen)
    k, v = (torch.randn(sum(PREFILL_LENS), HKV, D, device=DEV, dtype=DT, generator=gen) for _ in range(2))
    if fp8 is not None:
        k, v = (k * 0.25).to(fp8), (v * 0.25).to(fp8)
        kw = {**kw, "k_scale": 4.0, "v_scale": 4.0}
    o = torch.empty_like(q)

    def call(**more: Any) -> Any:
        return flashgen.batch_prefill(q, lens, k, v, lens, causal=True, out=o, **(kw | more))

    return call


def within(t: float, base: float, pct: float) -> tuple[str, str]:
    over = (t / base - 1) * 100
    return f"{over:+.1f} % vs base", "yes" if over <= pct else "no"


def bench_pages(timer: Timer, gen: torch.Generator) -> None:
    for batch, kv_len in ((64, 4096), (128, 8192)):
        base = 0.0
        for ps in (16, 32, 64):
            fn, nbytes = decode_call(batch, kv_len, ps, gen)
            t = timer(fn)
            base = base or t
            ext, met = within(t, base, 3.0) if ps != 16 else ("", "")
            row(f"batch_decode {batch} x {kv_len} page {ps}", t, f"{nbytes / t / 1e12:.2f} TB/s {ext}",
                "within 3 % of page 16" if ps != 16 else "", met, page_size=ps, tbs=nbytes / t / 1e12)
            del fn
            torch.cuda.empty_cache()
    base = 0.0
    flops = sum(2 * 2 * HQ * D * n * (n + 1) / 2 for n in PREFILL_LENS)
    for ps in (16, 32, 64):
        t = timer(prefill_call(ps, gen))
        base = base or t
        ext, met = within(t, base, 3.0) if ps != 16 else ("", "")
        row(f"batch_prefill_paged 16 x 512..4096 causal page {ps}", t, f"{flops / t / 1e12:.1f} TFLOP/s {ext}",
            "within 3 % of page 16" if ps != 16 else "", met, page_size=ps, tflops=flops / t / 1e12)
        torch.cuda.empty_cache()


def bench_sinks(timer: Timer, gen: torch.Generator) -> None:
    """attention_sink against default with no window (gpt-oss's full layers), against
    sliding_window with no window (the same mask machinery without the sink), and against
    sliding_window with gpt-oss's window of 128 tokens (its sliding layers)."""
    from flashgen import _matrix

    if "attention_sink" not in _matrix.matrix().variants:
        print("sinks: skipped (this flashgen has no attention_sink variant)")
        return
    sinks = torch.randn(HQ, device=DEV, dtype=torch.float32, generator=gen)
    q, k, v = (torch.randn(8192, h, D, device=DEV, dtype=DT, generator=gen) for h in (HQ, HKV, HKV))
    o = torch.empty_like(q)
    decode, _ = decode_call(64, 4096, 16, gen)
    workloads: dict[str, Callable[..., Any]] = {
        "batch_decode 64 x 4096": decode,
        "single_prefill causal 8192": lambda **kw: flashgen.single_prefill(q, k, v, causal=True, out=o, **kw),
        "batch_prefill_paged 16 x 512..4096": prefill_call(16, gen),
    }
    for name, call in workloads.items():
        t: dict[str, float] = {}
        for label, kw in (("default", {}), ("sliding_window -1", {"variant": "sliding_window", "window_left": -1}),
                          ("attention_sink -1", {"variant": "attention_sink", "sinks": sinks, "window_left": -1}),
                          ("sliding_window 127", {"variant": "sliding_window", "window_left": 127}),
                          ("attention_sink 127", {"variant": "attention_sink", "sinks": sinks, "window_left": 127})):
            t[label] = timer(lambda kw=kw: call(**({"variant": "default"} | kw)))
        row(f"{name} default", t["default"])
        for label, base, goal in (("attention_sink -1", "default", True), ("sliding_window -1", "default", False),
                                  ("attention_sink -1", "sliding_window -1", False),
                                  ("attention_sink 127", "sliding_window 127", True)):
            ext, met = within(t[label], t[base], 3.0)
            row(f"  {label} over {base}", t[label], ext, "within 3 %" if goal else "", met if goal else "")


def copy_rate(timer: Timer) -> float:
    """Bytes moved per second (read and written) by a device-to-device copy of 1 GiB: the
    memory's practical rate, which a read-only kernel can at best match."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timer(lambda: dst.copy_(src))


def bench_fp8(timer: Timer, gen: torch.Generator) -> None:
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        print("fp8: skipped (this torch has no float8_e4m3fn)")
        return
    batch, kv_len = 128, 8192
    fn, nbytes = decode_call(batch, kv_len, 16, gen)
    t_bf16 = timer(fn)
    del fn
    torch.cuda.empty_cache()
    cache, indptr, indices, last, kv_bytes = paged_cache([kv_len] * batch, 16, gen)
    cache8 = (cache * 0.25).to(fp8)
    del cache
    q = torch.randn(batch, HQ, D, device=DEV, dtype=DT, generator=gen)
    o = torch.empty_like(q)
    try:
        flashgen.batch_decode(q, cache8, indptr, indices, last, out=o, k_scale=4.0, v_scale=4.0)
    except (TypeError, ValueError) as exc:
        print(f"fp8: skipped (batch_decode refuses an fp8 cache: {exc})")
        return
    t_fp8 = timer(lambda: flashgen.batch_decode(q, cache8, indptr, indices, last, out=o, k_scale=4.0, v_scale=4.0))
    fp8_bytes = kv_bytes // 2 + 2 * q.nbytes
    ceiling = copy_rate(timer)
    speedup = t_bf16 / t_fp8
    share = fp8_bytes / t_fp8 / ceiling
    row(f"batch_decode {batch} x {kv_len} page 16 bf16 cache", t_bf16, f"{nbytes / t_bf16 / 1e12:.2f} TB/s")
    row(f"batch_decode {batch} x {kv_len} page 16 fp8_e4m3 cache", t_fp8, f"{speedup:.2f}x bf16",
        ">= 1.8x bf16", "yes" if speedup >= 1.8 else "no", speedup=speedup)
    row("  fp8 bytes / the read ceiling (a device copy's rate)", t_fp8,
        f"{fp8_bytes / t_fp8 / 1e12:.2f} of {ceiling / 1e12:.2f} TB/s", ">= 90 %",
        f"{'yes' if share >= 0.9 else 'no'} ({share * 100:.1f} %)", share=share)
    flops = sum(2 * 2 * HQ * D * n * (n + 1) / 2 for n in PREFILL_LENS)
    for backend in (None, "portable"):
        on = "" if backend is None else f" backend={backend}"
        t16 = timer(prefill_call(16, gen, backend=backend))
        t8 = timer(prefill_call(16, gen, fp8, backend=backend))
        ext, met = within(t8, t16, 10.0)
        row(f"batch_prefill_paged 16 x 512..4096 page 16 bf16{on}", t16, f"{flops / t16 / 1e12:.1f} TFLOP/s")
        row(f"batch_prefill_paged 16 x 512..4096 page 16 fp8_e4m3{on}", t8,
            f"{flops / t8 / 1e12:.1f} TFLOP/s {ext}", "within 10 % of bf16" if backend is None else "",
            met if backend is None else "", backend=backend or "default", vs_bf16=t8 / t16)
        torch.cuda.empty_cache()
        t16 = timer(ragged_call(gen, backend=backend))
        t8 = timer(ragged_call(gen, fp8, backend=backend))
        row(f"batch_prefill (ragged) 16 x 512..4096 bf16{on}", t16, f"{flops / t16 / 1e12:.1f} TFLOP/s")
        row(f"batch_prefill (ragged) 16 x 512..4096 fp8_e4m3{on}", t8,
            f"{flops / t8 / 1e12:.1f} TFLOP/s {within(t8, t16, 10.0)[0]}", backend=backend or "default",
            ragged=True, vs_bf16=t8 / t16)
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sections", nargs="*", default=["pages", "sinks", "fp8"])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_serving: no CUDA device")
    timer = Timer(a.iters)
    gen = torch.Generator(device=DEV).manual_seed(0)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} flashgen {flashgen.__version__}; bf16 d{D}, "
          f"{HQ}/{HKV} heads, median of {a.iters}, L2 flushed ({FLUSH_BYTES >> 20} MiB) before each run", flush=True)
    for s in a.sections:
        {"pages": bench_pages, "sinks": bench_sinks, "fp8": bench_fp8}[s](timer, gen)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(ROWS, f, indent=1)


if __name__ == "__main__":
    main()
