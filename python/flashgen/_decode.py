"""Decode attention: ``single_decode`` (one request, contiguous KV) and ``batch_decode`` (a batch
over a paged KV cache), in FlashInfer's layouts.

Each function is a declaration (``_op.Spec``): its tensors with symbolic dimensions per layout,
the axes they choose and how the module's arguments struct is filled; ``_op.call`` validates,
finds the instance and launches on the caller's current CUDA stream with the caller's framework
allocating the output. ``batch_decode`` is ``BatchDecodeWithPagedKVCacheWrapper``'s one-shot
(plan and run in one step over the stream's shared workspace, see _wrappers), which reads
``BATCH_DECODE``; ``single_decode`` has no class and calls ``_op.call`` itself.
"""

from __future__ import annotations

from typing import Any

from . import _fp8, _op
from ._op import Spec, Stride, T
from ._tensor import Output, TensorLike
from ._variant import Variant

__all__ = ["single_decode", "batch_decode"]

_KV = {"NHD": ("L", "Hk", "D"), "HND": ("Hk", "L", "D")}
_PAGED = {"NHD": ("Np", "2", "P", "Hk", "D"), "HND": ("Np", "2", "Hk", "P", "D")}

SINGLE_DECODE = Spec(
    name="single_decode",
    module="single_decode",
    inputs=(T("q", {"*": ("Hq", "D")}), T("k", _KV), T("v", _KV)),
    out=("Hq", "D"),
    lse=("Hq",),
    axes={"dtype": "$dtype", "head_dim": "D", "pos_encoding": "$pos_encoding"},
    fields={
        "num_qo_heads": "Hq", "num_kv_heads": "Hk", "kv_len": "L", "head_dim": "D",
        "q_stride_h": Stride("q", "Hq"), "k_stride_n": Stride("k", "L"), "k_stride_h": Stride("k", "Hk"),
        "v_stride_n": Stride("v", "L"), "v_stride_h": Stride("v", "Hk"), "o_stride_h": Stride("o", "Hq"),
    },
    checks=(_op.gqa, _op.at_least("L", 1)),
    options=_op.rope_options,
)

BATCH_DECODE = Spec(
    name="batch_decode",
    module="batch_decode",
    inputs=(
        T("q", {"*": ("B", "Hq", "D")}),
        T("paged_kv_cache", _PAGED, kind="cache", field="paged_kv"),
        T("kv_indptr", {"*": ("B+1",)}, kind="i32"),
        T("kv_indices", {"*": ("Ni",)}, kind="i32"),
        T("kv_last_page_len", {"*": ("B",)}, kind="i32"),
    ),
    out=("B", "Hq", "D"),
    lse=("B", "Hq"),
    axes={"dtype": "$dtype", "head_dim": "D", "page_size": "P", "pos_encoding": "$pos_encoding",
          "kv_dtype": "@paged_kv_cache"},
    fields={
        "batch_size": "B", "num_page_ids": "Ni", "num_qo_heads": "Hq", "num_kv_heads": "Hk", "head_dim": "D",
        "page_size": "P", "q_stride_b": Stride("q", "B"), "q_stride_h": Stride("q", "Hq"),
        "kv_stride_page": Stride("paged_kv_cache", "Np"), "kv_stride_kv": Stride("paged_kv_cache", "2"),
        "kv_stride_n": Stride("paged_kv_cache", "P"), "kv_stride_h": Stride("paged_kv_cache", "Hk"),
        "o_stride_b": Stride("o", "B"), "o_stride_h": Stride("o", "Hq"),
    },
    checks=(_op.gqa,),
    options=lambda what, pos, theta, scale, k_scale=1.0, v_scale=1.0: {
        **_op.rope_options(what, pos, theta, scale), **_fp8.scale_options(what, k_scale, v_scale)},
    check_params=_fp8.check_cache_call,
)


