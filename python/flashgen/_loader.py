"""Finding the binary of one kernel instance: the wheel's precompiled ``.so`` when it runs on the
device, else the one the bundled ``flashgen`` binary finds in, or builds into, its cache.

Python holds no build policy. Which architectures a precompiled file runs on is data the build
wrote into the manifest (each row's ``runs_on``); which backend of a module a device takes, and
the refusal of one it cannot run, is read from ``describe``'s ``backends`` table (the binary's
choice per range of compute capabilities, ``Matrix.with_backend``); where the cache lives, how
it is keyed, what the JIT builds for a device, locking and verification belong to the binary, which the JIT path runs as
``flashgen jit`` and which answers with the verified object's path and sha256. Either way the
loader reads the file once, checks it (``_verify``) and loads those very bytes. AOT hits spawn
nothing; loaded instances are memoized per process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from . import _cuda, _install, _runtime
from ._errors import CompileError, FlashgenError, JITDisabledError
from ._matrix import Instance, format_value, matrix
from ._variant import Variant
from ._verify import UntrustedFileError, loadable_path, read_checked

__all__ = ["Loaded", "load", "device_capability", "jit_enabled"]

# A compile on first use takes seconds; it is logged on the "flashgen" logger when it starts and
# ends, so that a caller that enables INFO for it (or any logging setup) sees why it waits. The
# logger is made on the first miss: `import logging` is 4 ms of an import that serves hits only.
LOGGER = "flashgen"


class Loaded:
    """One instance, ready to bind: its binary (``path``, where it was read from; the library is
    loaded from a sealed in-memory copy of the checked bytes), where it came from (``source``:
    "aot", "cache" or "jit"), its runtime codes, and the wall time of the lookup (and compile)
    in ``seconds``."""

    __slots__ = ("uri", "module", "params", "codes", "path", "source", "seconds", "_data", "_kernels")

    def __init__(self, uri: str, module: str, params: dict[str, Any], codes: dict[str, int],
                 path: Path, source: str, data: bytes, seconds: float = 0.0) -> None:
        self.uri = uri
        self.module = module
        self.params = params
        self.codes = codes
        self.path = path
        self.source = source
        self.seconds = seconds
        self._data: bytes | None = data
        self._kernels: Any = None

    def __repr__(self) -> str:
        return f"Loaded({self.uri!r}, source={self.source!r}, path={str(self.path)!r})"

    @property
    def kernels(self) -> Any:
        """The ctypes binding of this instance (``_kernels``), created on first use from the
        bytes that were checked."""
        if self._kernels is None:
            from ._kernels import KernelLibrary

            assert self._data is not None
            for soname in _runtime.needed_runtimes(self._data):
                _runtime.ensure_loaded(soname)
            try:
                self._kernels = KernelLibrary(loadable_path(self._data, self.uri))
            except OSError as exc:
                raise FlashgenError(
                    f"{self.uri}: cannot load {self.path} ({self.source}): {exc}"
                    + ("\n\nReinstall the flashgen wheel." if self.source == "aot" else
                       "\n\nRun `flashgen clean --cache` and try again.")
                ) from None
            self._data = None  # the loader holds the bytes now
        return self._kernels


_memo: dict[tuple[Any, ...], Loaded] = {}
_memo_lock = threading.Lock()
_key_locks: dict[tuple[Any, ...], threading.Lock] = {}


def jit_enabled() -> bool:
    return os.environ.get("FLASHGEN_DISABLE_JIT", "").strip().lower() in ("", "0", "false", "no", "off")


def device_capability(device: int | None = None) -> tuple[int, int]:
    """The compute capability the loader serves: ``FLASHGEN_DEVICE_CC`` (``MAJOR.MINOR``: build
    and pick kernels for that GPU, e.g. to fill a cache on a machine without it), else the
    driver's answer for ``device`` (default 0)."""
    env = os.environ.get("FLASHGEN_DEVICE_CC", "").strip()
    if env:
        cc = parse_capability(env)
        if cc is None:
            raise ValueError(
                f"FLASHGEN_DEVICE_CC={env!r} is not a compute capability: write MAJOR.MINOR in "
                "ASCII digits, e.g. 9.0, or unset it to use the GPU's"
            )
        return cc
    return _cuda.compute_capability(device or 0)


