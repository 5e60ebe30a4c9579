"""ctypes binding of flashgen's C ABI (include/flashgen/abi.h): one kernel module's entry points
(stdlib only).

A module's arguments struct is declared once, in variants.json (``modules.<m>.args``): the binary
generates the C struct from it, and ships the declaration in the matrix (``describe --json``),
from which ``args_struct(module)`` builds the ctypes mirror here (the test suite checks it
against the generated C header compiled by the host compiler). Every module exports the same
three entry points, ``flashgen_<m>(const Args*)``, ``flashgen_<m>_workspace_size(const Args*,
int64_t*)`` and ``flashgen_<m>_query``, so one binding serves all. Struct addresses travel as
plain ints (``c_void_p``), the cheapest conversion ctypes has. A nonzero status raises
``FlashgenError`` carrying ``flashgen_last_error()``.
"""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_int, c_int64, c_void_p
from typing import Any, Callable, Dict, Sequence, Tuple

ABI_VERSION = 3

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

_I64P = ctypes.POINTER(c_int64)

# The entry points every module exports, by suffix (restype, argtypes).
COMMON_SIGNATURES: Dict[str, Tuple[Any, tuple]] = {
    "flashgen_last_error": (c_char_p, ()),
    "flashgen_abi_version": (c_int, ()),
}
MODULE_SIGNATURES: Dict[str, Tuple[Any, tuple]] = {
    "": (c_int, (c_void_p,)),  # flashgen_<m>(const Args*)
    "_workspace_size": (c_int, (c_void_p, _I64P)),
    "_query": (c_int, (c_void_p, c_int64, c_char_p, c_int64)),
}

_structs: Dict[str, type] = {}


def _field_ctype(c_type: str) -> Any:
    if c_type.endswith("*"):
        return c_void_p
    from ._variant import ctype_of

    return ctype_of(c_type)[0]


def args_decl(module: str) -> Dict[str, Any]:
    """``{"call": [...], "shape": [...]}`` of ``module`` as the binary describes it."""
    from ._install import matrix_json

    decl = matrix_json()["modules"][module].get("args")
    if decl is None:
        raise KeyError(f"module {module!r} declares no args in variants.json")
    return decl


def args_struct(module: str) -> type:
    """The ctypes mirror of ``module``'s generated arguments struct (``Flashgen<Module>Args``):
    the declared fields, types and order, natural C alignment as the host compiler lays it out."""
    st = _structs.get(module)
    if st is None:
        decl = args_decl(module)
        fields = [(f["name"], _field_ctype(f["type"])) for f in decl["call"] + decl["shape"]]
        name = "Flashgen" + "".join(w.capitalize() for w in module.split("_")) + "Args"
        st = type(name, (ctypes.Structure,), {"_fields_": fields, "__doc__": f"{name} (generated)"})
        calls = [f["name"] for f in decl["call"]]
        got = [(getattr(st, n).offset, getattr(st, n).size) for n in calls]
        if got != [(8 * i, 8) for i in range(len(got))]:  # pragma: no cover - a 32-bit platform
            raise ImportError(f"flashgen: {name}'s per-call fields are not one block of 8-byte "
                              f"words on this platform: {got}")
        _structs[module] = st
    return st


def call_fields(module: str) -> Tuple[str, ...]:
    """The fields a call rewrites: the leading block of 8-byte words, in order."""
    return tuple(f["name"] for f in args_decl(module)["call"])


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
    """One loaded instance ``.so``: the common entry points, and each module's three (bound on
    first use)."""

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self._lib = ctypes.CDLL(self.path)
        self._fns: Dict[str, Callable] = {}
        for name in COMMON_SIGNATURES:
            if self._bind(name) is None:
                raise OSError(f"{self.path}: not a flashgen module (no {name})")
        self._last_error = self._fns["flashgen_last_error"]
        version = self._fns["flashgen_abi_version"]()
        if version != ABI_VERSION:
            raise OSError(f"{self.path}: ABI version {version}, this package speaks {ABI_VERSION}")

    def _bind(self, name: str) -> Callable | None:
        fn = self._fns.get(name)
        if fn is not None:
            return fn
        if name in COMMON_SIGNATURES:
            restype, argtypes = COMMON_SIGNATURES[name]
        else:
            for suffix, sig in sorted(MODULE_SIGNATURES.items(), key=lambda kv: -len(kv[0])):
                if suffix and name.endswith(suffix):
                    restype, argtypes = sig
                    break
            else:
                restype, argtypes = MODULE_SIGNATURES[""]
        try:
            fn = getattr(self._lib, name)
        except AttributeError:
            return None
        fn.restype = restype
        fn.argtypes = argtypes
        self._fns[name] = fn
        return fn

    def __getattr__(self, name: str) -> Callable:
        """``lib.<module>(args)``: the kernel entry point as a checked callable taking the
        arguments struct or its address."""
        if name.startswith("_"):
            raise AttributeError(name)
        entry = f"flashgen_{name}"
        fn = self._bind(entry)
        if fn is None:
            raise AttributeError(f"{self.path} does not export {entry}")
        checked = self._checked(fn, entry)
        setattr(self, name, checked)
        return checked

    def has(self, name: str) -> bool:
        return self._bind(name if name.startswith("flashgen_") else f"flashgen_{name}") is not None

    def last_error(self) -> str:
        return self._last_error().decode("utf-8", "replace")

    def _raise(self, status: int, entry: str) -> None:
        raise FlashgenError(status, entry, self.last_error(), self.path)

    def _checked(self, fn: Callable, entry: str) -> Callable:
        raise_ = self._raise
        addressof = ctypes.addressof

        def call(args: Any) -> None:
            status = fn(args if args.__class__ is int else addressof(args))
            if status:
                raise_(status, entry)

        call.__name__ = entry
        return call

    def entry(self, name: str) -> Callable:
        """The bare ctypes function of entry point ``name`` (``flashgen_`` optional): a kernel
        entry takes the address of its arguments struct and returns the status."""
        fn = self._bind(name if name.startswith("flashgen_") else f"flashgen_{name}")
        if fn is None:
            raise AttributeError(f"{self.path} does not export {name}")
        return fn

    def workspace_size(self, module: str, args: Any) -> int:
        """``flashgen_<module>_workspace_size(&args, &bytes)`` -> bytes (reads the shape fields)."""
        name = f"flashgen_{module}_workspace_size"
        out = c_int64(0)
        status = self.entry(name)(args if args.__class__ is int else ctypes.addressof(args),
                                  ctypes.byref(out))
        if status:
            self._raise(status, name)
        return out.value

    def query(self, module: str, codes: Sequence[int]) -> str:
        """``flashgen_<module>_query``: the instantiation ``codes`` reach, as ``axis=value ...``."""
        name = f"flashgen_{module}_query"
        arr = (c_int64 * len(codes))(*codes)
        buf = ctypes.create_string_buffer(512)
        status = self.entry(name)(ctypes.addressof(arr), len(codes), buf, len(buf))
        if status:
            self._raise(status, name)
        return buf.value.decode()


def __getattr__(name: str) -> Any:
    """``SingleDecodeArgs`` / ``BatchDecodeArgs``: the decode structs by their old names."""
    legacy = {"SingleDecodeArgs": "single_decode", "BatchDecodeArgs": "batch_decode"}
    if name in legacy:
        return args_struct(legacy[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
