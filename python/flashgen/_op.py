"""One generic path from a kernel function's arguments to its launch, driven by a declaration.

Each public kernel function is a ``Spec``: its tensors with symbolic dimensions per KV layout
(``("L", "Hk", "D")`` for NHD, ``("Hk", "L", "D")`` for HND), its index tensors, its output and
LSE shapes, which axes of the matrix the symbols and options choose, and how the module's
arguments struct (declared once in variants.json, mirrored by ``_kernels.args_struct``) is filled:
sizes by symbol, strides by (tensor, symbol), runtime codes by axis. ``call`` validates everything
before any launch (every error names the function, the argument and what would be accepted),
finds the instance, and launches through a ``Plan``; a later call with torch tensors of the same
shapes, strides, dtypes and devices and the same options reuses the plan and only reads data
pointers, the stream and the variant's parameters.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from . import _common as C
from . import _cuda, _fp8
from ._errors import KernelError
from ._kernels import StatusError, args_decl, args_struct, call_fields, entry_name
from ._matrix import matrix
from ._tensor import Tensor, allocator_for, describe, torch_tensor_type
from ._variant import ParamPacker, Variant

__all__ = ["T", "Stride", "Spec", "call"]

_addressof = ctypes.addressof

# What each dimension symbol means, for error messages.
SYMBOLS = {
    "Hq": "num_qo_heads", "Hk": "num_kv_heads", "D": "head_dim", "L": "kv_len", "Lq": "qo_len",
    "B": "batch", "P": "page_size", "Np": "num_pages", "Ni": "num_page_ids", "Tq": "total_q",
    "Tk": "total_kv",
}


class T(NamedTuple):
    """A tensor argument: ``dims`` maps a KV layout (or ``"*"``) to its dimension symbols; a
    digit is a fixed size, ``"B+1"`` a symbol plus a constant. ``kind`` is ``"attn"`` (f16/bf16,
    one dtype for all, last dimension contiguous), ``"cache"`` (a KV cache: the attn dtype or an
    fp8 type, last dimension contiguous; an axis ``"@<name>"`` is its ``kv_dtype``, see _fp8) or
    ``"i32"`` (1-D contiguous int32)."""

    name: str
    dims: Mapping[str, tuple[str, ...]]
    kind: str = "attn"
    field: str | None = None  # the args struct field, when it is not ``name``
    optional: bool = False

    def dims_for(self, layout: str) -> tuple[str, ...]:
        return self.dims.get(layout) or self.dims["*"]


class Stride(NamedTuple):
    """The stride (in elements) of ``tensor`` along the dimension labelled ``symbol``."""

    tensor: str
    symbol: str


class Spec(NamedTuple):
    name: str  # the public function (for messages)
    module: str
    inputs: tuple[T, ...]  # in the order of the struct's per-call fields
    out: tuple[str, ...]  # o's dimensions (o takes the inputs' dtype)
    lse: tuple[str, ...]  # the LSE's dimensions (float32)
    axes: Mapping[str, str]  # axis -> a symbol, or "$dtype" / "$<option>" / "@<cache tensor>"
    fields: Mapping[str, Any]  # struct field -> a symbol, a Stride, or a constant
    checks: tuple[Callable[[str, dict[str, int]], None], ...] = ()
    # (what, *option values) -> the checked options (axes by "$name", struct fields by name); run
    # on the checked path only, so the plan key holds the raw values.
    options: Callable[..., dict[str, Any]] = lambda what: {}
    uses_layout: bool = True
    # (what, axis values, checked options): combinations of them that no instance serves.
    check_params: Callable[[str, Mapping[str, Any], Mapping[str, Any]], None] = lambda what, p, o: None


def _describe_dims(t: T, layout: str) -> str:
    return "[" + ", ".join(SYMBOLS.get(s, s).replace("+", " + ") for s in t.dims_for(layout)) + "]"


def rope_options(what: str, pos_encoding: Any, rope_theta: Any, rope_scale: Any) -> dict[str, Any]:
    """The ``pos_encoding`` option (an axis) and the RoPE parameters (struct fields), checked."""
    try:
        theta, scale = float(rope_theta), float(rope_scale)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: rope_theta and rope_scale must be numbers, got {rope_theta!r} and "
                        f"{rope_scale!r}") from None
    if not (theta > 0 and scale > 0):
        raise ValueError(f"{what}: rope_theta and rope_scale must be positive, got {theta} and {scale}")
    return {"pos_encoding": pos_encoding, "rope_theta": theta, "rope_scale": scale}


def gqa(what: str, sym: dict[str, int]) -> None:
    C.check_gqa(what, sym["Hq"], sym["Hk"])


def at_least(symbol: str, low: int) -> Callable[[str, dict[str, int]], None]:
    def check(what: str, sym: dict[str, int]) -> None:
        if sym[symbol] < low:
            raise ValueError(f"{what}: {SYMBOLS.get(symbol, symbol)} must be at least {low}, got {sym[symbol]}")
    return check


class _Bound:
    """Dimension symbols as the tensors bind them, with who bound each first."""

    def __init__(self, what: str, layout: str) -> None:
        self.what = what
        self.layout = layout
        self.values: dict[str, int] = {}
        self.by: dict[str, str] = {}
        self.derived: list[tuple[str, str, int, int]] = []  # (tensor, base symbol, offset, got)

    def bind(self, t: T, d: Tensor) -> None:
        dims = t.dims_for(self.layout)
        if len(d.shape) != len(dims):
            raise ValueError(f"{self.what}: {t.name} must be {len(dims)}-D "
                             f"{_describe_dims(t, self.layout)} ({self.layout}), got shape {list(d.shape)}"
                             if t.kind == "attn" else
                             f"{self.what}: {t.name} must be {len(dims)}-D, got shape {list(d.shape)}")
        for i, (s, n) in enumerate(zip(dims, d.shape)):
            if s.isdigit():
                if n != int(s):
                    raise ValueError(f"{self.what}: {t.name}'s dimension {i} must be {s} "
                                     f"{_describe_dims(t, self.layout)}, got shape {list(d.shape)}")
            elif "+" in s:
                base, off = s.split("+")
                if base in self.values:
                    self.derived.append((t.name, base, int(off), n))
                else:  # the first tensor to name it binds it
                    self.values[base] = n - int(off)
                    self.by[base] = t.name
            elif s in self.values:
                if self.values[s] != n:
                    raise ValueError(f"{self.what}: {t.name} has {SYMBOLS.get(s, s)} {n} but "
                                     f"{self.by[s]} has {self.values[s]}")
            else:
                self.values[s] = n
                self.by[s] = t.name

    def finish(self) -> dict[str, int]:
        for name, base, off, got in self.derived:
            want = self.values[base] + off
            if got != want:
                raise ValueError(f"{self.what}: {name} must have {SYMBOLS.get(base, base)} + {off} = {want} "
                                 f"entries, got {got}")
        return self.values


# -- the plan: a validated call, ready to launch again -----------------------------------------


class Plan:
    """Everything a validated call derived from its arguments: the entry point, a template of its
    arguments struct with every per-shape field filled, and how to read the rest.

    A launch writes the per-call fields (the struct's leading block of 8-byte words: inputs,
    outputs, stream, variant parameters, workspace) into the calling thread's own copy of the
    template and passes its address: threads sharing a plan never share a struct.
    """

    __slots__ = ("what", "module", "loaded", "fn", "args_type", "template", "tls", "pack", "packer",
                 "stream", "alloc", "ptr_of", "device", "ws_bytes", "dtype", "out_shape", "lse_shape",
                 "guard", "sizes")

    def __init__(self, what: str, module: str, loaded: Any, fields: dict[str, Any],
                 packer: ParamPacker | None, fw: Any, alloc: Any, device: int, ws_bytes: int,
                 dtype: str, out_shape: tuple[int, ...], lse_shape: tuple[int, ...] | None) -> None:
        self.what = what
        self.module = module
        self.loaded = loaded
        self.fn = loaded.kernels.entry(module)
        self.args_type = args_struct(module)
        self.template = bytes(self.args_type(**fields))
        self.tls = threading.local()
        n_inputs = len(call_fields(module)) - 6  # o, lse, stream, params, workspace, its size
        self.pack = struct.Struct(f"@{n_inputs + 5}Qq").pack_into
        self.packer = packer if packer is not None and packer.struct_type is not None else None
        self.stream = fw.stream_getter()
        self.alloc = alloc
        self.ptr_of = alloc.ptr
        self.device = device
        self.ws_bytes = ws_bytes
        self.dtype = dtype
        self.out_shape = out_shape
        self.lse_shape = lse_shape
        self.guard = _cuda.needs_guard()
        self.sizes = fields  # what a pointer parameter's ``len`` names

    def _bind(self) -> tuple[Any, int]:
        a = self.args_type.from_buffer_copy(self.template)
        s = self.tls.s = (a, _addressof(a))
        return s

    def run(self, out: Any, o_ptr: int, lse: Any, lse_ptr: int, workspace: tuple[int, int] | None,
            variant_params: dict[str, Any], *ptrs: int) -> Any:
        """Launch on the current stream with input addresses ``ptrs`` (in the struct's order),
        output ``out`` at ``o_ptr`` and, with ``return_lse``, ``lse`` at ``lse_ptr`` (each
        allocated here when None). ``workspace``: the caller's (address, bytes), or None for the
        stream's shared one (``_common.WORKSPACES``)."""
        device = self.device
        params = None
        ap = 0
        if self.packer is not None:
            what = self.what
            params, keep = self.packer.pack(variant_params, what, device,
                                            lambda x, n: describe(x, f"{what}: {n}"), self.sizes)
            ap = _addressof(params)
        stream = self.stream(device)
        if out is None:
            out = self.alloc.empty(self.out_shape, self.dtype, device, self.what)
            o_ptr = self.ptr_of(out)
        if self.lse_shape is not None and lse is None:
            lse = self.alloc.empty(self.lse_shape, "f32", device, self.what)
            lse_ptr = self.ptr_of(lse)
        try:
            a, addr = self.tls.s
        except AttributeError:
            a, addr = self._bind()
        held = None
        if not self.ws_bytes:
            ws, ws_size = 0, 0
        elif workspace is None:
            held, ws, ws_size = C.WORKSPACES.acquire(self.alloc, device, stream, self.ws_bytes, self.what)
        else:
            ws, ws_size = workspace
        try:
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
        finally:
            if held is not None:
                held.release()  # enqueued: the stream orders any later use of the workspace
        if status:
            self._fail(status)
        del params  # the additional params are read during the call only
        return (out, lse) if self.lse_shape is not None else out

    def _fail(self, status: int) -> None:
        kern = self.loaded.kernels
        exc = StatusError(status, entry_name("kernel", self.module), kern.last_error(), kern.path)
        raise KernelError(f"{self.what} ({self.loaded.uri}): {exc}") from None


# Per-spec plans for plain torch tensors, keyed by every input the checks read, so a plan never
# skips a check that could fail.
_PLANS: dict[str, dict[tuple[Any, ...], Plan]] = {}
_MAX_PLANS = 4096


def shared_plans(spec: Spec) -> dict[tuple[Any, ...], Plan]:
    """The plan cache of ``spec``'s functional calls, which take the stream's shared workspace:
    ``call`` without ``plans`` (single_decode, single_prefill) and the wrapper classes' one-shots
    (the batch functions, ``_wrappers._Wrapper._call``). A reset clears it in place."""
    return _PLANS.setdefault(spec.name, {})


def call(spec: Spec, tensors: Sequence[Any], out: Any, kv_layout: str, variant: str | Variant,
         sm_scale: float | None, return_lse: bool, option_values: tuple[Any, ...],
         variant_params: dict[str, Any], backend: str | None = None, *,
         plans: dict[tuple[Any, ...], Plan] | None = None, lse: Any = None,
         workspace: tuple[int, int] | None = None, expect: Mapping[str, Any] | None = None,
         what: str | None = None) -> Any:
    """Validate, find the instance, launch. ``tensors`` are the values of ``spec.inputs`` in
    order; ``option_values`` are the function's extra options (``causal``, ``pos_encoding``, RoPE
    parameters) as ``spec.options`` takes them; ``backend`` names the module's implementation
    (None: the best one the device runs, chosen by the loader).

    The engine-facing wrappers (``_wrappers``), on which the batch functions are built, call
    this with their ``plans`` cache (None: ``shared_plans(spec)``), their ``workspace`` (the
    caller's (address, bytes), or None: the stream's shared one), an optional ``lse`` output,
    ``expect``: what their plan() declared (dimension symbols, ``"dtype"``), which the tensors
    must match, and ``what``: the name errors give (None: the spec's function)."""
    if plans is None:
        plans = _PLANS.get(spec.name)
        if plans is None:
            plans = shared_plans(spec)
    if lse is not None:
        return_lse = True
    key = None
    tt = _torch_type[0] if _torch_type else _torch_tensor_type()
    if tt is not None and (out is None or out.__class__ is tt) and (lse is None or lse.__class__ is tt):
        parts: list[Any] = []
        ptrs: list[int] = []
        add_part, add_ptr = parts.append, ptrs.append
        for t in tensors:
            if t.__class__ is tt:
                add_part((t.shape, t.stride(), t.dtype, t.get_device()))
                add_ptr(t.data_ptr())
            elif t is None:
                add_part(None)
                add_ptr(0)
            else:
                break
        else:
            okey = None if out is None else (out.shape, out.stride(), out.dtype, out.get_device())
            lkey = None if lse is None else (lse.shape, lse.stride(), lse.dtype, lse.get_device())
            key = (tuple(parts), okey, lkey, kv_layout, variant, sm_scale, return_lse, option_values,
                   tuple(variant_params) if variant_params else (), backend)
            try:
                plan = plans.get(key)
            except TypeError:  # an unhashable argument: the checked path reports it
                plan = key = None
            if plan is not None:
                return plan.run(out, 0 if out is None else out.data_ptr(), lse,
                                0 if lse is None else lse.data_ptr(), workspace, variant_params, *ptrs)
    what = what or spec.name
    options = spec.options(what, *option_values)
    plan, ptrs, o_ptr, out, lse_ptr = _plan(spec, tensors, out, lse, kv_layout, variant, sm_scale,
                                            return_lse, options, variant_params, backend, expect, what)
    if workspace is not None:
        check_workspace(plan.what, plan.ws_bytes, workspace)
    res = plan.run(out, o_ptr, lse, lse_ptr, workspace, variant_params, *ptrs)
    if key is not None:
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plans[key] = plan
    return res


_torch_type: list[Any] = []


def _torch_tensor_type() -> Any:
    """torch.Tensor once torch is imported (remembered from then on), else None."""
    tt = torch_tensor_type()
    if tt is not None:
        _torch_type.append(tt)
    return tt


def _plan(spec: Spec, tensors: Sequence[Any], out: Any, lse: Any, kv_layout: str, variant: Any,
          sm_scale: float | None, return_lse: bool, options: Mapping[str, Any],
          variant_params: dict[str, Any], backend: str | None, expect: Mapping[str, Any] | None,
          what: str) -> tuple[Plan, list[int], int, Any, int]:
    inputs = [t.field or t.name for t in spec.inputs]
    if inputs != list(call_fields(spec.module)[:len(inputs)]):  # pragma: no cover - a spec bug
        raise AssertionError(f"{what}: inputs {inputs} are not the leading per-call fields of "
                             f"{spec.module}'s args {call_fields(spec.module)}")
    layout = C.check_layout(what, kv_layout) if spec.uses_layout else "*"
    named = {t.name: v for t, v in zip(spec.inputs, tensors)}
    named["out"] = out
    named["lse"] = lse
    optional = tuple(t.name for t in spec.inputs if t.optional) + ("out", "lse")
    ts, fw, device = C.read_tensors(what, named, optional)
    bound = _Bound(what, layout)
    attn = [t.name for t in spec.inputs if t.kind == "attn"]
    for t in spec.inputs:
        if t.name in ts:
            bound.bind(t, ts[t.name])
    dtype = C.check_dtypes(what, ts, attn + ["out"])
    C.check_int32(what, ts, [t.name for t in spec.inputs if t.kind == "i32" and t.name in ts])
    sym = bound.finish()
    if expect:
        _check_expected(what, expect, sym, bound.by, dtype, ts)
    for check in spec.checks:
        check(what, sym)
    caches = [t.name for t in spec.inputs if t.kind == "cache"]
    C.check_last_dim_contiguous(what, ts, attn + caches + ["out"])
    out_shape = tuple(sym[s] for s in spec.out)
    if out is not None:
        C.check_out(what, "out", ts["out"], out_shape, dtype, device)
    lse_shape = tuple(sym[s] for s in spec.lse) if return_lse else None
    if lse is not None and lse_shape is not None:
        C.check_out(what, "lse", ts["lse"], lse_shape, "f32", device)
        if not ts["lse"].is_contiguous():
            raise ValueError(f"{what}: lse must be contiguous, got strides {list(ts['lse'].strides)}")
    cache_dtypes = {name: ts[name].dtype for name in caches if name in ts}
    _fp8.check_caches_agree(what, cache_dtypes)
    packer, params, custom = instance_params(spec, what, sym, dtype, options, variant, variant_params, backend,
                                             device, cache_dtypes)
    loaded = C.instance_for(what, spec.module, params, custom, device)
    alloc = allocator_for(fw)
    o = out if out is not None else alloc.empty(out_shape, dtype, device, what)
    to = ts["out"] if out is not None else alloc.describe(o, "out")
    described = dict(ts, o=to)

    def stride(tensor: str, dims: tuple[str, ...], symbol: str) -> int:
        return described[tensor].strides[dims.index(symbol)]

    fields = fill_fields(spec, layout, sym, stride, loaded, options, sm_scale)
    ws_bytes = C.workspace_bytes(what, loaded, spec.module, fields)
    plan = Plan(what, spec.module, loaded, fields, packer, fw, alloc, device, ws_bytes, dtype,
                out_shape, lse_shape)
    ptrs = [ts[t.name].ptr if t.name in ts else 0 for t in spec.inputs]
    return plan, ptrs, to.ptr, o, ts["lse"].ptr if lse is not None else 0


def instance_params(spec: Spec, what: str, sym: Mapping[str, int], dtype: str, options: Mapping[str, Any],
                    variant: Any, variant_params: dict[str, Any], backend: str | None,
                    device: int, cache_dtypes: Mapping[str, str] | None = None,
                    ) -> tuple[ParamPacker, dict[str, Any], Variant | None]:
    """The variant's parameter packer (the parameters checked), the instance's axis values and
    the custom variant (or None) for a call of ``spec`` with these sizes, dtype and options.
    ``cache_dtypes``: the dtype of each cache tensor (kind ``"cache"``); one left out is ``dtype``."""
    vname, custom, packer = C.resolve_variant(what, spec.module, variant, variant_params)
    params: dict[str, Any] = {}
    for axis, src in spec.axes.items():
        if src.startswith("@"):
            name = src[1:]
            params[axis] = _fp8.cache_dtype(what, name, (cache_dtypes or {}).get(name, dtype), dtype)
        else:
            params[axis] = dtype if src == "$dtype" else options[src[1:]] if src.startswith("$") else sym[src]
    spec.check_params(what, params, options)
    params["variant"] = vname
    if backend is not None:
        backend_axis = matrix().module(spec.module).backend_axis
        if backend_axis is None:
            raise ValueError(f"{what}: backend={backend!r}, but {spec.module} has one implementation "
                             "(its matrix declares no backend axis); leave backend unset")
        params[backend_axis] = backend  # checked against the device by the loader
    # The sizes a pointer parameter's ``len`` may name (a wrapper's plan() may not know them all).
    sizes = {name: sym[src] for name, src in spec.fields.items() if isinstance(src, str) and src in sym}
    packer.pack(variant_params, what, device, lambda x, n: describe(x, f"{what}: {n}"), sizes)  # checks them
    return packer, params, custom


def fill_fields(spec: Spec, layout: str, sym: Mapping[str, int],
                stride: Callable[[str, tuple[str, ...], str], int], loaded: Any,
                options: Mapping[str, Any], sm_scale: float | None) -> dict[str, Any]:
    """The arguments struct's shape fields: sizes by symbol, ``stride(tensor, its dims, symbol)``,
    the instance's runtime codes, the options that are fields, and the softmax scale."""
    struct_fields = {f["name"] for f in args_decl(spec.module)["shape"]}
    fields: dict[str, Any] = {}
    for name, src in spec.fields.items():
        if isinstance(src, Stride):
            dims = spec.out if src.tensor == "o" else next(
                x for x in spec.inputs if x.name == src.tensor).dims_for(layout)
            fields[name] = stride(src.tensor, dims, src.symbol)
        elif isinstance(src, str):
            fields[name] = sym[src]
        else:
            fields[name] = src
    for axis, code in loaded.codes.items():
        if f"{axis}_code" in struct_fields:
            fields[f"{axis}_code"] = code
    for name, value in options.items():
        if name in struct_fields:
            fields[name] = value
    fields["sm_scale"] = C.default_sm_scale(sym["D"], sm_scale)
    return fields


def check_workspace(what: str, need: int, workspace: tuple[int, int]) -> None:
    """A caller's workspace (address, bytes) holds ``need`` bytes, or a ValueError says what."""
    if need > workspace[1]:
        raise ValueError(f"{what}: this batch needs a workspace of {need} bytes but workspace_buffer "
                         f"holds {workspace[1]}; construct the wrapper with a larger buffer")


def _check_expected(what: str, expect: Mapping[str, Any], sym: Mapping[str, int],
                    bound_by: Mapping[str, str], dtype: str, ts: Mapping[str, Tensor]) -> None:
    """The tensors of a wrapper's run() against what its plan() was given: sizes by symbol,
    ``"dtype"`` (q's) and ``"@<tensor>"`` (that tensor's dtype)."""
    for s, want in expect.items():
        got: Any
        if s.startswith("@"):
            source, name, got = s[1:], "dtype", ts[s[1:]].dtype
        else:
            got = dtype if s == "dtype" else sym.get(s)
            name = SYMBOLS.get(s, s)
            source = "q" if s == "dtype" else bound_by.get(s, "the tensors")
        if got != want:
            raise ValueError(f"{what}: {source} has {name} {got} but plan() was given {want}; "
                             "call plan() again for this shape")


def _reset_for_tests() -> None:
    for plans in _PLANS.values():  # in place: the wrapper classes hold theirs
        plans.clear()
    _torch_type.clear()
