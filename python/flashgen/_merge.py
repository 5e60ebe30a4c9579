"""Merging attention states by their LSE: ``merge_state``, ``merge_state_in_place`` and
``merge_states`` (FlashInfer's functions of the same names), all three on the ``merge_state``
module.

A state is the attention output of some queries over one set of keys, ``v`` ``[n, num_heads,
head_dim]`` (float16 or bfloat16), with its LSE ``s`` ``[n, num_heads]`` (float32, natural log:
every flashgen function's ``return_lse``). The states of disjoint sets of keys merge into the
attention over their union: ``s = log(sum_k exp(s_k))``, ``v = sum_k exp(s_k - s) v_k``, in fp32
and rounded once. A state whose LSE is -inf (it saw no keys) weighs nothing; a row whose states
are all empty gets ``v = 0`` and ``s = -inf``.

Every check runs before anything touches the GPU, and a ValueError/TypeError names the function
and the argument. A call with torch tensors of the shapes, strides, dtypes and devices of an
earlier one reuses its plan (the instance and the arguments struct) and reads only the data
pointers and the stream.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Mapping

from . import _common as C
from . import _cuda
from ._errors import KernelError
from ._kernels import StatusError, args_struct, call_fields, entry_name
from ._tensor import Framework, Tensor, TensorLike, allocator_for, torch_tensor_type

__all__ = ["merge_state", "merge_state_in_place", "merge_states"]

MODULE = "merge_state"
MAX_HEAD_DIM = 4096  # the module's bound (csrc/merge_state.cu)
MAX_STATES = 65536
MAX_HEADS = 65536
MAX_ROWS = (1 << 31) - 1  # n * num_heads
MASK_DTYPES = ("bool", "u8")

# The per-call fields, in the struct's order (variants.json modules.merge_state.args.call).
CALL_FIELDS = ("v_a", "s_a", "v_b", "s_b", "mask", "v_out", "s_out", "stream")
_pack = struct.Struct(f"@{len(CALL_FIELDS)}Q").pack_into


def merge_state(v_a: TensorLike, s_a: TensorLike, v_b: TensorLike, s_b: TensorLike) -> tuple[Any, Any]:
    """Merge two attention states of the same queries over disjoint sets of keys.

    Args:
        v_a, v_b: ``[n, num_heads, head_dim]``, float16 or bfloat16 (one dtype), contiguous, on
            one CUDA device; ``head_dim`` a multiple of 8 up to 4096.
        s_a, s_b: their LSE, float32 ``[n, num_heads]``, contiguous, natural log (as
            ``return_lse=True`` gives it); -inf for a row that saw no keys.

    Returns:
        ``(v, s)``: the merged output, shaped and typed like ``v_a``, and its LSE, float32
        ``[n, num_heads]``, allocated by ``v_a``'s framework.
    """
    return _call("merge_state", {"v_a": v_a, "s_a": s_a, "v_b": v_b, "s_b": s_b}, None, None)


def merge_state_in_place(v: TensorLike, s: TensorLike, v_other: TensorLike, s_other: TensorLike,
                         mask: TensorLike | None = None) -> None:
    """Merge the state ``(v_other, s_other)`` into ``(v, s)``, overwriting ``v`` and ``s``.

    Args:
        v, s: the state to update: ``v`` ``[n, num_heads, head_dim]`` float16 or bfloat16, ``s``
            its LSE, float32 ``[n, num_heads]``; both contiguous.
        v_other, s_other: the state merged into it, shaped and typed likewise.
        mask: optional bool or uint8 ``[n]`` on the same device: rows whose entry is false (0)
            are left as they are, and their ``v_other``/``s_other`` are not read.
    """
    _call("merge_state_in_place", {"v": v, "s": s, "v_other": v_other, "s_other": s_other}, mask, (v, s))


def merge_states(v: TensorLike, s: TensorLike) -> tuple[Any, Any]:
    """Merge ``num_states`` states per row into one.

    Args:
        v: ``[n, num_states, num_heads, head_dim]``, float16 or bfloat16, contiguous;
            ``num_states`` from 1 to 65536.
        s: their LSE, float32 ``[n, num_states, num_heads]``, contiguous, natural log.

    Returns:
        ``(v, s)``: the merged output ``[n, num_heads, head_dim]`` (``v``'s dtype) and its LSE,
        float32 ``[n, num_heads]``.
    """
    return _call("merge_states", {"v": v, "s": s}, None, None)


# -- the plan: a checked call, ready to launch again -------------------------------------------


class _Plan:
    """What a checked call derived: the entry point, the arguments struct with its shape fields
    filled, and the outputs to allocate."""

    __slots__ = ("what", "uri", "kernels", "fn", "args_type", "template", "device", "dtype", "out_shape",
                 "lse_shape", "alloc", "stream", "guard")

    def __init__(self, what: str, loaded: Any, fields: Mapping[str, int], fw: Framework, device: int,
                 dtype: str, out_shape: tuple[int, ...]) -> None:
        self.what = what
        self.uri = loaded.uri
        self.kernels = loaded.kernels
        self.fn = self.kernels.entry(MODULE)
        self.args_type = args_struct(MODULE)
        self.template = bytes(self.args_type(**fields))
        self.device = device
        self.dtype = dtype
        self.out_shape = out_shape
        self.lse_shape = out_shape[:-1]
        self.alloc = allocator_for(fw)
        self.stream = fw.stream_getter()
        self.guard = _cuda.needs_guard()

    def run(self, ptrs: tuple[int, int, int, int, int], outs: tuple[Any, Any] | None) -> tuple[Any, Any]:
        """Launch on the current stream with the inputs at ``ptrs`` (v_a, s_a, v_b, s_b, mask);
        ``outs`` None: allocate the outputs here, else write them in place (v_a, s_a)."""
        if outs is None:
            alloc, device = self.alloc, self.device
            outs = (alloc.empty(self.out_shape, self.dtype, device, self.what),
                    alloc.empty(self.lse_shape, "f32", device, self.what))
            v_out, s_out = alloc.ptr(outs[0]), alloc.ptr(outs[1])
        else:
            v_out, s_out = ptrs[0], ptrs[1]
        a = self.args_type.from_buffer_copy(self.template)
        _pack(a, 0, *ptrs, v_out, s_out, self.stream(self.device))
        addr = ctypes.addressof(a)
        status = _cuda.call_on_device(self.device, self.fn, addr) if self.guard else self.fn(addr)
        if status:
            exc = StatusError(status, entry_name("kernel", MODULE), self.kernels.last_error(), self.kernels.path)
            raise KernelError(f"{self.what} ({self.uri}): {exc}") from None
        return outs


# Plans for plain torch tensors, keyed by every property the checks read but the addresses, whose
# alignment is checked on every call.
_PLANS: dict[tuple[Any, ...], _Plan] = {}
_MAX_PLANS = 1024


def _call(what: str, named: dict[str, Any], mask: Any, outs: tuple[Any, Any] | None) -> tuple[Any, Any]:
    """``named``: the states' tensors in the roles of the struct (v_a, s_a, then v_b, s_b when
    there are two); ``outs``: the tensors written in place, or None to allocate them."""
    tt = torch_tensor_type()
    key = None
    if tt is not None and all(t.__class__ is tt for t in named.values()) and (mask is None or mask.__class__ is tt):
        tensors = (*named.values(), mask)
        key = (what, *((t.shape, t.stride(), t.dtype, t.get_device()) if t is not None else None for t in tensors))
        plan = _PLANS.get(key)
        if plan is not None:
            ptrs = _addresses([t.data_ptr() for t in named.values()], 0 if mask is None else mask.data_ptr())
            if not (ptrs[0] | ptrs[2]) & 15:  # else the checked path says which is misaligned
                return plan.run(ptrs, outs)
    plan, ptrs = _plan(what, named, mask)
    res = plan.run(ptrs, outs)
    if key is not None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return res


def _addresses(states: list[int], mask: int) -> tuple[int, int, int, int, int]:
    """(v_a, s_a, v_b, s_b, mask): the states' addresses in the struct's roles, 0 for none."""
    v_b, s_b = states[2:4] if len(states) == 4 else (0, 0)
    return states[0], states[1], v_b, s_b, mask


def _plan(what: str, named: dict[str, Any], mask: Any) -> tuple[_Plan, tuple[int, int, int, int, int]]:
    """Check every argument and find the instance: the plan and the inputs' addresses."""
    ts, fw, device = C.read_tensors(what, {**named, "mask": mask}, optional=("mask",))
    names = list(named)
    v_names, s_names = names[0::2], names[1::2]
    dtype = C.check_dtypes(what, ts, v_names)
    stacked = len(names) == 2  # merge_states: one tensor of stacked states
    shape = _check_state(what, ts, v_names[0], s_names[0], 4 if stacked else 3)
    for v_name, s_name in zip(v_names[1:], s_names[1:]):
        other = _check_state(what, ts, v_name, s_name, 3)
        if other != shape:
            raise ValueError(f"{what}: {v_name} has shape {list(other)} but {v_names[0]} has "
                             f"{list(shape)}; the states must be of the same rows and heads")
    n, heads, head_dim = shape[0], shape[-2], shape[-1]
    states = shape[1] if stacked else 1
    if not 1 <= states <= MAX_STATES:
        raise ValueError(f"{what}: {v_names[0]} must hold 1 to {MAX_STATES} states per row (its dimension 1), "
                         f"got {states}")
    if not 1 <= heads <= MAX_HEADS or n * heads > MAX_ROWS:
        raise ValueError(f"{what}: num_heads must be 1 to {MAX_HEADS} and n * num_heads below 2^31, got "
                         f"n={n}, num_heads={heads}")
    if mask is not None:
        _check_mask(what, ts["mask"], n)
    if call_fields(MODULE) != CALL_FIELDS:  # pragma: no cover - variants.json and this file disagree
        raise AssertionError(f"{MODULE}'s per-call fields {call_fields(MODULE)} are not {CALL_FIELDS}")
    loaded = C.instance_for(what, MODULE, {"dtype": dtype}, None, device)
    fields = {"num_tokens": n, "num_states_a": states, "num_heads": heads, "head_dim": head_dim}
    fields.update({f"{axis}_code": code for axis, code in loaded.codes.items()})
    plan = _Plan(what, loaded, fields, fw, device, dtype, (n, heads, head_dim))
    return plan, _addresses([ts[name].ptr for name in names], ts["mask"].ptr if mask is not None else 0)