def single_decode(
    q: TensorLike,
    k: TensorLike,
    v: TensorLike,
    *,
    kv_layout: str = "NHD",
    pos_encoding: str = "none",
    variant: str | Variant = "default",
    sm_scale: float | None = None,
    return_lse: bool = False,
    out: TensorLike | None = None,
    rope_theta: float = 1e4,
    rope_scale: float = 1.0,
    backend: str | None = None,
    **variant_params: Any,
) -> Output:
    """Attention of one query token per head over one request's KV.

    Args:
        q: ``[num_qo_heads, head_dim]``, float16 or bfloat16, on a CUDA device.
        k, v: ``[kv_len, num_kv_heads, head_dim]`` (``kv_layout="NHD"``) or
            ``[num_kv_heads, kv_len, head_dim]`` (``"HND"``); same dtype and device as ``q``.
            ``num_qo_heads`` must be a multiple of ``num_kv_heads`` (grouped-query attention).
        variant: a built-in variant name (``flashgen.list_variants()`` shows them) or a
            ``flashgen.Variant``; its parameters go in ``**variant_params``
            (``logits_soft_cap=30.0``, ``window_left=256``, ``alibi_slopes=<float32 tensor>``).
        sm_scale: the softmax scale, default ``1/sqrt(head_dim)``.
        pos_encoding: ``"none"`` or ``"rope_llama"``: rotate q (at position ``kv_len - 1``) and k
            (at their positions) as ``single_prefill`` does, with ``rope_theta`` and ``rope_scale``;
            such a call runs the prefill kernels with one query.
        return_lse: also return the log-sum-exp of each head's logits (float32
            ``[num_qo_heads]``, natural log).
        out: optional output tensor shaped and typed like ``q``.
        backend: the module's implementation, for a module whose matrix declares a ``backend``
            axis (``flashgen.list_variants()`` shows each instance's); by default the first one,
            in the order variants.json declares, that runs on the device. One that cannot run
            there is a ValueError naming the device's compute capability and the backends it runs.

    Returns:
        ``o`` shaped like ``q``, or ``(o, lse)`` with ``return_lse``. Tensors may come from torch,
        cupy or any DLPack producer; outputs are allocated by ``q``'s framework.
    """
    return _op.call(SINGLE_DECODE, (q, k, v), out, kv_layout, variant, sm_scale, return_lse,
                    (pos_encoding, rope_theta, rope_scale), variant_params,
                    backend)


def batch_decode(
    q: TensorLike,
    paged_kv_cache: TensorLike,
    kv_indptr: TensorLike,
    kv_indices: TensorLike,
    kv_last_page_len: TensorLike,
    *,
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
    """Decode attention for a batch of requests over a paged KV cache.

    Args:
        q: ``[batch, num_qo_heads, head_dim]``, float16 or bfloat16, on a CUDA device.
        paged_kv_cache: ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (``"NHD"``) or
            ``[num_pages, 2, num_kv_heads, page_size, head_dim]`` (``"HND"``); index 0 of the
            second dimension holds K, 1 holds V. Its dtype is ``q``'s, or fp8
            (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``: half the memory and the bytes read;
            strides then multiples of 16 elements; not with ``pos_encoding="rope_llama"``).
        kv_indptr: int32 ``[batch + 1]``: request ``b`` owns ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``.
        kv_indices: int32 page ids, ``[kv_indptr[batch]]``.
        kv_last_page_len: int32 ``[batch]``, entries in the last page of each request (1..page_size).
        pos_encoding, rope_theta, rope_scale, variant, sm_scale, return_lse, out, backend,
            variant_params: as in ``single_decode``; the LSE is float32 ``[batch, num_qo_heads]``.
        k_scale, v_scale: an fp8 cache's per-tensor scales (K = ``k_scale`` times the stored
            values, V likewise): ``k_scale`` multiplies the query after the variant's
            QueryTransform (every variant sees the logits of the scaled K), ``v_scale`` the output
            before its OutputTransform. Leave them at 1.0 with a float16/bfloat16 cache.

    Returns:
        ``o`` shaped like ``q``, or ``(o, lse)`` with ``return_lse``.
    """
    tensors = (q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len)
    return _wrappers.BatchDecodeWithPagedKVCacheWrapper._call(
        tensors, out, kv_layout, variant, sm_scale, return_lse,
        (pos_encoding, rope_theta, rope_scale, k_scale, v_scale), variant_params, backend)


# Last: the wrapper classes read this module's specs (the batch function runs on its class).
from . import _wrappers  # noqa: E402
