"""batch_decode, batch_prefill_paged, batch_prefill (ragged) and single_prefill over an fp8 KV cache
(``torch.float8_e4m3fn`` / ``torch.float8_e5m2``) on a GPU, against the fp32 references on the
dequantized cache (``cache.float() * scale``): test_api_gpu's for decode, test_prefill_gpu's and
test_sinks_gpu's for prefill. bf16 and f16 q, head_dim 64/128/256, page sizes 1, 16, 32 and 64,
NHD and HND, k_scale and v_scale not 1, GQA 32/8, every built-in variant, causal and not, both
prefill backends (``backend=``: portable, and sm90 on an sm_90 device), return_lse, split-KV shapes (a few long requests), and the refusals.
The fp8 instances are not precompiled: the first call of each compiles it (JIT); the module
builds every instance it calls first, in parallel. Skips without torch, a CUDA device or torch's
fp8 dtypes.

Tolerances are test_api_gpu's and test_prefill_gpu's: the widening is exact and the products
run in f16 (finer than bf16; the query carries a power of two that keeps it in f16's range), so
the kernel's error is at most the 16-bit path's (P rounded for P V, the output rounded once; in
prefill the query times k_scale rounded once, as the 16-bit path rounds the scaled query).
"""

from __future__ import annotations

import math
import random
import zlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "float8_e5m2"):
    pytest.skip("this torch has no float8 dtypes", allow_module_level=True)

import flashgen  # noqa: E402
from conftest import compile_ahead  # noqa: E402
from test_api_gpu import (  # noqa: E402
    DEV, NUM_KV, NUM_QO, TORCH_DT, assert_close, gather_kv, make_paged, reference, variant_params,
)
# test_api_gpu's JIT cache, one for the session (its fixtures, used here by their names).
from test_api_gpu import _gpu_cache, _shared_cache  # noqa: E402, F401
from test_prefill_gpu import check as check_prefill  # noqa: E402
from test_prefill_gpu import reference_prefill  # noqa: E402
from test_prefill_gpu import variant_params as prefill_params  # noqa: E402
from test_sinks_gpu import check as check_sinks  # noqa: E402
from test_sinks_gpu import make_sinks  # noqa: E402
from test_sinks_gpu import reference as sink_reference  # noqa: E402

FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
VARIANTS = ["default", "soft_cap", "sliding_window", "alibi", "sigmoid"]
K_SCALE, V_SCALE = 0.75, 1.5


def instances() -> list[dict[str, object]]:
    """The batch_decode instances the tests below call (page 1 for the widening test)."""
    keys = {(d, f, h, p, "default") for d in ("bf16", "f16") for f in FP8 for h in (64, 128, 256) for p in (1, 16)}
    keys |= {("bf16", "fp8_e4m3", 128, p, "default") for p in (32, 64)}
    keys |= {(d, f, 128, 16, v) for d, f in (("bf16", "fp8_e4m3"), ("f16", "fp8_e5m2")) for v in VARIANTS}
    keys |= {("bf16", f, 128, 16, "soft_cap") for f in FP8} | {("bf16", "same", 128, 16, "default")}
    return [{"dtype": d, "head_dim": h, "page_size": p, "pos_encoding": "none", "variant": v, "kv_dtype": f}
            for d, f, h, p, v in sorted(keys)]


@pytest.fixture(scope="module", autouse=True)
def _warm(_gpu_cache: str) -> None:
    """Every instance this file calls, built in parallel before the first test."""
    from flashgen import _loader

    calls = [("batch_decode", p) for p in instances()] + prefill_instances()
    compile_ahead(_gpu_cache, [(f"{m} {p}", lambda m=m, p=p: _loader.load(m, p)) for m, p in calls])


