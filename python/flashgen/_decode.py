"""Decode attention: ``single_decode`` (one request, contiguous KV) and ``batch_decode`` (a batch
over a paged KV cache), in FlashInfer's layouts.

Each function validates its arguments (see ``_common``), finds the instance for the tensors'
dtype and head_dim (and page size) and the variant, then calls the module's C entry point on the
caller's current CUDA stream with the caller's framework allocating the output.
"""

from __future__ import annotations

import ctypes
from typing import Any

from . import _common as C
from ._tensor import allocator_for, describe, torch_tensor_type
from ._variant import Variant

__all__ = ["single_decode", "batch_decode"]


def _addr(struct: Any) -> int | None:
    return ctypes.addressof(struct) if struct is not None else None


# Per-call plans for plain torch tensors: a call whose tensors have the shapes, strides, dtypes
# and devices of an earlier validated call (and the same options) reuses everything derived from
# them and only reads the data pointers and the current stream. The key holds every input the
# checks read, so a plan never skips a check that could fail.
_SINGLE_PLANS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_BATCH_PLANS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_MAX_PLANS = 4096


def _tkey(t: Any) -> tuple[Any, ...]:
    return (t.shape, t.stride(), t.dtype, t.get_device())


def _run_plan(what: str, plan: tuple[Any, ...], ptrs: tuple[int, ...], shape: Any, out: Any,
              variant_params: dict[str, Any], after: tuple[int, ...] = ()) -> Any:
    """Launch with a remembered plan: pointers ``ptrs``, then the output and LSE, then ``after``."""
    fn, loaded, packer, fw, alloc, device, ws_bytes, mid, tail, dtype, lse_shape = plan
    struct = keep = None
    if packer is not None:
        struct, keep = packer.pack(variant_params, what, device, lambda x, n: describe(x, f"{what}: {n}"))
    stream = fw.stream(device)
    ws_ptr, ws_size = C.WORKSPACES.get(alloc, device, stream, ws_bytes, what) if ws_bytes else (0, 0)
    o = out if out is not None else alloc.empty(shape, dtype, device, what)
    lse = alloc.empty(lse_shape, "f32", device, what) if lse_shape is not None else None
    C.launch(what, loaded, device, fn, *ptrs, o.data_ptr(), lse.data_ptr() if lse is not None else None,
             *after, *mid, *tail, _addr(struct), ws_ptr, ws_size, stream)
    del keep
    return (o, lse) if lse is not None else o


def _remember(plans: dict[tuple[Any, ...], tuple[Any, ...]], key: tuple[Any, ...] | None,
              plan: tuple[Any, ...]) -> None:
    if key is not None:
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plans[key] = plan


