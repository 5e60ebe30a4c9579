"""Decode attention: ``single_decode`` (one request, contiguous KV) and ``batch_decode`` (a batch
over a paged KV cache), in FlashInfer's layouts.

Each function validates its arguments (see ``_common``), finds the instance for the tensors'
dtype and head_dim (and page size) and the variant, then calls the module's C entry point on the
caller's current CUDA stream with the caller's framework allocating the output.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

from . import _common as C
from . import _cuda
from ._errors import KernelError
from ._kernels import ARGS_STRUCTS, CALL_FIELDS, FlashgenError
from ._tensor import allocator_for, describe, torch_tensor_type
from ._variant import ParamPacker, Variant

__all__ = ["single_decode", "batch_decode"]

_addressof = ctypes.addressof


class _Plan:
    """Everything a validated call derived from its arguments, ready to launch again: the entry
    point, a template of its arguments struct with every constant field filled (sizes, strides,
    codes, sm_scale), and how to read the rest (stream, workspace, outputs, variant parameters).

    A launch writes the per-call fields (the leading block of 8-byte words: addresses, stream,
    additional params, workspace) into a struct of the calling thread's own, made once per thread
    from the template, and passes its address: threads sharing a plan never share a struct.
    """

    __slots__ = ("what", "module", "loaded", "fn", "args_type", "template", "tls", "pack",
                 "packer", "stream", "alloc", "ptr_of", "device", "ws_bytes", "dtype", "lse_shape",
                 "guard")

    def __init__(self, what: str, module: str, loaded: Any, fields: dict[str, Any],
                 packer: ParamPacker | None, fw: Any, alloc: Any, device: int, ws_bytes: int,
                 dtype: str, lse_shape: tuple[int, ...] | None) -> None:
        self.what = what
        self.module = module
        self.loaded = loaded
        self.fn = loaded.kernels.entry(module)
        self.args_type = ARGS_STRUCTS[module]
        self.template = bytes(self.args_type(**fields))
        self.tls = threading.local()
        self.pack = struct.Struct(f"@{len(CALL_FIELDS[module]) - 1}Qq").pack_into
        self.packer = packer if packer is not None and packer.struct_type is not None else None
        self.stream = fw.stream_getter()
        self.alloc = alloc
        self.ptr_of = alloc.ptr
        self.device = device
        self.ws_bytes = ws_bytes
        self.dtype = dtype
        self.lse_shape = lse_shape
        self.guard = _cuda.needs_guard()

    def _bind(self) -> tuple[Any, int]:
        """This thread's arguments struct (a copy of the template) and its address."""
        a = self.args_type.from_buffer_copy(self.template)
        s = self.tls.s = (a, _addressof(a))
        return s

    def run(self, out: Any, o_ptr: int, shape: Any, variant_params: dict[str, Any], *ptrs: int) -> Any:
        """Launch on the current stream with inputs ``ptrs`` (in the struct's order) and output
        ``out`` at ``o_ptr`` (allocated here when ``out`` is None)."""
        device = self.device
        params = None
        ap = 0
        if self.packer is not None:
            what = self.what
            params, keep = self.packer.pack(variant_params, what, device,
                                            lambda x, n: describe(x, f"{what}: {n}"))
            ap = _addressof(params)
        stream = self.stream(device)
        if self.ws_bytes:
            ws, ws_size = C.WORKSPACES.get(self.alloc, device, stream, self.ws_bytes, self.what)
        else:
            ws = ws_size = 0
        if out is None:
            out = self.alloc.empty(shape, self.dtype, device, self.what)
            o_ptr = self.ptr_of(out)
        lse = None
        lse_ptr = 0
        if self.lse_shape is not None:
            lse = self.alloc.empty(self.lse_shape, "f32", device, self.what)
            lse_ptr = self.ptr_of(lse)
        try:
            a, addr = self.tls.s
        except AttributeError:
            a, addr = self._bind()
        self.pack(a, 0, *ptrs, o_ptr, lse_ptr, stream, ap, ws, ws_size)
        if self.guard:
            pushed = _cuda.push_device(device)
            try:
                status = self.fn(addr)
            finally:
                if pushed:
                    _cuda.pop_device()
        else:
            status = self.fn(addr)
        if status:
            self._fail(status)
        del params  # the additional params are read during the call only
        return (out, lse) if lse is not None else out

    def _fail(self, status: int) -> None:
        kern = self.loaded.kernels
        exc = FlashgenError(status, f"flashgen_{self.module}", kern.last_error(), kern.path)
        raise KernelError(f"{self.what} ({self.loaded.uri}): {exc}") from None


# Per-call plans for plain torch tensors: a call whose tensors have the shapes, strides, dtypes
# and devices of an earlier validated call (and the same options) reuses its plan and only reads
# the data pointers, the current stream and the variant parameters. The key holds every input the
# checks read, so a plan never skips a check that could fail.
_SINGLE_PLANS: dict[tuple[Any, ...], _Plan] = {}
_BATCH_PLANS: dict[tuple[Any, ...], _Plan] = {}
_MAX_PLANS = 4096