def parse_capability(text: str) -> tuple[int, int] | None:
    """``MAJOR.MINOR`` as the binary's ``--device-cc`` reads it: ASCII digits (``str.isdigit()``
    would also take "²" and other scripts' digits), each part within the binary's range
    (``describe``'s ``capabilities``: major from ``min[0]`` to ``max[0]``, minor likewise)."""
    major, dot, minor = text.strip().partition(".")
    if not dot or not _ascii_digits(major) or not _ascii_digits(minor):
        return None
    bounds = _capabilities()
    cc = int(major), int(minor)
    ok = all(lo <= v <= hi for v, lo, hi in zip(cc, bounds["min"], bounds["max"]))
    return cc if ok else None


def _ascii_digits(text: str) -> bool:
    return bool(text) and all("0" <= c <= "9" for c in text)


def _capabilities() -> Mapping[str, Any]:
    caps: Mapping[str, Any] = _install.matrix_json()["capabilities"]
    return caps


def load(module: str, params: Mapping[str, Any], variant: Variant | None = None,
         device: int | None = None, *, prefer_aot: bool = True, what: str | None = None) -> Loaded:
    """The instance of ``module`` with ``params`` (axis -> value; for a custom ``variant`` the
    ``variant`` axis is taken from it). A module's backend axis may be left out: the device gets
    the first backend it runs (``Matrix.with_backend``); a backend given must run on it. Raises
    ValueError for params no instance covers and for a backend the device cannot run.
    ``prefer_aot=False`` skips the wheel's binaries (the parity test builds through the JIT);
    ``what`` names the caller in errors."""
    cc = device_capability(device)
    memo_key = (module, tuple(sorted((k, format_value(v)) for k, v in params.items())),
                variant.digest if variant is not None else None, cc,
                os.environ.get("FLASHGEN_CUDA_ARCH_LIST", ""), prefer_aot)
    hit = _memo.get(memo_key)
    if hit is not None:
        return hit
    with _memo_lock:  # one lock per instance: a long compile does not hold up other instances
        key_lock = _key_locks.setdefault(memo_key, threading.Lock())
    with key_lock:
        hit = _memo.get(memo_key)
        if hit is None:
            hit = _load(module, dict(params), variant, cc, prefer_aot, what)
            _memo[memo_key] = hit
    return hit


def _load(module: str, params: dict[str, Any], variant: Variant | None, cc: tuple[int, int],
          prefer_aot: bool, what: str | None) -> Loaded:
    t0 = time.perf_counter()
    mx = matrix()
    params = mx.with_backend(module, params, cc, what=what)
    inst: Instance | None = None
    if variant is None:
        inst = mx.find(module, params)
        aot = _aot_lookup(inst, cc) if prefer_aot else None
        if aot is not None:
            aot.seconds = time.perf_counter() - t0
            return aot
    else:
        vaxis = mx.module(module).variant_axis
        assert vaxis is not None
        params = {k: v for k, v in params.items() if k != vaxis.name}
        mx.check_custom(module, params)
        params[vaxis.name] = variant.name
    loaded = _jit(module, params, variant, cc, inst)
    loaded.seconds = time.perf_counter() - t0
    return loaded


def _runs_on(rows: Any, cc: tuple[int, int]) -> bool:
    """Whether ``runs_on`` rows (``{"target", "min", "max"}``, which the build wrote into the
    manifest per file) admit a GPU of compute capability ``cc``."""
    for row in rows or ():
        lo, hi = row.get("min"), row.get("max")
        if lo is not None and tuple(lo) <= cc and (hi is None or cc <= tuple(hi)):
            return True
    return False


def _aot_lookup(inst: Instance, cc: tuple[int, int]) -> Loaded | None:
    """The precompiled code of ``inst`` that runs on ``cc``, from any package of this
    installation (flashgen's own, or a release's kernel package): code built for the device's
    architecture before PTX the driver would have to compile."""
    # Each row holds the targets its instance was built for (an arch limit narrows them).
    found = [(not _runs_on(_cubins(rec.get("runs_on")), cc), package, rec)
             for package, rec in _install.aot_rows(inst.module, inst.uri) if _runs_on(rec.get("runs_on"), cc)]
    if not found:
        return None
    _, package, rec = min(found, key=lambda f: f[0])
    path = package.file(rec.get("path"))
    try:
        data = read_checked(path, str(rec.get("sha256")), private=False)
    except UntrustedFileError as exc:
        raise FlashgenError(
            f"{inst.uri}: the precompiled kernel listed in {package.dir / 'manifest.json'} "
            f"cannot be used: {exc}; the installation is corrupted.\n\nReinstall the flashgen "
            "wheel (pip install --force-reinstall)."
        ) from None
    codes = dict(rec.get("codes") or inst.codes)
    return Loaded(inst.uri, inst.module, dict(inst.params), codes, path, "aot", data)


