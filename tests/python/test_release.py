"""The release's architectures, as the loader of an installed release serves each GPU
generation, without a GPU (``FLASHGEN_DEVICE_CC``) and with the JIT disabled, so nothing
compiles: the wheels ``build-wheel --release`` writes (variants.json's ``release.archs``: sm_80
with compute_80 PTX, sm_90a, sm_100, sm_120; one kernel wheel each, and the core wheel) for one
single_decode configuration, both backends, installed with pip into one folder.

Each device gets the precompiled code that runs on it, from the kernel wheel that has it:
Ampere and Ada the sm_80 code, Hopper the sm90 backend's sm_90a, Blackwell its own sm_100 or
sm_120, and a generation the release does not name (11.0) the PTX, which its driver compiles.
The instance is loaded from the verified bytes, which also maps the shared CUDA runtime it
links. Without the kernel wheel a GPU needs, the error names the extra that installs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, whole_manifest

ONE = ["--module", "single_decode", "--where", "dtype=bf16", "--where", "head_dim=128",
       "--where", "pos_encoding=none", "--where", "variant=default"]


@pytest.fixture(scope="module")
def release_wheels(flashgen_bin: Path, build_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("release-dist")
    build = tmp_path_factory.mktemp("release-build") / "b"
    cmd = [str(flashgen_bin), "--config", str(REPO / "variants.json"), "build-wheel", "--release", "--out", str(out),
           "--build-dir", str(build), "--quiet", *ONE]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=build_env)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr}"
    return [Path(p) for p in proc.stdout.split()]


def _install(wheels: list[Path], site: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--target", str(site), *map(str, wheels)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return site


@pytest.fixture(scope="module")
def release_site(release_wheels: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _install(release_wheels, tmp_path_factory.mktemp("release-site"))


def _load(site: Path, build_env: dict[str, str], tmp_path: Path, cc: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import json\nfrom flashgen import _loader\n"
        "l = _loader.load('single_decode', {'dtype': 'bf16', 'head_dim': 128, 'pos_encoding': 'none',"
        " 'variant': 'default'})\n"
        "l.kernels\n"  # maps the bytes (and the CUDA runtime they need) without a GPU
        "print(json.dumps({'uri': l.uri, 'source': l.source}))\n"
    )
    env = dict(build_env, PYTHONPATH=str(site), FLASHGEN_DEVICE_CC=cc, FLASHGEN_DISABLE_JIT="1",
               FLASHGEN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("FLASHGEN_BIN", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)


def test_one_kernel_wheel_per_release_target_and_the_core(release_wheels: list[Path], release_site: Path) -> None:
    names = [w.name.split("-")[0] for w in release_wheels]
    assert names == ["flashgen_kernels_sm80", "flashgen_kernels_sm90a", "flashgen_kernels_sm100",
                     "flashgen_kernels_sm120", "flashgen"], names
    archs: dict[str, dict[str, list[str]]] = {}
    for package in names[:-1]:
        manifest = whole_manifest(lambda rel: (release_site / package / rel).read_text())
        archs[package] = {r["params"]["backend"]: r["archs"] for r in manifest["instances"]}
    assert archs == {
        "flashgen_kernels_sm80": {"portable": ["sm_80", "compute_80"]},
        "flashgen_kernels_sm90a": {"portable": ["sm_90a"], "sm90": ["sm_90a"]},
        "flashgen_kernels_sm100": {"portable": ["sm_100"]},
        "flashgen_kernels_sm120": {"portable": ["sm_120"]},
    }
    core = json.loads((release_site / "flashgen" / "_aot" / "manifest.json").read_text())
    assert core["instances"] == [] and [k["extra"] for k in core["kernel_packages"]] == [
        "sm80", "sm90a", "sm100", "sm120"]


@pytest.mark.parametrize("cc, backend", [
    ("8.0", "portable"), ("8.6", "portable"), ("8.9", "portable"),  # sm_80 code runs on 8.x
    ("9.0", "sm90"),                                                 # Hopper takes its own backend
    ("10.0", "portable"), ("10.3", "portable"),                      # sm_100 runs on 10.x
    ("12.0", "portable"),                                            # sm_120
    ("11.0", "portable"),                                            # no code of its own: the PTX
])
def test_each_gpu_generation_gets_precompiled_code(release_site: Path, build_env: dict[str, str], tmp_path: Path,
                                                   cc: str, backend: str) -> None:
    proc = _load(release_site, build_env, tmp_path, cc)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["source"] == "aot", got
    assert got["uri"].endswith(f"_backend_{backend}"), got


def test_a_gpu_older_than_the_release_is_told_so(release_site: Path, build_env: dict[str, str], tmp_path: Path) -> None:
    proc = _load(release_site, build_env, tmp_path, "7.5")
    assert proc.returncode != 0
    assert "7.5" in proc.stderr, proc.stderr


def test_without_its_kernel_wheel_a_gpu_is_told_which_extra_to_install(
        release_wheels: list[Path], build_env: dict[str, str], tmp_path: Path) -> None:
    # The core and Hopper's kernels only: Hopper is served, Ampere is told to install flashgen[sm80].
    site = _install([w for w in release_wheels if w.name.split("-")[0] in ("flashgen", "flashgen_kernels_sm90a")],
                    tmp_path / "site")
    proc = _load(site, build_env, tmp_path, "9.0")
    assert proc.returncode == 0, proc.stderr
    proc = _load(site, build_env, tmp_path, "8.0")
    assert proc.returncode != 0
    assert "JITDisabledError" in proc.stderr and "pip install 'flashgen[sm80]'" in proc.stderr, proc.stderr
    # doctor says the same of the installation.
    doctor = subprocess.run([str(site / "flashgen" / "_bin" / "flashgen"), "doctor"], capture_output=True, text=True,
                            env=build_env, cwd=tmp_path)
    assert "kernel wheel:  flashgen_kernels_sm90a (installed)" in doctor.stdout, doctor.stdout
    assert "kernel wheel:  flashgen_kernels_sm80 (not installed: pip install 'flashgen[sm80]')" in doctor.stdout
    assert "(2 precompiled instances for sm_90a)" in doctor.stdout, doctor.stdout


def test_a_missing_cuda_runtime_names_the_package_to_install(
        release_site: Path, build_env: dict[str, str], tmp_path: Path) -> None:
    """A fresh venv with no packages and the release on PYTHONPATH: nothing provides
    libcudart.so.13, so mapping an instance fails with the package to install, not a raw dlopen
    error."""
    import ctypes.util

    if ctypes.util.find_library("cudart"):
        pytest.skip("the system's library path has a CUDA runtime, which the loader would take")
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    code = (
        "from flashgen import _loader\n"
        "l = _loader.load('single_decode', {'dtype': 'bf16', 'head_dim': 128, 'pos_encoding': 'none',"
        " 'variant': 'default'})\n"
        "l.kernels\n"
    )
    env = {k: v for k, v in build_env.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(release_site), FLASHGEN_DEVICE_CC="9.0", FLASHGEN_DISABLE_JIT="1",
               FLASHGEN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("FLASHGEN_BIN", None)
    env.pop("LD_LIBRARY_PATH", None)
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "RuntimeMissingError" in proc.stderr, proc.stderr
    assert "libcudart.so.13" in proc.stderr and "pip install 'nvidia-cuda-runtime==13.*'" in proc.stderr, proc.stderr


def test_an_instance_the_release_leaves_out_is_refused_with_the_reason(
        release_site: Path, build_env: dict[str, str], tmp_path: Path) -> None:
    """variants.json's ``modules.<m>.release.exclude`` travels in the wheel's matrix
    (``outside_release``): with the JIT disabled, the error says the release leaves the instance
    out, and why, instead of naming a kernel wheel that would not hold it either."""
    import shutil

    site = tmp_path / "site"
    shutil.copytree(release_site, site)
    rows_file = site / "flashgen" / "_data" / "instances" / "single_decode.json"
    rows = json.loads(rows_file.read_text())
    wanted = {"dtype": "f16", "head_dim": 64, "pos_encoding": "none", "variant": "default", "backend": "portable"}
    (row,) = [r for r in rows if r["params"] == wanted]
    row["outside_release"] = "f16 head_dim 64 is left to the JIT"
    rows_file.write_text(json.dumps(rows))
    code = ("from flashgen import _loader\n"
            f"_loader.load('single_decode', {wanted!r})\n")
    env = dict(build_env, PYTHONPATH=str(site), FLASHGEN_DEVICE_CC="8.0", FLASHGEN_DISABLE_JIT="1",
               FLASHGEN_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("FLASHGEN_BIN", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode != 0
    assert "JITDisabledError" in proc.stderr, proc.stderr
    assert "the release leaves it out (f16 head_dim 64 is left to the JIT)" in proc.stderr, proc.stderr
