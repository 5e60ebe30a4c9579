"""Prefill attention: ``single_prefill`` (one request), ``batch_prefill`` (a batch with q, k and v
packed along tokens) and ``batch_prefill_paged`` (q packed, K/V in batch_decode's paged cache).

Like decode, each function is a declaration (``_op.Spec``) over one generic validate/bind/launch
path; the two batch functions are the one-shots of their wrapper classes
(``BatchPrefillWithRaggedKVCacheWrapper``, ``BatchPrefillWithPagedKVCacheWrapper``: plan and run
in one step over the stream's shared workspace, see _wrappers), and ``single_prefill``, which has
no class, calls ``_op.call`` itself. ``causal`` and ``pos_encoding`` choose the ``mask`` and
``pos_encoding`` axes of the matrix; the RoPE parameters fill the arguments struct.

Semantics (all three): query i of a request sits at position ``kv_len - qo_len + i`` and key j at
``j``; ``causal`` lets query i see key j when ``j <= kv_len - qo_len + i`` (bottom-right aligned,
as FlashInfer does), so with ``qo_len > kv_len`` the first ``qo_len - kv_len`` queries see no key:
their output is 0 and their LSE -inf. A request with ``kv_len == 0`` gets the same; one with
``qo_len == 0`` writes nothing. Variants see ``qo_idx`` (the query's index in its request) and
``kv_idx`` (the key's position), so the sliding window and ALiBi are defined for every query.
``pos_encoding="rope_llama"`` rotates q and k inside the kernels (Llama's half-split rotation,
angle ``(pos / rope_scale) * rope_theta ** (-2i / head_dim)``), at the positions above plus the
request's ``q_rope_offset`` / ``kv_rope_offset`` where given.

All three read K/V in q's dtype or in fp8 (their ``kv_dtype`` axis, _fp8) with per-tensor
``k_scale`` / ``v_scale``, as ``batch_decode`` does.
"""

from __future__ import annotations

from typing import Any

from . import _fp8, _op
from ._op import Spec, Stride, T
from ._tensor import Output, TensorLike
from ._variant import Variant

__all__ = ["single_prefill", "batch_prefill", "batch_prefill_paged"]

_KV = {"NHD": ("L", "Hk", "D"), "HND": ("Hk", "L", "D")}
_RAGGED_KV = {"NHD": ("Tk", "Hk", "D"), "HND": ("Hk", "Tk", "D")}
_PAGED = {"NHD": ("Np", "2", "P", "Hk", "D"), "HND": ("Np", "2", "Hk", "P", "D")}
_AXES = {"dtype": "$dtype", "head_dim": "D", "mask": "$mask", "pos_encoding": "$pos_encoding"}
_OUT = {"o_stride_n": Stride("o", "Tq"), "o_stride_h": Stride("o", "Hq")}


def _options(what: str, causal: Any, pos_encoding: Any, rope_theta: Any, rope_scale: Any,
             k_scale: Any = 1.0, v_scale: Any = 1.0) -> dict[str, Any]:
    """The three functions' options: the mask, RoPE and an fp8 cache's scales."""
    if not isinstance(causal, bool):
        raise TypeError(f"{what}: causal must be True or False, got {causal!r}")
    return {"mask": "causal" if causal else "none", **_op.rope_options(what, pos_encoding, rope_theta, rope_scale),
            **_fp8.scale_options(what, k_scale, v_scale)}


SINGLE_PREFILL = Spec(
    name="single_prefill",
    module="single_prefill",
    inputs=(T("q", {"*": ("Tq", "Hq", "D")}), T("k", _KV, kind="cache"), T("v", _KV, kind="cache")),
    out=("Tq", "Hq", "D"),
    lse=("Tq", "Hq"),
    axes={**_AXES, "kv_dtype": "@k"},
    fields={
        "qo_len": "Tq", "kv_len": "L", "num_qo_heads": "Hq", "num_kv_heads": "Hk", "head_dim": "D",
        "q_stride_n": Stride("q", "Tq"), "q_stride_h": Stride("q", "Hq"),
        "k_stride_n": Stride("k", "L"), "k_stride_h": Stride("k", "Hk"),
        "v_stride_n": Stride("v", "L"), "v_stride_h": Stride("v", "Hk"), **_OUT,
    },
    checks=(_op.gqa,),
    options=_options,
    check_params=_fp8.check_cache_call,
)

_OFFSETS = (T("q_rope_offset", {"*": ("B",)}, kind="i32", optional=True),
            T("kv_rope_offset", {"*": ("B",)}, kind="i32", optional=True))

