"""The wheel, checked with real tools on a machine without a GPU: its name, tags and metadata,
RECORD hashes recomputed here, the files the loader relies on, ``pip install`` into a fresh venv
plus ``pip check``, ``auditwheel show``, ``check-wheel-contents``, and ``import flashgen`` in that
venv: introspection agrees with the CLI, and calling a kernel without a GPU is a clear error.

The wheel comes from ``FLASHGEN_TEST_WHEEL`` or is built by ``flashgen build-wheel`` (see
conftest). The PyPI tools come from ``FLASHGEN_TOOLS_VENV`` or are installed once into
``build/test-tools-venv``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

from conftest import FAKE_TENSOR_SRC, REPO, SMALL_WHEEL_ARGS, whole_manifest, whole_matrix

TOOLS = ("auditwheel", "check-wheel-contents")


@pytest.fixture(scope="session")
def zf(wheel: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(wheel)


@pytest.fixture(scope="session")
def dist_info(zf: zipfile.ZipFile) -> str:
    names = {n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info")}
    assert len(names) == 1, names
    return names.pop()


@pytest.fixture(scope="session")
def tools_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("FLASHGEN_TOOLS_VENV")
    if env:
        venv = Path(env)
    else:
        venv = REPO / "build" / "test-tools-venv"
        if not all((venv / "bin" / t).exists() for t in TOOLS):
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *TOOLS],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                pytest.skip(f"could not install {', '.join(TOOLS)} from PyPI (offline?); set "
                            f"FLASHGEN_TOOLS_VENV to a venv that has them:\n{proc.stderr[-2000:]}")
    missing = [t for t in TOOLS if not (venv / "bin" / t).exists()]
    if missing:
        pytest.skip(f"{venv} lacks {', '.join(missing)} (FLASHGEN_TOOLS_VENV)")
    return venv


def _pinned(name: str) -> str:
    """The requirement line ``ci/requirements-cuda.txt`` pins for ``name``."""
    for line in (REPO / "ci" / "requirements-cuda.txt").read_text().splitlines():
        if line.split("==")[0].strip() == name:
            return line.strip()
    raise AssertionError(f"ci/requirements-cuda.txt pins no {name}")


@pytest.fixture(scope="session")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel pip-installed as a user would, its one dependency (the CUDA
    runtime its kernels link) resolved from a folder: pip sees no index, so nothing else can
    come in."""
    venv = tmp_path_factory.mktemp("venv")
    links = tmp_path_factory.mktemp("links")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                           "--dest", str(links), _pinned("nvidia-cuda-runtime")], capture_output=True, text=True)
    assert proc.returncode == 0, f"pip download of the CUDA runtime failed:\n{proc.stderr}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--find-links",
                           str(links), "--quiet", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, f"pip install {wheel.name} into a fresh venv failed:\n{proc.stderr}"
    return venv


