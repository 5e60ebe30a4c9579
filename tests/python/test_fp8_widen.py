"""The fp8 KV cache's widening to f16 / bf16 (``include/flashgen/dtype.cuh``, ``flashgen::fp8``),
checked for all 256 bytes of e4m3 and e5m2 on the CPU: ``tests/cuda/fp8_widen_check.cu`` is
compiled as host C++ against nvcc's CUDA headers (the functions are ``__host__ __device__``; on
the device only the exact power-of-two multiply is a packed 16-bit one instead of a float one)
and compares each value with one computed from the format's definition."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_every_fp8_byte_widens_to_its_exact_value(nvcc: Path, tmp_path: Path) -> None:
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler (c++)")
    exe = tmp_path / "fp8_widen_check"
    cuda_include = nvcc.parent.parent / "include"
    subprocess.run([cxx, "-std=c++17", "-x", "c++", "-O1", "-Wall", "-Wno-unknown-pragmas", "-I", str(REPO / "include"),
                    "-I", str(cuda_include), "-o", str(exe), str(REPO / "tests/cuda/fp8_widen_check.cu")],
                   check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for pair in ("e4m3->f16", "e5m2->f16", "e4m3->bf16", "e5m2->bf16"):
        assert f"{pair}: 0 wrong" in proc.stdout
