"""ctypes mirror of include/flashgen/abi.h: binds one kernel module's entry points (stdlib only).

A ``KernelLibrary`` wraps one instance ``.so``. Each entry point the library exports is bound once
with exact argument types. A kernel entry point (ABI version 2) takes one pointer to its
arguments struct, mirrored here field for field (``SingleDecodeArgs``, ``BatchDecodeArgs``; the
test suite checks sizes and offsets against abi.h compiled by the host C compiler); it is
declared ``c_void_p`` so callers pass the struct's address as a plain int, the cheapest
conversion ctypes has. A nonzero status raises ``FlashgenError`` carrying
``flashgen_last_error()``.
"""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_float, c_int, c_int64, c_void_p
from typing import Callable, Dict, Sequence, Tuple

ABI_VERSION = 2

OK = 0
INVALID_ARGUMENT = 1
NO_INSTANCE = 2
WORKSPACE_TOO_SMALL = 3
CUDA_ERROR = 4
STATUS_NAMES = {
    OK: "OK",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NO_INSTANCE: "NO_INSTANCE",
    WORKSPACE_TOO_SMALL: "WORKSPACE_TOO_SMALL",
    CUDA_ERROR: "CUDA_ERROR",
}

_P, _I, _F = c_void_p, c_int64, c_float
_I64P = ctypes.POINTER(c_int64)


class SingleDecodeArgs(ctypes.Structure):
    """``FlashgenSingleDecodeArgs`` of abi.h: the same fields, types and order."""

    _fields_ = [
        ("q", _P), ("k", _P), ("v", _P), ("o", _P), ("lse", _P), ("stream", _P),
        ("additional_params", _P), ("workspace", _P), ("workspace_bytes", _I),
        ("num_qo_heads", _I), ("num_kv_heads", _I), ("kv_len", _I), ("head_dim", _I),
        ("q_stride_h", _I), ("k_stride_n", _I), ("k_stride_h", _I), ("v_stride_n", _I),
        ("v_stride_h", _I), ("o_stride_h", _I), ("dtype_code", _I), ("variant_code", _I),
        ("sm_scale", _F),
    ]


class BatchDecodeArgs(ctypes.Structure):
    """``FlashgenBatchDecodeArgs`` of abi.h: the same fields, types and order."""

    _fields_ = [
        ("q", _P), ("paged_kv", _P), ("kv_indptr", _P), ("kv_indices", _P),
        ("kv_last_page_len", _P), ("o", _P), ("lse", _P), ("stream", _P),
        ("additional_params", _P), ("workspace", _P), ("workspace_bytes", _I),
        ("batch_size", _I), ("num_qo_heads", _I), ("num_kv_heads", _I), ("head_dim", _I),
        ("page_size", _I), ("q_stride_b", _I), ("q_stride_h", _I), ("kv_stride_page", _I),
        ("kv_stride_kv", _I), ("kv_stride_n", _I), ("kv_stride_h", _I), ("o_stride_b", _I),
        ("o_stride_h", _I), ("dtype_code", _I), ("variant_code", _I), ("sm_scale", _F),
    ]


# The fields a call rewrites (the leading block of each struct, 8 bytes each, in order): the
# inputs' and outputs' addresses, the stream, the additional params, the workspace and its size.
CALL_FIELDS = {
    "single_decode": ("q", "k", "v", "o", "lse", "stream", "additional_params", "workspace",
                      "workspace_bytes"),
    "batch_decode": ("q", "paged_kv", "kv_indptr", "kv_indices", "kv_last_page_len", "o", "lse",
                     "stream", "additional_params", "workspace", "workspace_bytes"),
}
ARGS_STRUCTS = {"single_decode": SingleDecodeArgs, "batch_decode": BatchDecodeArgs}


def _check_call_block(module: str) -> None:
    st = ARGS_STRUCTS[module]
    got = [(getattr(st, n).offset, getattr(st, n).size) for n in CALL_FIELDS[module]]
    if got != [(8 * i, 8) for i in range(len(got))]:  # pragma: no cover - a 32-bit platform
        raise ImportError(f"flashgen: {st.__name__}'s per-call fields are not one block of 8-byte "
                          f"words on this platform: {got}")


for _m in CALL_FIELDS:
    _check_call_block(_m)

