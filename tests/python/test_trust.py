"""The cache trust model from the outside, against the installed wheel: another user's cache or a
world-writable one is refused with a clear error, a second user cannot plant code that we load,
and what is loaded is always the bytes flashgen built.

Tests that need a second user create one (``flashgen-peer``) when they run as root and skip
otherwise.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import RunPy
from test_loader import DEVICE, PRELUDE, _load_snippet, _missing_instance, _objects, _result

PEER = "flashgen-peer"


def _peer_uid() -> int:
    """The uid of a second, unprivileged user (created once; root only)."""
    if os.geteuid() != 0:
        pytest.skip("creating a second user needs root")
    import pwd

    try:
        return pwd.getpwnam(PEER).pw_uid
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", PEER], check=True,
                   capture_output=True)
    return pwd.getpwnam(PEER).pw_uid


def _as_peer(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={PEER}", f"--regid={PEER}", "--clear-groups", *cmd],
                          capture_output=True, text=True)


def test_a_world_writable_shared_cache_is_refused(run_py: RunPy, installed: Path,
                                                  wheel_manifest: dict[str, Any], tmp_path: Path) -> None:
    shared = tmp_path / "team-cache"
    shared.mkdir()
    shared.chmod(0o1777)  # what a team sets up for "one cache for everybody"
    inst = _missing_instance(installed, wheel_manifest)
    proc = run_py(_load_snippet("single_decode", inst["params"]), check=False,
                  FLASHGEN_CACHE_DIR=str(shared), **DEVICE)
    assert proc.returncode != 0
    assert str(shared) in proc.stderr and "writable by" in proc.stderr, proc.stderr
    assert "chmod 700" in proc.stderr or "FLASHGEN_CACHE_DIR" in proc.stderr
    assert not _objects(shared), "nothing was built into the refused folder"


def test_another_users_cache_is_refused(run_py: RunPy, installed: Path, wheel_manifest: dict[str, Any],
                                        tmp_path: Path) -> None:
    uid = _peer_uid()
    theirs = tmp_path / "their-cache"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, uid, uid)
    inst = _missing_instance(installed, wheel_manifest)
    proc = run_py(_load_snippet("single_decode", inst["params"]), check=False,
                  FLASHGEN_CACHE_DIR=str(theirs), **DEVICE)
    assert proc.returncode != 0
    assert str(theirs) in proc.stderr and str(uid) in proc.stderr, proc.stderr


def test_a_second_user_cannot_get_code_loaded(run_py: RunPy, installed: Path, wheel_manifest: dict[str, Any],
                                              tmp_path: Path) -> None:
    """The peer writes a .so of its choosing and a matching record into our cache (as if the folder
    had been open to it once); we never load it: the object is not ours, so it is rebuilt."""
    uid = _peer_uid()
    inst = _missing_instance(installed, wheel_manifest)
    cache = tmp_path / "cache"
    genuine = _result(run_py(_load_snippet("single_decode", inst["params"]), **DEVICE))
    so = Path(genuine["path"])
    record = so.with_suffix(".json")
    # The plant: another valid flashgen .so (the wheel's precompiled one) with a record to match.
    evil = installed / "flashgen" / "_aot" / wheel_manifest["instances"][0]["path"]
    shutil.copy(evil, so)
    meta = json.loads(record.read_text())
    st = so.stat()
    meta.update(sha256=wheel_manifest["instances"][0]["sha256"], size=st.st_size, mtime_ns=st.st_mtime_ns)
    record.write_text(json.dumps(meta))
    os.chown(so, uid, uid)
    os.chown(record, uid, uid)
    again = _result(run_py(_load_snippet("single_decode", inst["params"]), **DEVICE))
    assert again["sha256"] == genuine["sha256"] != wheel_manifest["instances"][0]["sha256"]
    assert again["source"] == "jit", "the planted object was discarded and the instance rebuilt"
    assert so.stat().st_uid == os.geteuid()
    # And the peer, running the same loader on our cache, is refused outright.
    peer = _as_peer(sys.executable, "-c", "import os; print(os.access(%r, os.W_OK))" % str(cache))
    assert peer.returncode == 0 and peer.stdout.strip() == "False", "our cache is closed to the peer"


def test_the_peer_is_refused_our_cache(installed: Path, build_env: dict[str, str], tmp_path: Path) -> None:
    _peer_uid()
    cache = tmp_path / "ours"
    cache.mkdir(mode=0o700)
    tmp_path.chmod(0o755)
    env = dict(build_env, FLASHGEN_CACHE_DIR=str(cache), HOME=str(tmp_path))
    binary = installed / "flashgen" / "_bin" / "flashgen"
    copy = tmp_path / "flashgen-bin"
    shutil.copy(binary, copy)
    copy.chmod(0o755)
    proc = subprocess.run(["setpriv", f"--reuid={PEER}", f"--regid={PEER}", "--clear-groups", str(copy),
                           "doctor", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path)
    doctor = json.loads(proc.stdout)
    assert "error" in doctor["cache"] and str(cache) in doctor["cache"]["error"], doctor


def test_loaded_bytes_are_the_checked_bytes_across_a_swap(run_py: RunPy, installed: Path,
                                                          wheel_manifest: dict[str, Any]) -> None:
    """The loader reads and hashes the file at load(); swapping the file before the library is
    first used changes nothing, because the library comes from the checked bytes in memory."""
    inst = wheel_manifest["instances"][0]
    code = PRELUDE + (
        "import os, shutil\n"
        f"loaded = _loader.load({inst['module']!r}, {inst['params']!r})\n"
        "victim = str(loaded.path) + '.swap'\n"
        "open(victim, 'wb').write(b'not a library')\n"
        "backup = str(loaded.path) + '.orig'\n"
        "os.replace(loaded.path, backup); os.replace(victim, loaded.path)\n"
        "try:\n"
        "    print(loaded.kernels._fns['flashgen_abi_version']())\n"
        "finally:\n"
        "    os.replace(backup, loaded.path)\n"
    )
    copy = installed.parent / "site-swap"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(installed, copy)
    proc = run_py(code, PYTHONPATH=str(copy), **DEVICE)
    assert proc.stdout.strip().splitlines()[-1] == "3"


def _plant(folder: Path, marks: Path) -> None:
    """Another user's folder (owned by the peer when we run as root): Python modules the binary's
    Python children import by name, and programs a lookup of ``.`` on PATH would find. Each leaves
    a marker in ``marks`` when it runs."""
    folder.mkdir()
    marks.mkdir()
    for mod in ("sysconfig", "torch", "json"):
        (folder / f"{mod}.py").write_text(f"open({str(marks / mod)!r}, 'w').write('ran')\n")
    for prog in ("python3", "nvcc", "g++", "nvidia-smi", "flashgen"):
        (folder / prog).write_text(f"#!/bin/sh\necho ran > '{marks / prog}'\n")
        (folder / prog).chmod(0o755)
    if os.geteuid() == 0:
        uid = _peer_uid()
        for p in [folder, *folder.iterdir()]:
            os.chown(p, uid, uid)


def test_a_jit_run_from_a_planted_folder_runs_none_of_it(installed: Path, build_env: dict[str, str],
                                                          wheel_manifest: dict[str, Any], tmp_path: Path) -> None:
    """A program whose working folder holds another user's ``sysconfig.py``: its JIT asks the
    interpreter where its site-packages are (Debian's python keeps them outside the prefix, the
    path taken when nvcc is found only through the Python environment); that child must not
    import the folder's modules, nor must PATH's ``.`` find the folder's programs."""
    folder, marks = tmp_path / "theirs", tmp_path / "marks"
    _plant(folder, marks)
    inst = _missing_instance(installed, wheel_manifest)
    prog = tmp_path / "prog" / "prog.py"  # a script: its own folder, not the cwd, is on sys.path
    prog.parent.mkdir()
    prog.write_text(
        "from flashgen import _loader\n"
        "try:\n"
        f"    _loader.load('single_decode', {inst['params']!r})\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = dict(build_env, PYTHONPATH=str(installed), FLASHGEN_CACHE_DIR=str(tmp_path / "cache"),
               FLASHGEN_PYTHON="/usr/bin/python3", **DEVICE)
    for var in ("FLASHGEN_NVCC", "FLASHGEN_BIN", "CUDA_HOME", "CUDA_PATH", "VIRTUAL_ENV", "CONDA_PREFIX"):
        env.pop(var, None)
    if not Path("/usr/bin/python3").is_file():
        pytest.skip("no /usr/bin/python3 to stand for the system interpreter")
    for path in ("/usr/bin:/bin", ".::/usr/bin:/bin"):
        proc = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True,
                              env=dict(env, PATH=path), cwd=folder, timeout=300)
        assert sorted(p.name for p in marks.iterdir()) == [], f"PATH={path}"
        assert "nvcc not found" in proc.stdout, proc.stdout + proc.stderr


