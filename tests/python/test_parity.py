"""What the binary exports as data (``flashgen describe --json``: ``abi``, ``wheel.layout``,
``wheel.metadata``, each module's ``args_struct``) is what Python uses: every constant is iterated
from the exported records, so a new one the binary adds is checked without editing this file.
The backend choice and its refusals are checked against the binary's in ``test_backend.py``.
"""

from __future__ import annotations

import email.parser
import importlib.util
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO


@pytest.fixture(autouse=True)
def _real_matrix(described: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from flashgen import _install, _matrix

    _matrix._reset_for_tests()
    monkeypatch.setattr(_install, "_matrix_cache", described)


def test_abi_status_codes_and_version(described: dict[str, Any]) -> None:
    from flashgen import _kernels

    abi = described["abi"]
    assert _kernels.ABI_VERSION == abi["version"]
    assert abi["status"], "the binary exports no status codes"
    for name, code in abi["status"].items():
        assert getattr(_kernels, name) == code, name
        assert _kernels.STATUS_NAMES[code] == name
        err = _kernels.StatusError(code, "flashgen_x", "m")
        assert err.status_name == name and str(err) == f"flashgen_x: {name}: m"


def test_abi_entry_points_and_args_structs(described: dict[str, Any]) -> None:
    """Every entry point role the binary names has a ctypes signature here, and each module's
    declared entry points are the names the binding calls; each args struct is named as in C."""
    from flashgen import _kernels

    abi = described["abi"]
    assert set(abi["entry_points"]) == set(_kernels.COMMON_SIGNATURES)
    assert set(abi["module_entry_points"]) == set(_kernels.MODULE_SIGNATURES)
    for role, name in abi["entry_points"].items():
        assert _kernels.entry_name(role) == name
        assert _kernels._signature(name) == _kernels.COMMON_SIGNATURES[role]
    for module, spec in described["modules"].items():
        names = {role: t.replace("{module}", module) for role, t in abi["module_entry_points"].items()}
        assert sorted(spec["entry_points"]) == sorted(names.values()), module
        for role, name in names.items():
            assert _kernels.entry_name(role, module) == name
            assert _kernels._signature(name) == _kernels.MODULE_SIGNATURES[role], name
        if spec.get("args"):
            assert _kernels.args_struct(module).__name__ == spec["args_struct"]


def test_the_layout_python_names_is_the_binarys(described: dict[str, Any]) -> None:
    from flashgen import _install

    layout = described["wheel"]["layout"]
    assert _install.MATRIX_PATH == layout["matrix"]  # the one path Python writes itself
    assert _install.PACKAGE_DIR.name == layout["package"]
    for key, path in layout.items():
        if key != "package":
            assert _install.layout(key) == path


def test_the_wheel_is_laid_out_as_the_binary_says(described: dict[str, Any], wheel: Path) -> None:
    layout = described["wheel"]["layout"]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        meta = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
    with zipfile.ZipFile(wheel) as zf:
        header = json.loads(zf.read(f"{layout['package']}/{layout['manifest']}"))
    # A per-module path is there for every module that has one: each module's instances, and the
    # rows of each module the wheel precompiles.
    per_module = {"instances": list(described["modules"]), "manifest_rows": list(header["module_rows"])}
    assert set(per_module) == {k for k, p in layout.items() if "{module}" in p}
    assert per_module["manifest_rows"], "the wheel under test precompiles some instances"
    for key, path in layout.items():
        if key == "package":
            continue
        for module in per_module.get(key, [""]):
            full = f"{layout['package']}/{path.replace('{module}', module)}"
            assert any(n == full or n.startswith(full + "/") for n in names), f"{key}: {full}"
    metadata = described["wheel"]["metadata"]
    for field, key in (("Name", "name"), ("Version", "version"), ("Summary", "summary"),
                       ("License", "license"), ("Requires-Python", "requires_python"),
                       ("Description-Content-Type", "readme_content_type")):
        assert meta[field] == metadata[key], field
    extras = meta.get_all("Provides-Extra") or []
    assert metadata["jit_extra"] in extras, extras
    # The runtime requirement the wheel declares is the one the loader names when it is missing.
    requires = meta.get_all("Requires-Dist") or []
    assert [r for r in described["wheel"]["runtime_requirements"].values() if r in requires], requires


def test_the_pep517_backend_writes_the_binarys_metadata(described: dict[str, Any]) -> None:
    spec = importlib.util.spec_from_file_location("flashgen_backend_under_test",
                                                  REPO / "backend" / "flashgen_backend.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    metadata = described["wheel"]["metadata"]
    assert backend.METADATA == metadata
    assert json.loads((REPO / "backend" / "metadata.json").read_text()) == {"metadata": metadata,
                                                                          "tree": described["wheel"]["tree"]}
    # The sdist leaves out what the wheel writer leaves out, and starts time where it does.
    tree = described["wheel"]["tree"]
    assert backend.DEFAULT_EPOCH == tree["min_epoch"]
    for name in tree["skip_names"]:
        assert backend._skipped(name)
    for prefix in tree["skip_prefixes"]:
        assert backend._skipped(prefix + "x") and not backend._skipped("x" + prefix)
    for suffix in tree["skip_suffixes"]:
        assert backend._skipped("x" + suffix)
    assert not backend._skipped("x.py")
    pkg_info = email.parser.Parser().parsestr(backend._pkg_info(metadata["version"]))
    assert pkg_info["Requires-Python"] == metadata["requires_python"]
    assert pkg_info["Name"] == metadata["name"] and pkg_info["Summary"] == metadata["summary"]


SPELLINGS = ["9.0", "8.6", "1.0", "99.9", " 9.0 ", "09.0", "9.00", "0.9", "100.0", "9.10", "86", "sm_86", "8.x",
             "9.0a", "9.", ".9", "9.0.1", "-9.0", "+9.0", "9,0", "².0", "٩.٠", ""]


def test_a_capability_is_read_as_the_binary_reads_it(flashgen_bin: Path, build_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    """FLASHGEN_DEVICE_CC's grammar is --device-cc's: the same spellings are taken, as the same
    capability (the binary's answer names the arch it would build for it)."""
    from flashgen import _loader

    env = dict(build_env, FLASHGEN_CACHE_DIR=str(tmp_path / "cache"))
    for text in SPELLINGS:
        proc = subprocess.run([str(flashgen_bin), "--config", str(REPO / "tests" / "fixtures" / "backend" / "variants.json"),
                               "jit", "--device-cc", text, "--no-compile", "--module", "kern",
                               "--where", "width=64", "--where", "backend=portable"],
                              capture_output=True, text=True, env=env)
        cc = _loader.parse_capability(text)
        assert (proc.returncode == 0) == (cc is not None), (text, proc.stderr)
        if cc is not None:
            assert json.loads(proc.stdout)["arch"].startswith(f"{cc[0]}.{cc[1]}"), (text, proc.stdout)