def single_decode(
    q: Any,
    k: Any,
    v: Any,
    *,
    kv_layout: str = "NHD",
    variant: str | Variant = "default",
    sm_scale: float | None = None,
    return_lse: bool = False,
    out: Any = None,
    **variant_params: Any,
) -> Any:
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
        return_lse: also return the log-sum-exp of each head's logits (float32
            ``[num_qo_heads]``, natural log).
        out: optional output tensor shaped and typed like ``q``.

    Returns:
        ``o`` shaped like ``q``, or ``(o, lse)`` with ``return_lse``. Tensors may come from torch,
        cupy or any DLPack producer; outputs are allocated by ``q``'s framework.
    """
    what = "single_decode"
    key = None
    tt = torch_tensor_type()
    if tt is not None and q.__class__ is tt and k.__class__ is tt and v.__class__ is tt:
        okey = None if out is None else (out.__class__ is tt and _tkey(out))
        key = (_tkey(q), _tkey(k), _tkey(v), okey, kv_layout, variant, sm_scale, return_lse,
               tuple(variant_params))
        try:
            plan = _SINGLE_PLANS.get(key)
        except TypeError:  # an unhashable argument: the checked path reports it
            plan = key = None
        if plan is not None:
            return _run_plan(what, plan, (q.data_ptr(), k.data_ptr(), v.data_ptr()), q.shape, out,
                             variant_params)
        if okey is False:
            key = None
    layout = C.check_layout(what, kv_layout)
    ts, fw, device = C.read_tensors(what, {"q": q, "k": k, "v": v, "out": out})
    tq, tk, tv = ts["q"], ts["k"], ts["v"]
    C.check_ndim(what, "q", tq, 2, "[num_qo_heads, head_dim]")
    kv_dims = "[kv_len, num_kv_heads, head_dim]" if layout == "NHD" else "[num_kv_heads, kv_len, head_dim]"
    C.check_ndim(what, "k", tk, 3, kv_dims)
    C.check_ndim(what, "v", tv, 3, kv_dims)
    dtype = C.check_dtypes(what, ts, ("q", "k", "v", "out"))
    if tk.shape != tv.shape:
        raise ValueError(f"{what}: k and v must have the same shape, got {list(tk.shape)} and {list(tv.shape)}")
    num_qo_heads, head_dim = tq.shape
    if layout == "NHD":
        kv_len, num_kv_heads, kv_head_dim = tk.shape
        k_sn, k_sh, v_sn, v_sh = tk.strides[0], tk.strides[1], tv.strides[0], tv.strides[1]
    else:
        num_kv_heads, kv_len, kv_head_dim = tk.shape
        k_sn, k_sh, v_sn, v_sh = tk.strides[1], tk.strides[0], tv.strides[1], tv.strides[0]
    if kv_head_dim != head_dim:
        raise ValueError(f"{what}: q has head_dim {head_dim} but k/v have {kv_head_dim} ({layout})")
    if kv_len < 1:
        raise ValueError(f"{what}: kv_len must be at least 1, got {kv_len}")
    C.check_gqa(what, num_qo_heads, num_kv_heads)
    C.check_last_dim_contiguous(what, ts, ("q", "k", "v", "out"))
    if out is not None:
        C.check_out(what, "out", ts["out"], tq.shape, dtype, device)
    vname, custom, packer = C.resolve_variant(what, "single_decode", variant, variant_params)
    params = {"dtype": dtype, "head_dim": head_dim, "variant": vname}
    struct, keep = packer.pack(variant_params, what, device, lambda x, n: describe(x, f"{what}: {n}"))
    loaded = C.instance_for(what, "single_decode", params, custom, device)
    kern = loaded.kernels
    codes = loaded.codes
    stream = fw.stream(device)
    alloc = allocator_for(fw)

    ws_bytes = C.workspace_bytes(what, loaded, "single_decode", num_qo_heads, num_kv_heads, kv_len, head_dim)
    ws_ptr, ws_size = C.WORKSPACES.get(alloc, device, stream, ws_bytes, what)
    o = out if out is not None else alloc.empty(tq.shape, dtype, device, what)
    to = ts["out"] if out is not None else alloc.describe(o, "out")
    lse = alloc.empty((num_qo_heads,), "f32", device, what) if return_lse else None
    lse_ptr = alloc.describe(lse, "lse").ptr if lse is not None else None
    mid = (num_qo_heads, num_kv_heads, kv_len, head_dim, tq.strides[0], k_sn, k_sh, v_sn, v_sh,
           to.strides[0], codes["dtype"], codes["variant"])
    tail = (C.default_sm_scale(head_dim, sm_scale),)
    C.launch(what, loaded, device, kern.single_decode, tq.ptr, tk.ptr, tv.ptr, to.ptr, lse_ptr,
             *mid, *tail, _addr(struct), ws_ptr, ws_size, stream)
    del keep
    _remember(_SINGLE_PLANS, key, (kern.single_decode, loaded, packer if packer.struct_type else None,
                                   fw, alloc, device, ws_bytes, mid, tail, dtype,
                                   (num_qo_heads,) if return_lse else None))
    return (o, lse) if return_lse else o


def batch_decode(
    q: Any,
    paged_kv_cache: Any,
    kv_indptr: Any,
    kv_indices: Any,
    kv_last_page_len: Any,
    *,
    kv_layout: str = "NHD",
    variant: str | Variant = "default",
    sm_scale: float | None = None,
    return_lse: bool = False,
    out: Any = None,
    **variant_params: Any,
) -> Any:
    """Decode attention for a batch of requests over a paged KV cache.

    Args:
        q: ``[batch, num_qo_heads, head_dim]``, float16 or bfloat16, on a CUDA device.
        paged_kv_cache: ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (``"NHD"``) or
            ``[num_pages, 2, num_kv_heads, page_size, head_dim]`` (``"HND"``); index 0 of the
            second dimension holds K, 1 holds V.
        kv_indptr: int32 ``[batch + 1]``: request ``b`` owns ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``.
        kv_indices: int32 page ids, ``[kv_indptr[batch]]``.
        kv_last_page_len: int32 ``[batch]``, entries in the last page of each request (1..page_size).
        variant, sm_scale, return_lse, out, variant_params: as in ``single_decode``; the LSE is
            float32 ``[batch, num_qo_heads]``.

    Returns:
        ``o`` shaped like ``q``, or ``(o, lse)`` with ``return_lse``.
    """
    what = "batch_decode"
    key = None
    tt = torch_tensor_type()
    if (tt is not None and q.__class__ is tt and paged_kv_cache.__class__ is tt and kv_indptr.__class__ is tt
            and kv_indices.__class__ is tt and kv_last_page_len.__class__ is tt):
        okey = None if out is None else (out.__class__ is tt and _tkey(out))
        key = (_tkey(q), _tkey(paged_kv_cache), _tkey(kv_indptr), _tkey(kv_indices), _tkey(kv_last_page_len),
               okey, kv_layout, variant, sm_scale, return_lse, tuple(variant_params))
        try:
            plan = _BATCH_PLANS.get(key)
        except TypeError:
            plan = key = None
        if plan is not None:
            ptrs = (q.data_ptr(), paged_kv_cache.data_ptr())
            tables = (kv_indptr.data_ptr(), kv_indices.data_ptr(), kv_last_page_len.data_ptr())
            return _run_plan(what, plan, ptrs, q.shape, out, variant_params, tables)
        if okey is False:
            key = None
    layout = C.check_layout(what, kv_layout)
    ts, fw, device = C.read_tensors(what, {
        "q": q, "paged_kv_cache": paged_kv_cache, "kv_indptr": kv_indptr,
        "kv_indices": kv_indices, "kv_last_page_len": kv_last_page_len, "out": out,
    })
    tq, tkv = ts["q"], ts["paged_kv_cache"]
    C.check_ndim(what, "q", tq, 3, "[batch, num_qo_heads, head_dim]")
    cache_dims = ("[num_pages, 2, page_size, num_kv_heads, head_dim]" if layout == "NHD"
                  else "[num_pages, 2, num_kv_heads, page_size, head_dim]")
    C.check_ndim(what, "paged_kv_cache", tkv, 5, cache_dims)
    dtype = C.check_dtypes(what, ts, ("q", "paged_kv_cache", "out"))
    C.check_int32(what, ts, ("kv_indptr", "kv_indices", "kv_last_page_len"))
    batch, num_qo_heads, head_dim = tq.shape
    if tkv.shape[1] != 2:
        raise ValueError(
            f"{what}: paged_kv_cache's second dimension must be 2 (K and V), got shape {list(tkv.shape)} "
            f"({layout}: {cache_dims})"
        )
    s_page, s_kv = tkv.strides[0], tkv.strides[1]
    if layout == "NHD":
        _, _, page_size, num_kv_heads, kv_head_dim = tkv.shape
        s_n, s_h = tkv.strides[2], tkv.strides[3]
    else:
        _, _, num_kv_heads, page_size, kv_head_dim = tkv.shape
        s_n, s_h = tkv.strides[3], tkv.strides[2]
    if kv_head_dim != head_dim:
        raise ValueError(f"{what}: q has head_dim {head_dim} but paged_kv_cache has {kv_head_dim} ({layout})")
    if ts["kv_indptr"].shape[0] != batch + 1:
        raise ValueError(
            f"{what}: kv_indptr must have batch + 1 = {batch + 1} entries, got {ts['kv_indptr'].shape[0]}"
        )
    if ts["kv_last_page_len"].shape[0] != batch:
        raise ValueError(
            f"{what}: kv_last_page_len must have batch = {batch} entries, got {ts['kv_last_page_len'].shape[0]}"
        )
    C.check_gqa(what, num_qo_heads, num_kv_heads)
    C.check_last_dim_contiguous(what, ts, ("q", "paged_kv_cache", "out"))
    if out is not None:
        C.check_out(what, "out", ts["out"], tq.shape, dtype, device)
    vname, custom, packer = C.resolve_variant(what, "batch_decode", variant, variant_params)
    params = {"dtype": dtype, "head_dim": head_dim, "page_size": page_size, "variant": vname}
    struct, keep = packer.pack(variant_params, what, device, lambda x, n: describe(x, f"{what}: {n}"))
    loaded = C.instance_for(what, "batch_decode", params, custom, device)
    kern = loaded.kernels
    codes = loaded.codes
    stream = fw.stream(device)
    alloc = allocator_for(fw)

    ws_bytes = C.workspace_bytes(what, loaded, "batch_decode", batch, num_qo_heads, num_kv_heads, head_dim)
    ws_ptr, ws_size = C.WORKSPACES.get(alloc, device, stream, ws_bytes, what)
    o = out if out is not None else alloc.empty(tq.shape, dtype, device, what)
    to = ts["out"] if out is not None else alloc.describe(o, "out")
    lse = alloc.empty((batch, num_qo_heads), "f32", device, what) if return_lse else None
    lse_ptr = alloc.describe(lse, "lse").ptr if lse is not None else None
    mid = (batch, num_qo_heads, num_kv_heads, head_dim, page_size, tq.strides[0], tq.strides[1],
           s_page, s_kv, s_n, s_h, to.strides[0], to.strides[1], codes["dtype"], codes["variant"])
    tail = (C.default_sm_scale(head_dim, sm_scale),)
    C.launch(what, loaded, device, kern.batch_decode, tq.ptr, tkv.ptr, to.ptr, lse_ptr,
             ts["kv_indptr"].ptr, ts["kv_indices"].ptr, ts["kv_last_page_len"].ptr,
             *mid, *tail, _addr(struct), ws_ptr, ws_size, stream)
    del keep
    _remember(_BATCH_PLANS, key, (kern.batch_decode, loaded, packer if packer.struct_type else None,
                                  fw, alloc, device, ws_bytes, mid, tail, dtype,
                                  (batch, num_qo_heads) if return_lse else None))
    return (o, lse) if return_lse else o
