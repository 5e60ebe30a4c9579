"""The engine-facing API: ``plan()`` once per batch, ``run()`` many times, over a workspace the
caller owns.

Serving engines size one workspace buffer, plan each batch outside a CUDA graph, and replay
``run`` inside one. The three classes follow FlashInfer's wrappers (names, argument order,
keywords), so porting an engine's backend is mostly a rename; docs/user-guide.md lists the
differences.

The classes are the one layer of the batch API: ``batch_decode``, ``batch_prefill_paged`` and
``batch_prefill`` (ragged) are each their class's one-shot, ``_Wrapper._call``: plan and run in
one step over the stream's shared workspace (``_common.WORKSPACES``), with the class's shared
plan cache. Both forms end in one ``_op.call`` of the class's spec: ``plan()`` checks the page
table and the sizes, chooses the variant, loads (or compiles) the instance and checks the
workspace; ``run()`` launches the planned arguments over the caller's workspace with a plan cache
of the wrapper's own, so its host cost is the functional call's; the one-shot reads the sizes
from the tensors on its first call of a shape and takes the plan cache's fast path after that.
(``single_decode`` and ``single_prefill`` have no class and call ``_op.call`` themselves.)

``run()`` never synchronizes or allocates workspace; the kernels read the lengths from the
planned index tensors on the device, so a captured ``run`` replays correctly after a ``plan()``
with new lengths (same batch size). With ``use_cuda_graph=True`` the index tensors live in the
fixed buffers given at construction: ``plan()`` copies into them, and the captured addresses
stay valid.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from . import _common as C
from . import _fp8, _op
from ._decode import BATCH_DECODE
from ._matrix import matrix
from ._prefill import BATCH_PREFILL, BATCH_PREFILL_PAGED
from ._tensor import KDL_CPU, KDL_CUDA, Output, Tensor, TensorLike, describe, dtype_named
from ._variant import Variant

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
]

_POS_ENCODINGS = {"NONE": "none", "ROPE_LLAMA": "rope_llama"}


def _dtype(what: str, arg: str, value: Any) -> str:
    """"f16" or "bf16" from a torch dtype or its name (``torch.bfloat16``, ``"bfloat16"``)."""
    got = dtype_named(value)
    if got not in C.ATTN_DTYPES:
        raise TypeError(f"{what}: {arg} must be float16 or bfloat16 (a torch dtype or its name), "
                        f"got {value!r}")
    return got


def _cache_dtype(what: str, kv_data_type: Any, dtype: str, fp8: bool) -> str:
    """The cache's dtype: q's when ``kv_data_type`` is None, else the one named (an fp8 type only
    where ``fp8``: the module reads one)."""
    if kv_data_type is None:
        return dtype
    name = dtype_named(kv_data_type)
    if name in _fp8.FP8_DTYPES:
        if not fp8:
            raise TypeError(f"{what}: this wrapper reads no fp8 KV cache; got kv_data_type={kv_data_type!r} "
                            "(pass q_data_type's dtype or leave kv_data_type unset)")
        return name
    if _dtype(what, "kv_data_type", kv_data_type) != dtype:
        raise TypeError(f"{what}: kv_data_type must be q_data_type ({dtype})"
                        + (" or an fp8 type (torch.float8_e4m3fn, torch.float8_e5m2)" if fp8 else ""))
    return dtype


def _pos_encoding(what: str, mode: Any) -> str:
    got = _POS_ENCODINGS.get(str(mode).upper())
    if got is None:
        raise ValueError(f"{what}: pos_encoding_mode must be one of {', '.join(_POS_ENCODINGS)}, got "
                         f"{mode!r} (ALiBi: variant=\"alibi\" with alibi_slopes=...)")
    return got


def _variant(what: str, variant: str | Variant | None, window_left: int, logits_soft_cap: float | None,
             variant_params: Mapping[str, Any]) -> tuple[str | Variant, dict[str, Any]]:
    """FlashInfer's ``window_left`` and ``logits_soft_cap`` as flashgen's variants: each chooses
    its built-in variant when ``variant`` is not given, and is that variant's parameter when it
    is (a variant without such a parameter refuses it by name). A variant that takes
    ``window_left`` (sliding_window, attention_sink) gets it also when it is -1 (no window)."""
    params = dict(variant_params)
    if not isinstance(window_left, int) or isinstance(window_left, bool):
        raise TypeError(f"{what}: window_left must be an int (-1: no window), got {window_left!r}")
    cap = None if logits_soft_cap is None or logits_soft_cap == 0 else float(logits_soft_cap)
    if variant is None:
        if window_left >= 0 and cap is not None:
            raise ValueError(f"{what}: window_left and logits_soft_cap together need a variant that "
                             "has both; no built-in one does (pass variant=flashgen.Variant(...))")
        if window_left >= 0:
            return "sliding_window", {**params, "window_left": window_left}
        if cap is not None:
            return "soft_cap", {**params, "logits_soft_cap": cap}
        return "default", params
    takes = variant.params if isinstance(variant, Variant) else matrix().variants.get(variant, ())
    if window_left >= 0 or any(p.name == "window_left" for p in takes):
        params.setdefault("window_left", window_left)
    if cap is not None:
        params.setdefault("logits_soft_cap", cap)
    return variant, params


class _Planned(NamedTuple):
    """What plan() fixed for run()."""

    tensors: tuple[Any, ...]  # the index tensors, in the spec's input order after the data tensors
    variant: str | Variant
    variant_params: dict[str, Any]
    sm_scale: float | None
    option_values: tuple[Any, ...]  # the functional call's options (causal, RoPE)
    expect: dict[str, Any]  # sizes and dtype the run's tensors must have


class _Wrapper:
    """What the three wrappers share: the workspace, the layout, the fixed index buffers of CUDA
    graph mode, reading plan()'s index tensors, and preparing the instance."""

    _spec: _op.Spec
    _buffer_args: tuple[str, ...]  # the constructor's fixed-buffer keywords, in index order
    _page_ids_buffer: str | None = None  # the one of them passed whole (the page ids)
    _shared_plans: dict[tuple[Any, ...], _op.Plan]  # the one-shots' (_call): the spec's shared cache

    def __init__(self, workspace_buffer: TensorLike, kv_layout: str, use_cuda_graph: bool,
                 buffers: tuple[TensorLike | None, ...], backend: str | None) -> None:
        what = type(self).__name__
        ws = describe(workspace_buffer, f"{what}: workspace_buffer")
        if ws.device_type != KDL_CUDA:
            raise ValueError(f"{what}: workspace_buffer must be a CUDA tensor, got one on {ws.device}")
        if not ws.is_contiguous() or ws.ptr % 16:
            raise ValueError(f"{what}: workspace_buffer must be contiguous and 16-byte aligned")
        self._workspace_buffer = workspace_buffer  # keeps the memory alive
        self._workspace = (ws.ptr, ws.nbytes)
        self._device = ws.device_id
        self._layout = C.check_layout(what, kv_layout)
        self._backend = backend
        self._graph = bool(use_cuda_graph)
        self._buffers: tuple[Any, ...] = ()
        if self._graph:
            missing = [n for n, b in zip(self._buffer_args, buffers) if b is None]
            if missing:
                raise ValueError(f"{what}: use_cuda_graph=True needs the fixed index buffers "
                                 f"{', '.join(missing)} (int32 CUDA tensors sized for the largest batch)")
            self._buffers = tuple(self._read_index(what, n, b) for n, b in zip(self._buffer_args, buffers))
        self._plans: dict[tuple[Any, ...], _op.Plan] = {}
        self._planned: _Planned | None = None

    def __init_subclass__(cls, **kw: Any) -> None:
        """A class with a spec gets its one-shots' plan cache once, so a call only reads it."""
        super().__init_subclass__(**kw)
        if "_spec" in cls.__dict__:
            cls._shared_plans = _op.shared_plans(cls._spec)

    @property
    def workspace_bytes(self) -> int:
        return self._workspace[1]

    @classmethod
    def _call(cls, tensors: tuple[Any, ...], out: Any, kv_layout: str, variant: str | Variant,
              sm_scale: float | None, return_lse: bool, option_values: tuple[Any, ...],
              variant_params: dict[str, Any], backend: str | None) -> Output:
        """The class's functional call (``batch_decode`` and the others): plan and run in one
        step over the stream's shared workspace. ``tensors`` are run()'s data tensors, then
        plan()'s index tensors; ``option_values`` plan()'s options, then the scales.

        It needs no instance: the layout and backend are the call's and part of the plan key,
        so the first call of a shape plans (``_op.call``'s checked path, which reads from the
        tensors every size plan() is told) and every later one takes the plan cache's fast
        path. Errors name the functional function."""
        return _op.call(cls._spec, tensors, out, kv_layout, variant, sm_scale, return_lse, option_values,
                        variant_params, backend, plans=cls._shared_plans)

    def _read_index(self, what: str, name: str, t: Any) -> tuple[Any, Tensor]:
        """An int32 1-D contiguous index tensor on the workspace's device; a torch CPU tensor is
        copied there (plan() may synchronize)."""
        if t is None:
            raise TypeError(f"{what}: {name} is required: an int32 tensor")
        d = describe(t, f"{what}: {name}")
        if d.device_type == KDL_CPU and d.framework == "torch":
            t = t.to(device=f"cuda:{self._device}", non_blocking=True)
            d = describe(t, f"{what}: {name}")
        if d.device_type != KDL_CUDA or d.device_id != self._device:
            raise ValueError(f"{what}: {name} is on {d.device}; the workspace is on cuda:{self._device}")
        C.check_int32(what, {name: d}, [name])
        return t, d

    def _indices(self, what: str, given: Mapping[str, Any]) -> tuple[Any, ...]:
        """plan()'s index tensors as run() passes them: the caller's own (on the device), or in
        CUDA graph mode copies in the fixed buffers (the leading part of each, except the page
        ids, which keep the whole buffer so that every plan launches the same shape). Tensors
        without a fixed buffer (RoPE offsets) are passed as given: keep them alive and in place."""
        out: list[Any] = []
        for i, (name, t) in enumerate(given.items()):
            if t is None:  # an optional tensor (RoPE offsets)
                out.append(None)
                continue
            t, d = self._read_index(what, name, t)
            if i < len(self._buffers):
                buf, bd = self._buffers[i]
                n = d.shape[0]
                if n > bd.shape[0]:
                    raise ValueError(f"{what}: {name} has {n} entries but its fixed buffer "
                                     f"{self._buffer_args[i]} holds {bd.shape[0]}")
                if d.ptr != bd.ptr:
                    if not hasattr(buf, "copy_"):
                        raise TypeError(f"{what}: with use_cuda_graph=True pass torch tensors, or the "
                                        f"fixed buffer {self._buffer_args[i]} itself")
                    buf[:n].copy_(t, non_blocking=True)
                t = buf if self._buffer_args[i] == self._page_ids_buffer else buf[:n]
            out.append(t)
        return tuple(out)

    def _prepare(self, what: str, sym: dict[str, int], dtype: str, option_values: tuple[Any, ...],
                 variant: str | Variant | None, window_left: int, logits_soft_cap: float | None,
                 sm_scale: float | None, variant_params: Mapping[str, Any],
                 index: tuple[Any, ...], kv_data_type: Any) -> None:
        """Resolve the variant, load (or compile) the instance, check the workspace when the
        sizes alone fix it, and keep it all for run(). ``kv_data_type``: the cache's dtype, which
        may be an fp8 type where the spec reads a cache of its own type (an ``"@<tensor>"``
        axis: the kv_dtype of batch decode and batch prefill)."""
        spec = self._spec
        cache = next((src[1:] for src in spec.axes.values() if src.startswith("@")), None)
        cache_dtype = _cache_dtype(what, kv_data_type, dtype, fp8=cache is not None)
        for s in ("Hq", "Hk", "D", "P"):
            if s in sym and (not isinstance(sym[s], int) or isinstance(sym[s], bool) or sym[s] <= 0):
                raise ValueError(f"{what}: {_op.SYMBOLS[s]} must be a positive int, got {sym[s]!r}")
        for check in spec.checks:
            check(what, sym)
        chosen, params = _variant(what, variant, window_left, logits_soft_cap, variant_params)
        options = spec.options(what, *option_values)
        _, axes, custom = _op.instance_params(spec, what, sym, dtype, options, chosen, params, self._backend,
                                              self._device, {cache: cache_dtype} if cache else None)
        expect: dict[str, Any] = {s: v for s, v in sym.items() if s in ("Hq", "Hk", "D", "P")}
        expect["dtype"] = dtype
        if cache:
            expect["@" + cache] = cache_dtype
        # The batch is planned once its arguments pass their checks; a run() after a failure
        # below (no GPU, a compile error, a small workspace) fails the same way.
        self._planned = _Planned(index, chosen, params, sm_scale, option_values, expect)
        loaded = C.instance_for(what, spec.module, axes, custom, self._device)
        if all(s in sym for s in spec.fields.values() if isinstance(s, str)):
            fields = _op.fill_fields(spec, self._layout, sym, lambda *_: 0, loaded, options, sm_scale)
            _op.check_workspace(what, C.workspace_bytes(what, loaded, spec.module, fields), self._workspace)

    def _run(self, data: tuple[Any, ...], out: Any, lse: Any, return_lse: bool,
             k_scale: float | None, v_scale: float | None) -> Output:
        """run() of every wrapper: the planned call over ``data`` (q and the cache), with an fp8
        cache's scales (None: 1)."""
        p = self._planned
        if p is None:
            raise RuntimeError(f"{type(self).__name__}.run: call plan() first")
        scales = (1.0 if k_scale is None else k_scale, 1.0 if v_scale is None else v_scale)
        return _op.call(self._spec, data + p.tensors, out, self._layout, p.variant, p.sm_scale,
                        return_lse, p.option_values + scales, p.variant_params, self._backend,
                        plans=self._plans,
                        lse=lse, workspace=self._workspace, expect=p.expect,
                        what=f"{type(self).__name__}.run")


