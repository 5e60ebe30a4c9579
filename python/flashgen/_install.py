"""Where this installation keeps the ``flashgen`` binary, the kernel sources, the matrix and the
precompiled kernels.

Two layouts are supported. An installed wheel ships everything inside the package, where the
binary's ``LAYOUT`` (``src/records.rs``) puts it: ``_data/matrix.json`` (the one path written here
too: it holds the others, as ``describe``'s ``wheel.layout``), ``_bin/flashgen``, ``_src/``,
``_aot/manifest.json``. The matrix's instances and the manifests' rows are kept in a file per
module (``_data/instances/<module>.json``, ``_aot/rows/<module>.json``): a process parses only the
modules it calls, however large the release. A source checkout
(``python/`` on ``sys.path``) has none of those: the binary comes from ``FLASHGEN_BIN``, ``PATH`` or
``target/{release,debug}``, the sources from the repository root, and the matrix from asking the
binary once (``flashgen describe --json``), so no matrix logic is ever repeated in Python.
"""

from __future__ import annotations

import json
import os
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from ._errors import FlashgenError

__all__ = [
    "PACKAGE_DIR",
    "MATRIX_PATH",
    "layout",
    "is_installed",
    "repo_root",
    "binary",
    "variants_json",
    "matrix_json",
    "module_instances",
    "aot_manifest",
    "aot_file",
    "aot_packages",
    "aot_rows",
    "kernel_packages",
    "shipped_uris",
    "select_uris",
]

PACKAGE_DIR = Path(__file__).resolve().parent
# The binary's LAYOUT["matrix"]: where the wheel keeps the matrix, and in it the rest of the layout.
MATRIX_PATH = "_data/matrix.json"
_MATRIX_FILE = PACKAGE_DIR / MATRIX_PATH
_lock = threading.RLock()  # matrix_json() is read under it (layout)


def layout(key: str) -> str:
    """Where an installed wheel keeps ``key`` (``binary``, ``sources``, ``variants``, ``aot``,
    ``manifest``), relative to its package folder: the binary's data (``wheel.layout``)."""
    return str(matrix_json()["wheel"]["layout"][key])


def is_installed() -> bool:
    """True for the wheel layout (the package ships its own matrix.json)."""
    return _MATRIX_FILE.is_file()


def repo_root() -> Path | None:
    """The source checkout this package lives in (``<repo>/python/flashgen``), if any."""
    root = PACKAGE_DIR.parent.parent
    return root if (root / "variants.json").is_file() and (root / "csrc").is_dir() else None


@lru_cache(maxsize=None)
def binary() -> Path:
    """The ``flashgen`` binary the JIT runs: ``FLASHGEN_BIN``, the bundled one, ``PATH``, or the
    checkout's ``target/`` build, in that order."""
    env = os.environ.get("FLASHGEN_BIN")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FlashgenError(
                f"FLASHGEN_BIN={env} is not an executable file.\n\n"
                "Point FLASHGEN_BIN at a built flashgen binary, or unset it to use the bundled one."
            )
        return path.absolute()
    looked: list[str] = []
    bundled = PACKAGE_DIR / layout("binary") if is_installed() else None
    if bundled is not None:
        looked.append(str(bundled))
    if bundled is not None and bundled.is_file():
        if os.access(bundled, os.X_OK):
            return bundled
        raise FlashgenError(
            f"the bundled flashgen binary {bundled} is not executable (the wheel lost its mode "
            f"bits).\n\nRun `chmod +x {bundled}`, reinstall the wheel, or set FLASHGEN_BIN."
        )
    import shutil

    # Only PATH's absolute entries: an empty or relative one (``.``) would find a ``flashgen``
    # planted in whatever folder the program runs in (the binary drops them too).
    absolute = [d for d in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(d)]
    on_path = shutil.which("flashgen", path=os.pathsep.join(absolute)) if absolute else None
    looked.append("flashgen on PATH")
    if on_path:
        return Path(on_path)
    root = repo_root()
    if root is not None:
        for profile in ("release", "debug"):
            candidate = root / "target" / profile / "flashgen"
            looked.append(str(candidate))
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    hint = (
        f"build it with `cargo build --release` in {root}"
        if root is not None
        else "reinstall the flashgen wheel"
    )
    raise FlashgenError(
        "the flashgen binary was not found (looked at: " + ", ".join(looked) + ").\n\n"
        f"Set FLASHGEN_BIN to its path, or {hint}."
    )