def test_a_variant_parameter_named_like_a_core_field_is_refused(run_py: RunPy, installed: Path) -> None:
    """The kernel reads its own ``sm_scale``, ``kv_len``, ``q`` ...: a parameter of that name
    would be silently ignored. The names are the binary's (the shipped matrix's
    ``reserved_params``); Python keeps no list of its own."""
    shipped = json.loads((installed / "flashgen" / "_data" / "matrix.json").read_text())
    names = ["sm_scale", "kv_len", "q", "o", "lse", "num_qo_heads", "rope_scale", "paged_kv"]
    assert set(names) <= set(shipped["reserved_params"])
    code = (
        "import flashgen, json\n"
        "src = 'template <typename P> struct Mine : flashgen::DefaultAttention<P> {};'\n"
        "out = {}\n"
        f"for name in {names!r} + ['my_scale']:\n"
        "    try:\n"
        "        flashgen.Variant('mine', src, params=[('bias', 'float'), (name, 'float')])\n"
        "        out[name] = 'accepted'\n"
        "    except ValueError as exc:\n"
        "        out[name] = str(exc)\n"
        "print(json.dumps(out))\n"
    )
    out = json.loads(run_py(code).stdout.strip().splitlines()[-1])
    assert out.pop("my_scale") == "accepted"
    for name, msg in out.items():
        assert f"parameter name {name!r} clashes with the core field" in msg, msg
        assert "single_decode" in msg or "batch_" in msg, msg
    # The list is data: a name the shipped matrix reserves is refused, one it does not is not.
    copy = installed.parent / "site-reserved"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(installed, copy)
    edited = dict(shipped, reserved_params={"bias2": ["single_decode"]})
    (copy / "flashgen" / "_data" / "matrix.json").write_text(json.dumps(edited))
    out = json.loads(run_py(code.replace("'my_scale'", "'bias2'"), PYTHONPATH=str(copy)).stdout.strip()
                     .splitlines()[-1])
    assert "clashes with the core field 'bias2'" in out.pop("bias2")
    assert set(out.values()) == {"accepted"}, out


