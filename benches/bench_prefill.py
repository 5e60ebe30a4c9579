"""Prefill throughput on one GPU: flashgen's public prefill API beside PyTorch SDPA (flash and
cuDNN backends) in the same run.

    PYTHONPATH=<site with the flashgen wheel> python3 benches/bench_prefill.py [--quick] [--iters 30] [--json out.json]
        [--backend portable|sm90]

(from a source checkout without a wheel on PYTHONPATH, the checkout's python/ is used.)

Method: bf16, 32 query heads (= kv heads), head_dim 128 unless the row says otherwise, inputs
in flashgen's NHD layout ([tokens, heads, dim]) and handed to SDPA as views of the same memory
([1, heads, tokens, dim], last dim contiguous: no copies on either side). Each figure is the
median of --iters (>= 20) runs timed with CUDA events around one call, the L2 flushed before
every run by writing a 256 MiB buffer; 3 untimed calls first (they load, or JIT-compile, the
instance). FLOPs = 4 * heads * qo_len * kv_len * head_dim per request, halved for causal (the
convention of FlashAttention's benchmarks; exact causal work is (L + 1) / (2 L) of full).

--backend picks the implementation of the modules that have one (single and ragged; paged too
once it has a backend axis); without it the loader takes the best the GPU runs (sm90 on Hopper).
The single-prefill goals depend on it: issue 8's for the portable (mma.sync) kernels, issue 10's
for the Hopper (sm90) kernels.

Rows and goals:
  single prefill causal 8192, d128                      portable >= 370 TFLOP/s, sm90 >= 700
  single prefill non-causal 8192, d64 / d256 causal 8192, causal 1024 (sm90 also causal 32768)
      sm90: >= 760 / 480 / 750 / 270 (/ 680); portable: figures, no goal
  batch ragged: 16 causal requests, lengths drawn with seed 0 from 512..4096 (qo = kv)
      goal: within 10 % of single prefill, compared as TFLOP/s: the batch's TFLOP/s against
      single_prefill's at the FLOP-equivalent length L = sqrt(mean(len^2)) (one request of the
      batch's average work; same heads, head_dim, causal), measured in the same run
  batch paged (page 16, shuffled pages), same requests:  time within 5 % of ragged
  variants on single causal 8192 (soft_cap 30, sliding_window 1024, alibi, sigmoid): time
      within 5 % of default (sliding_window also shows TFLOP/s over the keys it sees)
  RoPE (rope_llama) on vs off, single causal 8192: within 10 %; peers: torch RoPE + SDPA
--quick: the single causal 8192, batch ragged (with its single reference) and paged rows only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from typing import Any, Callable

import torch

try:
    import flashgen
except ImportError:  # a source checkout: use its python/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import flashgen
from _timing import FLUSH_BYTES, Timer  # benches/, the script's own folder

DEV = torch.device("cuda")
# TFLOP/s goals of the single-prefill rows, (length, head_dim, causal): issue 8 (portable) and 10 (sm90).
PORTABLE_GOALS = {(8192, 128, True): 370}
SM90_GOALS = {(8192, 128, True): 700, (8192, 128, False): 760, (8192, 256, True): 750, (8192, 64, True): 480,
              (1024, 128, True): 270, (32768, 128, True): 680}
DT = torch.bfloat16
HEADS = 32


def flops(heads: int, qo: int, kv: int, d: int, causal: bool) -> float:
    f = 4.0 * heads * qo * kv * d
    return f / 2 if causal else f


def sdpa_peers(q: Any, k: Any, v: Any, causal: bool, pre: Callable[[], Any] | None = None) -> dict[str, Any]:
    """{name: callable or a note why not}. q/k/v are NHD [L, H, D]; SDPA gets [1, H, L, D] views.
    `pre` (e.g. a torch RoPE) runs inside the timed call, before SDPA."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as exc:
        return {"SDPA flash": f"n/a: {exc}", "SDPA cuDNN": f"n/a: {exc}"}
    q4, k4, v4 = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))
    out: dict[str, Any] = {}
    for name, backend in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
        def fn(backend: Any = backend) -> Any:
            qq, kk = (q4, k4) if pre is None else pre()
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qq, kk, v4, is_causal=causal)
        out[name] = _probe(fn, "n/a: ", 70)
    return out