def _cubins(runs_on: Any) -> list[Any]:
    """The rows of a ``runs_on`` list for machine code (``sm_*``), not PTX."""
    return [r for r in runs_on or () if isinstance(r, dict) and str(r.get("target", "")).startswith("sm_")]


def _missing_kernel_wheel(cc: tuple[int, int]) -> str | None:
    """The extra of a release's kernel wheel that holds code for ``cc`` and is not installed."""
    installed = {p.name for p in _install.aot_packages()}
    for k in _install.kernel_packages():
        if k.get("package") not in installed and _runs_on(_cubins(k.get("runs_on")), cc):
            return str(k.get("extra"))
    return None


def _precompiled_rows(inst: Instance) -> list[dict[str, Any]]:
    return [rec for _, rec in _install.aot_rows(inst.module, inst.uri)]


def _jit(module: str, params: Mapping[str, Any], variant: Variant | None, cc: tuple[int, int],
         inst: Instance | None) -> Loaded:
    """Ask ``flashgen jit`` for the instance: first only to look it up in its verified cache;
    on a miss, compile it (under its per-object lock, so concurrent loaders compile it once),
    logged on the ``flashgen`` logger when it starts and ends; with the JIT disabled, a miss is
    an error."""
    import tempfile

    cmd = [str(_install.binary()), "--config", str(_install.variants_json()), "jit",
           "--device-cc", f"{cc[0]}.{cc[1]}", "--module", module]
    for k, v in params.items():
        cmd += ["--where", f"{k}={format_value(v)}"]
    # The glibc target (FLASHGEN_MANYLINUX, else the wheel's) is the binary's to choose.
    env = dict(os.environ)
    # nvcc from PyPI lives in this interpreter's environment, even when it is not activated.
    env.setdefault("FLASHGEN_PYTHON", sys.executable)
    what = f"{module} ({', '.join(f'{k}={format_value(v)}' for k, v in params.items())})"
    with tempfile.TemporaryDirectory(prefix="flashgen-variant-") as tmp:
        if variant is not None:
            cmd += ["--variants-file", str(_write_variant(variant, Path(tmp)))]
        rec = _ask_binary([*cmd, "--no-compile"], env, what)
        if rec["source"] == "missing" and jit_enabled():
            import logging

            log = logging.getLogger(LOGGER)
            reason = _compile_reason(inst, variant, cc)
            log.info("compiling %s for %s: %s", rec["uri"], rec["arch"], reason)
            t0 = time.perf_counter()
            rec = _ask_binary(cmd, env, what)
            took = time.perf_counter() - t0
            if rec["source"] == "compiled":
                log.info("compiled %s for %s in %.1f s", rec["uri"], rec["arch"], took)
            else:  # another process compiled it while this one waited for the lock
                log.info("%s for %s was compiled by another process (waited %.1f s)", rec["uri"],
                         rec["arch"], took)
    if rec["source"] == "missing":
        err = JITDisabledError(_disabled_message(module, params, inst, variant, str(rec["arch"]), rec, cc))
        err.answer = rec  # what the binary said: its cache folder, the archs it would build
        raise err
    path = Path(rec["path"])
    try:
        data = read_checked(path, rec["sha256"], private=True)
    except UntrustedFileError as exc:
        raise FlashgenError(
            f"{what}: the JIT cache entry cannot be trusted: {exc}.\n\nRun `flashgen clean --cache` "
            "(or fix the folder's owner and mode) and try again."
        ) from None
    source = "jit" if rec["source"] == "compiled" else "cache"
    return Loaded(rec["uri"], rec["module"], dict(rec["params"]), dict(rec["codes"]), path, source, data)


