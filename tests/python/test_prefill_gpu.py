"""Prefill on a GPU through the public API (``flashgen.single_prefill``, ``batch_prefill``,
``batch_prefill_paged``), against a plain PyTorch fp32 reference written from the contract.

The case matrix (``single_cases``, ``batch_cases``, ...), the data builders and the reference
(``reference_prefill``) are plain functions. Masks, ALiBi distances and RoPE angles are all built
from explicit positions: query i of a request sits at ``kv_len - qo_len + i``, key j at ``j``;
RoPE adds ``q_rope_offset[b]`` / ``kv_rope_offset[b]`` to those positions (and nothing else
does). Every call writes into a caller's ``out`` filled with NaN (so an unwritten row shows);
strided q rows leave NaN in the unused half of their buffer; the paged cache holds NaN in its
unused pages and in the tail of each request's last page (garbage a kernel must never read into
its output). Seeds come from the case id (crc32), data is fresh per case.

Skips cleanly without torch, without a CUDA device, and while flashgen has no prefill API.
Default run: bf16 head_dim 128 in depth, the other dtype/head_dim pairs and variants trimmed
(as test_decode_gpu does); ``FLASHGEN_TEST_FULL=1`` runs the full product. The modules with a backend axis (single,
ragged, paged) run on the backend the loader picks for the device (sm90 on Hopper); set
``FLASHGEN_TEST_BACKEND=portable`` (or ``sm90``) to run every case of those modules on that one. The instances a run
needs are compiled up front, in parallel (``FLASHGEN_TEST_JIT_THREADS``, default 16), into one
cache for the module (``FLASHGEN_TEST_CACHE_DIR`` to keep it between runs). Set
``FLASHGEN_TEST_ERRLOG=path`` to log every case's worst errors as JSON lines.

Tolerances, per query row and head (u = the dtype's unit roundoff, 2^-8 bf16, 2^-10 f16):

  output:  ||o - ref|| / ||ref|| <= 2.5 u                         (bf16 9.8e-3, f16 2.4e-3)
  LSE:     |lse - ref| <= 0.5 u + 4 u / sqrt(n_eff)              (natural log)
  rows that see no key (causal with qo_len > kv_len, kv_len = 0): o exactly 0, lse exactly -inf

Why the same 2.5 u as decode for the output although prefill rounds P to the dtype before PV:
rounding to the dtype is off by at most u relative per element (about 0.4 u rms). Rounding P
moves o by about 0.4 u rms whatever the number of keys (the weights are positive); rounding o
itself adds 0.4 u rms (a float64 stand-in with only that rounding measured a worst row of 0.64 u
over 700 cases); rounding a transformed (scaled or RoPE-rotated) q or k to the dtype before the
tensor cores moves each logit by ~0.4-0.6 u rms, hence o by as much. About 0.8 u rms together,
~1.5 u at worst for a row over one or two keys; 2.5 u keeps that margin yet fails a dropped
16-key tile for kv_len up to ~160k (it moves o by ~4/sqrt(kv_len) relative), a one-key mask
error up to ~10k keys, and any wrong scale, head mapping, RoPE pairing or position (all of which
a mutation run of this file against a float64 stand-in caught).

Why the LSE bound is not decode's flat 5e-5: decode keeps its logits fp32-exact (hi + lo query
parts); a prefill kernel on bf16 tensor cores may round the scaled or rotated q and k, giving
logit errors of ~0.6 u rms per key (2.4e-3 bf16). The LSE is a softmax-weighted mean of those
errors, so it shrinks as 1/sqrt(n_eff) (n_eff = 1 / sum p^2, the effective number of keys, from
the reference): 4 u / sqrt(n_eff) is ~6 sigma of that. The query-side rounding does not average
out over keys (~0.07 u rms with randn data): the 0.5 u floor. A row over one key may be off by
1.8e-2 (bf16), a row over 4097 keys by 2.6e-3, over 100k by 2.0e-3. For sigmoid variants the
"LSE" is log(sum of weights) as in decode (test_decode_gpu's reference), with
n_eff = (sum w)^2 / sum w^2.

The reference computes in fp32 with TF32 off; RoPE angles are computed in float64 (the math
itself: at position 40000 an fp32 angle is off by ~2e-3 rad), then the rotation in fp32.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashgen  # noqa: E402

_API = ("single_prefill", "batch_prefill", "batch_prefill_paged")
if not all(hasattr(flashgen, name) for name in _API):
    pytest.skip("this flashgen has no prefill API yet (single_prefill, batch_prefill, batch_prefill_paged)",
                allow_module_level=True)

from conftest import FLASH_SIGMOID_PARAMS, compile_ahead, flash_sigmoid_source, needs_jit  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False  # the reference is fp32, not TF32
torch.backends.cudnn.allow_tf32 = False

DEV = "cuda:0"
# None: the loader's choice for the device; else the backend= of every single / ragged call.
TEST_BACKEND = os.environ.get("FLASHGEN_TEST_BACKEND") or None
BACKEND_KINDS = ("single", "ragged", "paged")  # the modules that declare a backend axis
FULL = os.environ.get("FLASHGEN_TEST_FULL") == "1"
ERRLOG = os.environ.get("FLASHGEN_TEST_ERRLOG")
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "f16": 2.0 ** -10}
OUT_RTOL_U = 2.5      # output: relative L2 per (row, head) <= 2.5 u
LSE_FLOOR_U = 0.5     # LSE: |err| <= 0.5 u + 4 u / sqrt(n_eff)
LSE_KEYS_U = 4.0
BUILTIN = ["default", "soft_cap", "sliding_window", "alibi", "sigmoid"]
CUSTOM = "user_flash_sigmoid"  # the RFC's FlashSigmoid (tests/python/custom_variants/), by the JIT
SIGMOID_LIKE = ("sigmoid", CUSTOM)
HKV = 2                        # kv heads; qo heads = HKV * group
HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (1, 16, 32, 64)
ROPE_SETTINGS = [(1e4, 1.0), (5e5, 8.0)]  # (rope_theta, rope_scale): Llama 2 and Llama 3 style

# ---------------------------------------------------------------- case matrix (plain functions)

EQ = [(1, 1), (7, 7), (129, 129), (1000, 1000), (4097, 4097)]          # qo_len = kv_len
LT = [(1, 7), (1, 4097), (7, 1000), (129, 4097), (1000, 4097)]         # qo_len < kv_len
GT = [(7, 1), (129, 7), (1000, 129), (4097, 1000)]                     # qo_len > kv_len
SINGLE_SHAPES = EQ + LT + GT
SINGLE_SHAPES_SHORT = [(7, 7), (129, 1000), (1000, 1000), (1000, 129)]

# Ragged/paged batches of (qo_len, kv_len).
BATCH_LENS = {
    "mixed": [(1, 1), (7, 33), (129, 129), (17, 1000), (300, 300), (1, 4097)],
    "empty": [(0, 50), (5, 0), (33, 100), (0, 0), (129, 7), (7, 7), (1, 16)],
    "long": [(1000, 1000), (129, 4097), (3, 5)],
}


def _case(**kw: Any) -> dict[str, Any]:
    base = dict(kind="single", dtype="bf16", head_dim=128, variant="default", group=4, layout="NHD",
                causal=True, pos_encoding="none", rope=0, offsets=False, sm_scale=None, page_size=None,
                backend=TEST_BACKEND)
    base.update(kw)
    return base


def single_cases() -> list[dict[str, Any]]:
    cases = []
    # default, bf16, head_dim 128: every shape, causal or not, both layouts; GQA 1 and 8 on a few.
    for qo, kv in SINGLE_SHAPES:
        for causal in (True, False):
            for layout in ("NHD", "HND"):
                for group in (1, 4, 8):
                    if group != 4 and not FULL and (qo, kv) not in ((129, 129), (1000, 4097), (129, 7)):
                        continue
                    cases.append(_case(shape=(qo, kv), causal=causal, layout=layout, group=group,
                                       sm_scale=0.07 if (qo, kv) == (129, 4097) else None))
    # default, the other dtype / head_dim pairs.
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            if (dtype, head_dim) == ("bf16", 128):
                continue
            for qo, kv in (SINGLE_SHAPES if FULL else SINGLE_SHAPES_SHORT[1:]):
                for causal in (True, False):
                    for layout in (("NHD", "HND") if FULL or (qo, kv) == (1000, 1000) else ("NHD",)):
                        if layout == "HND" and not causal and not FULL:
                            continue
                        cases.append(_case(dtype=dtype, head_dim=head_dim, shape=(qo, kv), causal=causal,
                                           layout=layout))
    # every other built-in variant, bf16 head_dim 128 (FULL: every dtype and head_dim).
    shapes = SINGLE_SHAPES if FULL else [(1, 4097), (7, 7), (129, 1000), (1000, 1000), (1000, 129)]
    for variant in BUILTIN[1:]:
        for dtype in (DTYPES if FULL else ("bf16",)):
            for head_dim in (HEAD_DIMS if FULL else (128,)):
                for qo, kv in shapes:
                    for causal in (True, False):
                        for layout in (("NHD", "HND") if FULL or (qo, kv) == (129, 1000) else ("NHD",)):
                            cases.append(_case(variant=variant, dtype=dtype, head_dim=head_dim,
                                               shape=(qo, kv), causal=causal, layout=layout,
                                               sm_scale=0.05 if layout == "HND" else None))
    # head_dim 64 with ALiBi, whose LinearBias holds per-row state: the sm90 kernel takes another
    # tile shape for it (hopper/traits.cuh); and the window, whose MaskBounds no longer does.
    if not FULL:
        for variant in ("sliding_window", "alibi"):
            for causal in (True, False):
                cases.append(_case(variant=variant, head_dim=64, shape=(129, 1000), causal=causal))
    return cases


def batch_cases() -> list[dict[str, Any]]:
    cases = []
    for kind in ("ragged", "paged"):
        sizes = (None,) if kind == "ragged" else PAGE_SIZES
        for ps in sizes:
            # default bf16 128: every batch, causal or not, both layouts, GQA 1/4/8 on one.
            for name in BATCH_LENS:
                for causal in (True, False):
                    for layout in ("NHD", "HND"):
                        for group in (1, 4, 8):
                            if group != 4 and not FULL and not (name == "mixed" and causal and layout == "NHD"):
                                continue
                            cases.append(_case(kind=kind, page_size=ps, lens=name, causal=causal,
                                               layout=layout, group=group))
            # variants
            for variant in BUILTIN[1:]:
                for name in (BATCH_LENS if FULL else ("mixed", "empty")):
                    for causal in (True, False):
                        if kind == "paged" and ps != 16 and not FULL:
                            continue  # page size 1 runs the variants in the FULL run only
                        for layout in (("NHD", "HND") if FULL or (name == "mixed" and causal) else ("NHD",)):
                            cases.append(_case(kind=kind, page_size=ps, lens=name, variant=variant,
                                               causal=causal, layout=layout))
            # the other dtype / head_dim pairs (paged: page 16 only unless FULL)
            if kind == "paged" and ps != 16 and not FULL:
                continue
            for dtype in DTYPES:
                for head_dim in HEAD_DIMS:
                    if (dtype, head_dim) == ("bf16", 128) or (not FULL and dtype == "f16" and head_dim != 128):
                        continue
                    if kind == "paged" and ps == 1 and head_dim == 256:
                        continue  # not in batch_decode's matrix either
                    for name in (BATCH_LENS if FULL else ("mixed",)):
                        cases.append(_case(kind=kind, page_size=ps, lens=name, dtype=dtype,
                                           head_dim=head_dim, causal=True))
            # head_dim 64 with per-row state (as in single_cases)
            if not FULL:
                for variant in ("sliding_window", "alibi"):
                    cases.append(_case(kind=kind, page_size=ps, lens="mixed", variant=variant,
                                       head_dim=64, causal=True))
    return cases


def rope_cases() -> list[dict[str, Any]]:
    """RoPE (Llama half-split) against the reference: single (positions kv_len - qo_len + i),
    ragged and paged with and without per-request offsets (q and kv offsets differ, otherwise
    RoPE's relative form would hide an ignored offset)."""
    cases = []
    for i, (qo, kv) in enumerate(SINGLE_SHAPES if FULL else SINGLE_SHAPES_SHORT + [(1, 4097)]):
        for causal in (True, False):
            cases.append(_case(shape=(qo, kv), causal=causal, pos_encoding="rope_llama", rope=i % 2,
                               layout="HND" if (i + causal) % 3 == 0 else "NHD"))
    for variant in (BUILTIN[1:] + [CUSTOM]):
        cases.append(_case(shape=(129, 1000), variant=variant, pos_encoding="rope_llama", rope=1))
    for dtype, head_dim in (("bf16", 64), ("bf16", 256), ("f16", 128)):
        cases.append(_case(shape=(1000, 1000), dtype=dtype, head_dim=head_dim, pos_encoding="rope_llama"))
    for kind in ("ragged", "paged"):
        for ps in ((None,) if kind == "ragged" else PAGE_SIZES):
            for name in (("mixed", "empty", "long") if kind == "ragged" or ps == 16 else ("mixed",)):
                for offsets in (False, True):
                    for causal in ((True, False) if kind == "ragged" or FULL else (True,)):
                        cases.append(_case(kind=kind, page_size=ps, lens=name, pos_encoding="rope_llama",
                                           offsets=offsets, causal=causal, rope=int(offsets),
                                           layout="HND" if (offsets and not causal) else "NHD"))
        cases.append(_case(kind=kind, page_size=16 if kind == "paged" else None, lens="mixed",
                           variant="alibi", pos_encoding="rope_llama", offsets=True))
    return cases


def custom_cases() -> list[dict[str, Any]]:
    cases = []
    for kind, ps in (("single", None), ("ragged", None), ("paged", 16), ("paged", 1)):
        for causal in (True, False):
            if ps == 1 and not FULL:
                continue
            extra = dict(shape=(129, 1000)) if kind == "single" else dict(lens="empty" if causal else "mixed")
            cases.append(_case(kind=kind, page_size=ps, variant=CUSTOM, causal=causal, **extra))
    cases.append(_case(kind="single", variant=CUSTOM, shape=(1000, 129), causal=True, dtype="f16"))
    return cases


def decode_cases() -> list[dict[str, Any]]:
    """qo_len = 1 prefill against decode, every variant, with and without RoPE."""
    cases = []
    for variant in BUILTIN + [CUSTOM]:
        for pe in ("none", "rope_llama"):
            for kind in ("single", "batch"):
                cases.append(_case(kind=kind, variant=variant, pos_encoding=pe, page_size=16,
                                   causal=zlib.crc32(f"{variant}{pe}{kind}".encode()) % 2 == 0, rope=len(variant) % 2,
                                   layout="HND" if variant in ("alibi", "sigmoid") else "NHD"))
    return cases


def case_id(case: dict[str, Any]) -> str:
    shape = case.get("shape") or case.get("lens") or ""
    parts = [case["kind"] + (f"{case['page_size']}" if case.get("page_size") and case["kind"] == "paged" else ""),
             case["variant"], case["dtype"], str(case["head_dim"]), f"g{case['group']}", case["layout"],
             "causal" if case["causal"] else "full", f"{shape}".replace(" ", "")]
    if case["pos_encoding"] != "none":
        parts.append(f"rope{case['rope']}" + ("+off" if case["offsets"] else ""))
    if case["sm_scale"] is not None:
        parts.append(f"s{case['sm_scale']}")
    if "window_left" in case:
        parts.append(f"w{case['window_left']}")
    if case.get("backend") and case["kind"] in BACKEND_KINDS:
        parts.append(case["backend"])
    return "-".join(parts)


def _seed(case: dict[str, Any]) -> int:
    """From the case's id without its backend: every backend gets the same data."""
    return zlib.crc32(case_id(dict(case, backend=None)).encode())


def variant_params(variant: str, kv_len: int, num_qo_heads: int, rng: random.Random) -> dict[str, Any]:
    """Additional params per variant, drawn so that each one visibly changes the output."""
    if variant == "soft_cap":
        return {"logits_soft_cap": rng.choice([1.5, 4.0])}
    if variant == "sliding_window":
        return {"window_left": rng.choice([-1, 0, 15, max(1, kv_len // 3)])}
    if variant == "alibi":
        return {"alibi_slopes": torch.tensor([2.0 ** (-8.0 * (i + 1) / num_qo_heads) for i in range(num_qo_heads)],
                                             dtype=torch.float32, device=DEV)}
    if variant == "sigmoid":
        return {"sigmoid_bias": rng.choice([-2.0, 0.5])}
    if variant == CUSTOM:
        return {"logits_scale": 0.11, "sigmoid_bias": -1.0}
    return {}


def case_params(case: dict[str, Any], kv_len: int, num_qo_heads: int, rng: random.Random) -> dict[str, Any]:
    """variant_params, with the case's own window_left where it names one (window_cases)."""
    params = variant_params(case["variant"], kv_len, num_qo_heads, rng)
    if "window_left" in case:
        params["window_left"] = case["window_left"]
    return params


_custom_variant: list[Any] = []


def variant_arg(name: str) -> Any:
    """The ``variant=`` argument: a built-in's name, or the RFC FlashSigmoid as a flashgen.Variant."""
    if name != CUSTOM:
        return name
    if not _custom_variant:
        _custom_variant.append(flashgen.Variant(CUSTOM, flash_sigmoid_source(), params=FLASH_SIGMOID_PARAMS))
    return _custom_variant[0]


def rope_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    if case["pos_encoding"] == "none":
        return {}
    theta, scale = ROPE_SETTINGS[case["rope"]]
    return {"pos_encoding": case["pos_encoding"], "rope_theta": theta, "rope_scale": scale}


# ---------------------------------------------------------------- reference (plain PyTorch fp32)

def rope_llama(x: Any, pos: Any, theta: float, scale: float) -> Any:
    """Llama's half-split RoPE. x [M, H, D] fp32, pos [M] int64 -> rotated x, fp32:
    freq_i = theta^(-2i/D), angle = pos / scale * freq_i (float64),
    x'[i] = x[i] cos - x[i + D/2] sin, x'[i + D/2] = x[i + D/2] cos + x[i] sin, i < D/2."""
    d = x.shape[-1]
    half = d // 2
    i = torch.arange(half, dtype=torch.float64, device=x.device)
    freq = theta ** (-2.0 * i / d)
    angle = (pos.to(torch.float64)[:, None] / scale) * freq[None, :]
    cos = torch.cos(angle).to(torch.float32)[:, None, :]
    sin = torch.sin(angle).to(torch.float32)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def reference_prefill(q: Any, k: Any, v: Any, causal: bool, variant: str, sm_scale: float,
                      params: dict[str, Any], pos_encoding: str = "none", rope_theta: float = 1e4,
                      rope_scale: float = 1.0, q_pos: Any = None, k_pos: Any = None,
                      q_rope_offset: int = 0, k_rope_offset: int = 0) -> tuple[Any, Any, Any]:
    """One request in fp32. q [M, Hq, D]: the query rows to check; k, v [N, Hkv, D] (NHD).
    q_pos [M] / k_pos [N] (int64): positions for the mask and ALiBi, default
    ``N - M + i`` and ``j`` (pass q_pos when q is a subset of the request's rows); RoPE rotates
    at q_pos + q_rope_offset and k_pos + k_rope_offset.
    Returns (o [M, Hq, D], lse [M, Hq] natural log, -inf where no key is seen, n_eff [M, Hq])."""
    dev = q.device
    m, hq, d = q.shape
    n, hkv = k.shape[0], k.shape[1]
    q, k, v = q.float(), k.float(), v.float()
    if q_pos is None:
        q_pos = torch.arange(n - m, n, device=dev, dtype=torch.int64)
    if k_pos is None:
        k_pos = torch.arange(n, device=dev, dtype=torch.int64)
    if pos_encoding == "rope_llama":
        q = rope_llama(q, q_pos + q_rope_offset, rope_theta, rope_scale)
        k = rope_llama(k, k_pos + k_rope_offset, rope_theta, rope_scale)
    elif pos_encoding != "none":
        raise ValueError(pos_encoding)
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=1)
    o = torch.zeros(m, hq, d, device=dev, dtype=torch.float32)
    lse = torch.full((m, hq), float("-inf"), device=dev, dtype=torch.float32)
    n_eff = torch.zeros(m, hq, device=dev, dtype=torch.float32)
    if m == 0 or n == 0:
        return o, lse, n_eff
    rows = max(1, (1 << 25) // (hq * n))  # keep each [Hq, rows, N] logits block near 128 MB
    for a in range(0, m, rows):
        b = min(m, a + rows)
        qp = q_pos[a:b]
        s = torch.einsum("mhd,nhd->hmn", q[a:b], k)  # [Hq, rows, N]
        seen = torch.ones(b - a, n, dtype=torch.bool, device=dev)
        if causal or variant == "sliding_window":
            seen &= k_pos[None, :] <= qp[:, None]
        if variant == "sliding_window" and params["window_left"] >= 0:
            seen &= k_pos[None, :] >= qp[:, None] - params["window_left"]
        if variant in SIGMOID_LIKE:
            scale = params["logits_scale"] if variant == CUSTOM else sm_scale
            w = torch.sigmoid(s * scale + params["sigmoid_bias"]).masked_fill(~seen[None], 0.0)
            total = w.sum(-1)  # [Hq, rows]
            o[a:b] = torch.einsum("hmn,nhd->mhd", w, v)
            lse[a:b] = torch.log(total).T
            n_eff[a:b] = torch.nan_to_num(total ** 2 / (w ** 2).sum(-1), nan=0.0).T
            continue
        logits = s * sm_scale
        if variant == "soft_cap":
            cap = params["logits_soft_cap"]
            logits = cap * torch.tanh(logits / cap)
        elif variant == "alibi":
            dist = (k_pos[None, :] - qp[:, None]).to(torch.float32)  # kv_pos - q_pos, <= 0 when seen
            logits = logits + params["alibi_slopes"][:, None, None] * dist[None]
        logits = logits.masked_fill(~seen[None], float("-inf"))
        row_lse = torch.logsumexp(logits, dim=-1)  # [Hq, rows], -inf for a row that sees nothing
        none = torch.isneginf(row_lse)
        p = torch.exp(logits - row_lse.masked_fill(none, 0.0)[..., None])  # exp(-inf) = 0 there
        o[a:b] = torch.einsum("hmn,nhd->mhd", p, v)
        lse[a:b] = row_lse.T
        n_eff[a:b] = torch.where(none, 0.0, 1.0 / (p ** 2).sum(-1).clamp_min(1e-30)).T
    return o, lse, n_eff


def check(out: Any, lse: Any, ref: tuple[Any, Any, Any], dtype: str, what: str) -> tuple[float, float]:
    """Asserts the tolerances of the module docstring. out [M, H, D], lse [M, H] (or None)."""
    ref_o, ref_lse, n_eff = ref
    u = UNIT_ROUNDOFF[dtype]
    out = out.float()
    none = torch.isneginf(ref_lse)  # [M, H] rows that see no key
    if none.any():
        bad = out[none].abs().amax().item() if out[none].numel() else 0.0
        assert bad == 0.0, f"{what}: {int(none.sum())} rows see no key; their output must be 0, max |o| {bad}"
        if lse is not None:
            assert torch.isneginf(lse[none]).all(), (
                f"{what}: rows that see no key must have lse -inf, got {lse[none][~torch.isneginf(lse[none])][:4].tolist()}")
    live = ~none
    if not live.any():
        return 0.0, 0.0
    assert torch.isfinite(out[live]).all(), (
        f"{what}: non-finite output in {int((~torch.isfinite(out[live])).any(-1).sum())} live rows (unwritten or NaN)")
    err = ((out - ref_o).norm(dim=-1) / ref_o.norm(dim=-1).clamp_min(1e-30))[live]
    worst = err.max().item()
    lse_worst = 0.0
    if lse is not None:
        lse = lse.float()
        assert torch.isfinite(lse[live]).all(), f"{what}: non-finite lse on live rows"
        lse_err = (lse - ref_lse).abs()[live]
        bound = LSE_FLOOR_U * u + LSE_KEYS_U * u / n_eff[live].clamp_min(1.0).sqrt()
        ratio = lse_err / bound
        i = int(ratio.argmax())
        lse_worst = lse_err[i].item()
        assert ratio[i].item() <= 1.0, (
            f"{what}: lse error {lse_worst:.3e} > {bound[i].item():.3e} (n_eff {n_eff[live][i].item():.1f})")
    if ERRLOG:
        with open(ERRLOG, "a") as f:
            f.write(json.dumps({"case": what, "dtype": dtype, "out_rel_l2": worst, "lse_abs": lse_worst}) + "\n")
    assert worst <= OUT_RTOL_U * u, (
        f"{what}: output relative L2 {worst:.3e} > {OUT_RTOL_U * u:.3e} "
        f"(row {int(err.argmax())} of the live rows)")
    return worst, lse_worst


# ---------------------------------------------------------------- data builders

def rand(shape: tuple[int, ...], dtype: str, gen: Any) -> Any:
    return torch.randn(shape, generator=gen, device=DEV).to(DTYPES[dtype])


def nan_strided(shape: tuple[int, ...], dtype: str, gen: Any) -> Any:
    """Random data in the first half of a last dimension twice as wide, NaN in the rest: a
    strided view (last dim contiguous) whose neighbours poison any wrong-stride read."""
    buf = torch.full((*shape[:-1], 2 * shape[-1]), float("nan"), device=DEV, dtype=DTYPES[dtype])
    view = buf[..., : shape[-1]]
    view.copy_(rand(shape, dtype, gen))
    return view


def poisoned(shape: tuple[int, ...], dtype: str) -> Any:
    return torch.full(shape, float("nan"), device=DEV, dtype=DTYPES[dtype])


def to_layout(x: Any, layout: str) -> Any:
    """[N, Hkv, D] (NHD) -> the layout's memory order (HND: [Hkv, N, D], contiguous)."""
    return x if layout == "NHD" else x.transpose(0, 1).contiguous()


def indptr(lens: list[int]) -> Any:
    acc = [0]
    for n in lens:
        acc.append(acc[-1] + n)
    return torch.tensor(acc, dtype=torch.int32, device=DEV)


def fill_paged(cache: Any, kv: list[tuple[Any, Any]], pages: list[list[int]], layout: str) -> None:
    """Write each request's K/V [n, Hkv, D] into its pages; the rest of the cache is NaN."""
    cache.fill_(float("nan"))
    ps = cache.shape[2] if layout == "NHD" else cache.shape[3]
    for (k, v), ids in zip(kv, pages):
        if not ids:
            continue
        idx = torch.tensor(ids, dtype=torch.long, device=DEV)
        for j, t in enumerate((k, v)):
            padded = torch.full((len(ids) * ps, *t.shape[1:]), float("nan"), device=DEV, dtype=t.dtype)
            padded[: t.shape[0]] = t
            padded = padded.view(len(ids), ps, *t.shape[1:])  # [p, ps, Hkv, D]
            if layout == "HND":
                padded = padded.transpose(1, 2)  # [p, Hkv, ps, D]
            cache[idx, j] = padded


def shuffled_pages(npages: list[int], total: int, gen: Any) -> tuple[list[int], list[list[int]]]:
    """Distinct random pages among ``total`` for requests of ``npages`` pages each: all of them
    in request order (the kv_indices) and each request's own."""
    perm = torch.randperm(total, generator=gen, device=DEV)[:sum(npages)].tolist()
    pages, at = [], 0
    for p in npages:
        pages.append(perm[at:at + p])
        at += p
    return perm, pages


def make_paged(kv_lens: list[int], page_size: int, hkv: int, d: int, layout: str, dtype: str,
               gen: Any, spare: int = 3) -> tuple[Any, ...]:
    """Shuffled pages for kv_lens (plus `spare` pages nobody owns): (cache, kv_indptr,
    kv_indices, kv_last_page_len, per-request [(k, v)] NHD). An empty request has no page and
    last_page_len 0."""
    npages = [-(-n // page_size) for n in kv_lens]
    used = sum(npages)
    total = used + spare
    shape = (total, 2, page_size, hkv, d) if layout == "NHD" else (total, 2, hkv, page_size, d)
    cache = torch.empty(shape, device=DEV, dtype=DTYPES[dtype])
    perm, pages = shuffled_pages(npages, total, gen)
    kv = [(rand((n, hkv, d), dtype, gen), rand((n, hkv, d), dtype, gen)) for n in kv_lens]
    fill_paged(cache, kv, pages, layout)
    indices = torch.tensor(perm, dtype=torch.int32, device=DEV)
    last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, npages)],
                        dtype=torch.int32, device=DEV)
    return cache, indptr(npages), indices, last, kv


def make_ragged(kv_lens: list[int], hkv: int, d: int, layout: str, dtype: str, gen: Any) -> tuple[Any, ...]:
    """Concatenated K/V: (k, v in the layout, kv_indptr, per-request [(k, v)] NHD views)."""
    total = sum(kv_lens)
    k = rand((total, hkv, d), dtype, gen)
    v = rand((total, hkv, d), dtype, gen)
    per, at = [], 0
    for n in kv_lens:
        per.append((k[at:at + n], v[at:at + n]))
        at += n
    return to_layout(k, layout), to_layout(v, layout), indptr(kv_lens), per


def rope_offsets(batch: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """Per-request q / kv RoPE offsets, different from each other (up to ~40k positions)."""
    q = [rng.randrange(0, 40000) for _ in range(batch)]
    k = [rng.randrange(0, 40000) for _ in range(batch)]
    return q, k


def _rope_offset_kwargs(case: dict[str, Any], kw: dict[str, Any], batch: int,
                        rng: random.Random) -> tuple[list[int], list[int]]:
    """The case's RoPE offsets (zeros unless ``case["offsets"]``), set as the call's tensors in
    ``kw`` when it has them."""
    if not case["offsets"]:
        return [0] * batch, [0] * batch
    q_off, k_off = rope_offsets(batch, rng)
    kw["q_rope_offset"] = torch.tensor(q_off, dtype=torch.int32, device=DEV)
    kw["kv_rope_offset"] = torch.tensor(k_off, dtype=torch.int32, device=DEV)
    return q_off, k_off


# ---------------------------------------------------------------- running cases

def _sm_scale(case: dict[str, Any]) -> float:
    return case["sm_scale"] if case["sm_scale"] is not None else 1.0 / math.sqrt(case["head_dim"])


def _api_kwargs(case: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    kw = dict(causal=case["causal"], kv_layout=case["layout"], variant=variant_arg(case["variant"]),
              return_lse=True, **rope_kwargs(case), **params)
    if case["sm_scale"] is not None:
        kw["sm_scale"] = case["sm_scale"]
    if case.get("backend") and case["kind"] in BACKEND_KINDS:
        kw["backend"] = case["backend"]
    return kw


def _ref_kwargs(case: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    theta, scale = ROPE_SETTINGS[case["rope"]]
    return dict(causal=case["causal"], variant=case["variant"], sm_scale=_sm_scale(case), params=params,
                pos_encoding=case["pos_encoding"], rope_theta=theta, rope_scale=scale)


def run_single(case: dict[str, Any]) -> None:
    gen = torch.Generator(device=DEV).manual_seed(_seed(case))
    rng = random.Random(_seed(case))
    dt, d, hq = case["dtype"], case["head_dim"], HKV * case["group"]
    qo, kv = case["shape"]
    q = nan_strided((qo, hq, d), dt, gen)
    k, v = rand((kv, HKV, d), dt, gen), rand((kv, HKV, d), dt, gen)
    params = case_params(case, kv, hq, rng)
    out = poisoned((qo, hq, d), dt)
    got, lse = flashgen.single_prefill(q, to_layout(k, case["layout"]), to_layout(v, case["layout"]), out=out,
                                       **_api_kwargs(case, params))
    assert got is out, "single_prefill(out=) must return the caller's out"
    assert lse.shape == (qo, hq) and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    ref = reference_prefill(q, k, v, **_ref_kwargs(case, params))
    check(out, lse, ref, dt, f"single_prefill {case_id(case)} {params_note(params)}")
    if case.get("on_result"):
        case["on_result"]("single_prefill", out, lse)


def params_note(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items() if not torch.is_tensor(v))


def run_batch(case: dict[str, Any], lens: list[tuple[int, int]] | None = None) -> None:
    gen = torch.Generator(device=DEV).manual_seed(_seed(case))
    rng = random.Random(_seed(case))
    dt, d, hq, layout = case["dtype"], case["head_dim"], HKV * case["group"], case["layout"]
    lens = lens if lens is not None else BATCH_LENS[case["lens"]]
    qo_lens, kv_lens = [a for a, _ in lens], [b for _, b in lens]
    q = nan_strided((sum(qo_lens), hq, d), dt, gen)
    qo_indptr = indptr(qo_lens)
    live_kv = [n for n in kv_lens if n] or [1]
    params = case_params(case, min(live_kv), hq, rng)
    kw = _api_kwargs(case, params)
    q_off, k_off = _rope_offset_kwargs(case, kw, len(lens), rng)
    out = poisoned(tuple(q.shape), dt)
    if case["kind"] == "paged":
        cache, kv_indptr, kv_indices, last, per = make_paged(kv_lens, case["page_size"], HKV, d, layout, dt, gen)
        got, lse = flashgen.batch_prefill_paged(q, qo_indptr, cache, kv_indptr, kv_indices, last, out=out, **kw)
    else:
        k, v, kv_indptr, per = make_ragged(kv_lens, HKV, d, layout, dt, gen)
        got, lse = flashgen.batch_prefill(q, qo_indptr, k, v, kv_indptr, out=out, **kw)
    assert got is out, "out= must be returned"
    assert lse.shape == (sum(qo_lens), hq) and lse.dtype == torch.float32
    check_batch(case, out, lse, q, lens, per, params, q_off, k_off)
    if case.get("on_result"):
        case["on_result"]("batch_prefill", out, lse)


def check_batch(case: dict[str, Any], out: Any, lse: Any, q: Any, lens: list[tuple[int, int]],
                per: list[tuple[Any, Any]], params: dict[str, Any], q_off: list[int], k_off: list[int],
                sample: int | None = None, what: str = "") -> None:
    """Each request against the reference; requests with more than `sample` query rows are
    checked on their first 16, last 16 and `sample` random rows (positions passed explicitly)."""
    at = 0
    gen = torch.Generator(device=DEV).manual_seed(_seed(case) ^ 0x5EED)
    for b, ((qo, kv), (k, v)) in enumerate(zip(lens, per)):
        rows = torch.arange(qo, device=DEV)
        if sample is not None and qo > sample + 32:
            mid = torch.randperm(qo - 32, generator=gen, device=DEV)[:sample] + 16
            rows = torch.cat([rows[:16], mid.sort().values, rows[-16:]])
        if qo:
            ref = reference_prefill(q[at:at + qo][rows], k, v, q_pos=rows + (kv - qo),
                                    q_rope_offset=q_off[b], k_rope_offset=k_off[b], **_ref_kwargs(case, params))
            check(out[at:at + qo][rows], lse[at:at + qo][rows], ref, case["dtype"],
                  f"{what or case['kind']} {case_id(case)} request {b} (qo {qo}, kv {kv}) {params_note(params)}")
        at += qo


# ---------------------------------------------------------------- warming the JIT

def warm_keys(case: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What selects an instance (or might, if the prefill modules grow axes for it)."""
    c = case
    keys = []
    kinds = [c["kind"]] if c["kind"] != "batch" else []
    if c.get("decode"):
        kinds = ["single", "ragged", "paged", "single_decode", "batch_decode"]
    for kind in kinds:
        ps = c["page_size"] if kind in ("paged", "batch_decode") else None
        keys.append((kind, c["dtype"], c["head_dim"], c["variant"], ps or (16 if kind in ("paged", "batch_decode") else None),
                     c["pos_encoding"], c["causal"], c["layout"], c.get("backend") if kind in BACKEND_KINDS else None))
        if c.get("both_backends") and kind in BACKEND_KINDS:
            keys.extend(keys[-1][:-1] + (b,) for b in ("sm90", "portable"))
    return keys


def warm_call(key: tuple[Any, ...]) -> None:
    kind, dt, d, variant, ps, pe, causal, layout, backend = key
    gen = torch.Generator(device=DEV).manual_seed(1)
    hq = HKV * 4
    params = variant_params(variant, 4, hq, random.Random(0))
    kw = dict(kv_layout=layout, variant=variant_arg(variant), **params)
    if pe != "none":
        kw["pos_encoding"] = pe
    if backend:
        kw["backend"] = backend
    q = rand((3, hq, d), dt, gen)
    if kind in ("single", "ragged", "paged"):
        kw["causal"] = causal
    if kind == "single":
        k = to_layout(rand((4, HKV, d), dt, gen), layout)
        flashgen.single_prefill(q, k, k, **kw)
    elif kind == "single_decode":
        k = to_layout(rand((4, HKV, d), dt, gen), layout)
        flashgen.single_decode(q[0], k, k, **kw)
    elif kind == "ragged":
        k = to_layout(rand((4, HKV, d), dt, gen), layout)
        flashgen.batch_prefill(q, indptr([3]), k, k, indptr([4]), **kw)
    else:
        cache, kv_indptr, kv_indices, last, _ = make_paged([4, 5, 6], ps, HKV, d, layout, dt, gen)
        if kind == "paged":
            flashgen.batch_prefill_paged(q, indptr([1, 1, 1]), cache, kv_indptr, kv_indices, last, **kw)
        else:
            flashgen.batch_decode(q, cache, kv_indptr, kv_indices, last, **kw)
    torch.cuda.synchronize()


@pytest.fixture(scope="module")
def _gpu_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return os.environ.get("FLASHGEN_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("prefill-gpu-cache"))


@pytest.fixture(scope="module", autouse=True)
def _warm(_gpu_cache: str, request: pytest.FixtureRequest) -> None:
    """Compile every instance the selected tests of this module need, in parallel threads (the
    loader locks per instance, so different instances build side by side), before the first
    test, so that the tests themselves time kernels, not nvcc. A failure here is ignored: the
    test that needs the instance reports it."""
    keys: set[tuple[Any, ...]] = set()
    for item in request.session.items:
        if item.module is not request.module:
            continue
        case = getattr(item, "callspec", None) and item.callspec.params.get("case")
        if isinstance(case, dict):
            keys.update(warm_keys(case))
    if not keys:
        return
    ordered = sorted(keys, key=repr)
    t0 = time.perf_counter()
    failed = compile_ahead(_gpu_cache, [(str(key), lambda key=key: warm_call(key)) for key in ordered])
    print(f"\nwarmed {len(keys)} call shapes in {time.perf_counter() - t0:.1f} s; {len(failed)} failed")
    for line in failed[:10]:
        print(f"  warm-up failed: {line}")


@pytest.fixture(autouse=True)
def _shared_cache(_gpu_cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One JIT cache for the module (conftest gives every test a fresh one)."""
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", _gpu_cache)


# ---------------------------------------------------------------- the matrix

def by_jit_if_custom(case: dict[str, Any], run: Callable[[dict[str, Any]], None]) -> None:
    """Run a case; one of the user variant compiles through the JIT, so with the JIT disabled
    (an installed release, ``NO_JIT``) it must refuse with ``JITDisabledError`` instead."""
    if case["variant"] == CUSTOM:
        needs_jit(lambda: run(case))
    else:
        run(case)


@pytest.mark.parametrize("case", single_cases(), ids=case_id)
def test_single_prefill(case: dict[str, Any]) -> None:
    by_jit_if_custom(case, run_single)


@pytest.mark.parametrize("case", batch_cases(), ids=case_id)
def test_batch_prefill(case: dict[str, Any]) -> None:
    by_jit_if_custom(case, run_batch)


@pytest.mark.parametrize("case", rope_cases(), ids=case_id)
def test_rope_llama(case: dict[str, Any]) -> None:
    by_jit_if_custom(case, run_single if case["kind"] == "single" else run_batch)


@pytest.mark.parametrize("case", custom_cases(), ids=case_id)
def test_custom_variant_rfc_flash_sigmoid(case: dict[str, Any]) -> None:
    """The RFC's FlashSigmoid (unchanged but for its name), compiled by the JIT for prefill.
    Its LogitsMask is always true: the causal mask comes from causal=, as for built-ins."""
    needs_jit(lambda: (run_single if case["kind"] == "single" else run_batch)(case))


# ---------------------------------------------------------------- every precompiled instance

def prefill_modules() -> list[str]:
    return sorted({r["module"] for r in flashgen.list_variants() if "prefill" in r["module"]})


def case_from_instance(module: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    """The cases that exercise precompiled instance ``p`` of ``module`` through the public API.
    Axes it knows: dtype, head_dim, variant, page_size, pos_encoding, mask ("none" / "causal"),
    kv_layout; another axis fails the test (teach it here)."""
    known = {"dtype", "head_dim", "variant", "page_size", "pos_encoding", "mask", "causal", "mask_mode", "kv_layout",
             "backend", "kv_dtype"}
    unknown = set(p) - known
    if unknown:
        pytest.fail(f"{module}: axes {sorted(unknown)} are unknown to this test; map them in case_from_instance")
    if p.get("kv_dtype", "same") != "same":
        pytest.fail(f"{module}: precompiled kv_dtype={p['kv_dtype']!r}: an fp8 cache has its reference in test_fp8_gpu")
    if "single" in module:
        kind, extra = "single", dict(shape=(129, 1000))
    elif "page_size" in p or "paged" in module:
        kind, extra = "paged", dict(lens="empty", page_size=p.get("page_size", 16))
    else:
        kind, extra = "ragged", dict(lens="empty")
    causals: tuple[bool, ...] = (True, False)
    if "causal" in p:
        causals = (bool(p["causal"]) if not isinstance(p["causal"], str) else p["causal"] in ("true", "1"),)
    elif "mask" in p or "mask_mode" in p:
        causals = (str(p.get("mask", p.get("mask_mode"))) == "causal",)
    layouts = (p["kv_layout"],) if "kv_layout" in p else ("NHD", "HND")
    if p["variant"] not in BUILTIN:
        pytest.fail(f"{module}: precompiled variant {p['variant']!r} has no reference here")
    if "backend" in p:
        extra["backend"] = p["backend"]
    return [_case(kind=kind, dtype=p["dtype"], head_dim=int(p["head_dim"]), variant=p["variant"],
                  pos_encoding=p.get("pos_encoding", "none"), causal=c, layout=layout, **extra)
            for c in causals for layout in layouts]


def _runs_here(module: str, params: dict[str, Any]) -> bool:
    """Whether this GPU runs the instance's backend (an sm90 instance is shipped for Hopper only)."""
    from flashgen import _loader, _matrix

    try:
        _matrix.matrix().with_backend(module, params, _loader.device_capability())
    except ValueError:
        return False
    return True


def test_every_precompiled_prefill_instance() -> None:
    mods = prefill_modules()
    assert mods, "flashgen has a prefill API but its matrix lists no prefill module"
    ran = 0
    for module in mods:
        for row in flashgen.list_variants(module):
            if not row["precompiled"] or not _runs_here(module, row["params"]):
                continue
            for case in case_from_instance(module, row["params"]):
                (run_single if case["kind"] == "single" else run_batch)(case)
                ran += 1
            from flashgen import _loader

            assert _loader.load(module, row["params"]).source == "aot", row["uri"]
    if not ran:
        pytest.skip(f"this flashgen precompiles no instance of {', '.join(mods)} (a source checkout)")
    print(f"\n{ran} cases over the precompiled prefill instances")


# ---------------------------------------------------------------- the backends agree

def agree_cases() -> list[dict[str, Any]]:
    """Cases run on every backend the GPU has, each checked against the reference and the
    backends against each other (the same inputs)."""
    return [
        _case(shape=(1000, 1000)), _case(shape=(129, 4097), causal=False, group=8),
        _case(shape=(1000, 129), layout="HND", group=1), _case(shape=(7, 1000), dtype="f16"),
        _case(shape=(1000, 1000), head_dim=64), _case(shape=(129, 1000), head_dim=256),
        _case(shape=(1000, 1000), variant="soft_cap"), _case(shape=(129, 1000), variant="alibi"),
        _case(shape=(1000, 1000), variant="sliding_window"), _case(shape=(129, 1000), variant="sigmoid", causal=False),
        _case(shape=(1000, 4097), pos_encoding="rope_llama", rope=1),
        _case(kind="ragged", lens="mixed"), _case(kind="ragged", lens="empty", causal=False),
        _case(kind="ragged", lens="mixed", pos_encoding="rope_llama", offsets=True, rope=1),
        _case(kind="paged", page_size=16, lens="mixed"), _case(kind="paged", page_size=1, lens="mixed"),
        _case(kind="paged", page_size=16, lens="empty", layout="HND", causal=False),
        _case(kind="paged", page_size=16, lens="mixed", pos_encoding="rope_llama", offsets=True, rope=1),
        _case(kind="paged", page_size=16, lens="mixed", variant="alibi"),
    ]


def _backends_here(module: str) -> list[str]:
    from flashgen import _loader, _matrix

    table = _matrix.matrix().module(module).backends
    row = table.device(_loader.device_capability()) if table is not None else None
    return list(row.backends) if row is not None else []


@pytest.mark.parametrize("case", [dict(c, backend=None, both_backends=True) for c in agree_cases()], ids=case_id)
def test_backends_agree(case: dict[str, Any]) -> None:
    module = {"single": "single_prefill", "ragged": "batch_prefill_ragged", "paged": "batch_prefill_paged"}[case["kind"]]
    backends = _backends_here(module)
    if torch.cuda.get_device_capability(0)[0] == 9:
        assert backends == ["sm90", "portable"], f"{module} on Hopper runs {backends}"
    if len(backends) < 2:
        pytest.skip(f"{module} has one backend on this GPU ({backends})")
    outs = {}
    for backend in backends:
        captured: dict[str, Any] = {}

        def keep(what: str, out: Any, lse: Any) -> None:
            captured["o"], captured["lse"] = out.clone(), lse.clone()

        c = dict(case, backend=backend, on_result=keep)
        (run_single if case["kind"] == "single" else run_batch)(c)
        outs[backend] = captured
    (a, b) = backends[:2]
    rows = torch.isfinite(outs[b]["lse"]) & torch.isfinite(outs[a]["lse"])
    _agree(outs[a]["o"][rows], outs[b]["o"][rows], outs[a]["lse"][rows], outs[b]["lse"][rows], case["dtype"],
           f"{case_id(case)}: backends {a} and {b}")
    assert torch.equal(torch.isinf(outs[a]["lse"]), torch.isinf(outs[b]["lse"])), "rows that see no key differ"


# ---------------------------------------------------------------- sliding-window edges

def window_cases() -> list[dict[str, Any]]:
    """sliding_window at fixed windows around the kv tile edges (64 rows portable, 128 sm90) and at
    and past kv_len. The kernels test the window's bounds on masked tiles, each row's first key
    only on the tiles before the mask-free run (prefill/mask.cuh row_keys): -1 and windows >=
    kv_len must keep every causal key, as default does."""
    cases = []
    for w in (-1, 0, 1, 63, 64, 127, 128, 129, 999, 1000, 4096, 100000):
        for causal in (True, False):
            cases.append(_case(shape=(1000, 1000), variant="sliding_window", causal=causal, window_left=w))
        cases.append(_case(shape=(129, 4097), variant="sliding_window", window_left=w))
        cases.append(_case(kind="paged", page_size=16, lens="mixed", variant="sliding_window", window_left=w))
    return cases


@pytest.mark.parametrize("case", [dict(c, backend=None, both_backends=True) for c in window_cases()], ids=case_id)
def test_sliding_window_edges(case: dict[str, Any]) -> None:
    module = {"single": "single_prefill", "paged": "batch_prefill_paged"}[case["kind"]]
    for backend in _backends_here(module):
        (run_single if case["kind"] == "single" else run_batch)(dict(case, backend=backend))


# ---------------------------------------------------------------- qo_len = 1 prefill == decode

def _agree(a: Any, b: Any, la: Any, lb: Any, dtype: str, what: str) -> None:
    """Two kernels' outputs for the same rows: within the output and LSE tolerances of each
    other (each is also checked against the reference)."""
    u = UNIT_ROUNDOFF[dtype]
    err = ((a.float() - b.float()).norm(dim=-1) / b.float().norm(dim=-1).clamp_min(1e-30)).max().item()
    assert err <= OUT_RTOL_U * u, f"{what}: outputs differ by {err:.3e} relative"
    lerr = (la - lb).abs().max().item()
    assert lerr <= (LSE_FLOOR_U + LSE_KEYS_U) * u, f"{what}: lse differ by {lerr:.3e}"


@pytest.mark.parametrize("case", [dict(c, decode=True) for c in decode_cases()], ids=case_id)
def test_qo_len_1_prefill_equals_decode(case: dict[str, Any]) -> None:
    by_jit_if_custom(case, _qo_len_1_prefill_equals_decode)


def _qo_len_1_prefill_equals_decode(case: dict[str, Any]) -> None:
    gen = torch.Generator(device=DEV).manual_seed(_seed(case))
    rng = random.Random(_seed(case))
    dt, d, hq, layout = case["dtype"], case["head_dim"], HKV * case["group"], case["layout"]
    kv_lens = [1, 33, 1000, 4097]
    rope = rope_kwargs(case)
    if case["kind"] == "single":
        for n in kv_lens:
            q = rand((1, hq, d), dt, gen)
            k, v = rand((n, HKV, d), dt, gen), rand((n, HKV, d), dt, gen)
            params = variant_params(case["variant"], n, hq, rng)
            what = f"{case_id(case)} kv {n} {params_note(params)}"
            kk, vv = to_layout(k, layout), to_layout(v, layout)
            o_p, lse_p = flashgen.single_prefill(q, kk, vv, out=poisoned((1, hq, d), dt), **_api_kwargs(case, params))
            o_d, lse_d = flashgen.single_decode(q[0], kk, vv, kv_layout=layout, variant=variant_arg(case["variant"]),
                                                return_lse=True, out=poisoned((hq, d), dt), **rope, **params)
            ref = reference_prefill(q, k, v, **_ref_kwargs(case, params))
            check(o_p, lse_p, ref, dt, f"single_prefill {what}")
            check(o_d[None], lse_d[None], ref, dt, f"single_decode {what}")
            _agree(o_p[0], o_d, lse_p[0], lse_d, dt, f"single {what}")
        return
    # A batch: qo_len 1 per request; decode and paged prefill on one cache, ragged on its copy.
    cache, kv_indptr, kv_indices, last, per = make_paged(kv_lens, case["page_size"], HKV, d, layout, dt, gen)
    q = nan_strided((len(kv_lens), hq, d), dt, gen)
    qo_indptr = indptr([1] * len(kv_lens))
    params = variant_params(case["variant"], min(kv_lens), hq, rng)
    what = f"{case_id(case)} {params_note(params)}"
    kw = _api_kwargs(case, params)
    o_pp, lse_pp = flashgen.batch_prefill_paged(q, qo_indptr, cache, kv_indptr, kv_indices, last,
                                                out=poisoned(tuple(q.shape), dt), **kw)
    k_r = to_layout(torch.cat([k for k, _ in per]), layout)
    v_r = to_layout(torch.cat([v for _, v in per]), layout)
    o_pr, lse_pr = flashgen.batch_prefill(q, qo_indptr, k_r, v_r, indptr(kv_lens), out=poisoned(tuple(q.shape), dt), **kw)
    o_d, lse_d = flashgen.batch_decode(q, cache, kv_indptr, kv_indices, last, kv_layout=layout,
                                       variant=variant_arg(case["variant"]), return_lse=True,
                                       out=poisoned(tuple(q.shape), dt), **rope, **params)
    lens = [(1, n) for n in kv_lens]
    check_batch(case, o_pp, lse_pp, q, lens, per, params, [0] * 4, [0] * 4, what="batch_prefill_paged")
    check_batch(case, o_pr, lse_pr, q, lens, per, params, [0] * 4, [0] * 4, what="batch_prefill")
    check_batch(case, o_d, lse_d, q, lens, per, params, [0] * 4, [0] * 4, what="batch_decode")
    _agree(o_pp, o_d, lse_pp, lse_d, dt, f"batch_prefill_paged vs batch_decode {what}")
    _agree(o_pr, o_d, lse_pr, lse_d, dt, f"batch_prefill vs batch_decode {what}")


# ---------------------------------------------------------------- long and short together

LONG = 100_003


@pytest.mark.parametrize("case", [
    _case(kind="ragged", lens="long-mix"),
    _case(kind="paged", page_size=16, lens="long-mix"),
    *([_case(kind="paged", page_size=16, lens="long-mix", layout="HND"),
       _case(kind="ragged", lens="long-mix", variant="sliding_window"),
       _case(kind="ragged", lens="long-mix", pos_encoding="rope_llama", offsets=True, rope=1)] if FULL else []),
], ids=case_id)
def test_batch_mixing_1_token_and_100k_token_requests(case: dict[str, Any]) -> None:
    """1-token requests beside a 100k-token causal prefill and a 1-query request over ~100k keys
    (8 qo / 2 kv heads keep it to ~0.6 GB); the long requests are checked on 160 of their rows."""
    case = dict(case, group=4)
    lens = [(1, 1), (LONG, LONG), (1, 1), (1, 99_991), (17, 17), (0, 3)]
    gen = torch.Generator(device=DEV).manual_seed(_seed(case))
    rng = random.Random(_seed(case))
    dt, d, hq, layout = case["dtype"], case["head_dim"], HKV * case["group"], case["layout"]
    qo_lens, kv_lens = [a for a, _ in lens], [b for _, b in lens]
    q = rand((sum(qo_lens), hq, d), dt, gen)
    params = variant_params(case["variant"], 1000, hq, rng)
    kw = _api_kwargs(case, params)
    q_off, k_off = _rope_offset_kwargs(case, kw, len(lens), rng)
    out = poisoned(tuple(q.shape), dt)
    if case["kind"] == "paged":
        cache, kv_indptr, kv_indices, last, per = make_paged(kv_lens, 16, HKV, d, layout, dt, gen)
        got, lse = flashgen.batch_prefill_paged(q, indptr(qo_lens), cache, kv_indptr, kv_indices, last, out=out, **kw)
    else:
        k, v, kv_indptr, per = make_ragged(kv_lens, HKV, d, layout, dt, gen)
        got, lse = flashgen.batch_prefill(q, indptr(qo_lens), k, v, kv_indptr, out=out, **kw)
    assert got is out
    check_batch(case, out, lse, q, lens, per, params, q_off, k_off, sample=128)


# ---------------------------------------------------------------- threads sharing a stream

def test_threads_sharing_a_stream_get_the_results_of_calls_made_alone() -> None:
    """Eight threads on the default stream (as the JIT warm-up's threads are), each repeating its
    own ragged batch: one call's kernels pass tables to each other through the stream's workspace,
    which starts empty here and grows under the threads, so a call whose kernels interleaved
    with another's, or that launched on a freed workspace, would differ from the same call made
    alone (or fault). Same plan, same inputs: results must be bitwise equal."""
    gen = torch.Generator(device=DEV).manual_seed(5)
    dt, d, hq = "bf16", 128, HKV * 4
    calls = []
    for i in range(8):
        lens = [(1 + 37 * i, 200 + 900 * i), (3, 4097 + 512 * i), (129, 129 + i), (0, 7)]
        q = rand((sum(a for a, _ in lens), hq, d), dt, gen)
        k, v, kv_indptr, _ = make_ragged([b for _, b in lens], HKV, d, "NHD", dt, gen)
        calls.append((q, indptr([a for a, _ in lens]), k, v, kv_indptr))

    def call(i: int) -> tuple[Any, Any]:
        return flashgen.batch_prefill(*calls[i], causal=True, return_lse=True, backend=TEST_BACKEND)

    alone = [call(i) for i in range(len(calls))]
    torch.cuda.synchronize()
    flashgen._common.WORKSPACES.clear()  # the threads start from no workspace and grow it
    results: list[list[tuple[Any, Any]]] = [[] for _ in calls]

    def worker(i: int) -> None:
        for _ in range(12):
            results[i].append(call(i))

    with ThreadPoolExecutor(max_workers=len(calls)) as ex:
        list(ex.map(worker, range(len(calls))))
    torch.cuda.synchronize()
    for i, (o, lse) in enumerate(alone):
        for n, (o2, lse2) in enumerate(results[i]):
            assert torch.equal(o2, o) and torch.equal(lse2, lse), f"thread {i}, call {n}: differs from the call alone"


def test_a_thread_whose_first_cuda_work_is_a_flashgen_call() -> None:
    """A fresh thread has no current CUDA context until its first runtime call binds one; the
    Hopper kernels' host code calls the driver (tensor maps) before any launch, so it must bind
    the context itself (a cold thread's sm90 single decode failed with CUDA_ERROR_INVALID_CONTEXT
    before it did). Each module on the device's default backend, in a thread that does nothing
    else: bitwise the main thread's results."""
    import threading

    gen = torch.Generator(device=DEV).manual_seed(11)
    q = rand((129, HKV * 4, 128), "bf16", gen)
    k = rand((1000, HKV, 128), "bf16", gen)
    v = rand((1000, HKV, 128), "bf16", gen)
    cache, kv_indptr, kv_indices, last, _ = make_paged([300, 700], 16, HKV, 128, "NHD", "bf16", gen)
    qo = indptr([29, 100])
    calls = [
        lambda: flashgen.single_prefill(q, k, v, causal=True),
        lambda: flashgen.batch_prefill(q, qo, k, v, indptr([300, 700]), causal=True),
        lambda: flashgen.batch_prefill_paged(q, qo, cache, kv_indptr, kv_indices, last, causal=True),
    ]
    for n, fn in enumerate(calls):
        want = fn()
        torch.cuda.synchronize()
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(fn()))
        t.start()
        t.join()
        assert got, f"call {n} raised in the fresh thread (see the thread's traceback above)"
        torch.cuda.synchronize()
        assert torch.equal(got[0], want), f"call {n}: the fresh thread's result differs"


# ---------------------------------------------------------------- strided inputs, out=, returns

def test_strided_inputs_and_out() -> None:
    """Views whose last dimension is contiguous: q/k/v as slices of one fused [N, Hq + 2 Hkv, D]
    QKV buffer (self-attention prefill), a padded head_dim, an HND cache sliced along N, and an
    `out` that is itself a strided view with NaN around it."""
    gen = torch.Generator(device=DEV).manual_seed(21)
    dt, d, hq = "bf16", 128, 8
    n = 1000
    qkv = rand((n, hq + 2 * HKV, d), dt, gen)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + HKV], qkv[:, hq + HKV:]
    obuf = poisoned((n, hq, 3 * d), dt)
    out = obuf[:, :, d:2 * d]
    got, lse = flashgen.single_prefill(q, k, v, causal=True, return_lse=True, out=out)
    assert got is out
    ref = reference_prefill(q, k, v, True, "default", 1 / math.sqrt(d), {})
    check(out, lse, ref, dt, "fused qkv, strided out")
    assert torch.isnan(obuf[:, :, :d].float()).all() and torch.isnan(obuf[:, :, 2 * d:].float()).all(), \
        "single_prefill wrote outside its out view"
    # Ragged over the same fused buffer.
    lens = [(100, 100), (1, 1), (899, 899)]
    o2, lse2 = flashgen.batch_prefill(q, indptr([a for a, _ in lens]), k, v, indptr([b for _, b in lens]),
                                      causal=True, return_lse=True, out=poisoned((n, hq, d), dt))
    per = [(k[0:100], v[0:100]), (k[100:101], v[100:101]), (k[101:], v[101:])]
    check_batch(_case(kind="ragged", lens="fused"), o2, lse2, q, lens, per, {}, [0] * 3, [0] * 3, what="fused qkv ragged")
    # HND sliced along N, and a padded head_dim for q.
    kb = rand((HKV, n + 40, d), dt, gen)
    vb = rand((HKV, n + 40, d), dt, gen)
    kh, vh = kb[:, 20:20 + n], vb[:, 20:20 + n]
    qp = nan_strided((300, hq, d), dt, gen)
    o3, lse3 = flashgen.single_prefill(qp, kh, vh, kv_layout="HND", causal=False, return_lse=True)
    ref3 = reference_prefill(qp, kh.transpose(0, 1), vh.transpose(0, 1), False, "default", 1 / math.sqrt(d), {})
    check(o3, lse3, ref3, dt, "HND sliced along N, padded q")
    # A paged cache with a padded head_dim (page stride != the packed one).
    cache_p, kv_indptr, kv_indices, last, per4 = make_paged([37, 300], 16, HKV, d, "NHD", dt, gen)
    wide = torch.full((*cache_p.shape[:-1], d + 64), float("nan"), device=DEV, dtype=DTYPES[dt])
    wide[..., :d] = cache_p
    q4 = rand((37 + 5, hq, d), dt, gen)
    o4, lse4 = flashgen.batch_prefill_paged(q4, indptr([37, 5]), wide[..., :d], kv_indptr, kv_indices, last,
                                            causal=True, return_lse=True)
    check_batch(_case(kind="paged", lens="padded"), o4, lse4, q4, [(37, 37), (5, 300)], per4, {}, [0, 0], [0, 0],
                what="padded paged cache")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_pools_of_every_stride_pattern(layout: str) -> None:
    """The same requests from a packed pool, from one whose page slots hold more rows (NHD) or
    heads (HND) than the view uses, and from one whose pages hold a third slot (K and V no longer
    a page's two halves): the kernels follow the pool's strides (the Hopper kernel's tensor map
    among them) instead of assuming the packed layout."""
    gen = torch.Generator(device=DEV).manual_seed(11)
    dt, d, hq, ps = "bf16", 128, 8, 16
    lens = [(37, 37), (5, 300), (200, 1000)]
    cache, kv_indptr, kv_indices, last, per = make_paged([b for _, b in lens], ps, HKV, d, layout, dt, gen)
    q = rand((sum(a for a, _ in lens), hq, d), dt, gen)
    qo = indptr([a for a, _ in lens])
    # Axis 2 of a page slot: its rows (NHD) or heads (HND); twice as wide, sliced back.
    wider = list(cache.shape)
    wider[2] *= 2
    roomy = torch.full(wider, float("nan"), device=DEV, dtype=DTYPES[dt])
    index = (slice(None), slice(None), slice(0, cache.shape[2]))
    roomy[index] = cache
    three = torch.full((cache.shape[0], 3, *cache.shape[2:]), float("nan"), device=DEV, dtype=DTYPES[dt])
    three[:, :2] = cache
    for what, pool in (("packed", cache), ("slots of 2x the rows or heads", roomy[index]),
                       ("pages of three slots", three[:, :2])):
        o, lse = flashgen.batch_prefill_paged(q, qo, pool, kv_indptr, kv_indices, last, causal=True,
                                              kv_layout=layout, return_lse=True)
        check_batch(_case(kind="paged", lens=what, layout=layout), o, lse, q, lens, per, {}, [0] * 3, [0] * 3,
                    what=f"{layout} paged pool, {what}")


def test_return_types_and_allocating_path() -> None:
    """Without out= the output is allocated like q; without return_lse only o comes back."""
    gen = torch.Generator(device=DEV).manual_seed(5)
    dt, d, hq = "bf16", 128, 8
    q = rand((129, hq, d), dt, gen)
    k, v = rand((1000, HKV, d), dt, gen), rand((1000, HKV, d), dt, gen)
    o = flashgen.single_prefill(q, k, v, causal=True)
    assert torch.is_tensor(o) and o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
    o2, lse = flashgen.single_prefill(q, k, v, causal=True, return_lse=True)
    ref = reference_prefill(q, k, v, True, "default", 1 / math.sqrt(d), {})
    check(o, None, ref, dt, "allocating single_prefill")
    check(o2, lse, ref, dt, "allocating single_prefill, return_lse")
    ob = flashgen.batch_prefill(q, indptr([129]), k, v, indptr([1000]), causal=True)
    assert torch.is_tensor(ob) and ob.shape == q.shape
    check(ob, None, ref, dt, "allocating batch_prefill")
    cache, kv_indptr, kv_indices, last, per = make_paged([1000], 16, HKV, d, "NHD", dt, gen)
    op, lp = flashgen.batch_prefill_paged(q, indptr([129]), cache, kv_indptr, kv_indices, last, causal=True,
                                          return_lse=True)
    assert op.shape == q.shape and lp.shape == (129, hq) and lp.dtype == torch.float32
    check(op, lp, reference_prefill(q, *per[0], True, "default", 1 / math.sqrt(d), {}), dt, "allocating paged")


# ---------------------------------------------------------------- CUDA graphs

def _partition(total: int, weights: list[float]) -> list[int]:
    parts = [int(total * w) for w in weights]
    parts[max(range(len(parts)), key=lambda i: weights[i])] += total - sum(parts)
    return parts


# Three sets of 5 requests with the same totals: (qo lens, kv lens / page shares).
GRAPH_QO = [[300] * 5, [1, 1200, 0, 99, 200], [1000, 500, 0, 0, 0]]
GRAPH_KV = [[600] * 5, [4, 2000, 30, 99, 867], [800, 700, 1500, 0, 0]]  # ragged: sum 3000
GRAPH_PAGE_SHARES = [[0.2] * 5, [0.005, 0.66, 0.01, 0.04, 0.285], [0.27, 0.24, 0.49, 0.0, 0.0]]


@pytest.mark.parametrize("case", [
    _case(kind="ragged"), _case(kind="paged", page_size=16), _case(kind="paged", page_size=1),
    *([_case(kind="ragged", variant="alibi", layout="HND"), _case(kind="paged", page_size=16, pos_encoding="rope_llama",
                                                                  offsets=True)] if FULL else []),
], ids=case_id)
def test_cuda_graph_capture_then_replay_with_new_lengths(case: dict[str, Any]) -> None:
    """Capture one call, then replay it for three sets of request lengths of the same batch size
    and the same tensor shapes (new indptr / page table / last-page / offset contents and new
    data written into the captured tensors; one set has a request longer than any captured and
    one has empty requests and qo_len > kv_len): each replay matches the reference."""
    gen = torch.Generator(device=DEV).manual_seed(_seed(case))
    rng = random.Random(_seed(case))
    dt, d, hq, layout = case["dtype"], case["head_dim"], HKV * case["group"], case["layout"]
    total_q = sum(GRAPH_QO[0])
    params = variant_params(case["variant"], 600, hq, rng)
    kw = _api_kwargs(case, params)
    q = torch.empty((total_q, hq, d), device=DEV, dtype=DTYPES[dt])
    qo_indptr = torch.empty(6, dtype=torch.int32, device=DEV)
    q_off_t = torch.zeros(5, dtype=torch.int32, device=DEV)
    k_off_t = torch.zeros(5, dtype=torch.int32, device=DEV)
    if case["offsets"]:
        kw["q_rope_offset"], kw["kv_rope_offset"] = q_off_t, k_off_t
    out = poisoned((total_q, hq, d), dt)
    paged = case["kind"] == "paged"
    if paged:
        ps = case["page_size"]
        n_pages = sum(-(-n // ps) for n in GRAPH_KV[0])
        cache = torch.empty((n_pages + 2, 2, ps, HKV, d) if layout == "NHD" else (n_pages + 2, 2, HKV, ps, d),
                            device=DEV, dtype=DTYPES[dt])
        kv_indptr = torch.empty(6, dtype=torch.int32, device=DEV)
        kv_indices = torch.empty(n_pages, dtype=torch.int32, device=DEV)
        last = torch.empty(5, dtype=torch.int32, device=DEV)
    else:
        total_kv = sum(GRAPH_KV[0])
        kbuf = torch.empty((total_kv, HKV, d), device=DEV, dtype=DTYPES[dt])
        vbuf = torch.empty_like(kbuf)
        k_in = torch.empty_like(to_layout(kbuf, layout))
        v_in = torch.empty_like(k_in)
        kv_indptr = torch.empty(6, dtype=torch.int32, device=DEV)

    def load(i: int) -> tuple[list[tuple[int, int]], list[tuple[Any, Any]], list[int], list[int]]:
        """Write set i into the captured tensors; returns (lens, per-request kv, offsets)."""
        qo = GRAPH_QO[i]
        q.copy_(rand(tuple(q.shape), dt, gen))
        qo_indptr.copy_(indptr(qo))
        if paged:
            pages_per = _partition(n_pages, GRAPH_PAGE_SHARES[i])
            kv = [(p - 1) * ps + rng.randint(1, ps) if p else 0 for p in pages_per]
            perm, pages = shuffled_pages(pages_per, n_pages + 2, gen)
            per = [(rand((n, HKV, d), dt, gen), rand((n, HKV, d), dt, gen)) for n in kv]
            fill_paged(cache, per, pages, layout)
            kv_indptr.copy_(indptr(pages_per))
            kv_indices.copy_(torch.tensor(perm, dtype=torch.int32, device=DEV))
            last.copy_(torch.tensor([n - (p - 1) * ps if p else 0 for n, p in zip(kv, pages_per)],
                                    dtype=torch.int32, device=DEV))
        else:
            kv = GRAPH_KV[i]
            kbuf.copy_(rand(tuple(kbuf.shape), dt, gen))
            vbuf.copy_(rand(tuple(vbuf.shape), dt, gen))
            k_in.copy_(to_layout(kbuf, layout))
            v_in.copy_(to_layout(vbuf, layout))
            kv_indptr.copy_(indptr(kv))
            per, at = [], 0
            for n in kv:
                per.append((kbuf[at:at + n], vbuf[at:at + n]))
                at += n
        q_off, k_off = rope_offsets(5, rng) if case["offsets"] else ([0] * 5, [0] * 5)
        q_off_t.copy_(torch.tensor(q_off, dtype=torch.int32))
        k_off_t.copy_(torch.tensor(k_off, dtype=torch.int32))
        out.fill_(float("nan"))
        return list(zip(qo, kv)), per, q_off, k_off

    def call() -> Any:
        if paged:
            return flashgen.batch_prefill_paged(q, qo_indptr, cache, kv_indptr, kv_indices, last, out=out, **kw)
        return flashgen.batch_prefill(q, qo_indptr, k_in, v_in, kv_indptr, out=out, **kw)

    load(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # load (JIT) and run once outside the capture
        call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = call()
    for i in range(3):
        lens, per, q_off, k_off = load(i)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        check_batch(case, out, lse, q, lens, per, params, q_off, k_off, what=f"graph replay {i}")