def sdpa_ragged_peers(q: Any, k: Any, v: Any, offsets: Any) -> dict[str, Any]:
    """SDPA over jagged nested tensors (one [B, j, H, D] per q/k/v), causal; where supported."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        nq, nk, nv = (torch.nested.nested_tensor_from_jagged(x, offsets.long()).transpose(1, 2) for x in (q, k, v))
    except Exception as exc:  # noqa: BLE001
        note = "n/a: " + (str(exc).splitlines() or [repr(exc)])[0][:70]
        return {"SDPA flash": note, "SDPA cuDNN": note}
    out: dict[str, Any] = {}
    for name, backend in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
        def fn(backend: Any = backend) -> Any:
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(nq, nk, nv, is_causal=True)
        out[name] = _probe(fn, "n/a (jagged): ", 60)
    return out


def _probe(fn: Callable[[], Any], refused: str, width: int) -> Any:
    """``fn`` when one call of it runs, else ``refused`` and the first ``width`` characters of
    why (a backend that refuses the shape is reported, not fatal)."""
    try:
        fn()
        torch.cuda.synchronize()
        return fn
    except Exception as exc:  # noqa: BLE001
        return refused + (str(exc).splitlines() or [repr(exc)])[0][:width]


def torch_rope(q: Any, k: Any, theta: float = 1e4) -> Callable[[], tuple[Any, Any]]:
    """The peer's RoPE: Llama half-split rotation of q and k in torch (cos/sin precomputed),
    returning [1, H, L, D] views for SDPA."""
    length, _, d = q.shape
    half = d // 2
    freq = theta ** (-2.0 * torch.arange(half, device=DEV, dtype=torch.float64) / d)
    ang = torch.arange(length, device=DEV, dtype=torch.float64)[:, None] * freq[None]
    cos = torch.cos(ang).to(DT)[:, None, :]
    sin = torch.sin(ang).to(DT)[:, None, :]

    def rot(x: Any) -> Any:
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    return lambda: (rot(q).unsqueeze(0).transpose(1, 2), rot(k).unsqueeze(0).transpose(1, 2))


class Table:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, metric: str, ours: str, flash: str = "", cudnn: str = "", goal: str = "", met: str = "",
            **data: Any) -> None:
        self.rows.append(dict(metric=metric, flashgen=ours, sdpa_flash=flash, sdpa_cudnn=cudnn, goal=goal,
                              met=met, **data))
        print(f"  {metric}: {ours} | SDPA flash {flash or '-'} | SDPA cuDNN {cudnn or '-'} | {goal} {met}",
              flush=True)

    def print(self) -> None:
        heads = ("metric", "flashgen", "SDPA flash", "SDPA cuDNN", "goal", "met?")
        keys = ("metric", "flashgen", "sdpa_flash", "sdpa_cudnn", "goal", "met")
        print("\n| " + " | ".join(heads) + " |")
        print("| " + " | ".join("---" for _ in heads) + " |")
        for r in self.rows:
            print("| " + " | ".join(str(r[k]) for k in keys) + " |")


def tf(seconds: float, f: float) -> str:
    return f"{f / seconds / 1e12:.1f} TFLOP/s ({seconds * 1e6:.0f} us)"


def peer_cells(timer: Timer, peers: dict[str, Any], f: float) -> tuple[str, str, dict[str, Any]]:
    cells, data = [], {}
    for name in ("SDPA flash", "SDPA cuDNN"):
        p = peers.get(name, "n/a")
        if callable(p):
            t = timer(p)
            cells.append(tf(t, f))
            data[name] = {"s": t, "tflops": f / t / 1e12}
        else:
            cells.append(str(p))
            data[name] = {"note": str(p)}
    return cells[0], cells[1], data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=30, help="timed runs per figure (median; at least 20)")
    ap.add_argument("--quick", action="store_true", help="headline rows only")
    ap.add_argument("--no-peers", action="store_true", help="skip SDPA")
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    ap.add_argument("--backend", default=None, help="backend= of every call whose module has one (default: the "
                    "loader's choice for the GPU)")
    a = ap.parse_args()
    if a.iters < 20:
        ap.error("--iters must be at least 20")
    if not torch.cuda.is_available():
        sys.exit("bench_prefill: no CUDA device")
    missing = [n for n in ("single_prefill", "batch_prefill", "batch_prefill_paged") if not hasattr(flashgen, n)]
    if missing:
        sys.exit(f"bench_prefill: this flashgen ({getattr(flashgen, '__file__', '?')}) has no {', '.join(missing)}")
    timer = Timer(a.iters)
    table = Table()
    from flashgen import _loader, _matrix

    mx = _matrix.matrix()
    backend = {m: mx.with_backend(m, {"backend": a.backend} if a.backend else {}, _loader.device_capability())
               .get("backend") if mx.module(m).backend_axis else None
               for m in ("single_prefill", "batch_prefill_ragged", "batch_prefill_paged")}
    bk = {m: ({"backend": b} if b else {}) for m, b in backend.items()}
    goals = SM90_GOALS if backend["single_prefill"] == "sm90" else PORTABLE_GOALS
    gen = torch.Generator(device=DEV).manual_seed(0)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} flashgen {flashgen.__version__} "
          f"({os.path.dirname(flashgen.__file__)}); bf16, {HEADS} heads, median of {a.iters}, L2 flushed "
          f"({FLUSH_BYTES >> 20} MiB write) before each run; backends {backend}", flush=True)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device=DEV, dtype=DT, generator=gen)

    def single(length: int, d: int, causal: bool, peers: bool = True, goal: bool = True, **kw: Any) -> float:
        q, k, v = randn(length, HEADS, d), randn(length, HEADS, d), randn(length, HEADS, d)
        out = torch.empty_like(q)
        f = flops(HEADS, length, length, d, causal)
        t = timer(lambda: flashgen.single_prefill(q, k, v, causal=causal, out=out, **bk["single_prefill"], **kw))
        fl, cu, data = ("", "", {})
        if peers and not a.no_peers:
            fl, cu, data = peer_cells(timer, sdpa_peers(q, k, v, causal), f)
        want = goals.get((length, d, causal)) if goal else None
        met = "" if want is None else ("yes" if f / t / 1e12 >= want else "no")
        table.add(f"single_prefill {'causal' if causal else 'non-causal'} {length}, d{d}", tf(t, f), fl, cu,
                  "" if want is None else f">= {want} TFLOP/s", met,
                  s=t, tflops=f / t / 1e12, peers=data)
        return t

    # ---- single prefill
    t_causal = single(8192, 128, True)
    if not a.quick:
        single(8192, 128, False)
        single(8192, 64, True)
        single(8192, 256, True)
        single(1024, 128, True)
        if goals is SM90_GOALS:
            single(32768, 128, True)

    # ---- batch: ragged and paged, 16 causal requests of 512..4096 tokens (qo = kv)
    rng = random.Random(0)
    lens = [rng.randint(512, 4096) for _ in range(16)]
    total = sum(lens)
    f_batch = sum(flops(HEADS, n, n, 128, True) for n in lens)
    l_eq = round(math.sqrt(sum(n * n for n in lens) / len(lens)))
    print(f"  batch lengths (seed 0): {lens}; total {total} tokens; FLOP-equivalent single length "
          f"sqrt(mean(len^2)) = {l_eq}", flush=True)
    q, k, v = randn(total, HEADS, 128), randn(total, HEADS, 128), randn(total, HEADS, 128)
    out = torch.empty_like(q)
    offs = [0]
    for n in lens:
        offs.append(offs[-1] + n)
    indptr = torch.tensor(offs, dtype=torch.int32, device=DEV)
    t_single_eq = single(l_eq, 128, True, peers=False, goal=False)
    tf_single_eq = flops(HEADS, l_eq, l_eq, 128, True) / t_single_eq / 1e12
    t_ragged = timer(lambda: flashgen.batch_prefill(q, indptr, k, v, indptr, causal=True, out=out,
                                                    **bk["batch_prefill_ragged"]))
    tf_ragged = f_batch / t_ragged / 1e12
    fl = cu = ""
    pdata: dict[str, Any] = {}
    if not a.no_peers:
        fl, cu, pdata = peer_cells(timer, sdpa_ragged_peers(q, k, v, indptr), f_batch)
    ratio = tf_ragged / tf_single_eq
    table.add(f"batch_prefill ragged 16 x 512..4096 causal ({total} tokens)", tf(t_ragged, f_batch), fl, cu,
              f"TFLOP/s >= 90 % of single_prefill at L={l_eq} ({tf_single_eq:.1f})",
              f"{'yes' if ratio >= 0.90 else 'no'} ({ratio * 100:.1f} %)", s=t_ragged, tflops=tf_ragged,
              single_eq_len=l_eq, single_eq_tflops=tf_single_eq, lens=lens, peers=pdata)

    # paged: page 16, shuffled pages, the same K/V
    ps = 16
    npages = [-(-n // ps) for n in lens]
    n_total = sum(npages)
    cache = torch.zeros(n_total, 2, ps, HEADS, 128, device=DEV, dtype=DT)
    perm = torch.randperm(n_total, device=DEV, generator=gen)
    at_tok = at_page = 0
    for n, p in zip(lens, npages):
        ids = perm[at_page:at_page + p]
        for j, t in enumerate((k, v)):
            padded = torch.zeros(p * ps, HEADS, 128, device=DEV, dtype=DT)
            padded[:n] = t[at_tok:at_tok + n]
            cache[ids, j] = padded.view(p, ps, HEADS, 128)
        at_tok += n
        at_page += p
    pofs = [0]
    for p in npages:
        pofs.append(pofs[-1] + p)
    kv_indptr = torch.tensor(pofs, dtype=torch.int32, device=DEV)
    kv_indices = perm.to(torch.int32)
    last = torch.tensor([n - (p - 1) * ps for n, p in zip(lens, npages)], dtype=torch.int32, device=DEV)
    t_paged = timer(lambda: flashgen.batch_prefill_paged(q, indptr, cache, kv_indptr, kv_indices, last,  # noqa: F821
                                                         causal=True,
                                                         out=out, **bk["batch_prefill_paged"]))
    over = t_paged / t_ragged - 1
    table.add(f"batch_prefill_paged page {ps}, same requests", tf(t_paged, f_batch), "n/a: no paged KV", "n/a: no paged KV",
              "time within 5 % of ragged", f"{'yes' if over <= 0.05 else 'no'} ({over * 100:+.1f} %)",
              s=t_paged, tflops=f_batch / t_paged / 1e12)
    del cache, q, k, v, out
    torch.cuda.empty_cache()

    if not a.quick:
        # ---- variants over default, single causal 8192 d128
        length = 8192
        q, k, v = randn(length, HEADS, 128), randn(length, HEADS, 128), randn(length, HEADS, 128)
        out = torch.empty_like(q)
        f = flops(HEADS, length, length, 128, True)
        t_def = timer(lambda: flashgen.single_prefill(q, k, v, causal=True, out=out, **bk["single_prefill"]))
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / HEADS) for i in range(HEADS)], device=DEV)
        window = 1024
        for variant, params in (("soft_cap", {"logits_soft_cap": 30.0}), ("sliding_window", {"window_left": window}),
                                ("alibi", {"alibi_slopes": slopes}), ("sigmoid", {"sigmoid_bias": 0.0})):
            try:
                t = timer(lambda: flashgen.single_prefill(q, k, v, causal=True, out=out, variant=variant, **params,
                                                          **bk["single_prefill"]))
            except Exception as exc:  # noqa: BLE001 - reported in the table
                table.add(f"{variant} over default (causal 8192)", "error: " + str(exc).splitlines()[0][:80])
                continue
            over = t / t_def - 1
            note = ""
            if variant == "sliding_window":
                seen = sum(min(i + 1, window + 1) for i in range(length))
                f_seen = 4.0 * HEADS * seen * 128
                note = f"; {f_seen / t / 1e12:.1f} TFLOP/s over the keys it sees"
            table.add(f"{variant} over default (causal 8192)", f"{over * 100:+.1f} % ({t * 1e6:.0f} us{note})",
                      "", "", "< 5 %", "yes" if over < 0.05 else "no", s=t, over=over, default_s=t_def)

        # ---- RoPE on vs off
        try:
            t_rope = timer(lambda: flashgen.single_prefill(q, k, v, causal=True, out=out, pos_encoding="rope_llama",
                                                           **bk["single_prefill"]))
            over = t_rope / t_def - 1
            fl = cu = ""
            pdata = {}
            if not a.no_peers:
                fl, cu, pdata = peer_cells(timer, sdpa_peers(q, k, v, True, pre=torch_rope(q, k)), f)
                fl, cu = (x + " (torch RoPE + SDPA)" if "TFLOP" in x else x for x in (fl, cu))
            table.add("rope_llama on vs off (causal 8192)", f"{over * 100:+.1f} % ({tf(t_rope, f)})", fl, cu, "< 10 %",
                      "yes" if over < 0.10 else "no", s=t_rope, over=over, peers=pdata)
        except Exception as exc:  # noqa: BLE001
            table.add("rope_llama on vs off (causal 8192)", "error: " + str(exc).splitlines()[0][:80])
        del q, k, v, out

    print(f"\nsingle causal 8192 d128: {flops(HEADS, 8192, 8192, 128, True) / t_causal / 1e12:.1f} TFLOP/s")
    table.print()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "backends": backend,
                       "flashgen": str(flashgen.__version__), "iters": a.iters, "rows": table.rows}, fh, indent=1)


if __name__ == "__main__":
    main()
