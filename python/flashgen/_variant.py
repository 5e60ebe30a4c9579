"""Attention variants as the loader sees them: built-in ones (named in the matrix) and custom
ones written by the user (``flashgen.Variant``), plus packing their additional parameters into
the C struct the kernel reads (members in declared order, natural C alignment, as ctypes lays out).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import re
from typing import Any, Mapping, NamedTuple, Sequence

from ._matrix import Param
from ._tensor import KDL_CUDA

__all__ = ["Variant", "ParamPacker", "ctype_of"]

# Patterns compile on first use: import flashgen stays cheap.
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_STRUCT = r"template\s*<[^<>]*>\s*struct\s+([A-Za-z_]\w*)"

_table: dict[str, tuple[Any, str | None]] | None = None


def _type_table() -> dict[str, tuple[Any, str | None]]:
    """Normalized C spelling -> (ctypes type, dtype of the tensor a pointer must be, or None for
    a value), from the one table the binary owns (``param_types`` of ``flashgen describe``)."""
    global _table
    if _table is None:
        from ._install import matrix_json

        _table = {row["c"]: (getattr(ctypes, row["ctypes"]), row["dtype"] if row["c"].endswith("*") else None)
                  for row in matrix_json()["param_types"]}
    return _table


def _check_name(what: str, name: Any) -> None:
    """``name`` must be a C identifier that is not a C/C++ keyword (the binary's list, from
    ``reserved_words`` of ``flashgen describe``); the binary checks the rest when it builds."""
    from ._install import matrix_json

    if not (isinstance(name, str) and re.fullmatch(_IDENT, name)):
        raise ValueError(f"{what} {name!r} is not a C identifier (letters, digits and _)")
    if name in matrix_json().get("reserved_words", ()):
        raise ValueError(f"{what} {name!r} is a C/C++ keyword; pick another name")


def _check_length(name: str) -> None:
    """The name is part of its instances' URIs, which name files: no longer than the binary's
    ``max_uri_bytes`` (of ``flashgen describe``), so it never ends in a raw ENAMETOOLONG."""
    from ._install import matrix_json

    limit = matrix_json().get("max_uri_bytes")
    if isinstance(limit, int) and len(name) > limit:
        raise ValueError(
            f"Variant name {name[:40]!r}... is {len(name)} characters long; the instance URIs that "
            f"hold it name files, so they are at most {limit} bytes. Choose a shorter name"
        )


def _check_not_core(variant: str, name: str) -> None:
    """A parameter may not be named like a core field of a module's params struct: the kernel
    would read its own member, never the parameter. The names are the binary's
    (``reserved_params`` of ``flashgen describe``: each with the modules that have it)."""
    from ._install import matrix_json

    modules = matrix_json().get("reserved_params", {}).get(name)
    if modules is not None:
        raise ValueError(
            f"Variant {variant!r}: parameter name {name!r} clashes with the core field {name!r} of "
            f"the params struct of {', '.join(modules)}; the kernel would read its own {name!r}, "
            f"never this parameter. Rename it (e.g. {variant + '_' + name!r})"
        )


def ctype_of(ctype: str) -> tuple[Any, str | None]:
    """(ctypes type, pointee dtype or None) for a parameter's C type, one of the binary's
    ``param_types`` (spaces and tabs are free, as the binary reads them: ``const float *``);
    pointers are device addresses (``c_void_p``) that must be tensors of that dtype."""
    table = _type_table()
    spelled = None
    if isinstance(ctype, str) and not ctype.strip(" \t*").count("\n"):
        words = ctype.replace("\t", " ").replace("*", " * ").split(" ")
        spelled = " ".join(w for w in words if w).replace(" *", "*")
    if spelled not in table:
        raise TypeError(
            f"unsupported C type {ctype!r} for a variant parameter; types: {', '.join(table)}"
        )
    return table[spelled]


class Variant:
    """A user-written attention variant, compiled on first use by the JIT.

    ``source`` is C++ in flashgen's variant interface: a struct template over the kernel's params
    type with the hooks it overrides (docs/user-guide.md, "Writing a variant"). Its additional
    parameters are declared as ``params=[("logits_scale", "float"), ...]`` and read in the
    source as ``params.logits_scale``; callers pass them as keyword arguments. ``struct`` names
    the template when the source defines more than one.
    """

    __slots__ = ("name", "source", "params", "struct", "digest")

    def __init__(self, name: str, source: str, params: Sequence[tuple[str, str]] = (),
                 struct: str | None = None) -> None:
        if not isinstance(name, str) or not re.fullmatch(_IDENT, name):
            raise ValueError(f"Variant name {name!r} must be a C identifier (letters, digits, _)")
        _check_length(name)
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"Variant {name!r}: source must be non-empty C++ text")
        plist: list[Param] = []
        for item in params:
            try:
                pname, ptype = item
            except (TypeError, ValueError):
                raise TypeError(
                    f"Variant {name!r}: params must be (name, C type) pairs, got {item!r}"
                ) from None
            _check_name(f"Variant {name!r}: parameter name", pname)
            _check_not_core(name, pname)
            if not isinstance(ptype, str):
                raise TypeError(f"Variant {name!r}: the C type of {pname!r} must be a string, got {ptype!r}")
            ctype_of(ptype)  # raises on a type outside the binary's table
            if any(p.name == pname for p in plist):
                raise ValueError(f"Variant {name!r}: parameter {pname!r} is declared twice")
            plist.append(Param(str(pname), str(ptype)))
        if struct is None:
            found = list(dict.fromkeys(re.findall(_STRUCT, source)))
            if len(found) != 1:
                which = f"it defines {', '.join(found)}" if found else "it defines none"
                raise ValueError(
                    f"Variant {name!r}: cannot tell which struct template is the variant ({which}); "
                    "pass struct='Name'"
                )
            struct = found[0]
        else:
            _check_name(f"Variant {name!r}: struct", struct)
        self.name = name
        self.source = source
        self.params: tuple[Param, ...] = tuple(plist)
        self.struct: str = struct
        canon = json.dumps(
            {"name": name, "struct": struct, "source": source,
             "params": [[p.name, p.ctype] for p in plist]},
            sort_keys=True,
        )
        self.digest = hashlib.sha256(canon.encode()).hexdigest()

    def __repr__(self) -> str:
        ps = ", ".join(f"({p.name!r}, {p.ctype!r})" for p in self.params)
        return f"Variant({self.name!r}, <{len(self.source)} chars>, params=[{ps}], struct={self.struct!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Variant) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)


class _Field(NamedTuple):
    name: str
    ctype: Any
    pointee: str | None
    length: str | None  # the args field its tensor's length must equal (Param.len)


class ParamPacker:
    """Builds the additional-params struct of one variant from keyword arguments."""

    def __init__(self, variant: str, params: Sequence[Param]) -> None:
        self.variant = variant
        self.fields = tuple(_Field(p.name, *ctype_of(p.ctype), p.len) for p in params)
        self.names = frozenset(f.name for f in self.fields)
        self.struct_type: Any = None
        if self.fields:
            self.struct_type = type(
                f"FlashgenParams_{variant}", (ctypes.Structure,),
                {"_fields_": [(f.name, f.ctype) for f in self.fields]},
            )

    def check_names(self, kwargs: Mapping[str, Any], what: str) -> None:
        unknown = [k for k in kwargs if k not in self.names]
        missing = [f.name for f in self.fields if f.name not in kwargs]
        if unknown or missing:
            takes = ", ".join(f.name for f in self.fields) or "no parameters"
            problems = []
            if unknown:
                problems.append(f"unknown parameter {', '.join(map(repr, unknown))}")
            if missing:
                problems.append(f"missing parameter {', '.join(map(repr, missing))}")
            raise TypeError(
                f"{what}: variant {self.variant!r} {' and '.join(problems)}; it takes {takes}"
            )

    def pack(self, kwargs: Mapping[str, Any], what: str, device: int,
             describe: Any, sizes: Mapping[str, int] | None = None) -> tuple[Any, list[Any]]:
        """(struct or None, objects to keep alive). ``describe(obj, name)`` reads a tensor;
        ``sizes`` holds the call's args fields that a pointer's ``len`` may name."""
        self.check_names(kwargs, what)
        if self.struct_type is None:
            return None, []
        values = []
        keep: list[Any] = []
        for f in self.fields:
            value = kwargs[f.name]
            if f.pointee is not None:
                t = describe(value, f.name)
                if t.device_type != KDL_CUDA:  # the kernel reads it through a device pointer
                    raise ValueError(
                        f"{what}: {f.name} is on {t.device}; pass it on the GPU, cuda:{device} "
                        "(torch: .cuda())"
                    )
                if t.device_id != device:
                    raise ValueError(
                        f"{what}: {f.name} is on cuda:{t.device_id}, the other tensors on cuda:{device}"
                    )
                if f.pointee != "any" and t.dtype != f.pointee:
                    raise TypeError(f"{what}: {f.name} must be a {f.pointee} tensor, got {t.dtype}")
                if not t.is_contiguous():
                    raise ValueError(f"{what}: {f.name} must be contiguous")
                want = None if f.length is None or sizes is None else sizes.get(f.length)
                if want is not None and tuple(t.shape) != (want,):
                    raise ValueError(
                        f"{what}: {f.name} must be 1-D with {f.length} = {want} values (one per "
                        f"{'query head' if f.length == 'num_qo_heads' else f.length}), got shape "
                        f"{list(t.shape)}"
                    )
                keep.append(value)
                values.append(t.ptr)
            elif f.ctype in (ctypes.c_float, ctypes.c_double):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    try:
                        value = float(value)
                    except (TypeError, ValueError):
                        raise TypeError(
                            f"{what}: {f.name} must be a number, got {type(value).__name__}"
                        ) from None
                values.append(float(value))
            elif f.ctype is ctypes.c_bool:
                values.append(bool(value))
            else:
                try:
                    values.append(value.__index__())
                except AttributeError:
                    raise TypeError(
                        f"{what}: {f.name} must be an integer, got {type(value).__name__}"
                    ) from None
        return self.struct_type(*values), keep


def _reset_for_tests() -> None:
    global _table
    _table = None