BATCH_PREFILL = Spec(
    name="batch_prefill",
    module="batch_prefill_ragged",
    inputs=(T("q", {"*": ("Tq", "Hq", "D")}), T("k", _RAGGED_KV, kind="cache"), T("v", _RAGGED_KV, kind="cache"),
            T("qo_indptr", {"*": ("B+1",)}, kind="i32"), T("kv_indptr", {"*": ("B+1",)}, kind="i32"),
            *_OFFSETS),
    out=("Tq", "Hq", "D"),
    lse=("Tq", "Hq"),
    axes={**_AXES, "kv_dtype": "@k"},
    fields={
        "batch_size": "B", "total_q": "Tq", "total_kv": "Tk", "num_qo_heads": "Hq", "num_kv_heads": "Hk",
        "head_dim": "D", "q_stride_n": Stride("q", "Tq"), "q_stride_h": Stride("q", "Hq"),
        "k_stride_n": Stride("k", "Tk"), "k_stride_h": Stride("k", "Hk"),
        "v_stride_n": Stride("v", "Tk"), "v_stride_h": Stride("v", "Hk"), **_OUT,
    },
    checks=(_op.gqa, _op.at_least("B", 1)),
    options=_options,
    check_params=_fp8.check_cache_call,
)

BATCH_PREFILL_PAGED = Spec(
    name="batch_prefill_paged",
    module="batch_prefill_paged",
    inputs=(T("q", {"*": ("Tq", "Hq", "D")}), T("paged_kv_cache", _PAGED, kind="cache", field="paged_kv"),
            T("qo_indptr", {"*": ("B+1",)}, kind="i32"), T("kv_indptr", {"*": ("B+1",)}, kind="i32"),
            T("kv_indices", {"*": ("Ni",)}, kind="i32"), T("kv_last_page_len", {"*": ("B",)}, kind="i32"),
            *_OFFSETS),
    out=("Tq", "Hq", "D"),
    lse=("Tq", "Hq"),
    axes={**_AXES, "page_size": "P", "kv_dtype": "@paged_kv_cache"},
    fields={
        "batch_size": "B", "total_q": "Tq", "num_page_ids": "Ni", "num_qo_heads": "Hq", "num_kv_heads": "Hk",
        "head_dim": "D", "page_size": "P", "q_stride_n": Stride("q", "Tq"), "q_stride_h": Stride("q", "Hq"),
        "kv_stride_page": Stride("paged_kv_cache", "Np"), "kv_stride_kv": Stride("paged_kv_cache", "2"),
        "kv_stride_n": Stride("paged_kv_cache", "P"), "kv_stride_h": Stride("paged_kv_cache", "Hk"), **_OUT,
    },
    checks=(_op.gqa, _op.at_least("B", 1)),
    options=_options,
    check_params=_fp8.check_cache_call,
)


def single_prefill(
    q: TensorLike,
    k: TensorLike,
    v: TensorLike,
    *,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding: str = "none",
    variant: str | Variant = "default",
    sm_scale: float | None = None,
    return_lse: bool = False,
    out: TensorLike | None = None,
    rope_theta: float = 1e4,
    rope_scale: float = 1.0,
    backend: str | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    **variant_params: Any,
) -> Output:
    """Attention of ``qo_len`` queries over one request's KV (see the module docstring for the
    positions, ``causal`` and RoPE).

    Args:
        q: ``[qo_len, num_qo_heads, head_dim]``, float16 or bfloat16, on a CUDA device; the last
            dimension contiguous (other strides are free).
        k, v: ``[kv_len, num_kv_heads, head_dim]`` (``kv_layout="NHD"``) or
            ``[num_kv_heads, kv_len, head_dim]`` (``"HND"``); ``num_qo_heads`` must be a multiple
            of ``num_kv_heads``. Their dtype is ``q``'s, or both one fp8 type
            (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``; strides then multiples of 16
            elements; not with ``pos_encoding="rope_llama"``).
        causal: mask key j for query i unless ``j <= kv_len - qo_len + i``.
        pos_encoding: ``"none"`` or ``"rope_llama"`` (with ``rope_theta``, ``rope_scale``).
        variant, sm_scale, backend, variant_params: as in ``single_decode``.
        return_lse: also return the float32 ``[qo_len, num_qo_heads]`` log-sum-exp (natural log).
        out: optional output tensor shaped and typed like ``q``.
        k_scale, v_scale: fp8 k and v's per-tensor scales, as in ``batch_decode``.

    Returns:
        ``o`` shaped like ``q``, or ``(o, lse)`` with ``return_lse``.
    """
    return _op.call(SINGLE_PREFILL, (q, k, v), out, kv_layout, variant, sm_scale, return_lse,
                    (causal, pos_encoding, rope_theta, rope_scale, k_scale, v_scale), variant_params,
                    backend)


