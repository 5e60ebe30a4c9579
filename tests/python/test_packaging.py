"""Building from source through the PEP 517 backend (``pyproject.toml`` -> ``backend/flashgen_backend.py``):
``pip wheel .`` on a copy of the checkout, the backend's hooks called directly, the sdist (name,
PKG-INFO, contents, reproducibility) and its round trip ``pip install <sdist>`` to a JIT-only
package whose loader JIT-compiles, and the ``aot=auto`` fallback when no nvcc can be found.

CI time stays small: the backend reuses the release binary (``FLASHGEN_BIN``, which the backend
honours instead of running cargo), and wheels hold the one-instance AOT selection or nothing.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, SMALL_WHEEL_ARGS

SOURCE_DATE_EPOCH = "1700000000"
# What the checkout holds besides build outputs; the copy is what `git clone` would give.
IGNORE = shutil.ignore_patterns("target", ".venv", "build", "dist", ".git", "__pycache__", "*.pyc",
                                ".pytest_cache", ".mypy_cache", "tests", "benches")
SINGLE_DECODE = {"dtype": "bf16", "head_dim": 128, "pos_encoding": "none", "variant": "default"}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("checkout") / "flashgen"
    shutil.copytree(REPO, dst, ignore=IGNORE)
    return dst


def _no_toolchain(env: dict[str, str]) -> dict[str, str]:
    """An environment in which the binary finds no nvcc by any of its rules."""
    env = {k: v for k, v in env.items()
           if k not in ("FLASHGEN_NVCC", "CUDA_HOME", "CUDA_PATH", "VIRTUAL_ENV", "CONDA_PREFIX",
                        "FLASHGEN_PYTHON")}
    env["PATH"] = "/usr/bin:/bin"
    return env


def _hook(tree: Path, hook: str, out: Path, env: dict[str, str], **settings: str) -> tuple[str, str]:
    """Calls a backend hook in a fresh interpreter in ``tree``, as a PEP 517 frontend does;
    returns the file name it reports and its stderr."""
    code = ("import sys; sys.path.insert(0, 'backend'); import flashgen_backend as b; "
            f"print(b.{hook}({str(out)!r}, {settings!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{hook} failed:\n{proc.stdout}\n{proc.stderr}"
    name = proc.stdout.strip().splitlines()[-1]
    assert (out / name).is_file(), name
    return name, proc.stderr


def _pip_install_target(what: Path, target: Path, env: dict[str, str], *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                           "--target", str(target), *args, str(what)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"pip install {what.name} failed:\n{proc.stdout}\n{proc.stderr}"


def _run_installed(target: Path, env: dict[str, str], code: str, tmp: Path) -> Any:
    env = dict(env, PYTHONPATH=str(target), FLASHGEN_CACHE_DIR=env["FLASHGEN_CACHE_DIR"])
    env.pop("FLASHGEN_BIN", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _metadata(text: str) -> dict[str, str]:
    msg = email.parser.Parser().parsestr(text)
    return {k: msg[k] for k in ("Name", "Version", "Summary", "License", "Requires-Python")}


@pytest.fixture
def backend_env(build_env: dict[str, str], flashgen_bin: Path) -> dict[str, str]:
    return dict(build_env, FLASHGEN_BIN=str(flashgen_bin), SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)


# ---- wheels ------------------------------------------------------------------------------------


def test_backend_wheel_is_the_build_wheel_wheel(checkout: Path, backend_env: dict[str, str], wheel: Path,
                                                tmp_path: Path) -> None:
    """build_wheel with the CI selection gives the same bytes as `flashgen build-wheel` (the
    session's small wheel), from the cache that build filled: the backend adds no packaging."""
    if os.environ.get("FLASHGEN_TEST_WHEEL"):
        pytest.skip("the wheel under test was given, not built here")
    env = dict(backend_env)
    env.pop("SOURCE_DATE_EPOCH", None)  # the session's small wheel is built without one
    name, err = _hook(checkout, "build_wheel", tmp_path, env, aot="yes",
                      **{"build-wheel-args": shlex.join(SMALL_WHEEL_ARGS)})
    assert name == wheel.name
    assert hashlib.sha256((tmp_path / name).read_bytes()).digest() == hashlib.sha256(wheel.read_bytes()).digest()


def test_pip_wheel_dot_gives_an_installable_wheel(checkout: Path, backend_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    """`pip wheel .` through the isolated build environment pip makes (requires = [], so
    offline), JIT-only here (-C aot=no) to stay fast; the wheel installs and imports."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
                           "-C", "aot=no", "--wheel-dir", str(tmp_path / "wh"), "."],
                          cwd=checkout, env=backend_env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = (tmp_path / "wh").glob("flashgen-*.whl")
    with zipfile.ZipFile(whl) as zf:
        assert not [n for n in zf.namelist() if n.endswith(".so")]
        assert json.loads(zf.read("flashgen/_aot/manifest.json"))["instances"] == []
    _pip_install_target(whl, tmp_path / "site", backend_env)
    got = _run_installed(tmp_path / "site", backend_env,
                         "import flashgen, json; print(json.dumps([flashgen.__version__, "
                         "any(r['precompiled'] for r in flashgen.list_variants())]))", tmp_path)
    assert got == [whl.name.split("-")[1], False]


# ---- sdist -------------------------------------------------------------------------------------


def test_sdist_name_contents_and_reproducibility(checkout: Path, tmp_path: Path) -> None:
    env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)
    name, _ = _hook(checkout, "build_sdist", tmp_path / "a", env)
    again, _ = _hook(checkout, "build_sdist", tmp_path / "b", env)
    a, b = tmp_path / "a" / name, tmp_path / "b" / again
    assert a.read_bytes() == b.read_bytes(), "two sdists of the same tree differ"
    version = json.loads((checkout / "backend" / "metadata.json").read_text())["metadata"]["version"]  # the binary's
    assert name == f"flashgen-{version}.tar.gz"  # PEP 625: normalized name, .tar.gz
    with tarfile.open(a) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names)
        assert {m.mtime for m in members} == {int(SOURCE_DATE_EPOCH)}
        assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "", "")}
        assert all(m.isfile() and m.mode in (0o644, 0o755) for m in members)
        base = f"flashgen-{version}/"
        assert all(n.startswith(base) for n in names)
        rel = {n[len(base):] for n in names}
        for needed in ("PKG-INFO", "pyproject.toml", "Cargo.toml", "Cargo.lock", "variants.json",
                       "backend/flashgen_backend.py", "src/main.rs", "src/wheel/writer.rs",
                       "python/flashgen/__init__.py", "include/flashgen/abi.h", "README.md"):
            assert needed in rel, f"the sdist lacks {needed}"
        for module in json.loads((checkout / "variants.json").read_text())["modules"].values():
            assert f"csrc/{module['source']}" in rel
        assert not [n for n in rel if "__pycache__" in n or n.endswith(".pyc") or n.startswith(("target/", "."))]
        pkg_info = tar.extractfile(base + "PKG-INFO").read().decode()  # type: ignore[union-attr]
    meta = email.parser.Parser().parsestr(pkg_info)
    assert meta["Metadata-Version"] == "2.2" and meta["Name"] == "flashgen" and meta["Version"] == version
    assert not meta.get_all("Dynamic")


def test_sdist_installs_as_a_jit_only_package_that_jit_compiles(
        checkout: Path, backend_env: dict[str, str], wheel: Path, tmp_path: Path) -> None:
    """`pip install <sdist>` where no nvcc can be found: aot=auto falls back to a JIT-only wheel
    and says so; its metadata is the sdist's; the loader then takes every kernel from the JIT
    (served here from the session cache the small wheel's build filled, so no nvcc runs)."""
    name, _ = _hook(checkout, "build_sdist", tmp_path / "sd", backend_env)
    sdist = tmp_path / "sd" / name
    env = _no_toolchain(backend_env)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "-v",
                           "--target", str(tmp_path / "site"), str(sdist)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert "no nvcc found" in proc.stdout + proc.stderr and "JIT-only" in proc.stdout + proc.stderr
    site = tmp_path / "site"
    assert json.loads((site / "flashgen" / "_aot" / "manifest.json").read_text())["instances"] == []
    (dist_info,) = site.glob("flashgen-*.dist-info")
    with tarfile.open(sdist) as tar:
        pkg_info = tar.extractfile(name[:-len(".tar.gz")] + "/PKG-INFO").read().decode()  # type: ignore[union-attr]
    assert _metadata((dist_info / "METADATA").read_text()) == _metadata(pkg_info)

    # The loader JIT-compiles what the wheel lacks: through `flashgen jit`, for a GPU of
    # compute capability 9.0 (FLASHGEN_DEVICE_CC), with the pinned nvcc back in the environment.
    code = ("import json, flashgen; from flashgen import _loader\n"
            f"l = _loader.load('single_decode', {SINGLE_DECODE!r})\n"
            "print(json.dumps([flashgen.is_precompiled('single_decode', **%r), l.source, str(l.path)]))\n"
            % SINGLE_DECODE)
    precompiled, source, path = _run_installed(site, dict(backend_env, FLASHGEN_DEVICE_CC="9.0"), code, tmp_path)
    assert precompiled is False
    assert source in ("jit", "cache") and path.startswith(backend_env["FLASHGEN_CACHE_DIR"])


def test_python_m_build_makes_the_sdist_and_a_wheel_from_it(checkout: Path, backend_env: dict[str, str],
                                                            tmp_path: Path) -> None:
    """`python -m build` (PyPA build, pinned in ci/requirements-test.txt): the sdist, then the
    wheel built from that sdist in an isolated environment, as a package index user gets it."""
    pythons = [Path(sys.executable)]
    if os.environ.get("FLASHGEN_TOOLS_VENV"):
        pythons.insert(0, Path(os.environ["FLASHGEN_TOOLS_VENV"]) / "bin" / "python")
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('build.__main__') is None)"
    python = next((p for p in pythons if p.is_file() and subprocess.run([str(p), "-c", probe]).returncode == 0), None)
    if python is None:
        pytest.skip("PyPA build is not installed (ci/requirements-test.txt; FLASHGEN_TOOLS_VENV)")
    proc = subprocess.run([str(python), "-m", "build", "-C", "aot=no", "--outdir", str(tmp_path / "out"), "."],
                          cwd=checkout, env=backend_env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    (sdist,) = (tmp_path / "out").glob("flashgen-*.tar.gz")
    (whl,) = (tmp_path / "out").glob("flashgen-*.whl")
    assert whl.name.startswith(sdist.name[:-len(".tar.gz")] + "-py3-none-")
    _pip_install_target(whl, tmp_path / "site", backend_env)
    assert (tmp_path / "site" / "flashgen" / "_bin" / "flashgen").is_file()
