"""Finding the binary of one kernel instance: the wheel's precompiled ``.so``, else the JIT cache,
else compiling it with the bundled ``flashgen`` binary (the same build that made the wheel).

The warm path (precompiled or cached) reads one small JSON file, hashes the ``.so`` once per
process and spawns nothing; loaded instances are memoized per process. The cold path takes the
entry's OS lock, looks again, runs ``flashgen build`` into a temporary folder inside the cache and
installs the result atomically (see ``_cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from . import _arch, _cuda, _install
from ._cache import Entry, sha256_file
from ._errors import CompileError, FlashgenError, JITDisabledError
from ._matrix import Instance, format_value, matrix
from ._variant import Variant

__all__ = ["Loaded", "load", "target_archs", "jit_enabled", "cache_dir"]


class Loaded:
    """One instance, ready to bind: its binary, where it came from (``source``: "aot", "cache"
    or "jit"), its runtime codes, and the wall time of the lookup (and compile) in ``seconds``."""

    __slots__ = ("uri", "module", "params", "codes", "path", "source", "seconds", "_kernels")

    def __init__(self, uri: str, module: str, params: dict[str, Any], codes: dict[str, int],
                 path: Path, source: str, seconds: float = 0.0) -> None:
        self.uri = uri
        self.module = module
        self.params = params
        self.codes = codes
        self.path = path
        self.source = source
        self.seconds = seconds
        self._kernels: Any = None

    def __repr__(self) -> str:
        return f"Loaded({self.uri!r}, source={self.source!r}, path={str(self.path)!r})"

    @property
    def kernels(self) -> Any:
        """The ctypes binding of this instance's ``.so`` (``_kernels``), created on first use."""
        if self._kernels is None:
            from ._kernels import KernelLibrary

            try:
                self._kernels = KernelLibrary(str(self.path))
            except OSError as exc:
                raise FlashgenError(
                    f"{self.uri}: cannot load {self.path} ({self.source}): {exc}"
                    + ("\n\nDelete it so the JIT rebuilds it." if self.source != "aot" else
                       "\n\nReinstall the flashgen wheel.")
                ) from None
        return self._kernels


_memo: dict[tuple[Any, ...], Loaded] = {}
_memo_lock = threading.Lock()
_key_locks: dict[tuple[Any, ...], threading.Lock] = {}
_verified_aot: set[str] = set()


def jit_enabled() -> bool:
    return os.environ.get("FLASHGEN_DISABLE_JIT", "").strip().lower() in ("", "0", "false", "no", "off")


def target_archs(device: int | None = None) -> tuple[list[_arch.Arch], str]:
    """(archs to build for / must be covered, the ``--arch`` argument). ``FLASHGEN_CUDA_ARCH_LIST``
    wins; otherwise the compute capability of ``device`` (default 0) from the driver."""
    env = os.environ.get("FLASHGEN_CUDA_ARCH_LIST", "").strip()
    if env:
        try:
            return _arch.parse_arch_list(env), env
        except ValueError as exc:
            raise ValueError(f"FLASHGEN_CUDA_ARCH_LIST: {exc}") from None
    cc = _cuda.compute_capability(device or 0)
    arg = _arch.jit_arch_for(cc)
    return _arch.parse_arch_list(arg), arg


def cache_dir(version: str, archs: list[_arch.Arch]) -> Path:
    """``<cache>/<version>/<arch key>``; a source checkout adds a stamp of its sources to the
    version folder (``0.1.0+src.<hash>``)."""
    stamp = _install.source_stamp()
    folder = version if stamp is None else f"{version}+src.{stamp}"
    return _install.cache_root() / folder / _arch.arch_key(archs)


