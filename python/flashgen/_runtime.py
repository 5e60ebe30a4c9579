"""The CUDA runtime a kernel binary links, mapped once per process before the binary is loaded.

An instance ``.so`` carries only its own code: it names the toolkit's shared runtime
(``libcudart.so.13``) as a dependency instead of linking a static copy. The dependency is read
from the verified bytes themselves (the ELF ``DT_NEEDED`` entries), so what is looked for is what
the checked binary asks for. The runtime is taken, in order:

1. already mapped in this process (torch, cupy and jax load it), matched by its soname;
2. the PyPI runtime package (``nvidia-cuda-runtime``, which the wheel requires) in this
   installation's own site folders: the one holding the flashgen package, then the
   interpreter's ``purelib``/``platlib`` and the user site; never the current folder or
   ``sys.path`` entries a program added;
3. the system's dynamic loader path (a CUDA toolkit, ``LD_LIBRARY_PATH``).

Loaded with ``RTLD_GLOBAL`` and kept for the life of the process, so the dynamic loader satisfies
every instance's dependency with that one copy.
"""

from __future__ import annotations

import ctypes
import os
import re
import site
import struct
import sysconfig
import threading
from pathlib import Path

from ._errors import FlashgenError

__all__ = ["RuntimeMissingError", "needed_runtimes", "ensure_loaded"]

_RUNTIME = re.compile(r"libcudart\.so\.(\d+)")
_lock = threading.Lock()
_loaded: dict[str, str] = {}  # soname -> where it came from
_handles: list[ctypes.CDLL] = []


class RuntimeMissingError(FlashgenError):
    """The CUDA runtime a kernel binary needs is not installed where flashgen looks for it."""


def needed_runtimes(data: bytes) -> list[str]:
    """The CUDA runtime sonames among the ``DT_NEEDED`` entries of the ELF64 shared object
    ``data`` (little endian, as every Linux x86_64 and aarch64 binary is)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != 6 or link >= len(sections):  # SHT_DYNAMIC; its link is the string table
            continue
        strtab = sections[link][4]
        for pos in range(offset, offset + size, entsize or 16):
            tag, value = struct.unpack_from("<qQ", data, pos)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", strtab + value)
                name = data[strtab + value:end].decode("ascii", "replace")
                if _RUNTIME.fullmatch(name):
                    out.append(name)
    return out


def _site_folders() -> list[Path]:
    """This installation's own package folders, in the order searched."""
    here = Path(__file__).resolve().parent.parent  # the folder that holds the flashgen package
    folders = [here]
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            folders.append(Path(path))
    try:
        folders.append(Path(site.getusersitepackages()))
    except Exception:  # pragma: no cover - site without a user folder
        pass
    return list(dict.fromkeys(folders))  # each once, in order


def _package_candidates(soname: str) -> list[Path]:
    major = _RUNTIME.fullmatch(soname).group(1)  # type: ignore[union-attr]
    # CUDA 13's wheels put every library under nvidia/cu13/lib; CUDA 12's under one folder each.
    rel = [Path("nvidia") / f"cu{major}" / "lib" / soname,
           Path("nvidia") / "cuda_runtime" / "lib" / soname]
    return [folder / r for folder in _site_folders() for r in rel]


def ensure_loaded(soname: str) -> str:
    """Makes sure ``soname`` is mapped in this process; returns where it was found."""
    if soname in _loaded:
        return _loaded[soname]
    with _lock:
        if soname in _loaded:
            return _loaded[soname]
        global_mode = getattr(os, "RTLD_GLOBAL", ctypes.RTLD_GLOBAL)
        try:
            _handles.append(ctypes.CDLL(soname, mode=global_mode | os.RTLD_NOLOAD))
            _loaded[soname] = "already loaded in this process"
            return _loaded[soname]
        except OSError:
            pass
        for path in _package_candidates(soname):
            if path.is_file():
                try:
                    _handles.append(ctypes.CDLL(str(path), mode=global_mode))
                except OSError as exc:
                    raise RuntimeMissingError(
                        f"the CUDA runtime {path} could not be loaded: {exc}"
                    ) from None
                _loaded[soname] = str(path)
                return _loaded[soname]
        try:
            _handles.append(ctypes.CDLL(soname, mode=global_mode))
            _loaded[soname] = "the system's library path"
            return _loaded[soname]
        except OSError as exc:
            system_error = str(exc)
        major = _RUNTIME.fullmatch(soname).group(1)  # type: ignore[union-attr]
        from ._install import matrix_json

        # The binary's name for the package (describe's wheel.runtime_requirements).
        requirement = matrix_json()["wheel"]["runtime_requirements"].get(
            major, f"the CUDA {major} runtime package")
        raise RuntimeMissingError(
            f"flashgen's kernels need the CUDA {major} runtime ({soname}), which is not loaded "
            f"and was not found: not under nvidia/ in this installation's site folders "
            f"({', '.join(map(str, _site_folders()))}), "
            f"nor on the system's library path ({system_error}).\n\n"
            f"Install it beside flashgen: pip install '{requirement}' (the flashgen wheel "
            "requires it; an install with --no-deps skips it), or put a CUDA "
            f"{major} toolkit's lib64 on LD_LIBRARY_PATH."
        )