def _ask_binary(cmd: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """Runs one ``flashgen jit`` call and returns its answer (``source``: missing, cache or
    compiled). The binary dies with this process (``FLASHGEN_PARENT_PID``: it sets its own
    parent-death signal), so no hook runs between fork and exec and Python starts it by
    ``vfork``: a ``fork`` copies this process's page tables, tens to hundreds of milliseconds
    in a process holding gigabytes (BENCHMARKS.md, "The release"), and is unsafe in threads."""
    import shlex
    import subprocess

    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, FLASHGEN_PARENT_PID=str(os.getpid())))
    if proc.returncode != 0:
        raise CompileError(
            f"{what}: `flashgen jit` exited with status {proc.returncode}.\n\n"
            f"command: {shlex.join(cmd)}\n"
            f"---- stderr ----\n{proc.stderr.strip() or '<stderr is empty>'}\n----------------"
        )
    try:
        rec = json.loads(proc.stdout)
        if rec["source"] not in ("missing", "cache", "compiled") or not isinstance(rec["arch"], str):
            raise ValueError(f"unexpected source {rec['source']!r} or arch {rec['arch']!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise CompileError(
            f"{what}: `flashgen jit` printed no usable answer ({exc!r}).\n\n"
            f"command: {shlex.join(cmd)}\n---- stdout ----\n{proc.stdout.strip()}\n----------------"
        ) from None
    return rec


def _not_precompiled(inst: Instance, cc: tuple[int, int]) -> tuple[str, str | None]:
    """Why this installation has no code of ``inst`` for ``cc``, and the extra of a release's
    kernel wheel that would have it (None when no such wheel is missing)."""
    if inst.outside_release is not None and _install.kernel_packages():
        return f"the release leaves it out ({inst.outside_release})", None
    extra = _missing_kernel_wheel(cc)
    if extra is not None:
        return f"the kernel wheel for this GPU is not installed (pip install 'flashgen[{extra}]')", extra
    archs = sorted({a for r in _precompiled_rows(inst) for a in r.get("archs", [])})
    if not archs:
        return "it is not precompiled in this installation", None
    return f"the installation's precompiled code does not run on this GPU (it holds {', '.join(archs)})", None


def _compile_reason(inst: Instance | None, variant: Variant | None, cc: tuple[int, int]) -> str:
    """Why an instance is compiled on this machine instead of loaded from the wheel."""
    if variant is not None:
        return f"the user variant {variant.name!r} is compiled on first use"
    assert inst is not None  # only a user variant has no instance in the matrix
    return _not_precompiled(inst, cc)[0]


def _write_variant(variant: Variant, folder: Path) -> Path:
    """The user's source as a header, and a variants file naming it, in a private folder that
    lives for one ``flashgen jit`` call (the build keys the header by content)."""
    header = folder / f"{variant.name}-{variant.digest[:16]}.cuh"
    header.write_text(
        f"// flashgen custom variant {variant.name!r}, written by the flashgen loader from "
        "flashgen.Variant(...): do not edit.\n"
        "#pragma once\n#include <flashgen/variant.cuh>\n\n"
        + variant.source.rstrip() + "\n"
    )
    vfile = folder / "variants.json"
    vfile.write_text(json.dumps({"variants": {variant.name: {
        "header": str(header), "struct": variant.struct,
        "params": [{"name": p.name, "type": p.ctype} for p in variant.params],
    }}}, indent=1))
    return vfile


def _disabled_message(module: str, params: Mapping[str, Any], inst: Instance | None,
                      variant: Variant | None, arch: str, rec: Mapping[str, Any],
                      cc: tuple[int, int]) -> str:
    import shlex

    where = " ".join(f"--where {k}={format_value(v)}" for k, v in params.items())
    cache = rec.get("cache_dir", "the JIT cache")
    forbids = f"FLASHGEN_DISABLE_JIT={os.environ.get('FLASHGEN_DISABLE_JIT')} forbids compiling it"
    if variant is None and inst is not None:
        why, extra = _not_precompiled(inst, cc)
        fix = (
            f"Install it: pip install 'flashgen[{extra}]' (or 'flashgen[all]'), or unset "
            "FLASHGEN_DISABLE_JIT to compile it on first use."
            if extra is not None else
            "Unset FLASHGEN_DISABLE_JIT to compile it on first use, or install a wheel that "
            f"precompiles it: flashgen build-wheel --arch {shlex.quote(arch)} --module {module} {where}"
        )
        return (
            f"{inst.uri} is needed for {arch}, but {why}, it is not in the JIT cache ({cache}), "
            f"and {forbids}.\n\n{fix}"
        )
    name = variant.name if variant is not None else "?"
    return (
        f"the custom variant {name!r} of {module} ({where}) is compiled only by the JIT and is not "
        f"in the JIT cache ({cache}), and {forbids}.\n\n"
        "Unset FLASHGEN_DISABLE_JIT, or compile it once with JIT enabled into the same "
        "FLASHGEN_CACHE_DIR before disabling the JIT."
    )


def _reset_for_tests() -> None:
    _memo.clear()
