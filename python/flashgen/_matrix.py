"""The variant matrix as the Rust tool describes it (``flashgen describe --json``).

Python never expands the matrix itself: instances, URIs and runtime codes are read from the
describe output, so ``list_variants`` here and ``flashgen list-variants --json`` agree by
construction. This module adds fast lookups and error messages that name the values that exist.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from . import _install

__all__ = ["Axis", "Backend", "Module", "Param", "Instance", "Matrix", "matrix", "format_value",
           "admits"]


class Axis(NamedTuple):
    name: str
    type: str
    values: tuple[Any, ...]


def admits(rows: Any, cc: tuple[int, int]) -> bool:
    """Whether ``runs_on`` rows (``{"target", "min", "max"}``, written by the binary: the
    manifest's, or a backend's in ``describe``) admit a GPU of compute capability ``cc``."""
    for row in rows or ():
        lo, hi = row.get("min"), row.get("max")
        if lo is not None and tuple(lo) <= cc and (hi is None or cc <= tuple(hi)):
            return True
    return False


class Backend(NamedTuple):
    """One implementation of a module (a value of its ``backend`` axis), as ``describe`` lists
    them in order of preference: the archs it is limited to and the compute capabilities those
    run on (both None: every arch; the JIT builds for the device)."""

    name: str
    arch_limit: tuple[str, ...] | None
    runs_on: tuple[Mapping[str, Any], ...] | None

    def runs_on_device(self, cc: tuple[int, int]) -> bool:
        return self.runs_on is None or admits(self.runs_on, cc)

    def describe(self) -> str:
        return self.name if self.arch_limit is None else f"{self.name} ({' '.join(self.arch_limit)} only)"


class Module(NamedTuple):
    name: str
    entry_points: tuple[str, ...]
    axes: tuple[Axis, ...]
    backend_axis: str | None = None  # the axis of its implementations, if it has several
    backends: tuple[Backend, ...] = ()  # in order of preference

    def axis(self, name: str) -> Axis | None:
        for axis in self.axes:
            if axis.name == name:
                return axis
        return None

    @property
    def variant_axis(self) -> Axis | None:
        for axis in self.axes:
            if axis.type == "variant":
                return axis
        return None


class Param(NamedTuple):
    """One additional parameter of a variant: its name and C type (``float``, ``const float*``)."""

    name: str
    ctype: str


class Instance(NamedTuple):
    uri: str
    module: str
    params: Mapping[str, Any]
    codes: Mapping[str, int]
    aot: bool
    arch_limit: tuple[str, ...] | None = None  # the only archs it is built for (None: all)


def format_value(value: Any) -> str:
    """An axis value as the CLI spells it in ``--where axis=value``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _describe(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in params.items())


