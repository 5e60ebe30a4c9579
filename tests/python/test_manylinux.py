"""A wheel built for manylinux_2_17 (nvcc's host compiler: the pinned zig, see src/manylinux.rs)
and its JIT: the wheel records its glibc target and requires ziglang, the loader's JIT builds a
missing instance with the same compiler and target (the same bytes as the wheel's for the same
settings), and a JIT that cannot find zig says so. Needs the pinned nvcc and ziglang (skips
otherwise); no GPU (FLASHGEN_DEVICE_CC)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, SMALL_WHEEL_ARGS, whole_manifest

DEVICE = {"FLASHGEN_DEVICE_CC": "9.0"}

LOAD = r"""
import hashlib, json, sys
from flashgen import _loader
from flashgen._errors import CompileError, JITDisabledError
inst = json.loads(sys.argv[1])
try:
    loaded = _loader.load(inst["module"], inst["params"], prefer_aot=False)
except (CompileError, JITDisabledError) as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
else:
    data = open(loaded.path, "rb").read()
    print(json.dumps({"source": loaded.source, "sha256": hashlib.sha256(data).hexdigest()}))
"""


@pytest.fixture(scope="module")
def zig(nvcc: Path) -> Path:
    # ci/setup.sh installs ziglang beside the PyPI nvcc: <site>/nvidia/cu13/bin/nvcc.
    path = Path(os.environ.get("FLASHGEN_ZIG") or nvcc.resolve().parents[3] / "ziglang" / "zig")
    if not path.is_file():
        pytest.skip("no zig 0.13: pip install ziglang==0.13.0 (ci/requirements-cuda.txt)")
    return path


@pytest.fixture(scope="module")
def zig_wheel(flashgen_bin: Path, build_env: dict[str, str], zig: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CI's small wheel, built with --manylinux 2_17. It ships a stand-in binary that needs
    no newer glibc (the real one would be the crt-static build of ci/build-wheel.sh); the tests
    run the checkout's binary through FLASHGEN_BIN."""
    tmp = tmp_path_factory.mktemp("zig-wheel")
    (tmp / "stub.c").write_text("int main(void) { return 0; }\n")
    subprocess.run([str(zig), "cc", "-target", "x86_64-linux-gnu.2.17", "-o", str(tmp / "stub"),
                    str(tmp / "stub.c")], check=True, capture_output=True)
    cmd = [str(flashgen_bin), "--config", str(REPO / "variants.json"), "build-wheel", "--manylinux", "2_17",
           "--binary", str(tmp / "stub"), "--out", str(tmp / "dist"), "--build-dir", str(tmp / "build"),
           "--quiet", *SMALL_WHEEL_ARGS]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=build_env)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = sorted((tmp / "dist").glob("flashgen-*.whl"))
    return wheel


@pytest.fixture(scope="module")
def zig_installed(zig_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("zig-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--target", str(target), str(zig_wheel)], check=True, capture_output=True)
    return target


def _load(installed: Path, flashgen_bin: Path, build_env: dict[str, str], inst: dict[str, Any],
          cache: Path, **env_vars: str) -> dict[str, Any]:
    env = dict(build_env, PYTHONPATH=str(installed), FLASHGEN_BIN=str(flashgen_bin),
               FLASHGEN_CACHE_DIR=str(cache), **DEVICE)
    env.pop("FLASHGEN_MANYLINUX", None)
    env.update(env_vars)
    proc = subprocess.run([sys.executable, "-c", LOAD, json.dumps(inst)], capture_output=True, text=True,
                          env=env, cwd=cache.parent)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_zig_wheel_records_its_target_and_requires_ziglang(zig_wheel: Path) -> None:
    with zipfile.ZipFile(zig_wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        manifest = json.loads(zf.read("flashgen/_aot/manifest.json"))
    assert zig_wheel.name.endswith("-py3-none-manylinux_2_17_x86_64.whl")
    assert '\nRequires-Dist: ziglang==0.13.0; extra == "jit"\n' in metadata
    assert manifest["manylinux"] == "2_17"
    assert manifest["toolchain"]["host_compiler"].startswith("zig 0.13.0 c++ -target x86_64-linux-gnu.2.17 ")


def test_the_jit_of_a_zig_wheel_builds_with_its_compiler_and_gives_its_bytes(
        zig_installed: Path, flashgen_bin: Path, build_env: dict[str, str], tmp_path: Path) -> None:
    manifest = whole_manifest(lambda rel: (zig_installed / "flashgen" / rel).read_text())
    (inst,) = manifest["instances"]
    got = _load(zig_installed, flashgen_bin, build_env, inst, tmp_path / "cache")
    assert got["source"] == "jit"
    # The same compiler, glibc target, flags and sources (the installed _src/, not the checkout):
    # the wheel's bytes.
    assert got["sha256"] == inst["sha256"]
    records = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "objects").glob("*/*.json")]
    assert [r["sha256"] for r in records] == [inst["sha256"]]
    assert {p.stem for p in (tmp_path / "cache" / "objects").glob("*/*.so")} == {inst["fingerprint"]}


def test_the_jit_of_a_zig_wheel_names_a_missing_zig(
        zig_installed: Path, flashgen_bin: Path, build_env: dict[str, str], tmp_path: Path) -> None:
    manifest = whole_manifest(lambda rel: (zig_installed / "flashgen" / rel).read_text())
    (inst,) = manifest["instances"]
    missing = tmp_path / "no" / "zig"
    got = _load(zig_installed, flashgen_bin, build_env, inst, tmp_path / "cache", FLASHGEN_ZIG=str(missing))
    assert got["error"] == "CompileError"
    # The binary took the wheel's glibc target by itself (the loader passes none): it looks for zig.
    assert f"FLASHGEN_ZIG={missing} is not a file" in got["message"]
    # FLASHGEN_MANYLINUX=off: the system's g++, no zig needed (the JIT is disabled here, so the
    # answer is "not in the cache" rather than a compile).
    got = _load(zig_installed, flashgen_bin, build_env, inst, tmp_path / "cache", FLASHGEN_ZIG=str(missing),
                FLASHGEN_MANYLINUX="off", FLASHGEN_DISABLE_JIT="1")
    assert got["error"] == "JITDisabledError"
    assert "--manylinux" not in got["message"]
