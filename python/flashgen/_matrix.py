"""The variant matrix as the Rust tool describes it (``flashgen describe --json``).

Python never expands the matrix itself: instances, URIs and runtime codes are read from the
describe output, so ``list_variants`` here and ``flashgen list-variants --json`` agree by
construction. This module adds fast lookups and error messages that name the values that exist.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple

from . import _install

__all__ = ["Axis", "Module", "Param", "Instance", "Matrix", "matrix", "format_value"]


class Axis(NamedTuple):
    name: str
    type: str
    values: tuple[Any, ...]


class Module(NamedTuple):
    name: str
    entry_points: tuple[str, ...]
    axes: tuple[Axis, ...]

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
        self.modules: dict[str, Module] = {
            name: Module(
                name,
                tuple(spec.get("entry_points", ())),
                tuple(Axis(a["name"], a["type"], tuple(a["values"])) for a in spec["axes"]),
            )
            for name, spec in data["modules"].items()
        }
        self.instances: list[Instance] = []
        self._index: dict[tuple[str, tuple[Any, ...]], Instance] = {}
        for raw in data.get("instances", ()):
            inst = Instance(
                raw["uri"], raw["module"], dict(raw["params"]), dict(raw.get("codes", {})),
                bool(raw.get("aot", False)),
            )
            self.instances.append(inst)
            module = self.modules.get(inst.module)
            if module is not None:
                key = tuple(_norm(inst.params.get(a.name)) for a in module.axes)
                self._index[(inst.module, key)] = inst

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
        return self._index.get((module, tuple(_norm(params.get(a.name)) for a in mod.axes)))

    def find(self, module: str, params: Mapping[str, Any], *, what: str | None = None) -> Instance:
        """The instance with these params, or a ValueError naming the values that do exist."""
        inst = self.lookup(module, params) if module in self.modules else None
        if inst is not None:
            return inst
        self._explain_miss(module, params, what=what, ignore=())
        raise AssertionError("unreachable")  # pragma: no cover

    def check_custom(self, module: str, params: Mapping[str, Any], *, what: str | None = None) -> None:
        """For a custom (JIT-only) variant: the other axes must name a combination the matrix has."""
        mod = self.module(module)
        vaxis = mod.variant_axis
        if vaxis is None:
            raise ValueError(f"module {module} has no variant axis; custom variants do not apply")
        for value in vaxis.values:
            if self.lookup(module, {**params, vaxis.name: value}) is not None:
                return
        self._explain_miss(module, {**params, vaxis.name: vaxis.values[0]}, what=what,
                           ignore=(vaxis.name,))

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
        return any(
            self.lookup(module, {**params, a.name: v}) is not None
            for a in mod.axes if a.name in ignore for v in a.values
        )


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