def _sdist_tree(tmp_path: Path) -> Path:
    """The part of the checkout the sdist hook reads (it skips roots that are missing)."""
    repo = Path(__file__).resolve().parents[2]
    tree = tmp_path / "checkout"
    tree.mkdir(parents=True)
    for name in ("Cargo.toml", "README.md", "variants.json"):
        shutil.copy(repo / name, tree / name)
    for name in ("backend", "include", "csrc"):
        shutil.copytree(repo / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _sdist(tree: Path, out: Path) -> subprocess.CompletedProcess[str]:
    code = ("import sys; sys.path.insert(0, 'backend'); import flashgen_backend as b; "
            f"print(b.build_sdist({str(out)!r}))")
    return subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=60)


def test_the_sdist_packs_no_file_a_symlink_leads_to_outside_the_tree(tmp_path: Path) -> None:
    import tarfile

    secret = tmp_path / "secret"
    secret.write_text("TOP-SECRET-BYTES\n")
    for link in ("include/flashgen/leak.cuh", "csrc/leak.cu", "README.md"):
        tree = _sdist_tree(tmp_path / link.replace("/", "_"))
        (tree / link).unlink(missing_ok=True)
        (tree / link).symlink_to(secret)
        proc = _sdist(tree, tmp_path / "out")
        assert proc.returncode != 0
        assert f"{tree / link} is a symlink to {secret}, outside" in proc.stderr, proc.stderr
        assert "packs no file from outside the tree" in proc.stderr
        assert not list((tmp_path / "out").glob("*.tar.gz")) if (tmp_path / "out").exists() else True
    # A symlinked folder from outside, and a FIFO (which would hang a blocking read), are refused.
    tree = _sdist_tree(tmp_path / "dir")
    (tree / "include" / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    proc = _sdist(tree, tmp_path / "out")
    assert "include/elsewhere is a symlink to" in proc.stderr and proc.returncode != 0, proc.stderr
    tree = _sdist_tree(tmp_path / "fifo")
    os.mkfifo(tree / "include" / "pipe.cuh")
    proc = _sdist(tree, tmp_path / "out")
    assert "pipe.cuh is not a regular file" in proc.stderr and proc.returncode != 0, proc.stderr
    # A link that stays inside the tree packs the file it names.
    tree = _sdist_tree(tmp_path / "inside")
    (tree / "include" / "flashgen" / "alias.cuh").symlink_to("params.cuh")
    proc = _sdist(tree, tmp_path / "ok")
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(tmp_path / "ok" / proc.stdout.strip().splitlines()[-1]) as tar:
        names = tar.getnames()
        assert any(n.endswith("include/flashgen/alias.cuh") for n in names)
        assert not any(b"TOP-SECRET" in (tar.extractfile(m) or io.BytesIO()).read()
                       for m in tar.getmembers() if m.isfile())


def test_a_fifo_in_place_of_a_precompiled_kernel_is_refused_not_waited_on(
        run_py: RunPy, installed: Path, wheel_manifest: dict[str, Any]) -> None:
    inst = wheel_manifest["instances"][0]
    copy = installed.parent / "site-fifo"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(installed, copy)
    so = copy / "flashgen" / "_aot" / inst["path"]
    so.unlink()
    os.mkfifo(so)
    proc = run_py(_load_snippet(inst["module"], inst["params"]), check=False, timeout=60,
                  PYTHONPATH=str(copy), **DEVICE)
    assert proc.returncode != 0
    assert f"{so} is not a regular file" in proc.stderr, proc.stderr
    assert "Reinstall the flashgen wheel" in proc.stderr


def test_flashgen_device_cc_takes_ascii_digits_only(run_py: RunPy) -> None:
    bad = ["\u00b2.0", "\u0669.\u0660", "9.0\u00e4", "+9.0", "9", "0.0"]
    code = (
        "import json, os\nfrom flashgen import _loader\nout = {}\n"
        f"for v in {bad!r}:\n"
        "    os.environ['FLASHGEN_DEVICE_CC'] = v\n"
        "    try:\n"
        "        out[v] = repr(_loader.device_capability())\n"
        "    except ValueError as exc:\n"
        "        out[v] = 'ValueError: ' + str(exc)\n"
        "print(json.dumps(out))\n"
    )
    out = json.loads(run_py(code).stdout.strip().splitlines()[-1])
    for v, msg in out.items():
        assert msg.startswith("ValueError: FLASHGEN_DEVICE_CC="), (v, msg)
        assert "ASCII digits" in msg, msg


def test_a_variant_name_too_long_for_a_file_name_is_a_clear_value_error(run_py: RunPy) -> None:
    code = (
        "import flashgen\n"
        "src = 'template <typename P> struct Mine : flashgen::DefaultAttention<P> {};'\n"
        "try:\n"
        "    flashgen.Variant('v' * 1000, src)\n"
        "except ValueError as exc:\n"
        "    print('ValueError:', exc)\n"
    )
    out = run_py(code).stdout
    assert "ValueError: Variant name" in out and "1000 characters long" in out, out
    assert "at most 200 bytes" in out, out


def test_the_loader_finds_no_flashgen_in_the_working_folder(installed: Path, build_env: dict[str, str],
                                                           tmp_path: Path) -> None:
    """Without a bundled binary (a package whose ``_bin/`` is gone), the loader looks for
    ``flashgen`` on PATH: an empty or ``.`` entry must not find one planted in the working folder."""
    folder, marks = tmp_path / "theirs", tmp_path / "marks"
    _plant(folder, marks)
    copy = tmp_path / "site-nobin"
    shutil.copytree(installed, copy)
    shutil.rmtree(copy / "flashgen" / "_bin")
    prog = tmp_path / "prog" / "prog.py"
    prog.parent.mkdir()
    prog.write_text(
        "import subprocess\nfrom flashgen import _install\n"
        "try:\n"
        "    print(subprocess.run([str(_install.binary()), '--version'], capture_output=True, text=True).stdout)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = dict(build_env, PYTHONPATH=str(copy), PATH=".::/usr/bin:/bin")
    env.pop("FLASHGEN_BIN", None)
    proc = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env, cwd=folder,
                          timeout=60)
    assert sorted(p.name for p in marks.iterdir()) == [], proc.stdout + proc.stderr
    assert "the flashgen binary was not found" in proc.stdout, proc.stdout + proc.stderr
