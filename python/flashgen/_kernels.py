"""ctypes binding of flashgen's C ABI (include/flashgen/abi.h): one kernel module's entry points
(stdlib only).

A module's arguments struct is declared once, in variants.json (``modules.<m>.args``): the binary
generates the C struct from it, and ships the declaration in the matrix (``describe --json``),
from which ``args_struct(module)`` builds the ctypes mirror here (the test suite checks it
against the generated C header compiled by the host compiler). Every module exports the same
three entry points, ``flashgen_<m>(const Args*)``, ``flashgen_<m>_workspace_size(const Args*,
int64_t*)`` and ``flashgen_<m>_query``, so one binding serves all. Struct addresses travel as
plain ints (``c_void_p``), the cheapest conversion ctypes has. A nonzero status raises
``StatusError`` (a ``flashgen.KernelError``) carrying ``flashgen_last_error()``. The entry points'
names, the status codes, the ABI version and the structs' C names are the binary's data
(``describe``'s ``abi`` and ``modules.<m>.args_struct``); only ctypes signatures are written here.
"""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_int, c_int64, c_void_p
from typing import Any, Callable, Dict, Mapping, Sequence, Tuple, cast

from ._errors import KernelError

# The C ABI's names and codes are the binary's (``describe``'s ``abi``, from ``src/records.rs``,
# which a Rust test checks against abi.h); only their ctypes signatures, by role, are written here.
_I64P = ctypes.POINTER(c_int64)

# The entry points every instance exports once, by role (restype, argtypes).
COMMON_SIGNATURES: Dict[str, Tuple[Any, tuple]] = {
    "last_error": (c_char_p, ()),
    "abi_version": (c_int, ()),
}
# Each module's entry points, by role.
MODULE_SIGNATURES: Dict[str, Tuple[Any, tuple]] = {
    "kernel": (c_int, (c_void_p,)),  # flashgen_<m>(const Args*)
    "workspace_size": (c_int, (c_void_p, _I64P)),
    "query": (c_int, (c_void_p, c_int64, c_char_p, c_int64)),
}


def abi() -> Mapping[str, Any]:
    """The binary's statement of the C ABI: ``version``, ``status`` (name -> code),
    ``entry_points`` and ``module_entry_points`` (role -> name, ``{module}`` for the module)."""
    from ._install import matrix_json

    data: Mapping[str, Any] = matrix_json()["abi"]
    return data


def status_names() -> Dict[int, str]:
    """Status code -> its name (``FLASHGEN_`` left out), as the binary states them."""
    return {int(code): name for name, code in abi()["status"].items()}


def entry_name(role: str, module: str | None = None) -> str:
    """The C name of an entry point by its role (``last_error``; ``kernel``, ``workspace_size``,
    ``query`` of ``module``)."""
    if module is None:
        return str(abi()["entry_points"][role])
    return str(abi()["module_entry_points"][role]).replace("{module}", module)