def _check_state(what: str, ts: Mapping[str, Tensor], v_name: str, s_name: str, ndim: int) -> tuple[int, ...]:
    """A state's values and LSE: their shapes, dtypes, contiguity and alignment; v's shape."""
    v, s = ts[v_name], ts[s_name]
    dims = "[n, num_states, num_heads, head_dim]" if ndim == 4 else "[n, num_heads, head_dim]"
    if len(v.shape) != ndim:
        raise ValueError(f"{what}: {v_name} must be {ndim}-D {dims}, got shape {list(v.shape)}")
    head_dim = v.shape[-1]
    if head_dim % 8 or not 8 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{what}: {v_name}'s head_dim must be a multiple of 8 from 8 to {MAX_HEAD_DIM} (rows "
                         f"are read as 16-byte vectors), got {head_dim}")
    _check_contiguous(what, v_name, v)
    if v.ptr % 16:
        raise ValueError(f"{what}: {v_name}'s data must be 16-byte aligned, got address {v.ptr:#x}; pass a "
                         "copy (.clone()) of a view that starts inside a row")
    if s.dtype != "f32":
        raise TypeError(f"{what}: {s_name} (the LSE of {v_name}) must be float32, got {s.dtype}")
    if tuple(s.shape) != tuple(v.shape[:-1]):
        lse_dims = dims.replace(", head_dim", "")
        raise ValueError(f"{what}: {s_name} must have shape {lse_dims} = {list(v.shape[:-1])} ({v_name}'s "
                         f"without head_dim), got {list(s.shape)}")
    _check_contiguous(what, s_name, s)
    return tuple(v.shape)


def _check_contiguous(what: str, name: str, t: Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{what}: {name} must be contiguous, got shape {list(t.shape)} with strides "
                         f"{list(t.strides)}; call .contiguous() on it")


def _check_mask(what: str, t: Tensor, n: int) -> None:
    if t.dtype not in MASK_DTYPES:
        raise TypeError(f"{what}: mask must be a bool or uint8 tensor, got {t.dtype}")
    if tuple(t.shape) != (n,):
        raise ValueError(f"{what}: mask must have shape [n] = [{n}], got {list(t.shape)}")
    _check_contiguous(what, "mask", t)


def _reset_for_tests() -> None:
    _PLANS.clear()