def variants_json() -> Path:
    """The ``variants.json`` the JIT passes to ``flashgen --config``."""
    shipped = PACKAGE_DIR / layout("variants") if is_installed() else None
    if shipped is not None and shipped.is_file():
        return shipped
    root = repo_root()
    if root is not None:
        return root / "variants.json"
    raise FlashgenError(
        f"the kernel sources are missing: neither {shipped or 'the wheel'} nor a source checkout around "
        f"{PACKAGE_DIR} holds variants.json.\n\nReinstall the flashgen wheel."
    )


_matrix_cache: dict[str, Any] | None = None


def matrix_json() -> dict[str, Any]:
    """The parsed ``flashgen describe --json`` object: shipped, or asked of the binary once."""
    global _matrix_cache
    if _matrix_cache is not None:
        return _matrix_cache
    with _lock:
        if _matrix_cache is None:
            if _MATRIX_FILE.is_file():
                _matrix_cache = json.loads(_MATRIX_FILE.read_text())
            else:
                _matrix_cache = _describe()
    return _matrix_cache


_instances_cache: dict[str, list[dict[str, Any]]] = {}


def module_instances(module: str) -> list[dict[str, Any]]:
    """``describe``'s instances of ``module``: the wheel's file of that module (its matrix leaves
    them out), else those of the checkout's ``describe`` output."""
    rows = _instances_cache.get(module)
    if rows is None:
        data = matrix_json()
        if "instances" in data:
            rows = [r for r in data["instances"] if r.get("module") == module]
        else:
            path = PACKAGE_DIR / _of_module(layout("instances"), module)
            try:
                rows = json.loads(path.read_text()) if module in data["modules"] else []
            except (OSError, ValueError) as exc:
                raise FlashgenError(
                    f"cannot read {path}, the instances of {module} ({exc}); the installation is "
                    "corrupted.\n\nReinstall the flashgen wheel."
                ) from None
        _instances_cache[module] = rows
    return rows


def _of_module(template: str, module: str) -> str:
    """A per-module path of the layout (``instances``, ``manifest_rows``) for ``module``
    (``Layout::of_module``)."""
    return template.replace("{module}", module)


