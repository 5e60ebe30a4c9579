"""batch_decode over an fp8 KV cache (``torch.float8_e4m3fn`` / ``torch.float8_e5m2``) on a GPU,
against the fp32 reference of test_api_gpu on the dequantized cache (``cache.float() * scale``):
bf16 and f16 q, head_dim 64/128/256, page sizes 1 and 16 (32 and 64 once), NHD and HND, k_scale and v_scale not 1,
GQA 32/8, every built-in variant, return_lse, and a split-KV shape (a small batch of long
requests). The fp8 instances are not precompiled: the first call of each compiles it (JIT).
Skips without torch, a CUDA device or torch's fp8 dtypes.

Tolerances are test_api_gpu's: the widening is exact, so the kernel's error is the 16-bit path's
(P rounded to q's dtype for P V, the output rounded once).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "float8_e5m2"):
    pytest.skip("this torch has no float8 dtypes", allow_module_level=True)

import flashgen  # noqa: E402
from conftest import compile_ahead  # noqa: E402
from test_api_gpu import (  # noqa: E402
    DEV, NUM_QO, TORCH_DT, assert_close, gather_kv, make_paged, reference, variant_params,
)
# test_api_gpu's JIT cache, one for the session (its fixtures, used here by their names).
from test_api_gpu import _gpu_cache, _shared_cache  # noqa: E402, F401

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

    compile_ahead(_gpu_cache, [(f"batch_decode {p}", lambda p=p: _loader.load("batch_decode", p))
                               for p in instances()])


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