class Matrix:
    """Modules, variants and instances of one ``describe --json`` object."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.version: str = str(data["flashgen_version"])
        self.archs: tuple[str, ...] = tuple(data.get("archs", ()))
        self.variants: dict[str, tuple[Param, ...]] = {
            name: tuple(Param(p["name"], p["type"]) for p in spec.get("params", ()))
            for name, spec in data.get("variants", {}).items()
        }
        self.modules: dict[str, Module] = {}
        for name, spec in data["modules"].items():
            table = spec.get("backends") or {}
            self.modules[name] = Module(
                name,
                tuple(spec.get("entry_points", ())),
                tuple(Axis(a["name"], a["type"], tuple(a["values"])) for a in spec["axes"]),
                table.get("axis"),
                tuple(Backend(b["name"], _tuple_or_none(b.get("arch_limit")),
                              _tuple_or_none(b.get("runs_on"))) for b in table.get("order", ())),
            )
        # Instances are made, and indexed per module, when first asked for: the matrix holds
        # hundreds of them and a process usually calls a few modules (import to first kernel).
        self._raw: list[Mapping[str, Any]] = list(data.get("instances", ()))
        self._raw_by_module: dict[str, list[Mapping[str, Any]]] = {}
        for raw in self._raw:
            self._raw_by_module.setdefault(raw["module"], []).append(raw)
        self._indexes: dict[str, dict[tuple[Any, ...], Instance]] = {}
        self._instances: list[Instance] | None = None

    @property
    def instances(self) -> list[Instance]:
        """Every instance, in ``describe``'s order."""
        if self._instances is None:
            self._instances = [_instance(raw) for raw in self._raw]
        return self._instances

    def _index(self, module: str) -> dict[tuple[Any, ...], Instance]:
        index = self._indexes.get(module)
        if index is None:
            axes = self.modules[module].axes
            index = {}
            for raw in self._raw_by_module.get(module, ()):
                inst = _instance(raw)
                index[tuple(_norm(inst.params.get(a.name)) for a in axes)] = inst
            self._indexes[module] = index
        return index

    # -- lookups -------------------------------------------------------------------------------

    def module(self, name: str) -> Module:
        try:
            return self.modules[name]
        except KeyError:
            raise ValueError(
                f"unknown module {name!r}; modules: {', '.join(self.modules)}"
            ) from None

    def lookup(self, module: str, params: Mapping[str, Any]) -> Instance | None:
        """The instance with exactly these params (axis -> value), or None. No validation."""
        mod = self.modules[module]
        return self._index(module).get(tuple(_norm(params.get(a.name)) for a in mod.axes))

    def find(self, module: str, params: Mapping[str, Any], *, what: str | None = None) -> Instance:
        """The instance with these params, or a ValueError naming the values that do exist."""
        inst = self.lookup(module, params) if module in self.modules else None
        if inst is not None:
            return inst
        self._explain_miss(module, params, what=what, ignore=())
        raise AssertionError("unreachable")  # pragma: no cover

    def check_custom(self, module: str, params: Mapping[str, Any], *, what: str | None = None) -> None:
        """For a custom (JIT-only) variant: the other axes must name a combination the matrix has
        (the backend may be left out: the loader chooses it)."""
        mod = self.module(module)
        vaxis = mod.variant_axis
        if vaxis is None:
            raise ValueError(f"module {module} has no variant axis; custom variants do not apply")
        ignore = [vaxis.name]
        if mod.backend_axis is not None and mod.backend_axis not in params:
            ignore.append(mod.backend_axis)
        self.check_partial(module, params, ignore, what=what)

    def check_partial(self, module: str, params: Mapping[str, Any], ignore: Sequence[str], *,
                      what: str | None = None) -> None:
        """The axes not in ``ignore`` name a combination the matrix has (with some values of the
        ignored ones), else a ValueError naming the values that exist."""
        mod = self.module(module)
        if self._exists_ignoring(module, params, set(ignore)):
            return
        filled = dict(params)
        for name in ignore:
            axis = mod.axis(name)
            if axis is not None:
                filled[name] = axis.values[0]
        self._explain_miss(module, filled, what=what, ignore=tuple(ignore))

    def with_backend(self, module: str, params: Mapping[str, Any], cc: tuple[int, int], *,
                     what: str | None = None) -> dict[str, Any]:
        """``params`` with the module's backend axis set for a GPU of compute capability ``cc``:
        the backend given, which must run there, else the first of ``describe``'s backends (in
        the order variants.json declares) whose ``runs_on`` admits the device. The order and the
        rows are the binary's; this only reads them. A module without a backend axis is left as
        it is. Raises ValueError naming the backend, the device and the backends that run."""
        mod = self.module(module)
        name = mod.backend_axis
        if name is None:
            return dict(params)
        prefix = f"{what or module}: "
        device = f"a GPU of compute capability {cc[0]}.{cc[1]}"
        runs = [b for b in mod.backends if b.runs_on_device(cc)]
        if name in params:
            wanted = format_value(params[name])
            backend = next((b for b in mod.backends if b.name == wanted), None)
            if backend is None:
                raise ValueError(
                    f"{prefix}{name}={wanted!r} is not a backend of {module}; it has "
                    f"{', '.join(b.describe() for b in mod.backends)}"
                )
            if not backend.runs_on_device(cc):
                supports = (f"on this device {module} supports {name} "
                            f"{', '.join(repr(b.name) for b in runs)}" if runs else
                            f"no backend of {module} runs there")
                raise ValueError(
                    f"{prefix}{name}={wanted!r} is built only for "
                    f"{' '.join(backend.arch_limit or ())}, which does not run on {device}; "
                    f"{supports}.\n\nLeave {name} unset to take the best one the device runs."
                )
            return dict(params)
        if not runs:
            raise ValueError(
                f"{prefix}no backend of {module} runs on {device}: "
                f"{', '.join(b.describe() for b in mod.backends)}"
            )
        return {**params, name: runs[0].name}

    def _explain_miss(self, module: str, params: Mapping[str, Any], *, what: str | None,
                      ignore: Iterable[str]) -> None:
        mod = self.module(module)
        prefix = f"{what or module}: "
        names = [a.name for a in mod.axes]
        unknown = [k for k in params if k not in names]
        if unknown:
            raise ValueError(
                f"{prefix}unknown axis {', '.join(map(repr, unknown))}; {module}'s axes: "
                f"{', '.join(names)}"
            )
        missing = [n for n in names if n not in params]
        if missing:
            raise ValueError(f"{prefix}no value given for axis {', '.join(missing)}")
        for axis in mod.axes:
            if _norm(params[axis.name]) not in {_norm(v) for v in axis.values}:
                raise ValueError(
                    f"{prefix}{axis.name}={format_value(params[axis.name])} is not in the variant "
                    f"matrix; {axis.name} takes {', '.join(map(format_value, axis.values))}"
                )
        # Every value exists on its own, so the combination was excluded. Say, per axis, which
        # values would work with the others held fixed.
        ignore = set(ignore)
        options = []
        for axis in mod.axes:
            if axis.name in ignore:
                continue
            ok = [v for v in axis.values if self._exists_ignoring(module, {**params, axis.name: v}, ignore)]
            if ok:
                others = ", ".join(
                    f"{n}={format_value(params[n])}" for n in names if n != axis.name and n not in ignore
                )
                options.append(f"{axis.name}={'|'.join(map(format_value, ok))} (with {others})")
        shown = {k: v for k, v in params.items() if k not in ignore}
        hint = "; instances exist for " + "; or ".join(options) if options else ""
        raise ValueError(f"{prefix}no instance of {module} has {_describe(shown)}{hint}")

    def _exists_ignoring(self, module: str, params: Mapping[str, Any], ignore: set[str]) -> bool:
        if not ignore:
            return self.lookup(module, params) is not None
        mod = self.modules[module]
        free = [a for a in mod.axes if a.name in ignore]
        return any(
            self.lookup(module, {**params, **{a.name: v for a, v in zip(free, values)}}) is not None
            for values in itertools.product(*(a.values for a in free))
        )


def _instance(raw: Mapping[str, Any]) -> Instance:
    return Instance(raw["uri"], raw["module"], dict(raw["params"]), dict(raw.get("codes", {})),
                    bool(raw.get("aot", False)), _tuple_or_none(raw.get("arch_limit")))


def _tuple_or_none(value: Any) -> Any:
    return None if value is None else tuple(value)


def _norm(value: Any) -> Any:
    """Compare axis values the way the CLI does: as their spelled-out strings."""
    return format_value(value)


_matrix: Matrix | None = None


def matrix() -> Matrix:
    """The installation's matrix (parsed once per process)."""
    global _matrix
    if _matrix is None:
        _matrix = Matrix(_install.matrix_json())
    return _matrix


def _reset_for_tests() -> None:
    global _matrix
    _matrix = None
