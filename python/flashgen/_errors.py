"""Exceptions raised by flashgen's loader and kernels.

Every message names what is at fault (the instance URI, the tensor, the value) and, where one
exists, the environment variable or flag that would fix it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FlashgenError", "JITDisabledError", "CompileError", "KernelError", "NoGPUError"]


class FlashgenError(RuntimeError):
    """Base class of flashgen's runtime errors (bad arguments raise ValueError/TypeError)."""


class JITDisabledError(FlashgenError):
    """An instance is neither precompiled nor cached and FLASHGEN_DISABLE_JIT forbids compiling it.
    ``answer``: what ``flashgen jit`` said (its cache folder, the archs it would build)."""

    answer: dict[str, Any] | None = None


class CompileError(FlashgenError):
    """The bundled ``flashgen`` binary failed to build an instance; the message holds its stderr."""


class NoGPUError(FlashgenError):
    """No CUDA driver or device is usable for a call that needs one."""


class KernelError(FlashgenError):
    """A kernel entry point returned a nonzero status; the message is flashgen_last_error()'s."""
