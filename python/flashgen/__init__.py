"""flashgen: attention kernels built from one CUDA source tree, precompiled in the wheel or
compiled on first use by the same build (the bundled ``flashgen`` binary), then cached.

Public API::

    flashgen.single_decode(q, k, v, *, kv_layout="NHD", variant="default", ...)
    flashgen.batch_decode(q, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, ...)
    flashgen.single_prefill(q, k, v, *, causal=False, pos_encoding="none", ...)
    flashgen.batch_prefill(q, qo_indptr, k, v, kv_indptr, *, causal=False, ...)
    flashgen.batch_prefill_paged(q, qo_indptr, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, ...)
    flashgen.merge_state(v_a, s_a, v_b, s_b) -> (v, s)      # merge attention states by their LSE
    flashgen.merge_state_in_place(v, s, v_other, s_other, mask=None)
    flashgen.merge_states(v, s) -> (v, s)                   # [n, num_states, heads, head_dim]
    # the engine-facing form: plan once per batch, run (CUDA-graph safe) over your workspace
    w = flashgen.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    w.plan(kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size)
    o = w.run(q, paged_kv_cache)        # also BatchPrefillWith{Paged,Ragged}KVCacheWrapper
    flashgen.Variant(name, source, params=[("logits_scale", "float")])   # a custom variant
    flashgen.list_variants(module=None, **where)
    flashgen.is_precompiled(module, **params)
    # every kernel function takes backend=None: the module's implementation (default: the best
    # one the device runs, in the order variants.json declares)

Importing flashgen imports only the standard library; tensors come from torch, cupy or any
DLPack producer. Environment: ``FLASHGEN_CACHE_DIR`` (JIT cache, default ``~/.cache/flashgen``),
``FLASHGEN_DISABLE_JIT=1`` (never compile), ``FLASHGEN_CUDA_ARCH_LIST`` (JIT archs, e.g. ``9.0a``;
they must run on the device), ``FLASHGEN_DEVICE_CC`` (serve a GPU of this compute capability,
e.g. ``9.0``, instead of asking the driver), ``FLASHGEN_BIN`` (the binary the JIT runs).
"""

from __future__ import annotations

from typing import Any

from ._decode import batch_decode, single_decode
from ._merge import merge_state, merge_state_in_place, merge_states
from ._prefill import batch_prefill, batch_prefill_paged, single_prefill
from ._errors import CompileError, FlashgenError, JITDisabledError, KernelError, NoGPUError
from ._tensor import TensorLike
from ._variant import Variant
from ._wrappers import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

__all__ = [
    "single_decode",
    "batch_decode",
    "single_prefill",
    "batch_prefill",
    "batch_prefill_paged",
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "Variant",
    "TensorLike",
    "list_variants",
    "is_precompiled",
    "FlashgenError",
    "CompileError",
    "JITDisabledError",
    "KernelError",
    "NoGPUError",
    "__version__",
]


def list_variants(module: str | None = None, **where: Any) -> list[dict[str, Any]]:
    """The matrix's instances, as ``flashgen list-variants --json`` prints them (``uri``,
    ``module``, ``params``, ``codes``, ``aot``), plus ``backend`` (its value of the module's
    backend axis, None for a module with one implementation), ``arch_limit`` (the only archs it
    is built for, None for all) and ``precompiled``: whether this installation ships its
    binary. ``where`` filters by axis value; string values may be shell-style globs
    (``head_dim="*6*"``): the selection is the CLI's own (``--module``/``--where``), so the two
    never disagree."""
    from . import _install, _matrix

    shipped = _install.shipped_uris(module)
    mx = _matrix.matrix()
    if module is None and not where:
        chosen = mx.instances
    else:
        if module is not None:
            mx.module(module)  # a ValueError naming the modules that exist
        uris = set(_install.select_uris(module, {k: _matrix.format_value(v) for k, v in where.items()}))
        chosen = [i for i in mx.instances if i.uri in uris]

    def backend(i: _matrix.Instance) -> Any:
        axis = mx.modules[i.module].backend_axis if i.module in mx.modules else None
        return None if axis is None else i.params.get(axis)

    return [
        {"uri": i.uri, "module": i.module, "params": dict(i.params), "codes": dict(i.codes),
         "aot": i.aot, "backend": backend(i),
         "arch_limit": list(i.arch_limit) if i.arch_limit is not None else None,
         "precompiled": i.uri in shipped}
        for i in chosen
    ]


def is_precompiled(module: str, **params: Any) -> bool:
    """Whether the instance of ``module`` with exactly ``params`` (every axis) is shipped
    precompiled in this installation. A module's ``backend`` may be left out: it is then the one
    a kernel call on this device takes (``FLASHGEN_DEVICE_CC``, else the driver's device 0).
    Raises ValueError when no instance has these params."""
    from . import _install, _loader, _matrix

    mx = _matrix.matrix()
    axis = mx.module(module).backend_axis
    if axis is not None and axis not in params:
        mx.check_partial(module, params, (axis,))
        params = mx.with_backend(module, params, _loader.device_capability())
    inst = mx.find(module, params)
    return inst.uri in _install.shipped_uris(module)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from . import _matrix

        return _matrix.matrix().version
    raise AttributeError(f"module 'flashgen' has no attribute {name!r}")
