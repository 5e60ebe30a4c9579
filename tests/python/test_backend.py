"""Per-architecture instances from Python: the loader's choice of a module's backend on a
simulated device (``FLASHGEN_DEVICE_CC``), read from the binary's ``describe`` data and never
derived; its parity with the binary's own choice (``flashgen jit``); the error for a backend the
device cannot run; ``list_variants``/``is_precompiled``; and a wheel of the ``backend`` fixture
(sm90 limited to 9.0a, portable for every arch, both precompiled for 8.0 and 9.0a) loaded on
Hopper, Ampere and newer devices through the AOT path and the JIT.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import flashgen
from conftest import REPO, FakeCudaTensor, whole_manifest

FIXTURE = REPO / "tests" / "fixtures" / "backend"
CONFIG = FIXTURE / "variants.json"


def _describe(flashgen_bin: Path) -> dict[str, Any]:
    proc = subprocess.run([str(flashgen_bin), "--config", str(CONFIG), "describe", "--json"],
                          capture_output=True, text=True, check=True)
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


# ---- the choice, read from describe's backends table -----------------------------------------


@pytest.mark.parametrize("cc, backend", [((9, 0), "sm90"), ((8, 0), "portable"), ((8, 6), "portable"),
                                         ((10, 0), "portable"), ((12, 0), "portable"), ((7, 5), "portable")])
def test_the_loader_takes_the_first_backend_the_device_runs(flashgen_bin: Path, cc: tuple[int, int],
                                                            backend: str) -> None:
    from flashgen._matrix import Matrix

    mx = Matrix(_describe(flashgen_bin))
    assert mx.with_backend("kern", {"width": 32}, cc) == {"width": 32, "backend": backend}
    # Named, a backend that runs on the device is kept as it is.
    assert mx.with_backend("kern", {"width": 32, "backend": "portable"}, cc)["backend"] == "portable"


def test_a_backend_the_device_cannot_run_is_a_clear_error(flashgen_bin: Path) -> None:
    from flashgen._matrix import Matrix

    mx = Matrix(_describe(flashgen_bin))
    with pytest.raises(ValueError) as err:
        mx.with_backend("kern", {"width": 32, "backend": "sm90"}, (8, 0), what="kern_call")
    msg = str(err.value)
    for needle in ("kern_call: backend='sm90' is built only for 9.0a", "compute capability 8.0",
                   "on this device kern supports backend 'portable'", "Leave backend unset"):
        assert needle in msg, msg
    with pytest.raises(ValueError, match=r"backend='sm100' is not a backend of kern; it has sm90 \(9.0a only\), "
                                         "portable"):
        mx.with_backend("kern", {"width": 32, "backend": "sm100"}, (9, 0))
    # A device none of the backends runs on gets the list.
    data = _describe(flashgen_bin)
    for row in data["modules"]["kern"]["backends"]["by_device"]:
        row["backends"] = [b for b in row["backends"] if b != "portable"]
    with pytest.raises(ValueError, match=r"no backend of kern runs on a GPU of compute capability 8.0: "
                                         r"sm90 \(9.0a only\), portable"):
        Matrix(data).with_backend("kern", {"width": 32}, (8, 0))


def test_the_choice_is_read_not_derived(flashgen_bin: Path) -> None:
    """Change the binary's table and the choice follows it: Python holds no rule of its own."""
    from flashgen._matrix import Matrix

    data = copy.deepcopy(_describe(flashgen_bin))
    for row in data["modules"]["kern"]["backends"]["by_device"]:
        row["backends"] = list(reversed(row["backends"]))
    mx = Matrix(data)
    assert mx.with_backend("kern", {"width": 32}, (8, 6))["backend"] == "portable"
    assert mx.with_backend("kern", {"width": 32}, (9, 0))["backend"] == "portable"
    data["modules"]["kern"]["backends"]["by_device"] = [
        {"min": [1, 0], "max": [99, 9], "backends": ["sm90"], "supports": "on this device kern supports backend 'sm90'"}]
    assert Matrix(data).with_backend("kern", {"width": 32}, (8, 6))["backend"] == "sm90"