# name -> (restype, argtypes), in the order of abi.h.
SIGNATURES: Dict[str, Tuple[object, Tuple[object, ...]]] = {
    "flashgen_last_error": (c_char_p, ()),
    "flashgen_abi_version": (c_int, ()),
    "flashgen_single_decode_workspace_size": (c_int, (_I, _I, _I, _I, _I64P)),
    "flashgen_single_decode": (c_int, (_P,)),  # const FlashgenSingleDecodeArgs*
    "flashgen_single_decode_query": (c_int, (_P, _I, c_char_p, _I)),
    "flashgen_batch_decode_workspace_size": (c_int, (_I, _I, _I, _I, _I64P)),
    "flashgen_batch_decode": (c_int, (_P,)),  # const FlashgenBatchDecodeArgs*
    "flashgen_batch_decode_query": (c_int, (_P, _I, c_char_p, _I)),
}

class FlashgenError(RuntimeError):
    """A nonzero status from an entry point, with the module's last error message."""

    def __init__(self, status: int, entry: str, message: str, path: str = "") -> None:
        self.status = status
        self.status_name = STATUS_NAMES.get(status, f"status {status}")
        self.entry = entry
        self.message = message
        self.path = path
        where = f" ({path})" if path else ""
        super().__init__(f"{entry}: {self.status_name}: {message}{where}")


def params_struct(name: str, params: Sequence[dict]) -> type:
    """A ctypes Structure laid out like ADDITIONAL_PARAMS_DECL for ``params`` [{"name", "type"}],
    from the binary's type table (``_variant.ParamPacker``)."""
    from ._matrix import Param
    from ._variant import ParamPacker

    st = ParamPacker(name, [Param(p["name"], p["type"]) for p in params]).struct_type
    return st if st is not None else type(f"{name}_params", (ctypes.Structure,), {"_fields_": []})


class KernelLibrary:
    """One loaded instance `.so`; methods exist for the entry points it exports."""

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self._lib = ctypes.CDLL(self.path)
        self._fns: Dict[str, Callable] = {}
        for name, (restype, argtypes) in SIGNATURES.items():
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            self._fns[name] = fn
        if "flashgen_last_error" not in self._fns:
            raise OSError(f"{self.path}: not a flashgen module (no flashgen_last_error)")
        self._last_error = self._fns["flashgen_last_error"]
        version = self._fns["flashgen_abi_version"]()
        if version != ABI_VERSION:
            raise OSError(f"{self.path}: ABI version {version}, this package speaks {ABI_VERSION}")
        # Kernel entry points as checked callables taking the arguments struct (or its address).
        for name in ("flashgen_single_decode", "flashgen_batch_decode"):
            if name in self._fns:
                setattr(self, name[len("flashgen_"):], self._checked(self._fns[name], name))

    @property
    def entry_points(self) -> frozenset:
        return frozenset(self._fns)

    def has(self, name: str) -> bool:
        return name in self._fns or f"flashgen_{name}" in self._fns

    def last_error(self) -> str:
        return self._last_error().decode("utf-8", "replace")

    def _raise(self, status: int, entry: str) -> None:
        raise FlashgenError(status, entry, self.last_error(), self.path)

    def _checked(self, fn: Callable, entry: str) -> Callable:
        raise_ = self._raise
        addressof = ctypes.addressof

        def call(args) -> None:
            status = fn(args if args.__class__ is int else addressof(args))
            if status:
                raise_(status, entry)

        call.__name__ = entry
        return call

    def entry(self, name: str) -> Callable:
        """The bare ctypes function of entry point ``name`` (``flashgen_`` optional): a kernel
        entry takes the address of its arguments struct and returns the status."""
        return self._fn(name if name.startswith("flashgen_") else f"flashgen_{name}")

    def _fn(self, name: str) -> Callable:
        try:
            return self._fns[name]
        except KeyError:
            raise AttributeError(f"{self.path} does not export {name}") from None

    def workspace_size(self, module: str, *shape: int) -> int:
        """`flashgen_<module>_workspace_size(*shape, &bytes)` -> bytes."""
        name = f"flashgen_{module}_workspace_size"
        out = c_int64(0)
        status = self._fn(name)(*shape, ctypes.byref(out))
        if status:
            self._raise(status, name)
        return out.value

    def query(self, module: str, codes: Sequence[int]) -> str:
        """`flashgen_<module>_query`: the instantiation `codes` reach, as `axis=value ...`."""
        name = f"flashgen_{module}_query"
        arr = (c_int64 * len(codes))(*codes)
        buf = ctypes.create_string_buffer(512)
        status = self._fn(name)(ctypes.addressof(arr), len(codes), buf, len(buf))
        if status:
            self._raise(status, name)
        return buf.value.decode()


def load(path: str) -> KernelLibrary:
    return KernelLibrary(path)
