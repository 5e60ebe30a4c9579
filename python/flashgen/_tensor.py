"""Reading tensors from any framework, and allocating outputs and workspace with the caller's.

``describe`` turns a tensor into a ``Tensor`` record (address, shape, strides in elements, dtype,
device). PyTorch tensors and CuPy arrays are read directly (a few attribute reads, no capsule);
anything else goes through DLPack (``__dlpack_device__`` / ``__dlpack__``), parsed with ctypes.
Frameworks are found in ``sys.modules`` and never imported here: torch is not needed to use
flashgen with CuPy, nor the other way round.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable, NamedTuple, Protocol, Sequence, Tuple, Union

__all__ = ["TensorLike", "Output", "Tensor", "describe", "Framework", "framework_of", "allocator_for", "KDL_CPU",
           "KDL_CUDA", "dtype_named"]

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                 10: "rocm", 13: "cuda_managed", 14: "oneapi"}


class TensorLike(Protocol):
    """What the API takes as a tensor: a DLPack producer on a CUDA device (a torch tensor, a CuPy
    array, or anything with these two methods). torch and CuPy are read through their own
    attributes, faster, but every tensor flashgen takes offers these."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __dlpack_device__(self) -> Tuple[int, int]: ...


# What a kernel call returns: ``o``, a tensor of ``q``'s framework (typed ``Any`` so that it keeps
# that framework's methods), or ``(o, lse)`` with ``return_lse=True``.
Output = Union[Any, Tuple[Any, Any]]


class Tensor(NamedTuple):
    """What the launch needs from a tensor. Strides are in elements."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str  # "f16", "bf16", "f32", "i32", "fp8_e4m3", ... (others spelled as their framework does)
    device_type: int  # DLPack device type: 2 = CUDA
    device_id: int
    framework: str  # "torch", "cupy" or "dlpack"

    @property
    def device(self) -> str:
        kind = _DEVICE_NAMES.get(self.device_type, f"dlpack-device-{self.device_type}")
        return f"{kind}:{self.device_id}" if self.device_type != KDL_CPU else "cpu"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of its elements (a dtype this module cannot name counts one byte each)."""
        return self.numel * _ITEM_BYTES.get(self.dtype, 1)

    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


# ---- DLPack -----------------------------------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DL_CODES = {(2, 16): "f16", (2, 32): "f32", (2, 64): "f64", (4, 16): "bf16", (0, 8): "i8",
             (0, 16): "i16", (0, 32): "i32", (0, 64): "i64", (1, 8): "u8", (1, 32): "u32",
             (1, 64): "u64", (6, 8): "bool",
             (10, 8): "fp8_e4m3", (12, 8): "fp8_e5m2"}  # DLPack 1.1's kDLFloat8_e4m3fn, _e5m2

_ITEM_BYTES = {name: bits // 8 for (_, bits), name in _DL_CODES.items()}

_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _describe_dlpack(obj: Any, name: str, stream: int | None) -> Tensor:
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(
            f"{name} must be a tensor (torch, cupy, or any object with __dlpack__), "
            f"got {type(obj).__name__}"
        )
    dev_type, dev_id = (KDL_CPU, 0)
    if hasattr(obj, "__dlpack_device__"):
        dev_type, dev_id = (int(x) for x in obj.__dlpack_device__())
    if dev_type == KDL_CUDA:
        # Ask the producer to make its pending work visible to our launch stream (DLPack: 1 is
        # the legacy default stream).
        capsule = obj.__dlpack__(stream=stream if stream else 1)
    else:
        capsule = obj.__dlpack__()
    if not _capsule_valid(capsule, b"dltensor"):
        raise TypeError(f"{name}: __dlpack__ returned no DLPack capsule")
    # The capsule owns a reference to the producer's buffer until it is dropped; `obj` keeps the
    # buffer alive for the call, so reading the fields and dropping the capsule is safe.
    managed = _capsule_get(capsule, b"dltensor")
    dl = _DLTensor.from_address(managed)
    ndim = dl.ndim
    shape = tuple(dl.shape[i] for i in range(ndim))
    if dl.strides:
        strides = tuple(dl.strides[i] for i in range(ndim))
    else:
        acc, rev = 1, []
        for size in reversed(shape):
            rev.append(acc)
            acc *= size
        strides = tuple(reversed(rev))
    code = (dl.dtype.code, dl.dtype.bits)
    dtype = _DL_CODES.get(code, f"dlpack(code={code[0]}, bits={code[1]})")
    if dl.dtype.lanes != 1:
        dtype += f"x{dl.dtype.lanes}"
    ptr = (dl.data or 0) + dl.byte_offset
    return Tensor(ptr, shape, strides, dtype, dl.device.device_type, dl.device.device_id, "dlpack")


# ---- frameworks -------------------------------------------------------------------------------


class Framework:
    """How to read, allocate and find the current stream for one framework's tensors."""

    name = "dlpack"

    def describe(self, obj: Any, name: str) -> Tensor:
        return _describe_dlpack(obj, name, None)

    def stream(self, device: int) -> int:
        return 0  # the legacy default stream

    def stream_getter(self) -> Callable[[int], int]:
        """A callable device -> current stream as an int (the fastest this framework has)."""
        return self.stream

    def ptr(self, obj: Any) -> int:
        """Address of a tensor this framework allocated (``empty``)."""
        return self.describe(obj, "output").ptr

    def empty(self, shape: Sequence[int], dtype: str, device: int, what: str) -> Any:
        raise TypeError(
            f"{what}: cannot allocate outputs for tensors of this framework (only torch and cupy); "
            "pass out= (and use torch or cupy tensors for kernels that need a workspace)"
        )


_TORCH_DT: dict[Any, str] = {}
_TORCH_FROM: dict[str, Any] = {}


class _Torch(Framework):
    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        for dt, s in ((torch.float16, "f16"), (torch.bfloat16, "bf16"), (torch.float32, "f32"),
                      (torch.float64, "f64"), (torch.int32, "i32"), (torch.int64, "i64"),
                      (torch.uint8, "u8"), (torch.int8, "i8"), (torch.bool, "bool")):
            _TORCH_DT[dt] = s
            _TORCH_FROM[s] = dt
        for attr, s in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):  # torch >= 2.1
            if hasattr(torch, attr):
                _TORCH_DT[getattr(torch, attr)] = s
        self._devices: dict[int, Any] = {}
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream: Callable[[int], int] | None = raw

    def describe(self, t: Any, name: str) -> Tensor:
        # is_cuda / get_device() are plain attribute reads; t.device would build a device object.
        if t.is_cuda:
            dt = t.dtype
            return Tensor(t.data_ptr(), t.shape, t.stride(), _TORCH_DT.get(dt) or str(dt),
                          KDL_CUDA, t.get_device(), "torch")
        dev = t.device
        dtype = _TORCH_DT.get(t.dtype) or str(t.dtype)
        kind = KDL_CPU if dev.type == "cpu" else -1
        return Tensor(0, tuple(t.shape), t.stride(), dtype, kind, dev.index or 0, f"torch:{dev.type}")

    def stream(self, device: int) -> int:
        if self._raw_stream is not None:
            return int(self._raw_stream(device))
        return int(self.torch.cuda.current_stream(device).cuda_stream)

    def stream_getter(self) -> Callable[[int], int]:
        raw = self._raw_stream
        return raw if raw is not None else self.stream  # the raw getter returns an int

    def ptr(self, obj: Any) -> int:
        return obj.data_ptr()

    def empty(self, shape: Sequence[int], dtype: str, device: int, what: str) -> Any:
        dev = self._devices.get(device)
        if dev is None:
            dev = self._devices[device] = self.torch.device("cuda", device)
        return self.torch.empty(shape, dtype=_TORCH_FROM[dtype], device=dev)


