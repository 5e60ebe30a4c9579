"""The few CUDA driver calls the loader needs, through ctypes on ``libcuda.so.1``.

Used for the visible GPU's compute capability (the JIT arch) and to make the tensors' device
current around a launch. Nothing here runs at import; without a driver every function raises
NoGPUError with the reason, never crashes.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

from ._errors import NoGPUError

__all__ = ["driver", "compute_capability", "device_count", "push_device", "pop_device", "call_on_device"]

_CC_MAJOR = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_CC_MINOR = 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_load_error: str | None = None
_primary: dict[int, ctypes.c_void_p] = {}
_cc: dict[int, tuple[int, int]] = {}


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return f"{name.value.decode()} ({code})"
    except AttributeError:  # pragma: no cover
        pass
    return str(code)


def driver() -> ctypes.CDLL:
    """The initialized driver library, or NoGPUError saying why there is none."""
    global _lib, _load_error
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            if _load_error is not None:
                raise NoGPUError(_load_error)
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                _load_error = (
                    f"no CUDA driver: libcuda.so.1 could not be loaded ({exc}). flashgen kernels "
                    "need an NVIDIA GPU and its driver; to only build kernels without one, set "
                    "FLASHGEN_DEVICE_CC to the GPU's compute capability (for example 9.0)"
                )
                raise NoGPUError(_load_error) from None
            status = lib.cuInit(0)
            if status != 0:
                _load_error = (
                    f"no usable CUDA device: cuInit failed with {_error_name(lib, status)}. Check "
                    "the driver and CUDA_VISIBLE_DEVICES; to only build kernels without a GPU, set "
                    "FLASHGEN_DEVICE_CC to the GPU's compute capability (for example 9.0)"
                )
                raise NoGPUError(_load_error)
            _lib = lib
    return _lib


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        raise NoGPUError(f"CUDA driver call {what} failed with {_error_name(lib, status)}")


def device_count() -> int:
    lib = driver()
    n = ctypes.c_int()
    _check(lib, lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    return n.value


def compute_capability(device: int = 0) -> tuple[int, int]:
    """(major, minor) of CUDA device ``device`` (an ordinal under CUDA_VISIBLE_DEVICES)."""
    cached = _cc.get(device)
    if cached is not None:
        return cached
    torch: Any = sys.modules.get("torch")
    cc: tuple[int, int] | None = None
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                major, minor = torch.cuda.get_device_capability(device)
                cc = (int(major), int(minor))
        except Exception:  # fall back to the driver
            cc = None
    if cc is None:
        lib = driver()
        count = device_count()
        if not 0 <= device < count:
            raise NoGPUError(
                f"CUDA device {device} does not exist: {count} device(s) visible "
                "(CUDA_VISIBLE_DEVICES decides which)"
            )
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        major, minor = ctypes.c_int(), ctypes.c_int()
        _check(lib, lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, dev), "cuDeviceGetAttribute")
        _check(lib, lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, dev), "cuDeviceGetAttribute")
        cc = (major.value, minor.value)
    _cc[device] = cc
    return cc


_single_device: bool | None = None


def needs_guard() -> bool:
    """Whether launches must make the tensors' device current: not with one visible device,
    where the only primary context is the one any thread's runtime uses anyway."""
    global _single_device
    if _single_device is None:
        _single_device = device_count() == 1
    return not _single_device


def push_device(device: int) -> bool:
    """Make ``device``'s primary context current unless it already is; True when one was pushed
    (then call pop_device after the launch). The kernels' static CUDA runtime uses whatever
    primary context is current, the one PyTorch and CuPy also use."""
    lib = driver()
    cur = ctypes.c_int(-1)
    if lib.cuCtxGetDevice(ctypes.byref(cur)) == 0 and cur.value == device:
        return False
    ctx = _primary.get(device)
    if ctx is None:
        dev = ctypes.c_int()
        _check(lib, lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _primary[device] = ctx
    _check(lib, lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
    return True


def pop_device() -> None:
    lib = driver()
    old = ctypes.c_void_p()
    _check(lib, lib.cuCtxPopCurrent_v2(ctypes.byref(old)), "cuCtxPopCurrent")


def call_on_device(device: int, fn: Any, arg: Any) -> Any:
    """``fn(arg)`` with ``device``'s primary context current (pushed for the call when another
    one is): a launch with several visible devices."""
    pushed = push_device(device)
    try:
        return fn(arg)
    finally:
        if pushed:
            pop_device()