def _describe() -> dict[str, Any]:
    import subprocess

    cmd = [str(binary()), "--config", str(variants_json()), "describe", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 and "'--json'" in proc.stderr:  # binaries whose describe is JSON-only
        cmd = cmd[:-1]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise FlashgenError(
            f"`{' '.join(cmd)}` failed with exit status {proc.returncode}:\n"
            f"{proc.stderr.strip() or '<stderr is empty>'}"
        )
    try:
        data: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise FlashgenError(f"`{' '.join(cmd)}` printed no valid JSON ({exc})") from None
    return data


def select_uris(module: str | None, where: dict[str, str]) -> list[str]:
    """The URIs ``flashgen list-variants --module M --where AXIS=GLOB ...`` selects: the
    binary's filter, so globbing has one implementation. A bad filter is a ValueError carrying
    the binary's message; one that matches nothing selects nothing."""
    import subprocess

    cmd = [str(binary()), "--config", str(variants_json()), "list-variants", "--json"]
    if module is not None:
        cmd += ["--module", module]
    for k, v in where.items():
        cmd += ["--where", f"{k}={v}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 1 and "no instance matches" in proc.stderr:
        return []
    if proc.returncode != 0:
        raise ValueError(proc.stderr.strip().removeprefix("error: "))
    return [row["uri"] for row in json.loads(proc.stdout)]


_manifest_cache: tuple[dict[str, Any] | None] | None = None


def aot_manifest() -> dict[str, Any] | None:
    """The shipped build manifest of the precompiled kernels, or None (source checkout)."""
    global _manifest_cache
    if _manifest_cache is None:
        path = PACKAGE_DIR / layout("manifest") if is_installed() else None
        data = json.loads(path.read_text()) if path is not None and path.is_file() else None
        _manifest_cache = (data,)
    return _manifest_cache[0]


class AotPackage:
    """One package of precompiled kernels: flashgen's own ``_aot/``, or a release's kernel
    package (``flashgen_kernels_sm90a``, from its per-architecture wheel) beside it."""

    __slots__ = ("name", "root", "dir", "manifest", "_rows")

    def __init__(self, name: str, root: Path, manifest: dict[str, Any]) -> None:
        self.name = name
        self.root = root  # the package folder
        self.dir = root / layout("aot")
        self.manifest = manifest
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def rows(self, module: str) -> list[dict[str, Any]]:
        """The manifest's rows of ``module``: the wheel keeps them in a file per module (its
        header's ``module_rows`` names the modules and counts them), a build folder's manifest
        in ``instances``. Read on first use."""
        rows = self._rows.get(module)
        if rows is None:
            counts = self.manifest.get("module_rows")
            rows = [r for r in self.manifest.get("instances", ())
                    if isinstance(r, dict) and r.get("module") == module]
            if isinstance(counts, dict) and module in counts:
                rows += self._read_rows(module, counts[module])
            self._rows[module] = rows
        return rows

    def _read_rows(self, module: str, count: Any) -> list[dict[str, Any]]:
        path = self.root / _of_module(layout("manifest_rows"), module)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            data = exc
        if not isinstance(data, list) or len(data) != count:
            why = data if isinstance(data, Exception) else f"it does not hold {count} rows"
            raise FlashgenError(
                f"cannot read {path}, the precompiled kernels of {module} that "
                f"{self.dir / 'manifest.json'} names ({why}); the installation is corrupted."
                "\n\nReinstall the flashgen wheel."
            )
        return [r for r in data if isinstance(r, dict) and r.get("module") == module]

    def file(self, name: Any) -> Path:
        """The file a row of this manifest names: a plain ``.so`` file name inside ``_aot/``,
        never a path that leads out of it (the build writes names only)."""
        if (not isinstance(name, str) or not name.endswith(".so") or name.startswith(".")
                or "/" in name or "\\" in name or "\0" in name):
            raise FlashgenError(
                f"{self.dir / 'manifest.json'} names the file {name!r}, which is not a plain .so "
                f"file name in {self.dir}; the installation is corrupted.\n\nReinstall the "
                "flashgen wheel."
            )
        return self.dir / name


_packages_cache: list[AotPackage] | None = None


def kernel_packages() -> list[dict[str, Any]]:
    """The per-architecture kernel wheels of a release, as its core manifest names them (each
    ``extra``, ``distribution``, ``package``, ``runs_on``); empty for a wheel that holds its
    kernels itself."""
    manifest = aot_manifest() or {}
    return [k for k in manifest.get("kernel_packages", ()) if isinstance(k, dict)]


def aot_packages() -> list[AotPackage]:
    """Every package of precompiled kernels this installation has: flashgen's own, then each
    kernel package its manifest names that is installed beside it (in the same folder: pip puts
    an extra's wheels there) and was built by this flashgen version. Only packages the core
    manifest names are looked at, never whatever happens to be on ``sys.path``."""
    global _packages_cache
    if _packages_cache is not None:
        return _packages_cache
    with _lock:
        if _packages_cache is None:
            found = []
            own = aot_manifest()
            if own is not None:
                found.append(AotPackage(PACKAGE_DIR.name, PACKAGE_DIR, own))
            version = (own or {}).get("flashgen_version")
            for k in kernel_packages():
                name = k.get("package")
                if not isinstance(name, str) or not name.isidentifier():
                    continue
                root = PACKAGE_DIR.parent / name
                try:
                    data = json.loads((root / layout("manifest")).read_text())
                except (OSError, ValueError):
                    continue  # not installed (or unreadable): its extra is not there
                if isinstance(data, dict) and data.get("flashgen_version") == version:
                    found.append(AotPackage(name, root, data))
            _packages_cache = found
    return _packages_cache


def aot_rows(module: str, uri: str) -> list[tuple[AotPackage, dict[str, Any]]]:
    """Every manifest row of ``uri`` (an instance of ``module``) in this installation's
    packages, with its package."""
    return [(package, rec) for package in aot_packages() for rec in package.rows(module)
            if rec.get("uri") == uri]


def shipped_uris(module: str | None = None) -> set[str]:
    """The URIs this installation has precompiled code of, in any of its packages (of
    ``module`` only, if given: the other modules' rows are not read)."""
    from ._matrix import matrix

    modules = [module] if module is not None else list(matrix().modules)
    return {str(rec.get("uri")) for package in aot_packages() for m in modules
            for rec in package.rows(m)}


def aot_dir() -> Path:
    """The folder the manifest's relative ``path`` entries are relative to."""
    return PACKAGE_DIR / layout("aot")


def aot_file(name: Any) -> Path:
    """The file a row of flashgen's own manifest names (see ``AotPackage.file``)."""
    return AotPackage(PACKAGE_DIR.name, PACKAGE_DIR, {}).file(name)


def _reset_for_tests() -> None:
    """Forget memoized lookups (tests change the environment between cases)."""
    global _matrix_cache, _manifest_cache, _packages_cache
    _matrix_cache = None
    _manifest_cache = None
    _packages_cache = None
    _instances_cache.clear()
    binary.cache_clear()