def _venv_env(venv: Path, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHGEN_", "PYTHON"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env["FLASHGEN_CACHE_DIR"] = str(tmp_path / "cache")
    return env


def _run_in_venv(venv: Path, tmp_path: Path, code: str) -> str:
    """Runs ``code`` with the venv's interpreter in a clean environment; returns its stdout."""
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=_venv_env(venv, tmp_path),
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# ---- name, tags, metadata, RECORD ---------------------------------------------------------------


def test_name_and_wheel_tags(wheel: Path, zf: zipfile.ZipFile, dist_info: str) -> None:
    m = re.fullmatch(r"flashgen-([^-]+)-py3-none-([a-z0-9_.]+)\.whl", wheel.name)
    assert m, f"{wheel.name}: expected flashgen-<version>-py3-none-<platform>.whl"
    version, platforms = m.groups()
    assert dist_info == f"flashgen-{version}.dist-info"
    meta = Parser().parsestr(zf.read(f"{dist_info}/WHEEL").decode())
    assert meta["Wheel-Version"] == "1.0"
    assert meta["Root-Is-Purelib"].strip().lower() == "false", "the wheel holds platform binaries"
    assert sorted(meta.get_all("Tag")) == sorted(f"py3-none-{p}" for p in platforms.split("."))
    assert all(re.fullmatch(r"(manylinux_\d+_\d+|linux)_x86_64|manylinux_\d+_\d+_aarch64", p) for p in platforms.split("."))


def test_metadata(zf: zipfile.ZipFile, dist_info: str) -> None:
    meta = Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
    assert tuple(int(x) for x in meta["Metadata-Version"].split(".")) >= (2, 1)
    assert meta["Name"] == "flashgen"
    for field in ("Version", "Summary", "Requires-Python"):
        assert meta[field], f"METADATA lacks {field}"
    assert meta["License"] or meta["License-Expression"], "METADATA names no license"
    assert meta.get_payload().strip() or meta["Description"], "METADATA has no readme"
    # The one hard requirement is the CUDA runtime the kernels link (no framework: torch and friends
    # stay optional); the compile toolchain is the `jit` extra, pinned to the release that built it.
    requires = meta.get_all("Requires-Dist") or []
    assert [r for r in requires if "extra ==" not in r] == ["nvidia-cuda-runtime==13.*"], requires
    assert meta.get_all("Provides-Extra") == ["jit"]
    jit = sorted(r.split("==")[0] for r in requires if r.endswith('extra == "jit"'))
    assert jit == ["nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-cuda-nvcc", "nvidia-nvvm"], requires
    assert all(re.search(r"==13\.0\.\*; extra", r) for r in requires if "extra ==" in r), requires


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_record_hashes_and_sizes(zf: zipfile.ZipFile, dist_info: str) -> None:
    record_name = f"{dist_info}/RECORD"
    rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
    listed = [r[0] for r in rows]
    assert len(listed) == len(set(listed)), "RECORD lists a file twice"
    assert sorted(listed) == sorted(n for n in zf.namelist() if not n.endswith("/")), "RECORD and the zip differ"
    for path, digest, size in rows:
        if path == record_name:
            assert digest == "" and size == ""
            continue
        data = zf.read(path)
        algo, _, value = digest.partition("=")
        assert algo == "sha256", path
        assert value == _b64(hashlib.sha256(data).digest()), f"{path}: RECORD hash does not match"
        assert int(size) == len(data), f"{path}: RECORD size does not match"
    assert zf.namelist()[-1] == record_name, "RECORD is written last"


def test_entries_are_sorted_and_reproducible(zf: zipfile.ZipFile) -> None:
    infos = zf.infolist()
    dates = {i.date_time for i in infos}
    assert len(dates) == 1, f"entries carry several timestamps: {sorted(dates)[:3]}"
    package = [i.filename for i in infos if i.filename.startswith("flashgen/")]
    assert package == sorted(package), "package entries are not in a stable (sorted) order"
    tail = [i.filename for i in infos][-len([i for i in infos if ".dist-info/" in i.filename]):]
    assert all(".dist-info/" in n for n in tail), "the .dist-info entries come last"


# ---- what the loader relies on ------------------------------------------------------------------


def test_layout_for_the_loader(zf: zipfile.ZipFile, dist_info: str) -> None:
    names = set(zf.namelist())
    for required in ("flashgen/__init__.py", "flashgen/py.typed", "flashgen/_loader.py", "flashgen/_kernels.py",
                     "flashgen/_data/matrix.json", "flashgen/_aot/manifest.json", "flashgen/_src/variants.json",
                     "flashgen/_src/include/flashgen/abi.h", "flashgen/_bin/flashgen"):
        assert required in names, f"the wheel lacks {required}"
    sources = json.loads(zf.read("flashgen/_src/variants.json"))
    for module in sources["modules"].values():
        assert f"flashgen/_src/csrc/{module['source']}" in names
    binary = zf.getinfo("flashgen/_bin/flashgen")
    mode = binary.external_attr >> 16
    assert stat.S_ISREG(mode) and mode & 0o111, f"flashgen/_bin/flashgen is not marked executable ({oct(mode)})"
    on_path = [n for n in names if re.fullmatch(r"flashgen-[^/]+\.data/scripts/flashgen", n)]
    ep = f"{dist_info}/entry_points.txt"
    assert on_path or (ep in names and b"flashgen" in zf.read(ep)), "nothing puts `flashgen` on PATH"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_manifest_agrees_with_matrix_and_files(zf: zipfile.ZipFile) -> None:
    manifest = whole_manifest(lambda rel: zf.read(f"flashgen/{rel}"))
    matrix = whole_matrix(lambda rel: zf.read(f"flashgen/{rel}"))
    assert manifest["flashgen_version"] == matrix["flashgen_version"]
    assert manifest["archs"] and manifest["instances"]
    by_uri = {i["uri"]: i for i in matrix["instances"]}
    for inst in manifest["instances"]:
        m = by_uri[inst["uri"]]
        assert (inst["module"], inst["params"], inst["codes"]) == (m["module"], m["params"], m["codes"])
        data = zf.read(f"flashgen/_aot/{inst['path']}")
        assert hashlib.sha256(data).hexdigest() == inst["sha256"], inst["uri"]
        assert data[:4] == b"\x7fELF"


def test_rebuild_is_byte_identical(wheel: Path, flashgen_bin: Path, build_env: dict[str, str],
                                   tmp_path: Path) -> None:
    if os.environ.get("FLASHGEN_TEST_WHEEL"):
        pytest.skip("the wheel under test was given, not built here")
    cmd = [str(flashgen_bin), "--config", str(REPO / "variants.json"), "build-wheel", "--out", str(tmp_path / "d"),
           "--build-dir", str(tmp_path / "b"), "--quiet", *SMALL_WHEEL_ARGS]
    subprocess.run(cmd, cwd=REPO, env=build_env, check=True, capture_output=True)
    (again,) = (tmp_path / "d").glob("*.whl")
    assert again.name == wheel.name
    assert hashlib.sha256(again.read_bytes()).hexdigest() == hashlib.sha256(wheel.read_bytes()).hexdigest()


# ---- real tools -----------------------------------------------------------------------------------


def test_auditwheel_show_agrees_with_the_tag(wheel: Path, tools_venv: Path) -> None:
    proc = subprocess.run([str(tools_venv / "bin" / "auditwheel"), "show", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = " ".join(proc.stdout.split())
    m = re.search(r'constrains the platform tag to "([^"]+)"', text) or re.search(
        r'consistent with the following platform tag: "([^"]+)"', text)
    assert m, text
    platforms = wheel.name[:-4].split("-")[-1].split(".")
    assert m.group(1) in platforms, f"auditwheel says {m.group(1)}, the wheel says {platforms}"


def test_check_wheel_contents(wheel: Path, tools_venv: Path) -> None:
    proc = subprocess.run([str(tools_venv / "bin" / "check-wheel-contents"), str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pip_check_in_the_fresh_venv(fresh_venv: Path) -> None:
    proc = subprocess.run([str(fresh_venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_and_introspection_agree_with_the_cli(fresh_venv: Path, tmp_path: Path) -> None:
    env = _venv_env(fresh_venv, tmp_path)
    code = (
        "import json, sys, time\n"
        "t = time.perf_counter(); import flashgen; t = time.perf_counter() - t\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'cupy')]\n"
        "rows = flashgen.list_variants()\n"
        "shipped = [r for r in rows if r['precompiled']]\n"
        "print(json.dumps({'version': flashgen.__version__, 'file': flashgen.__file__, 'bad': bad,"
        " 'rows': rows, 'precompiled': [flashgen.is_precompiled(r['module'], **r['params']) for r in shipped],"
        " 'n_shipped': len(shipped), 'import_s': t}))\n"
    )
    got = json.loads(_run_in_venv(fresh_venv, tmp_path, code))
    assert got["file"].startswith(str(fresh_venv)) and not got["bad"]
    assert got["n_shipped"] >= 1 and all(got["precompiled"])
    cli = subprocess.run(["flashgen", "--config", str(Path(got["file"]).parent / "_src" / "variants.json"),
                          "list-variants", "--json"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert shutil.which("flashgen", path=env["PATH"]).startswith(str(fresh_venv)), "the CLI on PATH is the wheel's"

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["uri"], r["module"], json.dumps(r["params"], sort_keys=True), r["aot"])

    assert sorted(map(key, got["rows"])) == sorted(map(key, json.loads(cli.stdout)))
    version = subprocess.run(["flashgen", "--version"], env=env, capture_output=True, text=True).stdout
    assert got["version"] in version


def test_installed_cli_works_outside_a_source_tree(fresh_venv: Path, tmp_path: Path) -> None:
    """With no ./variants.json the installed command reads the matrix the wheel ships, as the
    loader does, and doctor says so."""
    env = _venv_env(fresh_venv, tmp_path)
    assert not (tmp_path / "variants.json").exists()
    listed = subprocess.run(["flashgen", "list-variants", "--json"], env=env, capture_output=True, text=True,
                            cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    code = "import flashgen, json; print(json.dumps([r['uri'] for r in flashgen.list_variants()]))"
    assert [r["uri"] for r in json.loads(listed.stdout)] == json.loads(_run_in_venv(fresh_venv, tmp_path, code))
    doctor = subprocess.run(["flashgen", "doctor", "--json"], env=env, capture_output=True, text=True, cwd=tmp_path)
    config = json.loads(doctor.stdout)["config"]
    assert config["origin"] == "bundled with the installed wheel" and config["instances"] > 0
    assert config["path"].startswith(str(fresh_venv))
    for verb in (["describe"], ["list-variants", "--module", "single_decode", "--where", "head_dim=1*"]):
        proc = subprocess.run(["flashgen", *verb], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 0, (verb, proc.stderr)


def test_kernel_call_without_a_gpu_is_a_clear_error(fresh_venv: Path, tmp_path: Path) -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA driver")
    code = FAKE_TENSOR_SRC + (
        "import flashgen\n"
        "q, k = FakeCudaTensor((32, 128)), FakeCudaTensor((100, 8, 128))\n"
        "try:\n"
        "    flashgen.single_decode(q, k, k)\n"
        "except flashgen.NoGPUError as exc:\n"
        "    print('NoGPUError:', exc)\n"
        "try:\n"
        "    flashgen.single_decode(q, FakeCudaTensor((100, 8, 96)), FakeCudaTensor((100, 8, 96)))\n"
        "except ValueError as exc:\n"
        "    print('ValueError:', exc)\n"
    )
    out = _run_in_venv(fresh_venv, tmp_path, code)
    assert "NoGPUError: no CUDA driver: libcuda.so.1 could not be loaded" in out
    assert "ValueError: single_decode: k has head_dim 96 but q has 128" in out


def test_every_precompiled_binary_holds_its_instance_and_guards_its_abi(fresh_venv: Path,
                                                                        tmp_path: Path) -> None:
    """Each `.so` of the wheel, taken through the loader as a device of each of its targets would
    take it (FLASHGEN_DEVICE_CC; no GPU needed: no kernel runs). Its query entry point reaches
    exactly the instantiation the manifest names, and a code it was not built for is
    NO_INSTANCE. Its kernel and workspace entry points refuse a NULL or an empty arguments
    struct with the module's message, before they touch the driver."""
    code = (
        "import json, os\n"
        "os.environ['FLASHGEN_DISABLE_JIT'] = '1'\n"
        "from flashgen import _install, _loader, _matrix\n"
        "from flashgen import FlashgenError\nfrom flashgen._kernels import args_struct\n"
        "def text(params):\n"
        "    fmt = lambda v: ('true' if v else 'false') if isinstance(v, bool) else str(v)\n"
        "    return ' '.join(f'{k}={fmt(v)}' for k, v in params.items())\n"
        "def refused(fn, *args):\n"
        "    try:\n"
        "        fn(*args)\n"
        "    except FlashgenError as exc:\n"
        "        return [exc.status, exc.message]\n"
        "    return [0, '']\n"
        "rows = []\n"
        "for rec in [r for m in _matrix.matrix().modules for p in _install.aot_packages() for r in p.rows(m)]:\n"
        "    for target in rec['runs_on']:\n"
        "        m = rec['module']\n"
        "        os.environ['FLASHGEN_DEVICE_CC'] = '%d.%d' % tuple(target['min'])\n"
        "        loaded = _loader.load(m, rec['params'])\n"
        "        lib, empty = loaded.kernels, args_struct(m)()\n"
        "        other = [96 if k == 'head_dim' else c for k, c in rec['codes'].items()]\n"
        "        rows.append({\n"
        "            'module': m, 'uri': rec['uri'], 'target': target['target'],\n"
        "            'source': loaded.source, 'path': loaded.path.name, 'want': text(rec['params']),\n"
        "            'query': lib.query(m, list(rec['codes'].values())),\n"
        "            'other': refused(lib.query, m, other)[0],\n"
        "            'short': [lib.entry(m + '_query')(None, 0, None, 0), lib.last_error()],\n"
        "            'null': [lib.entry(m)(None), lib.last_error()],\n"
        "            'empty': refused(getattr(lib, m), empty),\n"
        "            'ws_null': [lib.entry(m + '_workspace_size')(None, None), lib.last_error()],\n"
        "            'ws_empty': refused(lib.workspace_size, m, empty),\n"
        "        })\n"
        "print(json.dumps(rows))\n"
    )
    rows = json.loads(_run_in_venv(fresh_venv, tmp_path, code))
    assert rows, "the wheel holds no precompiled instance"
    invalid, no_instance = 1, 2  # FLASHGEN_INVALID_ARGUMENT, FLASHGEN_NO_INSTANCE (abi.h)
    for r in rows:
        m = r["module"]
        assert r["source"] == "aot" and r["path"] == r["uri"] + ".so", r
        assert r["query"] == r["want"], r
        assert r["other"] == no_instance, r
        assert r["short"][0] == invalid and r["short"][1].startswith(f"{m}_query: expected "), r
        assert r["null"] == [invalid, f"{m}: args is NULL"], r
        assert r["empty"][0] == invalid and r["empty"][1].startswith(f"{m}: "), r
        assert "must not be NULL" in r["empty"][1], r
        assert r["ws_null"] == [invalid, f"{m}_workspace_size: args or bytes is NULL"], r
        assert r["ws_empty"][0] == invalid and r["ws_empty"][1].startswith(f"{m}: "), r