def _indptr_batch(what: str, name: str, t: Any) -> int:
    n = describe(t, f"{what}: {name}").shape
    if len(n) != 1 or n[0] < 2:
        raise ValueError(f"{what}: {name} must be 1-D with batch + 1 >= 2 entries, got shape {list(n)}")
    return int(n[0]) - 1


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    """Decode for a batch of requests over a paged KV cache, planned once per batch.

    ``workspace_buffer``: a CUDA tensor the caller owns (FlashInfer's engines use 128 MiB; the
    need grows with batch x heads x head_dim); ``kv_layout``: ``"NHD"`` or ``"HND"`` as in
    ``flashgen.batch_decode``. ``use_cuda_graph=True`` takes fixed int32 buffers for the page
    table (``paged_kv_indptr_buffer`` [max_batch + 1], ``paged_kv_indices_buffer`` [max pages],
    ``paged_kv_last_page_len_buffer`` [max_batch]) that plan() fills.
    """

    _spec = BATCH_DECODE
    _buffer_args = ("paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer")
    _page_ids_buffer = "paged_kv_indices_buffer"

    def __init__(self, workspace_buffer: TensorLike, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 paged_kv_indptr_buffer: TensorLike | None = None,
                 paged_kv_indices_buffer: TensorLike | None = None,
                 paged_kv_last_page_len_buffer: TensorLike | None = None,
                 backend: str | None = None) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph,
                         (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer),
                         backend)

    def plan(self, indptr: TensorLike, indices: TensorLike, last_page_len: TensorLike, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, pos_encoding_mode: str = "NONE",
             window_left: int = -1, logits_soft_cap: float | None = None,
             q_data_type: Any = "float16", kv_data_type: Any = None, sm_scale: float | None = None,
             rope_scale: float | None = None, rope_theta: float | None = None, *,
             variant: str | Variant | None = None, **variant_params: Any) -> None:
        """Plan a batch: ``indptr`` int32 [batch + 1] (pages of request b:
        ``indices[indptr[b]:indptr[b+1]]``), ``indices`` int32 page ids, ``last_page_len`` int32
        [batch], on the GPU (or torch CPU tensors, copied). Their values are read by the kernels,
        never here. ``window_left >= 0`` chooses the sliding_window variant, ``logits_soft_cap``
        the soft_cap one; ``variant`` and ``**variant_params`` choose any other (as in
        ``flashgen.batch_decode``)."""
        what = f"{type(self).__name__}.plan"
        batch = _indptr_batch(what, "indptr", indptr)
        index = self._indices(what, {"indptr": indptr, "indices": indices, "last_page_len": last_page_len})
        dtype = _dtype(what, "q_data_type", q_data_type)
        num_page_ids = describe(index[1], f"{what}: indices").shape[0]
        sym = {"B": batch, "Ni": num_page_ids, "Hq": num_qo_heads, "Hk": num_kv_heads, "D": head_dim,
               "P": page_size}
        options = (_pos_encoding(what, pos_encoding_mode), 1e4 if rope_theta is None else rope_theta,
                   1.0 if rope_scale is None else rope_scale)
        self._prepare(what, sym, dtype, options, variant, window_left, logits_soft_cap, sm_scale,
                      variant_params, index, kv_data_type)

    def run(self, q: TensorLike, paged_kv_cache: TensorLike, *, k_scale: float | None = None,
            v_scale: float | None = None, out: TensorLike | None = None, lse: TensorLike | None = None,
            return_lse: bool = False) -> Output:
        """``q`` [batch, num_qo_heads, head_dim] against the planned batch; returns ``o`` (into
        ``out`` when given), or ``(o, lse)`` with ``return_lse`` or ``lse`` (float32
        [batch, num_qo_heads], natural log). ``k_scale``, ``v_scale``: an fp8 cache's scales
        (``kv_data_type`` in plan(); default 1). Never synchronizes; CUDA-graph safe."""
        return self._run((q, paged_kv_cache), out, lse, return_lse, k_scale, v_scale)