_CUPY_DT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
            "int32": "i32", "int64": "i64", "uint8": "u8", "int8": "i8", "bool": "bool"}
_CUPY_FROM = {v: k for k, v in _CUPY_DT.items()}
# Our dtype names by every spelling an argument may use: ours, cupy's / numpy's, torch's.
_NAMED = {**{n: n for n in _DL_CODES.values()}, **_CUPY_DT, "half": "f16",
          "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


def dtype_named(value: Any) -> str | None:
    """Our name of a dtype given as an argument (``torch.bfloat16``, ``"bfloat16"``, ``"bf16"``),
    or None for one flashgen does not know."""
    return _NAMED.get(str(value).removeprefix("torch."))


class _Cupy(Framework):
    name = "cupy"

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy

    def describe(self, a: Any, name: str) -> Tensor:
        item = a.itemsize
        dt = a.dtype.name
        return Tensor(a.data.ptr, tuple(a.shape), tuple(s // item for s in a.strides),
                      _CUPY_DT.get(dt, dt), KDL_CUDA, a.device.id, "cupy")

    def stream(self, device: int) -> int:
        cuda = self.cupy.cuda
        try:
            return int(cuda.get_current_stream(device).ptr)
        except TypeError:  # older cupy: no device argument
            with cuda.Device(device):
                return int(cuda.get_current_stream().ptr)

    def ptr(self, obj: Any) -> int:
        return int(obj.data.ptr)

    def empty(self, shape: Sequence[int], dtype: str, device: int, what: str) -> Any:
        with self.cupy.cuda.Device(device):
            if dtype == "bf16":
                raise TypeError(f"{what}: cupy has no bfloat16 dtype; pass out= for bf16 outputs")
            return self.cupy.empty(tuple(shape), dtype=_CUPY_FROM[dtype])


_GENERIC = Framework()
_by_type: dict[type, Framework] = {}


def framework_of(obj: Any) -> Framework:
    """The adapter for ``obj``'s type (memoized per type)."""
    tp = type(obj)
    fw = _by_type.get(tp)
    if fw is not None:
        return fw
    fw = _GENERIC
    torch = sys.modules.get("torch")
    cupy = sys.modules.get("cupy")
    if torch is not None and isinstance(obj, torch.Tensor):
        fw = _Torch(torch)
    elif cupy is not None and isinstance(obj, cupy.ndarray):
        fw = _Cupy(cupy)
    _by_type[tp] = fw
    return fw


def describe(obj: Any, name: str) -> Tensor:
    return framework_of(obj).describe(obj, name)


_torch_tensor: Any = None


def torch_tensor_type() -> Any:
    """``torch.Tensor`` once the process has imported torch, else None (never imports it)."""
    global _torch_tensor
    if _torch_tensor is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        _torch_tensor = torch.Tensor
    return _torch_tensor


def allocator_for(fw: Framework) -> Framework:
    """The framework that allocates outputs and workspace for inputs read through ``fw``: the
    inputs' own when it can, else torch or cupy if the process already imported one (tensors from
    a bare DLPack producer such as JAX). Streams still come from ``fw``."""
    if fw is not _GENERIC:
        return fw
    torch = sys.modules.get("torch")
    if torch is not None:
        return framework_of(torch.empty(0))
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        return _Cupy(cupy)
    return fw
