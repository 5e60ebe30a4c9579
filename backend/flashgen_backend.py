"""flashgen's PEP 517 build backend: ``pip install .``, ``pip wheel .``, ``python -m build``.

It holds no packaging logic of its own for wheels: it gets the ``flashgen`` binary (``FLASHGEN_BIN``,
else ``cargo build --release --locked``) and runs ``flashgen build-wheel`` into the folder the
frontend names, so a wheel built by pip is the wheel ``./ci/build-wheel.sh`` builds. The sdist is
written here (stdlib ``tarfile``), because making one must not need a Rust toolchain.

Precompiling needs nvcc. Config setting ``aot`` (``pip wheel . -C aot=...``):

- ``auto`` (default): precompile variants.json's AOT subset when the binary finds nvcc by its
  usual rules (``FLASHGEN_NVCC``, ``CUDA_HOME``, ``CUDA_PATH``, ``PATH``, the PyPI nvcc in the active
  Python environment); otherwise build a JIT-only wheel and say so on stderr;
- ``yes``: precompile, and fail when there is no nvcc;
- ``no``: a JIT-only wheel (``flashgen build-wheel --no-aot``).

``build-wheel-args`` (a shell-quoted string) is appended to ``flashgen build-wheel`` when it
precompiles, e.g. ``-C build-wheel-args="--arch 9.0a --module single_decode"``.
Stdlib only, Python 3.9+: the build environment has nothing else.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shlex
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
# The package metadata that does not depend on a build, and what a wheel packs of a folder, as
# the binary states them (src/records.rs `BackendData`; a Rust test keeps this copy equal to it,
# so that an sdist needs no Rust toolchain).
_DATA: Dict[str, Any] = json.loads((Path(__file__).resolve().parent / "metadata.json").read_text())
METADATA: Dict[str, str] = _DATA["metadata"]  # name, version, summary, license, requires_python, ...
TREE: Dict[str, Any] = _DATA["tree"]  # skip_names, skip_prefixes, skip_suffixes, min_epoch
NAME = METADATA["name"]

# What an sdist holds: enough to build the binary (Cargo.toml, Cargo.lock, src/) and the wheel
# (the kernel tree, variants.json, the Python package), this backend, and the docs the README links.
SDIST_ROOTS = ("pyproject.toml", "Cargo.toml", "Cargo.lock", "README.md", "DEVELOPERS.md", "LICENSE",
               "CHANGELOG.md", "docs", "variants.json", "backend", "src", "csrc", "include", "python")
# 1980-01-01T00:00:00Z: the wheel writer's time when SOURCE_DATE_EPOCH is unset.
DEFAULT_EPOCH: int = TREE["min_epoch"]

__all__ = ["get_requires_for_build_wheel", "get_requires_for_build_sdist", "build_wheel", "build_sdist"]


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


# ---- wheel -------------------------------------------------------------------------------------


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    settings = config_settings or {}
    binary = _binary()
    aot = _aot(settings, binary)
    cmd = [str(binary), "--config", str(ROOT / "variants.json"), "build-wheel",
           "--out", str(Path(wheel_directory).resolve())]
    if aot:
        cmd += shlex.split(str(settings.get("build-wheel-args", "")))
    else:
        cmd.append("--no-aot")
    # The .so copies are scratch: the cache keeps the objects, the wheel keeps the bytes.
    with tempfile.TemporaryDirectory(prefix="flashgen-wheel-build-") as build_dir:
        cmd += ["--build-dir", build_dir]
        _log("running " + " ".join(shlex.quote(c) for c in cmd))
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"flashgen build-wheel failed with exit status {proc.returncode}")
    # build-wheel prints the wheel's path as its last line of stdout.
    return Path(proc.stdout.strip().splitlines()[-1]).name


def _binary() -> Path:
    """``FLASHGEN_BIN`` (a prebuilt binary of this very version: CI reuses its release build),
    else the one ``cargo build --release --locked`` makes here."""
    env = os.environ.get("FLASHGEN_BIN")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise SystemExit(f"FLASHGEN_BIN={env} is not an executable file")
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout.split()
        if out[-1:] != [METADATA["version"]]:
            raise SystemExit(f"FLASHGEN_BIN={env} is {' '.join(out) or 'no flashgen'}, but this "
                             f"source tree is {NAME} {METADATA['version']}; unset FLASHGEN_BIN")
        return path
    cmd = ["cargo", "build", "--release", "--locked", "--message-format=json-render-diagnostics"]
    _log("running " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise SystemExit("building flashgen needs Rust's cargo (https://rustup.rs), or FLASHGEN_BIN "
                         "set to a flashgen binary of this version") from None
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed with exit status {proc.returncode}")
    # Cargo names the executable it built (wherever CARGO_TARGET_DIR or a config puts it).
    for line in proc.stdout.splitlines():
        msg = json.loads(line) if line.startswith("{") else {}
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == NAME \
                and msg.get("executable"):
            return Path(msg["executable"])
    raise SystemExit(f"`{' '.join(cmd)}` reported no {NAME} executable")


def _aot(settings: Dict[str, Any], binary: Path) -> bool:
    """Whether to precompile: the ``aot`` setting, and for ``auto`` whether nvcc is found."""
    value = str(settings.get("aot", "auto")).strip().lower()
    if value in ("yes", "true", "on", "1"):
        return True
    if value in ("no", "false", "off", "0"):
        _log("aot=no: building a JIT-only wheel (kernels compile on first use)")
        return False
    if value != "auto":
        raise SystemExit(f"config setting aot={value!r}: use auto, yes or no")
    # The binary's own discovery decides, so the backend never disagrees with a build.
    proc = subprocess.run([str(binary), "--config", str(ROOT / "variants.json"), "doctor", "--json"],
                          cwd=ROOT, capture_output=True, text=True)
    try:
        toolchain = json.loads(proc.stdout)["toolchain"]
    except (ValueError, KeyError):
        raise SystemExit(f"`flashgen doctor --json` failed:\n{proc.stderr}") from None
    if "error" in toolchain:
        _log("no nvcc found, so the wheel precompiles nothing: a JIT-only wheel, whose kernels "
             "compile on first use (with nvcc present then). To precompile, set FLASHGEN_NVCC or "
             "CUDA_HOME, or install nvidia-cuda-nvcc in the active environment; -C aot=yes makes a "
             "missing nvcc an error.")
        return False
    _log(f"precompiling with {toolchain['nvcc']} ({toolchain['found_by']})")
    return True


# ---- sdist -------------------------------------------------------------------------------------


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    """``flashgen-<version>.tar.gz`` (PEP 625): ``flashgen-<version>/`` holding PKG-INFO and
    ``SDIST_ROOTS``. Reproducible as the wheel is: entries sorted, every time SOURCE_DATE_EPOCH
    (else 1980-01-01), owner 0, modes 0644/0755, a gzip header without name or time."""
    version = METADATA["version"]
    base = f"{NAME}-{version}"
    epoch = _source_date_epoch()
    # archive name -> (bytes, executable): every file is read once, as it is checked.
    files: Dict[str, Tuple[bytes, bool]] = {f"{base}/PKG-INFO": (_pkg_info(version).encode(), False)}
    for root in SDIST_ROOTS:
        path = ROOT / root
        if path.is_symlink():
            _check_link(path, ROOT)
        if path.is_file():
            files[f"{base}/{root}"] = (_read_inside(path, ROOT), os.access(path, os.X_OK))
        elif path.is_dir():
            for f in _tree(path):
                files[f"{base}/{f.relative_to(ROOT).as_posix()}"] = (_read_inside(f, path), os.access(f, os.X_OK))
    out_dir = Path(sdist_directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / f"{base}.tar.gz"
    # Written beside the destination, then renamed: a reader never sees half an sdist.
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=epoch, compresslevel=9) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for arcname in sorted(files):
                data, executable = files[arcname]
                info = tarfile.TarInfo(arcname)
                info.size = len(data)
                info.mtime = epoch
                info.mode = 0o755 if executable else 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest.name


def _tree(folder: Path) -> List[Path]:
    """Every file under ``folder``, leaving out what a build or an editor leaves behind (bytecode
    caches, dot files), as the wheel writer does. A symlinked folder is not walked, and one that
    leads out of ``folder`` is refused (as ``_read_inside`` refuses such a file)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not _skipped(d)]
        for d in dirnames:
            if (Path(dirpath) / d).is_symlink():
                _check_link(Path(dirpath) / d, folder)
        out += [Path(dirpath) / f for f in filenames if not _skipped(f)]
    return out