class _PrefillWrapper(_Wrapper):
    """The planning the two prefill wrappers share."""

    def _plan_prefill(self, what: str, index: Mapping[str, Any], sym: dict[str, int], head_dim_vo: int | None,
                      causal: bool, pos_encoding_mode: str, window_left: int, logits_soft_cap: float | None,
                      q_data_type: Any, kv_data_type: Any, sm_scale: float | None, rope_scale: float | None,
                      rope_theta: float | None, variant: str | Variant | None,
                      variant_params: Mapping[str, Any]) -> None:
        if head_dim_vo is not None and head_dim_vo != sym["D"]:
            raise ValueError(f"{what}: head_dim_vo ({head_dim_vo}) must equal head_dim_qk ({sym['D']})")
        sym["B"] = _indptr_batch(what, "qo_indptr", index["qo_indptr"])
        planned = self._indices(what, index)
        dtype = _dtype(what, "q_data_type", q_data_type)
        options = (causal, _pos_encoding(what, pos_encoding_mode), 1e4 if rope_theta is None else rope_theta,
                   1.0 if rope_scale is None else rope_scale)
        self._prepare(what, sym, dtype, options, variant, window_left, logits_soft_cap, sm_scale,
                      variant_params, planned, kv_data_type)


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapper):
    """Prefill for a batch whose queries are packed along tokens and whose K/V live in a paged
    cache (``flashgen.batch_prefill_paged``), planned once per batch. Constructor as
    BatchDecodeWithPagedKVCacheWrapper's, with ``qo_indptr_buf`` [max_batch + 1] among the fixed
    buffers of CUDA graph mode."""

    _spec = BATCH_PREFILL_PAGED
    _buffer_args = ("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf",
                    "paged_kv_last_page_len_buf")
    _page_ids_buffer = "paged_kv_indices_buf"

    def __init__(self, workspace_buffer: TensorLike, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: TensorLike | None = None, paged_kv_indptr_buf: TensorLike | None = None,
                 paged_kv_indices_buf: TensorLike | None = None,
                 paged_kv_last_page_len_buf: TensorLike | None = None, backend: str | None = None) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph,
                         (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf),
                         backend)

    def plan(self, qo_indptr: TensorLike, paged_kv_indptr: TensorLike, paged_kv_indices: TensorLike,
             paged_kv_last_page_len: TensorLike, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             page_size: int, head_dim_vo: int | None = None, causal: bool = False,
             pos_encoding_mode: str = "NONE", sm_scale: float | None = None, window_left: int = -1,
             logits_soft_cap: float | None = None, rope_scale: float | None = None,
             rope_theta: float | None = None, q_data_type: Any = "float16", kv_data_type: Any = None, *,
             q_rope_offset: TensorLike | None = None, kv_rope_offset: TensorLike | None = None,
             variant: str | Variant | None = None, **variant_params: Any) -> None:
        """Plan a batch: ``qo_indptr`` int32 [batch + 1] (queries of request b: rows
        ``qo_indptr[b]:qo_indptr[b+1]`` of q), the page table as in the decode wrapper, and
        optional int32 [batch] RoPE position offsets. Other arguments as in the decode wrapper's
        plan() and ``flashgen.batch_prefill_paged``."""
        what = f"{type(self).__name__}.plan"
        index = {"qo_indptr": qo_indptr, "paged_kv_indptr": paged_kv_indptr,
                 "paged_kv_indices": paged_kv_indices, "paged_kv_last_page_len": paged_kv_last_page_len,
                 "q_rope_offset": q_rope_offset, "kv_rope_offset": kv_rope_offset}
        sym = {"Hq": num_qo_heads, "Hk": num_kv_heads, "D": head_dim_qk, "P": page_size}
        self._plan_prefill(what, index, sym, head_dim_vo, causal, pos_encoding_mode, window_left,
                           logits_soft_cap, q_data_type, kv_data_type, sm_scale, rope_scale, rope_theta,
                           variant, variant_params)

    def run(self, q: TensorLike, paged_kv_cache: TensorLike, *, k_scale: float | None = None,
            v_scale: float | None = None, out: TensorLike | None = None, lse: TensorLike | None = None,
            return_lse: bool = False) -> Output:
        """``q`` [total_q, num_qo_heads, head_dim] against the planned batch; returns ``o`` or
        ``(o, lse)`` (float32 [total_q, num_qo_heads], natural log). ``k_scale``, ``v_scale``: an
        fp8 cache's scales (``kv_data_type`` in plan(); default 1). CUDA-graph safe."""
        return self._run((q, paged_kv_cache), out, lse, return_lse, k_scale, v_scale)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapper):
    """Prefill for a batch whose q, k and v are packed along tokens (``flashgen.batch_prefill``),
    planned once per batch; CUDA graph mode takes ``qo_indptr_buf`` and ``kv_indptr_buf``
    [max_batch + 1]."""

    _spec = BATCH_PREFILL
    _buffer_args = ("qo_indptr_buf", "kv_indptr_buf")

    def __init__(self, workspace_buffer: TensorLike, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: TensorLike | None = None, kv_indptr_buf: TensorLike | None = None,
                 backend: str | None = None) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph, (qo_indptr_buf, kv_indptr_buf), backend)

    def plan(self, qo_indptr: TensorLike, kv_indptr: TensorLike, num_qo_heads: int, num_kv_heads: int,
             head_dim_qk: int, head_dim_vo: int | None = None, causal: bool = False,
             pos_encoding_mode: str = "NONE", sm_scale: float | None = None, window_left: int = -1,
             logits_soft_cap: float | None = None, rope_scale: float | None = None,
             rope_theta: float | None = None, q_data_type: Any = "float16", kv_data_type: Any = None, *,
             q_rope_offset: TensorLike | None = None, kv_rope_offset: TensorLike | None = None,
             variant: str | Variant | None = None, **variant_params: Any) -> None:
        """Plan a batch: ``qo_indptr`` and ``kv_indptr`` int32 [batch + 1] (rows of q and of k/v
        per request). Other arguments as in BatchPrefillWithPagedKVCacheWrapper.plan()."""
        what = f"{type(self).__name__}.plan"
        index = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "q_rope_offset": q_rope_offset,
                 "kv_rope_offset": kv_rope_offset}
        sym = {"Hq": num_qo_heads, "Hk": num_kv_heads, "D": head_dim_qk}
        self._plan_prefill(what, index, sym, head_dim_vo, causal, pos_encoding_mode, window_left,
                           logits_soft_cap, q_data_type, kv_data_type, sm_scale, rope_scale, rope_theta,
                           variant, variant_params)

    def run(self, q: TensorLike, k: TensorLike, v: TensorLike, *, k_scale: float | None = None,
            v_scale: float | None = None, out: TensorLike | None = None, lse: TensorLike | None = None,
            return_lse: bool = False) -> Output:
        """``q`` [total_q, num_qo_heads, head_dim], ``k`` and ``v`` [total_kv, num_kv_heads,
        head_dim] (NHD) or HND, both of plan()'s ``kv_data_type``, against the planned batch;
        ``k_scale``, ``v_scale`` and the result as in the paged wrapper's run()."""
        return self._run((q, k, v), out, lse, return_lse, k_scale, v_scale)