def batch_prefill(
    q: TensorLike,
    qo_indptr: TensorLike,
    k: TensorLike,
    v: TensorLike,
    kv_indptr: TensorLike,
    *,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding: str = "none",
    variant: str | Variant = "default",
    sm_scale: float | None = None,
    return_lse: bool = False,
    out: TensorLike | None = None,
    q_rope_offset: TensorLike | None = None,
    kv_rope_offset: TensorLike | None = None,
    rope_theta: float = 1e4,
    rope_scale: float = 1.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    backend: str | None = None,
    **variant_params: Any,
) -> Output:
    """Prefill for a batch of requests whose q, k and v are packed along tokens (ragged).

    Args:
        q: ``[total_q, num_qo_heads, head_dim]``; request b's queries are rows
            ``qo_indptr[b]:qo_indptr[b+1]``.
        qo_indptr, kv_indptr: int32 ``[batch + 1]`` on the GPU, non-decreasing from 0, ending at
            most at ``total_q`` / ``total_kv``. Their values are not checked (that would need a
            device sync): other values give undefined results. Lengths may be 0.
        k, v: ``[total_kv, num_kv_heads, head_dim]`` (NHD) or ``[num_kv_heads, total_kv,
            head_dim]`` (HND); request b's keys are rows ``kv_indptr[b]:kv_indptr[b+1]``.
        q_rope_offset, kv_rope_offset: optional int32 ``[batch]`` position offsets for RoPE.
        k_scale, v_scale: with fp8 ``k`` and ``v`` (``torch.float8_e4m3fn`` or
            ``torch.float8_e5m2``, both the same; strides then multiples of 16 elements; not with
            ``pos_encoding="rope_llama"``), K = ``k_scale`` times the stored values and V likewise,
            as in ``batch_decode``. With k and v in q's dtype they must stay 1.
        Others as in ``single_prefill``; the LSE is float32 ``[total_q, num_qo_heads]``.

    The launch reads the lengths on the device, so a call captured in a CUDA graph can be
    replayed with new lengths in the same tensors (same batch size and tensor shapes).
    """
    tensors = (q, k, v, qo_indptr, kv_indptr, q_rope_offset, kv_rope_offset)
    return _wrappers.BatchPrefillWithRaggedKVCacheWrapper._call(
        tensors, out, kv_layout, variant, sm_scale, return_lse,
        (causal, pos_encoding, rope_theta, rope_scale, k_scale, v_scale), variant_params, backend)


def batch_prefill_paged(
    q: TensorLike,
    qo_indptr: TensorLike,
    paged_kv_cache: TensorLike,
    kv_indptr: TensorLike,
    kv_indices: TensorLike,
    kv_last_page_len: TensorLike,
    *,
    causal: bool = False,
    kv_layout: str = "NHD",
    pos_encoding: str = "none",
    variant: str | Variant = "default",
    sm_scale: float | None = None,
    return_lse: bool = False,
    out: TensorLike | None = None,
    q_rope_offset: TensorLike | None = None,
    kv_rope_offset: TensorLike | None = None,
    rope_theta: float = 1e4,
    rope_scale: float = 1.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    backend: str | None = None,
    **variant_params: Any,
) -> Output:
    """Prefill for a batch whose K/V live in ``batch_decode``'s paged cache (same layouts and
    page table: ``kv_indptr`` in pages, ``kv_indices`` page ids, ``kv_last_page_len``; in q's
    dtype or fp8, with ``k_scale`` and ``v_scale``), with q packed along tokens as in
    ``batch_prefill``. Page table values are not checked (a device sync); others as in
    ``batch_prefill``.
    """
    tensors = (q, paged_kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, q_rope_offset,
               kv_rope_offset)
    return _wrappers.BatchPrefillWithPagedKVCacheWrapper._call(
        tensors, out, kv_layout, variant, sm_scale, return_lse,
        (causal, pos_encoding, rope_theta, rope_scale, k_scale, v_scale), variant_params, backend)


# Last: the wrapper classes read this module's specs (the batch functions run on their classes).
from . import _wrappers  # noqa: E402