def _where_flags(params: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for k, v in params.items():
        out += ["--where", f"{k}={format_value(v)}"]
    return out


def load(module: str, params: Mapping[str, Any], variant: Variant | None = None,
         device: int | None = None, *, prefer_aot: bool = True) -> Loaded:
    """The instance of ``module`` with ``params`` (axis -> value; for a custom ``variant`` the
    ``variant`` axis is taken from it). Raises ValueError for params no instance covers.
    ``prefer_aot=False`` skips the wheel's binaries (the parity test builds through the JIT)."""
    targets, arch_arg = target_archs(device)
    memo_key = (module, tuple(sorted((k, format_value(v)) for k, v in params.items())),
                variant.digest if variant is not None else None, _arch.arch_key(targets), prefer_aot)
    hit = _memo.get(memo_key)
    if hit is not None:
        return hit
    with _memo_lock:  # one lock per instance: a long compile does not hold up other instances
        key_lock = _key_locks.setdefault(memo_key, threading.Lock())
    with key_lock:
        hit = _memo.get(memo_key)
        if hit is None:
            hit = _load(module, dict(params), variant, targets, arch_arg, prefer_aot)
            _memo[memo_key] = hit
    return hit


def _load(module: str, params: dict[str, Any], variant: Variant | None,
          targets: list[_arch.Arch], arch_arg: str, prefer_aot: bool = True) -> Loaded:
    t0 = time.perf_counter()
    mx = matrix()
    inst: Instance | None = None
    if variant is None:
        inst = mx.find(module, params)
        aot = _aot_lookup(inst, targets) if prefer_aot else None
        if aot is not None:
            aot.seconds = time.perf_counter() - t0
            return aot
        key = inst.uri
    else:
        vaxis = mx.module(module).variant_axis
        assert vaxis is not None
        params = {k: v for k, v in params.items() if k != vaxis.name}
        mx.check_custom(module, params)
        params[vaxis.name] = variant.name
        where = json.dumps({"module": module, "params": {k: format_value(v) for k, v in params.items()},
                            "variant": variant.digest}, sort_keys=True)
        key = f"{module}-custom-{variant.name}-{hashlib.sha256(where.encode()).hexdigest()[:16]}"
    entry = Entry(cache_dir(mx.version, targets), key)
    meta = entry.read_valid()
    if meta is not None:
        return _from_meta(entry, meta, "cache", t0)
    if not jit_enabled():
        raise JITDisabledError(_disabled_message(module, params, inst, variant, targets, arch_arg, entry))
    with entry.lock():
        meta = entry.read_valid()  # another process may have built it while we waited
        if meta is not None:
            return _from_meta(entry, meta, "cache", t0)
        entry.clear_stale_tmp()
        meta = _compile(entry, module, params, variant, arch_arg, mx.version)
    return _from_meta(entry, meta, "jit", t0)


def _from_meta(entry: Entry, meta: Mapping[str, Any], source: str, t0: float) -> Loaded:
    inst = meta["instance"]
    return Loaded(inst["uri"], inst["module"], dict(inst["params"]), dict(inst["codes"]),
                  entry.so_path, source, time.perf_counter() - t0)


def _aot_lookup(inst: Instance, targets: list[_arch.Arch]) -> Loaded | None:
    manifest = _install.aot_manifest()
    if not manifest:
        return None
    raw_archs = manifest.get("archs") or []
    archs = _arch.parse_arch_list(raw_archs) if raw_archs else []
    if not archs or not all(_arch.covers(archs, t.cc) for t in targets):
        return None
    for rec in manifest.get("instances", ()):
        if rec.get("uri") == inst.uri:
            break
    else:
        return None
    path = _install.aot_dir() / rec["path"]
    if inst.uri not in _verified_aot:
        try:
            digest = sha256_file(path)
        except OSError as exc:
            raise FlashgenError(
                f"{inst.uri}: the precompiled kernel {path} is listed in the manifest but cannot be "
                f"read ({exc}).\n\nReinstall the flashgen wheel."
            ) from None
        if digest != rec.get("sha256"):
            raise FlashgenError(
                f"{inst.uri}: the precompiled kernel {path} does not match the sha256 in "
                f"{_install.aot_dir() / 'manifest.json'} (got {digest}, expected {rec.get('sha256')}); "
                "the installation is corrupted.\n\nReinstall the flashgen wheel "
                "(pip install --force-reinstall)."
            )
        _verified_aot.add(inst.uri)
    codes = dict(rec.get("codes") or inst.codes)
    return Loaded(inst.uri, inst.module, dict(inst.params), codes, path, "aot")


def _disabled_message(module: str, params: Mapping[str, Any], inst: Instance | None,
                      variant: Variant | None, targets: list[_arch.Arch], arch_arg: str,
                      entry: Entry) -> str:
    import shlex

    archs = " ".join(a.name for a in targets)
    where = " ".join(f"--where {k}={format_value(v)}" for k, v in params.items())
    if variant is None and inst is not None:
        manifest = _install.aot_manifest()
        shipped = manifest is not None and any(r.get("uri") == inst.uri for r in manifest.get("instances", ()))
        why = (
            f"the wheel precompiles it only for {', '.join(manifest.get('archs', []))}"  # type: ignore[union-attr]
            if shipped else "it is not precompiled in this installation"
        )
        return (
            f"{inst.uri} is needed for {archs}, but {why} and it is not in the JIT cache "
            f"({entry.dir}), and FLASHGEN_DISABLE_JIT={os.environ.get('FLASHGEN_DISABLE_JIT')} "
            "forbids compiling it.\n\n"
            "Unset FLASHGEN_DISABLE_JIT to compile it on first use, or install a wheel that "
            f"precompiles it: flashgen build-wheel --arch {shlex.quote(arch_arg)} --module {module} {where}"
        )
    name = variant.name if variant is not None else "?"
    return (
        f"the custom variant {name!r} of {module} ({where}) is compiled only by the JIT and is not "
        f"in the JIT cache ({entry.dir}), and FLASHGEN_DISABLE_JIT="
        f"{os.environ.get('FLASHGEN_DISABLE_JIT')} forbids compiling it.\n\n"
        "Unset FLASHGEN_DISABLE_JIT, or compile it once with JIT enabled into the same "
        "FLASHGEN_CACHE_DIR before disabling the JIT."
    )


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child
    """Kill the compile if the process that asked for it dies (Linux), so no orphan keeps
    compiling into a folder the next process removes."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _compile(entry: Entry, module: str, params: Mapping[str, Any], variant: Variant | None,
             arch_arg: str, version: str) -> dict[str, Any]:
    import shlex
    import shutil
    import subprocess

    out = entry.make_tmp()
    try:
        cmd = [str(_install.binary()), "--config", str(_install.variants_json()), "build",
               "--out", str(out), "--arch", arch_arg, "--json", "--quiet", "--module", module]
        cmd += _where_flags(params)
        if variant is not None:
            vfile = out / "variants.json"
            vfile.write_text(json.dumps(_variants_file(variant, version), indent=1))
            cmd += ["--variants-file", str(vfile)]
        env = dict(os.environ)
        env["FLASHGEN_CACHE_DIR"] = str(_install.cache_root())
        # nvcc from PyPI lives in this interpreter's environment, even when it is not activated.
        env.setdefault("FLASHGEN_PYTHON", sys.executable)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None)
        what = f"{module} ({', '.join(f'{k}={format_value(v)}' for k, v in params.items())})"
        if proc.returncode != 0:
            raise CompileError(
                f"compiling {what} for {arch_arg} failed: flashgen exited with status "
                f"{proc.returncode}.\n\ncommand: {shlex.join(cmd)}\n"
                f"---- stderr ----\n{proc.stderr.strip() or '<stderr is empty>'}\n----------------"
            )
        try:
            summary = json.loads(proc.stdout)
            rec = next(r for r in summary["instances"] if r.get("module") == module)
            built = Path(rec["path"])
            if not built.is_absolute():
                built = out / built
            sha = rec["sha256"]
        except (ValueError, KeyError, StopIteration, TypeError) as exc:
            raise CompileError(
                f"compiling {what}: flashgen printed no usable build summary ({exc!r}).\n\n"
                f"command: {shlex.join(cmd)}\n---- stdout ----\n{proc.stdout.strip()}\n----------------"
            ) from None
        toolchain: dict[str, Any] = dict(summary.get("toolchain") or {})
        with_manifest = out / "manifest.json"
        if not toolchain and with_manifest.is_file():
            try:
                toolchain = dict(json.loads(with_manifest.read_text()).get("toolchain") or {})
            except ValueError:
                toolchain = {}
        meta = {
            "flashgen_version": version,
            "arch": arch_arg,
            "instance": {k: rec.get(k) for k in ("uri", "module", "params", "codes", "fingerprint")},
            "toolchain": toolchain,
            "variant": None if variant is None else {"name": variant.name, "digest": variant.digest},
        }
        try:
            return entry.install(built, sha, meta)
        except OSError as exc:
            raise CompileError(f"installing {what} into the JIT cache {entry.dir} failed: {exc}") from None
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _variants_file(variant: Variant, version: str) -> dict[str, Any]:
    header = _variant_header(variant, version)
    return {"variants": {variant.name: {
        "header": str(header), "struct": variant.struct,
        "params": [{"name": p.name, "type": p.ctype} for p in variant.params],
    }}}


def _variant_header(variant: Variant, version: str) -> Path:
    """Write the user's source into the cache as a header named by its content hash."""
    folder = _install.cache_root() / version / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{variant.name}-{variant.digest[:16]}.cuh"
    text = (
        f"// flashgen custom variant {variant.name!r}, written by the flashgen loader from "
        "flashgen.Variant(...): do not edit.\n"
        "#pragma once\n#include <flashgen/variant.cuh>\n\n"
        + variant.source.rstrip() + "\n"
    )
    if not path.is_file() or path.read_text() != text:
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        part.write_text(text)
        os.replace(part, path)
    return path


def _reset_for_tests() -> None:
    _memo.clear()
    _verified_aot.clear()
