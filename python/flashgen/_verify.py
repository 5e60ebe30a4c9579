"""Loading a kernel binary that someone else could have written: check it, then load exactly the
bytes that were checked.

A ``.so`` is opened once (never through a symlink), its owner and mode are checked on the open
file, its bytes are read into memory and hashed, and only when the sha256 is the one its record
names are those same bytes copied into a sealed in-memory file (``memfd_create``) that the
dynamic loader maps. Nothing can swap the file between the check and the load: the loader never
opens the path again.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from ._errors import FlashgenError

__all__ = ["read_checked", "loadable_path", "UntrustedFileError"]


class UntrustedFileError(FlashgenError):
    """A kernel file is not what its record says, or could have been written by someone else."""


def read_checked(path: Path, sha256: str, *, private: bool) -> bytes:
    """The bytes of ``path`` when they hash to ``sha256``. ``private``: the file must also belong
    to this user and be writable by nobody else (a cache entry; the wheel's own files are as
    trusted as its Python code, so for them only the hash is checked)."""
    # No symlink is followed, and a FIFO (or device) planted in its place opens without waiting
    # for a writer, then is refused as not a regular file.
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UntrustedFileError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFileError(f"{path} is not a regular file (mode {st.st_mode:o})")
        if private:
            if st.st_uid != os.geteuid():
                raise UntrustedFileError(
                    f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); "
                    "flashgen loads only cache files it could have written itself"
                )
            if st.st_mode & 0o022:
                raise UntrustedFileError(
                    f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                    "another user could have replaced it"
                )
        chunks = []
        while True:
            block = os.read(fd, 1 << 22)
            if not block:
                break
            chunks.append(block)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise UntrustedFileError(
            f"{path} does not match the sha256 of its record (got {digest}, expected {sha256})"
        )
    return data


# The sealed files stay open for the life of the process: the dynamic loader recognises an
# already-loaded library by its path, so a closed descriptor number reused by a later memfd
# would make dlopen hand back the earlier library.
_memfds: list[int] = []


def loadable_path(data: bytes, name: str) -> str:
    """A path the dynamic loader can open that holds exactly ``data``: a sealed memfd."""
    import fcntl

    fd = os.memfd_create(f"flashgen:{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    _memfds.append(fd)
    path = f"/proc/self/fd/{fd}"
    if not os.path.exists(path):  # pragma: no cover - /proc not mounted
        raise FlashgenError(
            f"cannot load {name} from memory: {path} does not exist (is /proc mounted?)"
        )
    return path