def __getattr__(name: str) -> Any:
    """``ABI_VERSION``, the status codes (``OK``, ``INVALID_ARGUMENT``, ...), ``STATUS_NAMES``,
    read from the binary's data on first use; ``SingleDecodeArgs`` / ``BatchDecodeArgs``: the
    decode structs by their old names."""
    if name == "ABI_VERSION":
        return int(abi()["version"])
    if name == "STATUS_NAMES":
        return status_names()
    legacy = {"SingleDecodeArgs": "single_decode", "BatchDecodeArgs": "batch_decode"}
    if name in legacy:
        return args_struct(legacy[name])
    if name.isupper() and not name.startswith("_") and name in abi()["status"]:
        return int(abi()["status"][name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_structs: Dict[str, type[ctypes.Structure]] = {}


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


def args_struct(module: str) -> type[ctypes.Structure]:
    """The ctypes mirror of ``module``'s generated arguments struct (``Flashgen<Module>Args``):
    the declared fields, types and order, natural C alignment as the host compiler lays it out."""
    st = _structs.get(module)
    if st is None:
        decl = args_decl(module)
        fields = [(f["name"], _field_ctype(f["type"])) for f in decl["call"] + decl["shape"]]
        from ._install import matrix_json

        name = str(matrix_json()["modules"][module]["args_struct"])  # the binary's C name
        st = cast("type[ctypes.Structure]",
                  type(name, (ctypes.Structure,), {"_fields_": fields, "__doc__": f"{name} (generated)"}))
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


class StatusError(KernelError):
    """A nonzero status from an entry point, with the module's last error message (a
    ``flashgen.KernelError``, so a ``flashgen.FlashgenError``)."""

    def __init__(self, status: int, entry: str, message: str, path: str = "") -> None:
        self.status = status
        self.status_name = status_names().get(status, f"status {status}")
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
        for role in COMMON_SIGNATURES:
            if self._bind(entry_name(role)) is None:
                raise OSError(f"{self.path}: not a flashgen module (no {entry_name(role)})")
        self._last_error = self._fns[entry_name("last_error")]
        version = self._fns[entry_name("abi_version")]()
        expected = int(abi()["version"])
        if version != expected:
            raise OSError(f"{self.path}: ABI version {version}, this package speaks {expected}")

    def _bind(self, name: str) -> Callable | None:
        fn = self._fns.get(name)
        if fn is not None:
            return fn
        restype, argtypes = _signature(name)
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
        entry = entry_name("kernel", name)
        fn = self._bind(entry)
        if fn is None:
            raise AttributeError(f"{self.path} does not export {entry}")
        checked = self._checked(fn, entry)
        setattr(self, name, checked)
        return checked

    def has(self, name: str) -> bool:
        return self._bind(_full_name(name)) is not None

    def last_error(self) -> str:
        return self._last_error().decode("utf-8", "replace")

    def _raise(self, status: int, entry: str) -> None:
        raise StatusError(status, entry, self.last_error(), self.path)

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
        fn = self._bind(_full_name(name))
        if fn is None:
            raise AttributeError(f"{self.path} does not export {name}")
        return fn

    def workspace_size(self, module: str, args: Any) -> int:
        """``flashgen_<module>_workspace_size(&args, &bytes)`` -> bytes (reads the shape fields)."""
        name = entry_name("workspace_size", module)
        out = c_int64(0)
        status = self.entry(name)(args if args.__class__ is int else ctypes.addressof(args),
                                  ctypes.byref(out))
        if status:
            self._raise(status, name)
        return out.value

    def query(self, module: str, codes: Sequence[int]) -> str:
        """``flashgen_<module>_query``: the instantiation ``codes`` reach, as ``axis=value ...``."""
        name = entry_name("query", module)
        arr = (c_int64 * len(codes))(*codes)
        buf = ctypes.create_string_buffer(512)
        status = self.entry(name)(ctypes.addressof(arr), len(codes), buf, len(buf))
        if status:
            self._raise(status, name)
        return buf.value.decode()


def _full_name(name: str) -> str:
    """``name`` with the entry points' common prefix (``flashgen_``), if it lacks it."""
    prefix = entry_name("kernel", "")
    return name if name.startswith(prefix) else prefix + name


def _signature(name: str) -> Tuple[Any, tuple]:
    """The ctypes signature of the entry point ``name``: a common one by its name, else a
    module's by the longest role suffix its name ends with (``flashgen_<m>``: the kernel)."""
    for role, sig in COMMON_SIGNATURES.items():
        if entry_name(role) == name:
            return sig
    suffixes = sorted(((str(t).split("{module}", 1)[1], role) for role, t in abi()["module_entry_points"].items()),
                      key=lambda sr: -len(sr[0]))
    for suffix, role in suffixes:
        if suffix and name.endswith(suffix):
            return MODULE_SIGNATURES[role]
    return MODULE_SIGNATURES["kernel"]
