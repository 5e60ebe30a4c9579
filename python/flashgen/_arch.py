"""GPU architectures: parsing arch lists, and which compiled arch runs on which GPU.

Spellings accepted as PyTorch users write them (``"8.0 9.0a"``, ``"80;90a"``, ``"sm_90a"``,
``"9.0+PTX"``). Compatibility rules (CUDA's): a cubin ``sm_XY`` runs on compute capability X.y
with y >= Y; an arch-specific ``sm_XYa`` only on exactly X.Y; a family ``sm_XYf`` on X.y with
y >= Y; PTX (``compute_XY``) is JIT-compiled by the driver on any capability >= X.Y.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

__all__ = ["Arch", "parse_arch", "parse_arch_list", "runs_on", "arch_key", "jit_arch_for"]


class Arch(NamedTuple):
    major: int
    minor: int
    suffix: str  # "", "a" or "f"
    ptx: bool  # compute_XY (PTX) rather than sm_XY (cubin)

    @property
    def name(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.major}{self.minor}{self.suffix}"

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)


_TOKEN = r"^(?:(sm|compute)_)?(\d+)(?:\.(\d))?([af]?)$"  # compiled on first use (re caches it)


def parse_arch(token: str) -> list[Arch]:
    """One token (``9.0a``, ``90a``, ``sm_90a``, ``compute_90``, ``8.6+PTX``) as one or two archs."""
    text = token.strip()
    ptx_too = False
    if text.upper().endswith("+PTX"):
        ptx_too, text = True, text[:-4]
    m = re.match(_TOKEN, text.lower())
    if not m:
        raise ValueError(
            f"cannot read the GPU arch {token!r}; write it like 9.0a, 8.6, 90a, sm_90a or 9.0+PTX"
        )
    kind, digits, dotted_minor, suffix = m.groups()
    if dotted_minor is not None:
        major, minor = int(digits), int(dotted_minor)
    else:
        if len(digits) < 2:
            raise ValueError(f"cannot read the GPU arch {token!r}; write it like 9.0a or 90a")
        major, minor = int(digits[:-1]), int(digits[-1])
    is_ptx = kind == "compute"
    out = [Arch(major, minor, suffix, is_ptx)]
    if ptx_too and not is_ptx:
        out.append(Arch(major, minor, suffix, True))
    return out


def parse_arch_list(text: str | Iterable[str]) -> list[Arch]:
    """A whole list (space, comma or semicolon separated, or already split), deduplicated, in order."""
    tokens = re.split(r"[\s,;]+", text) if isinstance(text, str) else list(text)
    out: list[Arch] = []
    for token in tokens:
        if token.strip():
            for arch in parse_arch(token):
                if arch not in out:
                    out.append(arch)
    if not out:
        raise ValueError(f"the GPU arch list {text!r} is empty")
    return out


def runs_on(arch: Arch, cc: tuple[int, int]) -> bool:
    """Whether code compiled for ``arch`` runs on a GPU of compute capability ``cc``."""
    major, minor = cc
    if arch.suffix == "a":
        return (major, minor) == arch.cc
    if arch.ptx:
        return (major, minor) >= arch.cc
    return major == arch.major and minor >= arch.minor


def covers(archs: Iterable[Arch], cc: tuple[int, int]) -> bool:
    return any(runs_on(a, cc) for a in archs)


def arch_key(archs: Iterable[Arch]) -> str:
    """A folder name for a JIT arch list, independent of spelling and order: ``sm_80-sm_90a``."""
    return "-".join(sorted({a.name for a in archs}))


def jit_arch_for(cc: tuple[int, int]) -> str:
    """The arch the JIT builds for a GPU: ``9.0a`` on Hopper (wgmma needs it), else ``X.Y``."""
    major, minor = cc
    return f"{major}.{minor}a" if (major, minor) == (9, 0) else f"{major}.{minor}"
