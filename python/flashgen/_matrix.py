"""The variant matrix as the Rust tool describes it (``flashgen describe --json``).

Python never expands the matrix itself: instances, URIs and runtime codes are read from the
describe output, so ``list_variants`` here and ``flashgen list-variants --json`` agree by
construction. This module adds fast lookups and error messages that name the values that exist.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from . import _install

__all__ = ["Axis", "Backend", "Backends", "DeviceRow", "Module", "Param", "Instance", "Matrix", "Unsupported",
           "matrix", "format_value", "fill"]


class Axis(NamedTuple):
    name: str
    type: str
    values: tuple[Any, ...]


class Backend(NamedTuple):
    """One implementation of a module (a value of its ``backend`` axis), as ``describe`` lists
    them in order of preference: the archs it is limited to (None: every arch) and its refusal
    on a device it does not run on (a template of the binary's; None: it runs on every one)."""

    name: str
    arch_limit: tuple[str, ...] | None
    refused: str | None


class DeviceRow(NamedTuple):
    """GPUs of compute capability ``min..max`` and the backends they run, best first (the
    binary's choice), with what a refusal says they support."""

    min: tuple[int, int]
    max: tuple[int, int]
    backends: tuple[str, ...]
    supports: str


class Backends(NamedTuple):
    """``describe``'s ``modules.<m>.backends``: the binary's choice of a backend per device and
    its refusals, as data (``src/commands/choice.rs`` decides; this only reads)."""

    axis: str
    order: tuple[Backend, ...]
    by_device: tuple[DeviceRow, ...]
    unknown: str
    none_runs: str
    hint: str

    def device(self, cc: tuple[int, int]) -> DeviceRow | None:
        return next((d for d in self.by_device if d.min <= cc <= d.max), None)

    @staticmethod
    def read(table: Mapping[str, Any]) -> Backends:
        return Backends(
            table["axis"],
            tuple(Backend(b["name"], _tuple_or_none(b.get("arch_limit")), b.get("refused"))
                  for b in table["order"]),
            tuple(DeviceRow(tuple(d["min"]), tuple(d["max"]), tuple(d["backends"]), d["supports"])
                  for d in table["by_device"]),
            table["unknown"], table["none_runs"], table["hint"],
        )


def fill(template: str, **holes: str) -> str:
    """A template of the binary's with each ``{name}`` replaced (``choice::fill`` in Rust)."""
    for name, value in holes.items():
        template = template.replace("{" + name + "}", value)
    return template


class Unsupported(NamedTuple):
    """``describe``'s ``modules.<m>.unsupported[i]`` (variants.json's declaration): combinations
    no instance serves, as axis -> the values it names, and the reason a call asking for one reads."""

    where: Mapping[str, tuple[Any, ...]]
    reason: str

    def holds(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` give each axis it names one of its values (an axis left out of
        ``params``, such as a backend the loader picks later, holds nothing)."""
        return all(name in params and _norm(params[name]) in {_norm(v) for v in values}
                   for name, values in self.where.items())


class Module(NamedTuple):
    name: str
    entry_points: tuple[str, ...]
    axes: tuple[Axis, ...]
    backends: Backends | None = None  # its implementations, if it has several
    unsupported: tuple[Unsupported, ...] = ()  # combinations that are not instances

    @property
    def backend_axis(self) -> str | None:
        return None if self.backends is None else self.backends.axis

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
    """One additional parameter of a variant: its name and C type (``float``, ``const float*``);
    ``len``, for a pointer, the args field that gives its tensor's length (``num_qo_heads``)."""

    name: str
    ctype: str
    len: str | None = None


class Instance(NamedTuple):
    uri: str
    module: str
    params: Mapping[str, Any]
    codes: Mapping[str, int]
    aot: bool
    arch_limit: tuple[str, ...] | None = None  # the only archs it is built for (None: all)
    outside_release: str | None = None  # why a release leaves it out (None: a release has it)


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
            name: tuple(Param(p["name"], p["type"], p.get("len")) for p in spec.get("params", ()))
            for name, spec in data.get("variants", {}).items()
        }
        self.modules: dict[str, Module] = {}
        for name, spec in data["modules"].items():
            table = spec.get("backends")
            self.modules[name] = Module(
                name,
                tuple(spec.get("entry_points", ())),
                tuple(Axis(a["name"], a["type"], tuple(a["values"])) for a in spec["axes"]),
                None if table is None else Backends.read(table),
                tuple(Unsupported({k: tuple(v) for k, v in u["where"].items()}, u["reason"])
                      for u in spec.get("unsupported", ())),
            )
        # Instances are made, and indexed per module, when first asked for: the matrix holds
        # hundreds of them and a process usually calls a few modules (import to first kernel). An
        # installed wheel's matrix leaves them out: they are read per module (``_install``).
        raw_all = data.get("instances")
        self._raw_by_module: dict[str, list[Mapping[str, Any]]] | None = None
        if raw_all is not None:
            self._raw_by_module = {}
            for raw in raw_all:
                self._raw_by_module.setdefault(raw["module"], []).append(raw)
        self._indexes: dict[str, dict[tuple[Any, ...], Instance]] = {}
        self._instances: list[Instance] | None = None

    def _raw(self, module: str) -> Sequence[Mapping[str, Any]]:
        if self._raw_by_module is not None:
            return self._raw_by_module.get(module, [])
        return _install.module_instances(module)

    @property
    def instances(self) -> list[Instance]:
        """Every instance, in ``describe``'s order (module by module)."""
        if self._instances is None:
            self._instances = [_instance(raw) for m in self.modules for raw in self._raw(m)]
        return self._instances

    def _index(self, module: str) -> dict[tuple[Any, ...], Instance]:
        index = self._indexes.get(module)
        if index is None:
            axes = self.modules[module].axes
            index = {}
            for raw in self._raw(module):
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
        the backend given, which must run there, else the binary's choice for the device. Both
        and the refusals are read from ``describe``'s table (``Backends``); nothing is decided
        here. A module without a backend axis is left as it is. Raises ValueError naming the
        backend, the device and the backends that run."""
        table = self.module(module).backends
        if table is None:
            return dict(params)
        prefix = f"{what or module}: "
        device = f"{cc[0]}.{cc[1]}"
        row = table.device(cc)
        runs = row.backends if row is not None else ()
        if table.axis in params:
            wanted = format_value(params[table.axis])
            backend = next((b for b in table.order if b.name == wanted), None)
            if backend is None:
                raise ValueError(prefix + fill(table.unknown, value=wanted))
            if wanted not in runs:
                supports = row.supports if row is not None else ""
                raise ValueError(prefix + fill(backend.refused or "", cc=device, supports=supports)
                                 + f".\n\n{table.hint}")
            return dict(params)
        if not runs:
            raise ValueError(prefix + fill(table.none_runs, cc=device))
        return {**params, table.axis: runs[0]}

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
        ignore = set(ignore)
        self.check_supported(module, {k: v for k, v in params.items() if k not in ignore}, what=what)
        # Every value exists on its own, so the combination was excluded. Say, per axis, which
        # values would work with the others held fixed.
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

    def check_supported(self, module: str, params: Mapping[str, Any], *, what: str | None = None) -> None:
        """A ValueError naming the arguments and the declared reason when ``params`` ask for a
        combination the module declares unsupported (variants.json ``modules.<m>.unsupported``)."""
        mod = self.module(module)
        for declared in mod.unsupported:
            if declared.holds(params):
                named = " with ".join(f"{a.name}={params[a.name]!r}" for a in mod.axes if a.name in declared.where)
                raise ValueError(f"{what or module}: {named} is not supported: {declared.reason}")

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
                    bool(raw.get("aot", False)), _tuple_or_none(raw.get("arch_limit")),
                    raw.get("outside_release"))


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