def run_fp8(dtype: str, fp8: str, head_dim: int, page_size: int, variant: str, layout: str,
            lens: list[int], k_scale: float = K_SCALE, v_scale: float = V_SCALE) -> None:
    what = f"batch_decode {dtype} q, {fp8} cache, d{head_dim} ps{page_size} {variant} {layout} {lens}"
    gen = torch.Generator(device=DEV).manual_seed(hash((dtype, fp8, head_dim, page_size, variant, layout)) % 2**31)
    t = TORCH_DT[dtype]
    stored, indptr, indices, last = make_paged(lens, page_size, head_dim, layout, torch.float32, gen)
    cache = stored.to(FP8[fp8])  # the stored values; the cache holds K / k_scale and V / v_scale
    q = torch.randn(len(lens), NUM_QO, head_dim, device=DEV, dtype=t, generator=gen)
    params = variant_params(variant)
    o, lse = flashgen.batch_decode(q, cache, indptr, indices, last, kv_layout=layout, variant=variant,
                                   return_lse=True, k_scale=k_scale, v_scale=v_scale, **params)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (len(lens), NUM_QO)
    for b in range(len(lens)):
        k, v = gather_kv(cache.float(), indptr, indices, lens, b, layout)
        ref, ref_lse = reference(q[b], k * k_scale, v * v_scale, variant, 1.0 / math.sqrt(head_dim), params)
        assert_close(o[b], ref, dtype, f"{what} b{b}", lse[b], ref_lse)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("fp8", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_fp8_cache_shapes(dtype: str, fp8: str, head_dim: int, page_size: int, layout: str) -> None:
    run_fp8(dtype, fp8, head_dim, page_size, "default", layout, [1, 17, 300, 1029])


@pytest.mark.parametrize("page_size", [32, 64])
def test_fp8_cache_larger_pages(page_size: int) -> None:
    run_fp8("bf16", "fp8_e4m3", 128, page_size, "default", "HND", [1, 17, 300, 1029])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype, fp8", [("bf16", "fp8_e4m3"), ("f16", "fp8_e5m2")])
def test_fp8_cache_every_variant(dtype: str, fp8: str, variant: str) -> None:
    run_fp8(dtype, fp8, 128, 16, variant, "NHD", [1, 17, 300, 1029])


@pytest.mark.parametrize("fp8", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_split_kv(fp8: str) -> None:
    # Two requests of 8k and 5k tokens: 16 (request, kv head) units, so the plan splits the KV
    # and the merge combines partials that already carry v_scale.
    run_fp8("bf16", fp8, 128, 16, "default", "NHD", [8192, 5003], k_scale=0.3, v_scale=2.5)
    run_fp8("bf16", fp8, 128, 16, "soft_cap", "HND", [8192, 5003], k_scale=0.3, v_scale=2.5)


def test_fp8_cache_with_unit_scales_matches_its_bf16_copy() -> None:
    # The same call on the fp8 cache and on its exact bf16 copy: the widening is exact, so the two
    # differ only by the order of the sums (the fp8 path reads K's dims in another order and may
    # split the KV otherwise).
    gen = torch.Generator(device=DEV).manual_seed(7)
    lens = [33, 700, 4096]
    stored, indptr, indices, last = make_paged(lens, 16, 128, "NHD", torch.float32, gen)
    cache = stored.to(torch.float8_e4m3fn)
    q = torch.randn(len(lens), NUM_QO, 128, device=DEV, dtype=torch.bfloat16, generator=gen)
    o8 = flashgen.batch_decode(q, cache, indptr, indices, last)
    o16 = flashgen.batch_decode(q, cache.to(torch.bfloat16), indptr, indices, last)
    for b in range(len(lens)):
        assert_close(o8[b], o16[b].float(), "bf16", f"fp8 cache vs its bf16 copy b{b}")


def test_fp8_cache_with_rope_llama_is_refused() -> None:
    gen = torch.Generator(device=DEV).manual_seed(3)
    cache, indptr, indices, last = make_paged([5], 16, 128, "NHD", torch.float32, gen)
    q = torch.randn(1, NUM_QO, 128, device=DEV, dtype=torch.bfloat16, generator=gen)
    with pytest.raises(ValueError, match="rope_llama.*not supported with an fp8 KV cache"):
        flashgen.batch_decode(q, cache.to(torch.float8_e4m3fn), indptr, indices, last, pos_encoding="rope_llama")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("fp8", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_widening_is_exact_on_the_gpu(dtype: str, fp8: str) -> None:
    # One token a request: the output is V itself and the LSE K's logit, so both must come out
    # exactly (subnormals included) for every finite byte value. Request b's K row of kv head g
    # holds byte b * 32 + g * 4 + j at dim 4 * b + j, which query head 4 * g + j reads one-hot.
    t, f8 = TORCH_DT[dtype], FP8[fp8]
    codes = torch.arange(256, dtype=torch.int32, device=DEV).to(torch.uint8)
    values = codes.view(f8).float()
    nbytes = torch.where(torch.isfinite(values), codes, torch.zeros_like(codes))  # NaN/Inf: 0
    batch, d = 8, 128
    k = torch.zeros(batch, 8, d, dtype=torch.uint8, device=DEV)
    for b in range(batch):
        for j in range(4):
            k[b, :, 4 * b + j] = nbytes[b * 32 + torch.arange(8, device=DEV) * 4 + j]
    v = nbytes[torch.arange(batch * 8 * d, device=DEV) % 256].view(batch, 8, d)
    cache = torch.stack([k, v], dim=1).view(batch, 2, 1, 8, d).view(f8)  # [pages, 2, 1, Hk, D]
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=DEV)
    indices = torch.arange(batch, dtype=torch.int32, device=DEV)
    last = torch.ones(batch, dtype=torch.int32, device=DEV)
    q = torch.zeros(batch, NUM_QO, d, dtype=t, device=DEV)
    for b in range(batch):
        for h in range(NUM_QO):
            q[b, h, 4 * b + h % 4] = 1.0
    o, lse = flashgen.batch_decode(q, cache, indptr, indices, last, sm_scale=1.0, return_lse=True)
    want_o = cache[:, 1, 0].float().repeat_interleave(NUM_QO // 8, dim=1)  # [batch, Hq, D]
    torch.testing.assert_close(o.float(), want_o, atol=0, rtol=0)
    want_lse = torch.stack([cache[b, 0, 0].float()[torch.arange(NUM_QO, device=DEV) // 4,
                                                     4 * b + torch.arange(NUM_QO, device=DEV) % 4]
                            for b in range(batch)])
    # The logit goes through the hi + lo split of the scaled query (16 bits of it for bf16).
    torch.testing.assert_close(lse, want_lse, rtol=1e-4, atol=1e-10)


# ---- batch prefill (paged and ragged) over an fp8 cache -------------------------------------------

PREFILL_VARIANTS = [*VARIANTS, "attention_sink"]
PREFILL_BACKENDS = ["portable", "sm90"]
SM90 = torch.cuda.get_device_capability(0) == (9, 0)
# (qo_len, kv_len) per request: one token, chunked prefill over a longer history, equal lengths
# with a partial last tile, and a long one.
PREFILL_REQS = [(1, 1), (7, 33), (129, 129), (17, 1000), (300, 300), (64, 2100)]
SINK_WINDOW = 15


def prefill_key(kind: str, dtype: str, fp8: str, head_dim: int, page_size: int | None, variant: str,
                causal: bool, backend: str) -> tuple[str, dict[str, object]]:
    """The (module, params) of one prefill call."""
    params: dict[str, object] = {"dtype": dtype, "head_dim": head_dim, "mask": "causal" if causal else "none",
                                 "pos_encoding": "none", "variant": variant, "backend": backend, "kv_dtype": fp8}
    if kind == "paged":
        params["page_size"] = page_size
        return "batch_prefill_paged", params
    return ("single_prefill" if kind == "single" else "batch_prefill_ragged"), params


# The cases of the tests below (kind, dtype, fp8, head_dim, page_size, variant, causal, backend).
PAGE_CASES = [("paged", d, f, 128, p, "default", c, b) for d, f in (("bf16", "fp8_e4m3"), ("f16", "fp8_e5m2"))
              for p in (1, 16, 32, 64) for c in (True, False) for b in PREFILL_BACKENDS]
RAGGED_CASES = [("ragged", d, f, 128, None, "default", c, b) for d in ("bf16", "f16") for f in FP8
                for c in (True, False) for b in PREFILL_BACKENDS]
VARIANT_CASES = [(k, d, f, 128, 16 if k == "paged" else None, v, True, b) for k in ("paged", "ragged")
                 for d, f in (("bf16", "fp8_e4m3"), ("f16", "fp8_e5m2")) for v in PREFILL_VARIANTS
                 for b in PREFILL_BACKENDS]
HEAD_DIM_CASES = [(k, "bf16", f, h, 16 if k == "paged" else None, "default", True, "portable")
                  for k in ("paged", "ragged") for f in FP8 for h in (64, 256)]
SINGLE_CASES = ([("single", d, f, 128, None, "default", c, b) for d, f in (("bf16", "fp8_e4m3"), ("f16", "fp8_e5m2"))
                 for c in (True, False) for b in PREFILL_BACKENDS]
                + [("single", "bf16", "fp8_e4m3", 128, None, v, True, b)
                   for v in ("soft_cap", "sliding_window", "attention_sink") for b in PREFILL_BACKENDS]
                + [("single", "bf16", "fp8_e5m2", h, None, "default", True, "portable") for h in (64, 256)])
# single_prefill's request: a chunk of queries over a longer history.
SINGLE_REQS = [(300, 1000)]


def prefill_instances() -> list[tuple[str, dict[str, object]]]:
    cases = PAGE_CASES + RAGGED_CASES + VARIANT_CASES + HEAD_DIM_CASES + SINGLE_CASES
    keys = {repr(prefill_key(*c)): prefill_key(*c) for c in cases}
    keys.update({repr(k): k for k in (prefill_key("paged", "bf16", "same", 128, 16, "default", True, "portable"),
                                      prefill_key("ragged", "bf16", "same", 128, None, "default", False, "portable"))})
    if not SM90:
        keys = {r: k for r, k in keys.items() if k[1]["backend"] != "sm90"}
    return list(keys.values())


def need(backend: str) -> None:
    if backend == "sm90" and not SM90:
        pytest.skip("backend sm90 runs on sm_90 only")


def fp8_ragged(kv_lens: list[int], head_dim: int, f8: Any, gen: Any) -> tuple[Any, Any]:
    """Token-packed fp8 k and v [total_kv, NUM_KV, head_dim] (the stored values)."""
    total = sum(kv_lens)
    return tuple(torch.randn(total, NUM_KV, head_dim, device=DEV, generator=gen).to(f8) for _ in range(2))


def run_fp8_prefill(kind: str, dtype: str, fp8: str, head_dim: int, page_size: int | None, variant: str,
                    causal: bool, backend: str, layout: str = "NHD",
                    reqs: list[tuple[int, int]] | None = None, k_scale: float = K_SCALE,
                    v_scale: float = V_SCALE) -> tuple[Any, Any]:
    """One prefill call over an fp8 cache (``kind``: paged, ragged or single), each request
    checked against the fp32 reference on the dequantized K/V (k_scale and v_scale applied);
    returns (o, lse)."""
    need(backend)
    reqs = reqs or (SINGLE_REQS if kind == "single" else PREFILL_REQS)
    what = f"{kind} {dtype} q, {fp8} cache, d{head_dim} ps{page_size} {variant} causal={causal} {backend} {layout}"
    seed = zlib.crc32(f"{what} {reqs} {k_scale} {v_scale}".encode())
    gen = torch.Generator(device=DEV).manual_seed(seed)
    f8 = FP8[fp8]
    qo_lens, kv_lens = [a for a, _ in reqs], [b for _, b in reqs]
    q = torch.randn(sum(qo_lens), NUM_QO, head_dim, device=DEV, dtype=TORCH_DT[dtype], generator=gen)
    qo_indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    if variant == "attention_sink":
        params: dict[str, Any] = {"sinks": make_sinks(seed), "window_left": SINK_WINDOW}
    else:
        params = prefill_params(variant, min(n for n in kv_lens if n), NUM_QO, random.Random(seed))
    kw = dict(causal=causal, kv_layout=layout, variant=variant, return_lse=True, k_scale=k_scale,
              v_scale=v_scale, backend=backend, **params)
    if kind == "paged":
        stored, kv_indptr, indices, last = make_paged(kv_lens, page_size, head_dim, layout, torch.float32, gen)
        cache = stored.to(f8)
        o, lse = flashgen.batch_prefill_paged(q, qo_indptr, cache, kv_indptr, indices, last, **kw)
        per = [gather_kv(cache.float(), kv_indptr, indices, kv_lens, b, layout) for b in range(len(reqs))]
    else:
        k, v = fp8_ragged(kv_lens, head_dim, f8, gen)
        kv_indptr = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
        lay = (lambda x: x) if layout == "NHD" else (lambda x: x.transpose(0, 1).contiguous())
        if kind == "single":
            assert len(reqs) == 1, "single_prefill takes one request"
            o, lse = flashgen.single_prefill(q, lay(k), lay(v), **kw)
        else:
            o, lse = flashgen.batch_prefill(q, qo_indptr, lay(k), lay(v), kv_indptr, **kw)
        per = [(k[a:b].float(), v[a:b].float()) for a, b in zip(kv_indptr[:-1].tolist(), kv_indptr[1:].tolist())]
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (sum(qo_lens), NUM_QO)
    sm_scale = 1.0 / math.sqrt(head_dim)
    for b, (kb, vb) in enumerate(per):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        note = f"{what} request {b} {reqs[b]}"
        if variant == "attention_sink":
            ref = sink_reference(q[rows], kb * k_scale, vb * v_scale, params["sinks"], SINK_WINDOW, sm_scale)
            check_sinks(o[rows], lse[rows], ref, dtype, note, True)
        else:
            ref = reference_prefill(q[rows], kb * k_scale, vb * v_scale, causal, variant, sm_scale, params)
            check_prefill(o[rows], lse[rows], ref, dtype, note)
    return o, lse


@pytest.mark.parametrize("case", PAGE_CASES + RAGGED_CASES + VARIANT_CASES + HEAD_DIM_CASES + SINGLE_CASES, ids=repr)
def test_fp8_prefill(case: tuple[Any, ...]) -> None:
    """Every page size, ragged, every variant, head_dim 64 and 256, single (the case lists above)."""
    run_fp8_prefill(*case)


@pytest.mark.parametrize("kind", ["paged", "ragged", "single"])
def test_fp8_prefill_hnd(kind: str) -> None:
    run_fp8_prefill(kind, "bf16", "fp8_e4m3", 128, 16 if kind == "paged" else None, "default", True, "portable",
                    layout="HND")


@pytest.mark.parametrize("backend", PREFILL_BACKENDS)
@pytest.mark.parametrize("kind", ["paged", "ragged", "single"])
def test_fp8_prefill_split_kv(kind: str, backend: str) -> None:
    # Long requests with a few queries: few work units, so the plan splits the KV and the
    # merge combines partials that already carry v_scale.
    ps = 16 if kind == "paged" else None
    reqs = [(16, 8192)] if kind == "single" else [(16, 8192), (3, 5003)]
    run_fp8_prefill(kind, "bf16", "fp8_e4m3", 128, ps, "default", True, backend, reqs=reqs, k_scale=0.3, v_scale=2.5)
    run_fp8_prefill(kind, "bf16", "fp8_e5m2", 128, ps, "soft_cap", True, backend, reqs=reqs, k_scale=0.3, v_scale=2.5)


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_fp8_prefill_with_unit_scales_matches_its_bf16_copy(kind: str) -> None:
    # The same call on the fp8 cache and on its exact bf16 copy, on the same (portable) kernel:
    # the widening is exact, so the two differ only by the products' type (f16 for fp8, whose
    # query carries a power of two) and the rounding of P.
    gen = torch.Generator(device=DEV).manual_seed(11)
    lens, qo = [33, 700, 4096], [5, 300, 64]
    q = torch.randn(sum(qo), NUM_QO, 128, device=DEV, dtype=torch.bfloat16, generator=gen)
    qo_indptr = torch.tensor([0, *torch.tensor(qo).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    if kind == "paged":
        stored, indptr, indices, last = make_paged(lens, 16, 128, "NHD", torch.float32, gen)
        cache = stored.to(torch.float8_e4m3fn)
        o8, l8 = flashgen.batch_prefill_paged(q, qo_indptr, cache, indptr, indices, last, causal=True,
                                              return_lse=True, backend="portable")
        o16, l16 = flashgen.batch_prefill_paged(q, qo_indptr, cache.to(torch.bfloat16), indptr, indices, last,
                                                causal=True, return_lse=True, backend="portable")
    else:
        k, v = fp8_ragged(lens, 128, torch.float8_e4m3fn, gen)
        indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
        o8, l8 = flashgen.batch_prefill(q, qo_indptr, k, v, indptr, return_lse=True, backend="portable")
        o16, l16 = flashgen.batch_prefill(q, qo_indptr, k.to(torch.bfloat16), v.to(torch.bfloat16), indptr,
                                          return_lse=True, backend="portable")
    assert_close(o8, o16.float(), "bf16", f"{kind}: fp8 cache vs its bf16 copy")
    lerr = (l8 - l16).abs().max().item()
    assert lerr <= 2e-2, f"{kind}: fp8 cache vs its bf16 copy: lse differs by {lerr:.2e}"


def test_fp8_prefill_refusals() -> None:
    gen = torch.Generator(device=DEV).manual_seed(5)
    stored, indptr, indices, last = make_paged([40], 16, 128, "NHD", torch.float32, gen)
    cache = stored.to(torch.float8_e4m3fn)
    q = torch.randn(4, NUM_QO, 128, device=DEV, dtype=torch.bfloat16, generator=gen)
    qo_indptr = torch.tensor([0, 4], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="batch_prefill_paged: pos_encoding='rope_llama' with kv_dtype='fp8_e4m3' "
                                         "is not supported: in-kernel RoPE is not supported with an fp8 KV cache"):
        flashgen.batch_prefill_paged(q, qo_indptr, cache, indptr, indices, last, pos_encoding="rope_llama")
    k, v = fp8_ragged([40], 128, torch.float8_e5m2, gen)
    with pytest.raises(ValueError, match="single_prefill: pos_encoding='rope_llama' with kv_dtype='fp8_e5m2' "
                                         "is not supported: in-kernel RoPE is not supported with an fp8 KV cache"):
        flashgen.single_prefill(q, k, v, pos_encoding="rope_llama")
    kv_indptr = torch.tensor([0, 40], dtype=torch.int32, device=DEV)
    with pytest.raises(TypeError, match="batch_prefill: k and v must share one dtype"):
        flashgen.batch_prefill(q, qo_indptr, k, v.to(torch.bfloat16), kv_indptr)
    with pytest.raises(ValueError, match="batch_prefill: k_scale must be finite"):
        flashgen.batch_prefill(q, qo_indptr, k, v, kv_indptr, k_scale=float("inf"))
    with pytest.raises(ValueError, match="k_scale and v_scale apply to an fp8 KV cache"):
        flashgen.batch_prefill(q, qo_indptr, k.to(torch.bfloat16), v.to(torch.bfloat16), kv_indptr, v_scale=2.0)
    # Rows 8 elements apart (a 16-bit cache's rule) are not 16-byte copies of fp8: the kernel's
    # entry point refuses them and names the strides.
    wide = torch.zeros(40, NUM_KV, 136, device=DEV, dtype=torch.float8_e5m2)
    with pytest.raises(flashgen.KernelError, match="an fp8 k and v needs strides that are multiples of 16 elements"):
        flashgen.batch_prefill(q, qo_indptr, wide[..., :128], wide[..., :128], kv_indptr, backend="portable")
    paged = torch.zeros(4, 2, 16, NUM_KV, 136, device=DEV, dtype=torch.float8_e4m3fn)[..., :128]
    with pytest.raises(flashgen.KernelError, match="an fp8 paged_kv needs strides that are multiples of 16"):
        flashgen.batch_prefill_paged(q, qo_indptr, paged, indptr, indices % 4, last, backend="portable")