def _remember(plans: dict[tuple[Any, ...], _Plan], key: tuple[Any, ...] | None, plan: _Plan) -> None:
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
        if out is None:
            okey: Any = None
        elif out.__class__ is tt:
            okey = (out.shape, out.stride(), out.dtype, out.get_device())
        else:
            okey = False
        key = (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype,
               k.get_device(), v.shape, v.stride(), v.dtype, v.get_device(), okey, kv_layout,
               variant, sm_scale, return_lse, tuple(variant_params) if variant_params else ())
        try:
            plan = _SINGLE_PLANS.get(key)
        except TypeError:  # an unhashable argument: the checked path reports it
            plan = key = None
        if plan is not None:
            return plan.run(out, 0 if out is None else out.data_ptr(), q.shape, variant_params,
                            q.data_ptr(), k.data_ptr(), v.data_ptr())
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
    packer.pack(variant_params, what, device, lambda x, n: describe(x, f"{what}: {n}"))  # checks them
    loaded = C.instance_for(what, "single_decode", params, custom, device)
    codes = loaded.codes
    alloc = allocator_for(fw)

    ws_bytes = C.workspace_bytes(what, loaded, "single_decode", num_qo_heads, num_kv_heads, kv_len, head_dim)
    o = out if out is not None else alloc.empty(tq.shape, dtype, device, what)
    to = ts["out"] if out is not None else alloc.describe(o, "out")
    fields = dict(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, kv_len=kv_len, head_dim=head_dim,
                  q_stride_h=tq.strides[0], k_stride_n=k_sn, k_stride_h=k_sh, v_stride_n=v_sn, v_stride_h=v_sh,
                  o_stride_h=to.strides[0], dtype_code=codes["dtype"], variant_code=codes["variant"],
                  sm_scale=C.default_sm_scale(head_dim, sm_scale))
    plan = _Plan(what, "single_decode", loaded, fields, packer, fw, alloc, device, ws_bytes, dtype,
                 (num_qo_heads,) if return_lse else None)
    res = plan.run(o, to.ptr, tq.shape, variant_params, tq.ptr, tk.ptr, tv.ptr)
    _remember(_SINGLE_PLANS, key, plan)
    return res


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
        if out is None:
            okey: Any = None
        elif out.__class__ is tt:
            okey = (out.shape, out.stride(), out.dtype, out.get_device())
        else:
            okey = False
        c, ip, ix, ln = paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len
        key = (q.shape, q.stride(), q.dtype, q.get_device(), c.shape, c.stride(), c.dtype, c.get_device(),
               ip.shape, ip.stride(), ip.dtype, ip.get_device(), ix.shape, ix.stride(), ix.dtype,
               ix.get_device(), ln.shape, ln.stride(), ln.dtype, ln.get_device(), okey, kv_layout, variant,
               sm_scale, return_lse, tuple(variant_params) if variant_params else ())
        try:
            plan = _BATCH_PLANS.get(key)
        except TypeError:
            plan = key = None
        if plan is not None:
            return plan.run(out, 0 if out is None else out.data_ptr(), q.shape, variant_params,
                            q.data_ptr(), c.data_ptr(), ip.data_ptr(), ix.data_ptr(), ln.data_ptr())
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
    packer.pack(variant_params, what, device, lambda x, n: describe(x, f"{what}: {n}"))  # checks them
    loaded = C.instance_for(what, "batch_decode", params, custom, device)
    codes = loaded.codes
    alloc = allocator_for(fw)

    ws_bytes = C.workspace_bytes(what, loaded, "batch_decode", batch, num_qo_heads, num_kv_heads, head_dim)
    o = out if out is not None else alloc.empty(tq.shape, dtype, device, what)
    to = ts["out"] if out is not None else alloc.describe(o, "out")
    fields = dict(batch_size=batch, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                  page_size=page_size, q_stride_b=tq.strides[0], q_stride_h=tq.strides[1], kv_stride_page=s_page,
                  kv_stride_kv=s_kv, kv_stride_n=s_n, kv_stride_h=s_h, o_stride_b=to.strides[0],
                  o_stride_h=to.strides[1], dtype_code=codes["dtype"], variant_code=codes["variant"],
                  sm_scale=C.default_sm_scale(head_dim, sm_scale))
    plan = _Plan(what, "batch_decode", loaded, fields, packer, fw, alloc, device, ws_bytes, dtype,
                 (batch, num_qo_heads) if return_lse else None)
    res = plan.run(o, to.ptr, tq.shape, variant_params, tq.ptr, tkv.ptr, ts["kv_indptr"].ptr,
                   ts["kv_indices"].ptr, ts["kv_last_page_len"].ptr)
    _remember(_BATCH_PLANS, key, plan)
    return res
