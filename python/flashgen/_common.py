"""Shared helpers of the public kernel functions: reading and validating tensors, resolving the
variant and its parameters, finding the instance, allocating outputs and workspace with the
caller's framework, and launching on the caller's stream.

Every check runs before anything touches the GPU; errors are ValueError/TypeError that name the
function, the argument and the values that would be accepted. Decode and (later) prefill
functions are thin layers over this module.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Mapping, Sequence

from . import _cuda, _loader
from ._errors import KernelError
from ._matrix import matrix
from ._tensor import KDL_CUDA, Framework, Tensor, framework_of
from ._variant import ParamPacker, Variant

__all__ = [
    "KV_LAYOUTS", "read_tensors", "check_dtypes", "check_last_dim_contiguous", "check_layout",
    "resolve_variant", "instance_for", "Workspaces", "default_sm_scale",
]

KV_LAYOUTS = ("NHD", "HND")
ATTN_DTYPES = ("f16", "bf16")


def check_layout(what: str, kv_layout: Any) -> str:
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"{what}: kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {kv_layout!r}")
    return str(kv_layout)


def read_tensors(what: str, named: Mapping[str, Any],
                 optional: Sequence[str] = ("out",)) -> tuple[dict[str, Tensor], Framework, int]:
    """Describe each tensor; all must be CUDA tensors on one device, and only the ``optional``
    ones may be None. Returns (tensors, the first tensor's framework, device ordinal)."""
    missing = [n for n, obj in named.items() if obj is None and n not in optional]
    if missing:
        raise TypeError(
            f"{what}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required: "
            "pass a CUDA tensor (torch, cupy or any DLPack producer), got None"
        )
    out: dict[str, Tensor] = {}
    fw: Framework | None = None
    device = -1
    first = ""
    for name, obj in named.items():
        if obj is None:
            continue
        f = framework_of(obj)
        t = f.describe(obj, f"{what}: {name}")
        if t.device_type != KDL_CUDA:
            raise ValueError(
                f"{what}: {name} is on {t.device}; flashgen kernels run on CUDA devices, so every "
                "tensor must be on the GPU (torch: .cuda(), cupy arrays are always on it)"
            )
        if fw is None:
            fw, device, first = f, t.device_id, name
        elif t.device_id != device:
            raise ValueError(
                f"{what}: {name} is on cuda:{t.device_id} but {first} is on cuda:{device}; "
                "all tensors must be on the same device"
            )
        out[name] = t
    if fw is None:
        raise TypeError(f"{what}: no tensor given")
    return out, fw, device


def check_dtypes(what: str, ts: Mapping[str, Tensor], names: Sequence[str]) -> str:
    """All ``names`` share one attention dtype (f16 or bf16); returns it."""
    first = names[0]
    dtype = ts[first].dtype
    if dtype not in ATTN_DTYPES:
        raise TypeError(f"{what}: {first} must be float16 or bfloat16, got {dtype}")
    for n in names[1:]:
        if n in ts and ts[n].dtype != dtype:
            raise TypeError(f"{what}: {n} is {ts[n].dtype} but {first} is {dtype}; they must match")
    return dtype


def check_int32(what: str, ts: Mapping[str, Tensor], names: Sequence[str]) -> None:
    for n in names:
        t = ts[n]
        if t.dtype != "i32":
            raise TypeError(f"{what}: {n} must be an int32 tensor, got {t.dtype}")
        if len(t.shape) != 1:
            raise ValueError(f"{what}: {n} must be 1-D, got shape {list(t.shape)}")
        if t.shape[0] > 1 and t.strides[0] != 1:
            raise ValueError(f"{what}: {n} must be contiguous (stride {t.strides[0]})")


def check_ndim(what: str, name: str, t: Tensor, ndim: int, layout: str) -> None:
    if len(t.shape) != ndim:
        raise ValueError(f"{what}: {name} must be {ndim}-D {layout}, got shape {list(t.shape)}")


def check_last_dim_contiguous(what: str, ts: Mapping[str, Tensor], names: Sequence[str]) -> None:
    for n in names:
        t = ts.get(n)
        if t is not None and t.shape[-1] > 1 and t.strides[-1] != 1:
            raise ValueError(
                f"{what}: {n} must be contiguous in its last (head_dim) dimension, got strides "
                f"{list(t.strides)}; call .contiguous() on it"
            )


def check_gqa(what: str, num_qo_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads <= 0 or num_qo_heads % num_kv_heads != 0:
        raise ValueError(
            f"{what}: num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads "
            f"({num_kv_heads}) for grouped-query attention"
        )


def default_sm_scale(head_dim: int, sm_scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


_packers: dict[Any, ParamPacker] = {}


def resolve_variant(what: str, module: str, variant: Any,
                    variant_params: Mapping[str, Any]) -> tuple[str, Variant | None, ParamPacker]:
    """(variant name for the ``variant`` axis, the custom Variant or None, its param packer)."""
    if isinstance(variant, Variant):
        packer = _packers.get(variant)
        if packer is None:
            mx = matrix()
            if variant.name in mx.variants:
                raise ValueError(
                    f"{what}: the custom variant's name {variant.name!r} is a built-in variant's; "
                    "give it another name"
                )
            packer = _packers[variant] = ParamPacker(variant.name, variant.params)
        packer.check_names(variant_params, what)
        return variant.name, variant, packer
    if not isinstance(variant, str):
        raise TypeError(
            f"{what}: variant must be a built-in variant name or a flashgen.Variant, got "
            f"{type(variant).__name__}"
        )
    packer = _packers.get(variant)
    if packer is None:
        mx = matrix()
        axis = mx.module(module).variant_axis
        names = list(axis.values) if axis is not None else list(mx.variants)
        if variant not in names or variant not in mx.variants:
            raise ValueError(
                f"{what}: unknown variant {variant!r}; built-in variants: {', '.join(names)}, "
                "or pass a flashgen.Variant"
            )
        packer = _packers[variant] = ParamPacker(variant, mx.variants[variant])
    packer.check_names(variant_params, what)
    return variant, None, packer


_instances: dict[tuple[Any, ...], _loader.Loaded] = {}


def instance_for(what: str, module: str, params: dict[str, Any], custom: Variant | None,
                 device: int) -> _loader.Loaded:
    """The loaded instance for these params (validated against the matrix on first use; without
    the module's backend axis, the loader takes the best backend the device runs)."""
    key = (module, tuple(params.values()), custom, device)
    hit = _instances.get(key)
    if hit is not None:
        return hit
    mx = matrix()
    backend = mx.module(module).backend_axis
    if custom is not None:
        mx.check_custom(module, {k: v for k, v in params.items() if k != "variant"}, what=what)
    elif backend is not None and backend not in params:
        mx.check_partial(module, params, (backend,), what=what)  # the loader picks the backend
    else:
        mx.find(module, params, what=what)
    _cuda.driver()  # a clear NoGPUError before any build or launch when there is no driver
    loaded = _loader.load(module, params, custom, device, what=what)
    _instances[key] = loaded
    return loaded


class Workspaces:
    """Split-KV workspace, allocated once per (framework, device, stream) by the caller's
    framework and grown when a call needs more.

    A call holds its stream's workspace from taking it until its kernels are enqueued
    (:meth:`acquire`, then release after the launch). Two reasons, both about threads that share a
    stream: one call's kernels pass tables to each other through the workspace (a plan
    kernel writes what the main kernel reads), so a second call's kernels enqueued between them
    would overwrite those tables; and growing the buffer drops the old one, which the framework's
    allocator may hand to the next allocation while another thread is about to launch on its
    address. Once enqueued, the stream orders every later use of the same memory after them, so
    the hold ends with the launch, not with the kernels.
    """

    class _Slot:
        """One stream's workspace: its lock, and the buffer (kept alive), address and size the
        holder of the lock may read or grow."""

        __slots__ = ("lock", "buf", "ptr", "size")

        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.buf: Any = None
            self.ptr = 0
            self.size = 0

    def __init__(self) -> None:
        self._slots: dict[tuple[str, int, int], Workspaces._Slot] = {}
        self._slots_lock = threading.Lock()

    def acquire(self, fw: Framework, device: int, stream: int, nbytes: int,
                what: str) -> tuple[threading.Lock, int, int]:
        """Holds ``stream``'s workspace of at least ``nbytes`` (``nbytes`` > 0) for one launch:
        returns the held lock, the address and the size; the caller releases the lock once its
        kernels are enqueued (or the launch failed)."""
        key = (fw.name, device, stream)
        slot = self._slots.get(key)  # one lookup on every call but a stream's first
        if slot is None:
            with self._slots_lock:
                slot = self._slots.setdefault(key, Workspaces._Slot())
        lock = slot.lock
        lock.acquire()
        if slot.size < nbytes:
            try:
                size = max(nbytes, slot.size * 2)
                size = (size + (1 << 20) - 1) & ~((1 << 20) - 1)
                buf = fw.empty((size,), "u8", device, what)
                slot.buf, slot.ptr, slot.size = buf, fw.describe(buf, "workspace").ptr, size
            except BaseException:
                lock.release()
                raise
        return lock, slot.ptr, slot.size

    def clear(self) -> None:
        with self._slots_lock:
            self._slots.clear()


WORKSPACES = Workspaces()


def check_out(what: str, name: str, t: Tensor, shape: Sequence[int], dtype: str, device: int) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what}: {name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{what}: {name} must be {dtype}, got {t.dtype}")
    if t.device_type != KDL_CUDA or t.device_id != device:
        raise ValueError(f"{what}: {name} is on {t.device}, the inputs on cuda:{device}")


_ws_sizes: dict[tuple[Any, ...], int] = {}


def workspace_bytes(what: str, loaded: _loader.Loaded, module: str, fields: Mapping[str, Any]) -> int:
    """``flashgen_<module>_workspace_size`` for the arguments struct ``fields`` fill (memoized per
    instance and fields); a nonzero status raises KernelError."""
    key = (loaded.uri, loaded.path, tuple(sorted(fields.items())))
    hit = _ws_sizes.get(key)
    if hit is not None:
        return hit
    from ._kernels import StatusError, args_struct

    try:
        n = _ws_sizes[key] = int(loaded.kernels.workspace_size(module, args_struct(module)(**fields)))
        return n
    except StatusError as exc:
        raise KernelError(f"{what} ({loaded.uri}): {exc}") from None


def _reset_for_tests() -> None:
    _packers.clear()
    _instances.clear()
    _ws_sizes.clear()
    WORKSPACES.clear()