def test_the_table_covers_every_capability_once(flashgen_bin: Path) -> None:
    """The binary's by_device rows tile 1.0..99.9 (every capability it accepts) without overlap."""
    rows = _describe(flashgen_bin)["modules"]["kern"]["backends"]["by_device"]
    assert rows[0]["min"] == [1, 0] and rows[-1]["max"] == [99, 9]
    for a, b in zip(rows, rows[1:]):
        nxt = [a["max"][0], a["max"][1] + 1] if a["max"][1] < 9 else [a["max"][0] + 1, 0]
        assert b["min"] == nxt, (a, b)


def test_the_loader_and_the_binary_choose_alike(flashgen_bin: Path, build_env: dict[str, str],
                                               tmp_path: Path) -> None:
    """`flashgen jit` without a backend term makes the binary choose; Python's choice from the
    describe table agrees on every device."""
    from flashgen._matrix import Matrix

    mx = Matrix(_describe(flashgen_bin))
    env = dict(build_env, FLASHGEN_CACHE_DIR=str(tmp_path / "cache"))
    for cc in ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"):
        proc = subprocess.run([str(flashgen_bin), "--config", str(CONFIG), "jit", "--device-cc", cc, "--no-compile",
                               "--module", "kern", "--where", "width=64"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        major, minor = map(int, cc.split("."))
        assert json.loads(proc.stdout)["params"]["backend"] == mx.with_backend("kern", {"width": 64},
                                                                               (major, minor))["backend"], cc
    # And they refuse alike, in the same words (the binary's templates, filled).
    proc = subprocess.run([str(flashgen_bin), "--config", str(CONFIG), "jit", "--device-cc", "8.0", "--no-compile",
                           "--module", "kern", "--where", "backend=sm90", "--where", "width=64"],
                          capture_output=True, text=True, env=env)
    with pytest.raises(ValueError) as err:
        mx.with_backend("kern", {"width": 64, "backend": "sm90"}, (8, 0))
    message, hint = str(err.value).split(".\n\n")
    assert proc.returncode != 0 and f"error: {message}\n\nhint: {hint}" in proc.stderr, (proc.stderr, str(err.value))


# ---- the public API's backend= (fake matrix, no GPU) ---------------------------------------------


def test_backend_keyword_for_a_module_with_one_implementation(fake_matrix: Any) -> None:
    q, k = FakeCudaTensor((100, 32, 128)), FakeCudaTensor((300, 8, 128))
    with pytest.raises(ValueError, match="single_prefill: backend='sm90', but single_prefill has one "
                                         "implementation"):
        flashgen.single_prefill(q, k, k, backend="sm90")
    with pytest.raises(ValueError, match="single_decode: backend='portable', but single_decode has one"):
        flashgen.single_decode(FakeCudaTensor((32, 128)), k, k, backend="portable")


def test_backend_keyword_reaches_the_loader(fake_matrix: Any, flashgen_bin: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With a backend axis in the matrix, ``backend=`` names the instance's backend and leaving it
    out leaves the choice to the loader (which picks per device, as tested above)."""
    from flashgen import _common, _install, _matrix

    data = copy.deepcopy(fake_matrix)
    mod = data["modules"]["single_prefill"]
    mod["axes"].insert(0, {"name": "backend", "type": "backend", "values": ["sm90", "portable"]})
    mod["backends"] = _describe(flashgen_bin)["modules"]["kern"]["backends"]  # sm90 (9.0a only), portable
    for inst in [i for i in data["instances"] if i["module"] == "single_prefill"]:
        data["instances"].remove(inst)
        for b in ("sm90", "portable"):
            data["instances"].append(dict(inst, uri=inst["uri"] + "_" + b, params={"backend": b, **inst["params"]}))
    _matrix._reset_for_tests()
    monkeypatch.setattr(_install, "_matrix_cache", data)
    seen: list[dict[str, Any]] = []

    class Stop(Exception):
        pass

    def loader(module: str, params: dict[str, Any], variant: Any = None, device: Any = None, **kw: Any) -> Any:
        seen.append(dict(params))
        raise Stop

    monkeypatch.setattr(_common._cuda, "driver", lambda: None)
    monkeypatch.setattr(_common._loader, "load", loader)
    q, k = FakeCudaTensor((100, 32, 128)), FakeCudaTensor((300, 8, 128))
    for backend in ("sm90", None):
        with pytest.raises(Stop):
            flashgen.single_prefill(q, k, k, causal=True, backend=backend)
    assert seen[0]["backend"] == "sm90" and "backend" not in seen[1]
    with pytest.raises(ValueError, match="head_dim=96 is not in the variant matrix"):
        flashgen.single_prefill(FakeCudaTensor((100, 32, 96)), FakeCudaTensor((300, 8, 96)),
                                FakeCudaTensor((300, 8, 96)))


# ---- a wheel of the fixture, on simulated devices ------------------------------------------------


@pytest.fixture(scope="module")
def backend_site(flashgen_bin: Path, build_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's AOT subset (width 32: sm90 for 9.0a, portable for 8.0 and 9.0a) in a wheel
    with this checkout's loader, installed with pip."""
    tree = tmp_path_factory.mktemp("backend-tree")
    shutil.copytree(FIXTURE, tree, dirs_exist_ok=True)
    shutil.copytree(REPO / "python" / "flashgen", tree / "python" / "flashgen",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "README.md").write_text("# backend fixture\n")
    proc = subprocess.run([str(flashgen_bin), "build-wheel", "--binary", str(flashgen_bin), "--out", "dist",
                           "--jobs", "2", "--quiet"], cwd=tree, capture_output=True, text=True, env=build_env)
    assert proc.returncode == 0, proc.stderr
    site = tmp_path_factory.mktemp("backend-site")
    wheel = Path(proc.stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True)
    return site


LOAD = r"""
import json, subprocess, sys
import flashgen
from flashgen import _loader
if "--warm" in sys.argv:
    def no_spawn(*a, **k):
        raise AssertionError(f"the AOT path spawned a process: {a!r}")
    subprocess.Popen = no_spawn
params = json.loads(sys.argv[1])
l = _loader.load("kern", params)
print(json.dumps({"uri": l.uri, "source": l.source, "params": l.params, "codes": l.codes}))
"""


def _run(site: Path, build_env: dict[str, str], tmp_path: Path, code: str, *args: str,
         **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(build_env, PYTHONPATH=str(site), FLASHGEN_CACHE_DIR=str(tmp_path / "cache"), **env)
    full.pop("FLASHGEN_BIN", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full,
                          cwd=tmp_path, timeout=900)


def test_the_wheel_holds_both_backends_with_their_own_runs_on(backend_site: Path) -> None:
    manifest = whole_manifest(lambda rel: (backend_site / "flashgen" / rel).read_text())
    rows = {r["uri"]: r for r in manifest["instances"]}
    assert set(rows) == {"kern_backend_sm90_width_32", "kern_backend_portable_width_32"}
    assert rows["kern_backend_sm90_width_32"]["runs_on"] == [{"target": "sm_90a", "min": [9, 0], "max": [9, 0]}]
    assert rows["kern_backend_sm90_width_32"]["archs"] == ["sm_90a"]
    assert rows["kern_backend_portable_width_32"]["archs"] == ["sm_80", "sm_90a"]
    assert rows["kern_backend_portable_width_32"]["runs_on"] == manifest["runs_on"]


@pytest.mark.parametrize("cc, backend", [("9.0", "sm90"), ("8.0", "portable"), ("8.6", "portable")])
def test_aot_load_takes_the_devices_backend_and_spawns_nothing(backend_site: Path, build_env: dict[str, str],
                                                               tmp_path: Path, cc: str, backend: str) -> None:
    proc = _run(backend_site, build_env, tmp_path, LOAD, json.dumps({"width": 32}), "--warm", FLASHGEN_DEVICE_CC=cc)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert (got["source"], got["params"]["backend"]) == ("aot", backend)
    assert got["uri"] == f"kern_backend_{backend}_width_32"
    assert got["codes"]["backend"] == {"sm90": 0, "portable": 1}[backend]


def test_a_named_backend_the_device_cannot_run_is_refused(backend_site: Path, build_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    proc = _run(backend_site, build_env, tmp_path, LOAD, json.dumps({"width": 32, "backend": "sm90"}),
                FLASHGEN_DEVICE_CC="8.0")
    assert proc.returncode != 0
    assert ("ValueError: kern: backend='sm90' is built only for 9.0a, which does not run on a GPU of compute "
            "capability 8.0; on this device kern supports backend 'portable'") in proc.stderr, proc.stderr
    proc = _run(backend_site, build_env, tmp_path, LOAD, json.dumps({"width": 32, "backend": "portable"}), "--warm",
                FLASHGEN_DEVICE_CC="9.0")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["params"]["backend"] == "portable", "backend= overrides"


def test_a_device_the_wheel_does_not_cover_goes_to_the_jit_with_its_backend(
        backend_site: Path, build_env: dict[str, str], tmp_path: Path) -> None:
    # 10.0: portable (sm90 is 9.0a only), which the wheel holds for sm_80/sm_90a only.
    proc = _run(backend_site, build_env, tmp_path, LOAD, json.dumps({"width": 32}), FLASHGEN_DEVICE_CC="10.0",
                FLASHGEN_DISABLE_JIT="1")
    assert proc.returncode != 0
    assert "kern_backend_portable_width_32 is needed for 10.0" in proc.stderr, proc.stderr
    assert "does not run on this GPU (it holds sm_80, sm_90a)" in proc.stderr
    # Hopper, an instance the wheel lacks: the JIT compiles the sm90 one, for 9.0a.
    proc = _run(backend_site, build_env, tmp_path, LOAD, json.dumps({"width": 64}), FLASHGEN_DEVICE_CC="9.0")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert (got["source"], got["uri"]) == ("jit", "kern_backend_sm90_width_64")


def test_list_variants_and_is_precompiled_say_which_backend(backend_site: Path, build_env: dict[str, str],
                                                            tmp_path: Path) -> None:
    code = r"""
import json, flashgen
rows = flashgen.list_variants("kern")
print(json.dumps([{k: r[k] for k in ("uri", "backend", "arch_limit", "precompiled")} for r in rows]))
print(json.dumps([flashgen.is_precompiled("kern", width=32), flashgen.is_precompiled("kern", width=64),
                  flashgen.is_precompiled("kern", width=64, backend="portable")]))
"""
    for cc, precompiled in (("9.0", [True, False, False]), ("8.0", [True, False, False])):
        proc = _run(backend_site, build_env, tmp_path, code, FLASHGEN_DEVICE_CC=cc)
        assert proc.returncode == 0, proc.stderr
        rows, answers = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
        assert rows == [
            {"uri": "kern_backend_sm90_width_32", "backend": "sm90", "arch_limit": ["9.0a"], "precompiled": True},
            {"uri": "kern_backend_sm90_width_64", "backend": "sm90", "arch_limit": ["9.0a"], "precompiled": False},
            {"uri": "kern_backend_portable_width_32", "backend": "portable", "arch_limit": None, "precompiled": True},
            {"uri": "kern_backend_portable_width_64", "backend": "portable", "arch_limit": None,
             "precompiled": False},
        ]
        assert answers == precompiled, cc
