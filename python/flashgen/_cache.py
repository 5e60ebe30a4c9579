"""The JIT cache: one verified ``.so`` per entry, installed atomically, guarded by an OS lock.

Layout under ``FLASHGEN_CACHE_DIR`` (default ``~/.cache/flashgen``)::

    <flashgen version>/<arch key>/<entry>.so     the kernel module
    <flashgen version>/<arch key>/<entry>.json   sidecar: sha256 of the .so, instance, toolchain
    <flashgen version>/<arch key>/.locks/<entry>.lock
    <flashgen version>/<arch key>/.tmp/<entry>.<random>/   build output while compiling

The version and arch are folders, so another flashgen release or GPU arch can never see this
entry; the toolchain is checked against the sidecar. An entry is trusted only when the sidecar
parses, the toolchain matches and the bytes hash to the recorded sha256; anything else is a miss
and is rebuilt under the lock. The lock is ``fcntl.flock`` on a file that is never deleted: the
kernel drops it when its holder dies, so a killed compile never blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

__all__ = ["Entry", "sha256_file", "toolchain_probe"]

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(_CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _stat_key(path: str | None) -> list[int] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def toolchain_probe(toolchain: Mapping[str, Any]) -> dict[str, Any]:
    """What the warm path compares to notice a changed toolchain without running anything: a
    stat of the nvcc the build used and the variables that steer nvcc discovery."""
    return {
        "nvcc_stat": _stat_key(toolchain.get("nvcc")),
        "env": {k: os.environ.get(k) for k in ("FLASHGEN_NVCC", "CUDA_HOME", "CUDA_PATH")},
        "which_nvcc": _which("nvcc"),
    }


def _which(name: str) -> str | None:
    """shutil.which without importing shutil on the warm path."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


class Entry(NamedTuple):
    """One cache entry: ``dir/key.so`` and its sidecar."""

    dir: Path
    key: str

    @property
    def so_path(self) -> Path:
        return self.dir / f"{self.key}.so"

    @property
    def meta_path(self) -> Path:
        return self.dir / f"{self.key}.json"

    @property
    def lock_path(self) -> Path:
        return self.dir / ".locks" / f"{self.key}.lock"

    @property
    def tmp_root(self) -> Path:
        return self.dir / ".tmp"

    def read_valid(self) -> dict[str, Any] | None:
        """The sidecar when the entry is complete, untouched and built by the current
        toolchain; None for a miss (absent, partial, corrupted or stale)."""
        try:
            meta: dict[str, Any] = json.loads(self.meta_path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or "sha256" not in meta:
            return None
        probe = meta.get("probe")
        if probe is not None and probe != toolchain_probe(meta.get("toolchain") or {}):
            return None
        try:
            if sha256_file(self.so_path) != meta["sha256"]:
                return None
        except OSError:
            return None
        return meta

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the entry's exclusive OS lock (blocking); released on exit or process death."""
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def clear_stale_tmp(self) -> None:
        """Remove build folders that dead processes left for this entry. Call with the lock
        held: any holder of a folder for this key held the lock, so it is gone."""
        import shutil

        try:
            names = os.listdir(self.tmp_root)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(self.key + "."):
                shutil.rmtree(self.tmp_root / name, ignore_errors=True)
        for name in os.listdir(self.dir):
            if name.startswith(f".{self.key}.") and name.endswith(".part"):
                with contextlib.suppress(OSError):
                    os.unlink(self.dir / name)

    def make_tmp(self) -> Path:
        import tempfile

        self.tmp_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=self.key + ".", dir=self.tmp_root))

    def install(self, built: Path, expected_sha256: str, meta: Mapping[str, Any]) -> dict[str, Any]:
        """Copy ``built`` in (hashing as it goes), check it against ``expected_sha256``, and
        publish ``.so`` then sidecar, each by an atomic rename. Returns the sidecar."""
        self.dir.mkdir(parents=True, exist_ok=True)
        part = self.dir / f".{self.key}.{os.getpid()}.so.part"
        h = hashlib.sha256()
        try:
            with open(built, "rb") as src, open(part, "wb") as dst:
                while True:
                    block = src.read(_CHUNK)
                    if not block:
                        break
                    h.update(block)
                    dst.write(block)
                dst.flush()
                os.fsync(dst.fileno())
            digest = h.hexdigest()
            if digest != expected_sha256:
                raise OSError(
                    f"{built} hashes to {digest}, but the build reported {expected_sha256}; "
                    "the flashgen build cache may be corrupted (`flashgen clean` clears it)"
                )
            os.chmod(part, 0o755)
            os.replace(part, self.so_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
        sidecar = dict(meta)
        sidecar["sha256"] = digest
        sidecar["probe"] = toolchain_probe(sidecar.get("toolchain") or {})
        meta_part = self.dir / f".{self.key}.{os.getpid()}.json.part"
        try:
            with open(meta_part, "w") as f:
                json.dump(sidecar, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(meta_part, self.meta_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(meta_part)
        return sidecar