def _skipped(name: str) -> bool:
    """Whether the wheel writer leaves out a file or folder of this name (``TREE``)."""
    return (name in TREE["skip_names"] or name.startswith(tuple(TREE["skip_prefixes"]))
            or name.endswith(tuple(TREE["skip_suffixes"])))


def _check_link(path: Path, top: Path) -> Path:
    """What the symlink ``path`` resolves to, when that lies inside ``top``; else the sdist is
    refused naming the link, so a link to a file elsewhere (``~/.ssh/id_ed25519``) never ships."""
    target = Path(os.path.realpath(path))
    inside = Path(os.path.realpath(top))
    if not target.exists() or not (target == inside or inside in target.parents):
        raise SystemExit(
            f"{path} is a symlink to {target}, outside {top}: the sdist packs no file from "
            "outside the tree.\n\nReplace the link by a copy of the file (if it is meant to ship), "
            "or remove it."
        )
    return target


def _read_inside(path: Path, top: Path) -> bytes:
    """The bytes of the regular file ``path`` under ``top``: a symlink is followed only to a file
    inside ``top``, and a FIFO or device is refused (opened without blocking, never followed)."""
    target = _check_link(path, top) if path.is_symlink() else path
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SystemExit(f"cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SystemExit(f"{path} is not a regular file; the sdist packs regular files only."
                             "\n\nRemove it from the tree.")
        return f.read()


def _source_date_epoch() -> int:
    raw = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not raw:
        return DEFAULT_EPOCH
    if not raw.isdigit():
        raise SystemExit(f"SOURCE_DATE_EPOCH={raw!r} is not a whole number of seconds since 1970")
    # Zip (the wheel) cannot go below 1980; the sdist keeps the same floor so both agree.
    return max(int(raw), DEFAULT_EPOCH)


def _pkg_info(version: str) -> str:
    """Core metadata 2.2 with the fields the wheel's METADATA carries (src/wheel/metadata.rs),
    none of them dynamic: a wheel built from this sdist says the same."""
    fields = [("Metadata-Version", "2.2"), ("Name", NAME), ("Version", version),
              ("Summary", METADATA["summary"]), ("License", METADATA["license"]),
              ("Requires-Python", METADATA["requires_python"]),
              ("Description-Content-Type", METADATA["readme_content_type"])]
    head = "".join(f"{k}: {v}\n" for k, v in fields)
    readme = (ROOT / "README.md").read_text()
    return head + "\n" + readme + ("" if readme.endswith("\n") else "\n")


def _log(msg: str) -> None:
    sys.stderr.write(f"flashgen backend: {msg}\n")
    sys.stderr.flush()
