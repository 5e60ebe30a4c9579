"""The loader on a machine without a GPU: arch rules, the cache's lock and verification, variant
parameters, tensor reading and argument validation (in-process), then the real thing against an
installed wheel and the pinned PyPI nvcc (fresh interpreters): AOT hit, JIT miss, cache hit,
corrupted entry, FLASHGEN_DISABLE_JIT, eight racing processes, a compile killed mid-way, a
custom variant, and AOT/JIT byte parity.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import flashgen
from flashgen import _common, _kernels, _tensor, _variant
from flashgen._errors import NoGPUError

from conftest import FakeCudaTensor, RunPy, whole_matrix

# ---- what the loader reads: the manifest's runs_on rows, FLASHGEN_DEVICE_CC, manifest paths ------


@pytest.mark.parametrize("rows, cc, ok", [
    ([{"target": "sm_90a", "min": [9, 0], "max": [9, 0]}], (9, 0), True),
    ([{"target": "sm_90a", "min": [9, 0], "max": [9, 0]}], (10, 0), False),
    ([{"target": "sm_80", "min": [8, 0], "max": [8, 9]}], (8, 6), True),
    ([{"target": "sm_80", "min": [8, 0], "max": [8, 9]}], (9, 0), False),
    ([{"target": "sm_80", "min": [8, 0], "max": [8, 9]}, {"target": "compute_80", "min": [8, 0], "max": None}],
     (12, 0), True),
    ([], (9, 0), False),
    (None, (9, 0), False),
])
def test_runs_on_rows_are_read_not_derived(rows: Any, cc: tuple[int, int], ok: bool) -> None:
    from flashgen import _loader

    assert _loader._runs_on(rows, cc) is ok


def test_device_capability_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashgen import _loader

    monkeypatch.setenv("FLASHGEN_DEVICE_CC", "8.6")
    assert _loader.device_capability() == (8, 6)
    for bad in ("86", "sm_86", "8.x", "9.0a"):
        monkeypatch.setenv("FLASHGEN_DEVICE_CC", bad)
        with pytest.raises(ValueError, match="FLASHGEN_DEVICE_CC"):
            _loader.device_capability()


@pytest.mark.parametrize("name", ["../../elsewhere/evil.so", "/etc/evil.so", "sub/x.so", ".hidden.so",
                                  "x.py", "x.so\0", 3, None])
def test_manifest_paths_never_leave_the_package(name: Any) -> None:
    from flashgen import _install

    with pytest.raises(flashgen.FlashgenError, match="not a plain .so file name"):
        _install.aot_file(name)
    assert _install.aot_file("single_decode_x.so").parent == _install.aot_dir()


def test_no_python_copy_of_build_policy() -> None:
    """Arch rules, the cache root and layout, and globbing live in the binary only."""
    pkg = Path(flashgen.__file__).parent
    assert not (pkg / "_arch.py").exists() and not (pkg / "_cache.py").exists()
    text = "\n".join(p.read_text() for p in pkg.glob("*.py"))
    for needle in ("XDG_CACHE_HOME", "fnmatch", "jit_arch_for", "expanduser", "Path.home", "PARAM_CTYPES"):
        assert needle not in text, needle


# ---- checking a file before loading it, and loading exactly what was checked --------------------


def _tiny_lib(tmp_path: Path, name: str, value: int) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no host C compiler (cc)")
    src = tmp_path / f"{name}.c"
    src.write_text(f"int answer(void) {{ return {value}; }}\n")
    out = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    out.chmod(0o644)
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checked_bytes_are_the_loaded_bytes_even_if_the_file_is_swapped(tmp_path: Path) -> None:
    from flashgen import _verify

    good, evil = _tiny_lib(tmp_path, "good", 42), _tiny_lib(tmp_path, "evil", 666)
    data = _verify.read_checked(good, _sha(good), private=True)
    os.replace(evil, good)  # the swap lands between the check and the load
    lib = ctypes.CDLL(_verify.loadable_path(data, "good"))
    assert lib.answer() == 42
    # A second library from memory is another library, not the first one again.
    other = _tiny_lib(tmp_path, "other", 7)
    lib2 = ctypes.CDLL(_verify.loadable_path(_verify.read_checked(other, _sha(other), private=True), "other"))
    assert lib2.answer() == 7 and lib.answer() == 42


def test_read_checked_refuses_what_it_cannot_trust(tmp_path: Path) -> None:
    from flashgen import _verify

    lib = _tiny_lib(tmp_path, "lib", 1)
    sha = _sha(lib)
    with pytest.raises(_verify.UntrustedFileError, match="does not match the sha256"):
        _verify.read_checked(lib, "0" * 64, private=True)
    link = tmp_path / "link.so"
    link.symlink_to(lib)
    with pytest.raises(_verify.UntrustedFileError, match="cannot open"):
        _verify.read_checked(link, sha, private=True)
    lib.chmod(0o664)
    with pytest.raises(_verify.UntrustedFileError, match="writable by group or others"):
        _verify.read_checked(lib, sha, private=True)
    assert _verify.read_checked(lib, sha, private=False) == lib.read_bytes(), "wheel files: hash only"
    lib.chmod(0o644)
    if os.geteuid() == 0:
        os.chown(lib, 65534, 65534)
        with pytest.raises(_verify.UntrustedFileError, match="belongs to uid 65534"):
            _verify.read_checked(lib, sha, private=True)


# ---- variants and their parameters ---------------------------------------------------------------



def test_variant_finds_its_struct(fake_matrix: Any) -> None:
    v = flashgen.Variant("my_sigmoid", "template <typename P>\nstruct MySigmoid { };", params=[("logits_scale", "float")])
    assert v.struct == "MySigmoid" and v.params[0].name == "logits_scale"
    assert v == flashgen.Variant("my_sigmoid", "template <typename P>\nstruct MySigmoid { };", params=[("logits_scale", "float")])
    assert v.digest != flashgen.Variant("my_sigmoid", "template <typename P>\nstruct MySigmoid { };").digest


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "1bad", "source": "template <class P> struct A {};"}, "C identifier"),
    ({"name": "v", "source": "struct A {};"}, "pass struct="),
    ({"name": "v", "source": "template <class P> struct A {}; template <class P> struct B {};"}, "A, B"),
    ({"name": "v", "source": "template <class P> struct A {};", "params": [("x", "float"), ("x", "float")]}, "twice"),
    ({"name": "v", "source": "template <class P> struct A {};", "params": [("x", "std::string")]}, "unsupported"),
    ({"name": "bad\n", "source": "template <class P> struct A {};"}, "C identifier"),
    ({"name": "v", "source": "template <class P> struct A {};", "params": [("x\n", "float")]}, "not a C identifier"),
    ({"name": "v", "source": "template <class P> struct A {};", "params": [("x", "int")]}, "unsupported C type"),
    ({"name": "v", "source": "template <class P> struct A {};", "params": [("x", "float\n; evil")]}, "unsupported"),
    ({"name": "v", "source": "template <class P> struct A {};", "struct": "A\n"}, "not a C identifier"),
    ({"name": "v", "source": "template <class P> struct A {};", "params": [("float", "float")]}, "C/C\\+\\+ keyword"),
    ({"name": "v", "source": "template <class P> struct A {};", "struct": "class"}, "keyword"),
])
def test_variant_rejects(fake_matrix: Any, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        flashgen.Variant(**kwargs)


def test_param_struct_layout_is_natural_c_alignment(fake_matrix: Any) -> None:
    from flashgen._matrix import Param

    packer = _variant.ParamPacker("v", [Param("a", "int32_t"), Param("slopes", "const float*"), Param("b", "float")])
    st = packer.struct_type
    assert (st.a.offset, st.slopes.offset, st.b.offset, ctypes.sizeof(st)) == (0, 8, 16, 24)
    slopes = FakeCudaTensor((8,), "f32")
    obj, keep = packer.pack({"a": 3, "slopes": slopes, "b": 0.5}, "f", 0, _tensor.describe)
    assert (obj.a, obj.slopes, obj.b, keep) == (3, 0x10000, 0.5, [slopes])
    with pytest.raises(TypeError, match="must be a f32 tensor"):
        packer.pack({"a": 3, "slopes": FakeCudaTensor((8,), "f16"), "b": 0.5}, "f", 0, _tensor.describe)
    with pytest.raises(TypeError, match="a must be an integer"):
        packer.pack({"a": 3.5, "slopes": slopes, "b": 0.5}, "f", 0, _tensor.describe)
    with pytest.raises(TypeError, match=r"unknown parameter 'c' and missing parameter 'b'; it takes a, slopes, b"):
        packer.pack({"a": 3, "slopes": slopes, "c": 1}, "f", 0, _tensor.describe)


# ---- tensors -------------------------------------------------------------------------------------


def test_dlpack_reading_and_stream() -> None:
    t = FakeCudaTensor((4, 3, 128), "bf16", device=1, strides=(128 * 8, 128, 1))
    d = _tensor.describe(t, "k")
    assert d == _tensor.Tensor(0x10000, (4, 3, 128), (1024, 128, 1), "bf16", 2, 1, "dlpack")
    assert t.streams_seen == [1], "CUDA producers are asked to sync with the legacy default stream"


def test_numpy_arrays_are_read_and_rejected_as_cpu() -> None:
    np = pytest.importorskip("numpy")
    a = np.zeros((2, 64), dtype=np.float16)[:, ::2]
    d = _tensor.describe(a, "q")
    assert (d.shape, d.strides, d.dtype, d.device) == ((2, 32), (64, 2), "f16", "cpu")
    with pytest.raises(ValueError, match="q is on cpu; flashgen kernels run on CUDA devices"):
        flashgen.single_decode(a, a, a)


def test_non_tensors_are_type_errors() -> None:
    with pytest.raises(TypeError, match="single_decode: q must be a tensor"):
        flashgen.single_decode([1.0], [1.0], [1.0])
    with pytest.raises(TypeError, match="single_decode: q, k, v are required: pass a CUDA tensor"):
        flashgen.single_decode(None, None, None)
    with pytest.raises(TypeError, match="batch_decode: paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len are required"):
        flashgen.batch_decode(FakeCudaTensor((4, 32, 128)), None, None, None, None)


# ---- validation before any launch (fake matrix, fake CUDA tensors) -------------------------------


def _sd(fake_matrix: Any, **kw: Any) -> Any:
    q = kw.pop("q", FakeCudaTensor((32, 128)))
    k = kw.pop("k", FakeCudaTensor((100, 8, 128)))
    v = kw.pop("v", FakeCudaTensor((100, 8, 128)))
    return flashgen.single_decode(q, k, v, **kw)


def _bd(fake_matrix: Any, page_size: int = 16, head_dim: int = 128, **kw: Any) -> Any:
    q = kw.pop("q", FakeCudaTensor((4, 32, head_dim)))
    cache = kw.pop("cache", FakeCudaTensor((10, 2, page_size, 8, head_dim)))
    indptr = kw.pop("indptr", FakeCudaTensor((5,), "i32"))
    indices = kw.pop("indices", FakeCudaTensor((10,), "i32"))
    last = kw.pop("last", FakeCudaTensor((4,), "i32"))
    return flashgen.batch_decode(q, cache, indptr, indices, last, **kw)


def _no_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return False
    except OSError:
        return True


needs_no_driver = pytest.mark.skipif(not _no_driver(), reason="a CUDA driver is present (test_api_gpu covers it)")


@needs_no_driver
def test_valid_call_without_a_driver_is_a_clear_error(fake_matrix: Any) -> None:
    with pytest.raises(NoGPUError, match="no CUDA driver: libcuda.so.1 could not be loaded"):
        _sd(fake_matrix)
    with pytest.raises(NoGPUError, match="FLASHGEN_DEVICE_CC"):
        _bd(fake_matrix, kv_layout="HND", cache=FakeCudaTensor((10, 2, 8, 16, 128)))


@needs_no_driver
@pytest.mark.parametrize("cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_cache_call_passes_validation(fake_matrix: Any, cache_dtype: str) -> None:
    # Every check passes (the cache's kv_dtype finds an instance); only the missing driver stops it.
    cache = FakeCudaTensor((10, 2, 16, 8, 128), cache_dtype)
    with pytest.raises(NoGPUError, match="no CUDA driver"):
        _bd(fake_matrix, cache=cache, k_scale=0.25, v_scale=2)


@pytest.mark.parametrize("kw, exc, match", [
    ({"kv_layout": "NDH"}, ValueError, "kv_layout must be one of NHD, HND, got 'NDH'"),
    ({"q": FakeCudaTensor((32, 128), "f32")}, TypeError, "q must be float16 or bfloat16, got f32"),
    ({"k": FakeCudaTensor((100, 8, 128), "f16")}, TypeError, "k is f16 but q is bf16"),
    ({"q": FakeCudaTensor((32, 96)), "k": FakeCudaTensor((9, 8, 96)), "v": FakeCudaTensor((9, 8, 96))},
     ValueError, "head_dim=96 is not in the variant matrix; head_dim takes 64, 128"),
    ({"k": FakeCudaTensor((100, 8, 64))}, ValueError, "k has head_dim 64 but q has 128"),
    ({"v": FakeCudaTensor((99, 8, 128))}, ValueError, "v has kv_len 99 but k has 100"),
    ({"k": FakeCudaTensor((0, 8, 128)), "v": FakeCudaTensor((0, 8, 128))}, ValueError, "kv_len must be at least 1"),
    ({"q": FakeCudaTensor((30, 128))}, ValueError, r"num_qo_heads \(30\) must be a multiple of num_kv_heads \(8\)"),
    ({"q": FakeCudaTensor((32, 128), strides=(1, 32))}, ValueError, "q must be contiguous in its last"),
    ({"v": FakeCudaTensor((100, 8, 128), device=1)}, ValueError, "v is on cuda:1 but q is on cuda:0"),
    ({"q": FakeCudaTensor((1, 32, 128))}, ValueError, r"q must be 2-D \[num_qo_heads, head_dim\]"),
    ({"variant": "nope"}, ValueError, "unknown variant 'nope'; built-in variants: default, soft_cap"),
    ({"variant": "soft_cap"}, TypeError, "variant 'soft_cap' missing parameter 'logits_soft_cap'"),
    ({"window_left": 3}, TypeError, "variant 'default' unknown parameter 'window_left'; it takes no parameters"),
    ({"variant": "sliding_window", "window_left": "x"}, TypeError, "window_left must be an integer"),
    ({"out": FakeCudaTensor((32, 64))}, ValueError, r"out must have shape \[32, 128\]"),
    ({"q": FakeCudaTensor((32, 128), device_type=1)}, ValueError, "q is on cpu"),
    ({"variant": 3}, TypeError, "variant must be a built-in variant name or a flashgen.Variant"),
])
def test_single_decode_validation(fake_matrix: Any, kw: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _sd(fake_matrix, **kw)


@pytest.mark.parametrize("kw, exc, match", [
    ({"page_size": 8}, ValueError, "page_size=8 is not in the variant matrix; page_size takes 1, 16"),
    ({"page_size": 1, "head_dim": 256}, ValueError,
     "no instance of batch_decode has dtype=bf16, head_dim=256, page_size=1, pos_encoding=none, kv_dtype=same, "
     r"variant=default; instances exist for head_dim=64\|128 \(with dtype=bf16, page_size=1, pos_encoding=none, "
     r"variant=default, kv_dtype=same\); or page_size=16"),
    ({"indptr": FakeCudaTensor((5,), "i64")}, TypeError, "kv_indptr must be an int32 tensor, got i64"),
    ({"indptr": FakeCudaTensor((4,), "i32")}, ValueError, r"kv_indptr must have batch \+ 1 = 5 entries, got 4"),
    ({"last": FakeCudaTensor((5,), "i32")}, ValueError, "kv_last_page_len has batch 5 but q has 4"),
    ({"cache": FakeCudaTensor((10, 3, 16, 8, 128))}, ValueError, r"paged_kv_cache's dimension 1 must be 2 \[num_pages, 2, page_size, num_kv_heads, head_dim\]"),
    ({"cache": FakeCudaTensor((10, 2, 16, 8, 64))}, ValueError, "paged_kv_cache has head_dim 64 but q has 128"),
    ({"kv_layout": "HND", "cache": FakeCudaTensor((10, 2, 12, 16, 128))}, ValueError, "num_qo_heads \\(32\\) must be a multiple of num_kv_heads \\(12\\)"),
    ({"variant": "alibi", "alibi_slopes": FakeCudaTensor((32,), "f16")}, TypeError, "alibi_slopes must be a f32 tensor, got f16"),
    # An fp8 KV cache: q stays 16-bit, the cache is q's dtype or fp8, scales are finite numbers
    # for an fp8 cache only, and rope_llama (the prefill kernels) reads no fp8.
    ({"q": FakeCudaTensor((4, 32, 128), "fp8_e4m3"), "cache": FakeCudaTensor((10, 2, 16, 8, 128), "fp8_e4m3")},
     TypeError, "q must be float16 or bfloat16, got fp8_e4m3"),
    ({"cache": FakeCudaTensor((10, 2, 16, 8, 128), "f16")}, TypeError,
     r"paged_kv_cache must be bf16 like q, or an fp8 type \(torch.float8_e4m3fn or torch.float8_e5m2\), got f16"),
    ({"cache": FakeCudaTensor((10, 2, 16, 8, 128), "fp8_e4m3"), "k_scale": "2"}, TypeError,
     "k_scale must be a real number"),
    ({"cache": FakeCudaTensor((10, 2, 16, 8, 128), "fp8_e5m2"), "v_scale": None}, TypeError,
     "v_scale must be a real number"),
    ({"cache": FakeCudaTensor((10, 2, 16, 8, 128), "fp8_e4m3"), "k_scale": float("inf")}, ValueError,
     "k_scale must be finite, got inf"),
    ({"k_scale": 0.5}, ValueError, "k_scale and v_scale apply to an fp8 KV cache, but the cache is bf16 like q"),
    ({"cache": FakeCudaTensor((10, 2, 16, 8, 128), "fp8_e5m2"), "pos_encoding": "rope_llama"}, ValueError,
     "pos_encoding='rope_llama' with kv_dtype='fp8_e5m2' is not supported: in-kernel RoPE is not supported with "
     "an fp8 KV cache"),
])
def test_batch_decode_validation(fake_matrix: Any, kw: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _bd(fake_matrix, **kw)


def test_custom_variant_validation(fake_matrix: Any) -> None:
    shadow = flashgen.Variant("soft_cap", "template <class P> struct X {};")
    with pytest.raises(ValueError, match="is a built-in variant's; give it another name"):
        _sd(fake_matrix, variant=shadow)
    mine = flashgen.Variant("mine", "template <class P> struct X {};", params=[("scale", "float")])
    with pytest.raises(TypeError, match="variant 'mine' missing parameter 'scale'"):
        _sd(fake_matrix, variant=mine)
    with pytest.raises(ValueError, match="head_dim=96 is not in the variant matrix"):
        _sd(fake_matrix, variant=mine, scale=1.0, q=FakeCudaTensor((32, 96)), k=FakeCudaTensor((9, 8, 96)),
            v=FakeCudaTensor((9, 8, 96)))


def _cli_uris(flashgen_bin: Path, *args: str) -> list[str]:
    from conftest import REPO

    proc = subprocess.run([str(flashgen_bin), "--config", str(REPO / "variants.json"), "list-variants", "--json",
                           *args], capture_output=True, text=True)
    return [r["uri"] for r in json.loads(proc.stdout)] if proc.returncode == 0 else []


def test_list_variants_selects_with_the_clis_own_filter(flashgen_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flashgen import _install, _matrix

    monkeypatch.setenv("FLASHGEN_BIN", str(flashgen_bin))
    _install._reset_for_tests()
    _matrix._reset_for_tests()
    if _install.is_installed():
        pytest.skip("compares against the checkout's variants.json")
    everything = flashgen.list_variants()
    assert [r["uri"] for r in everything] == _cli_uris(flashgen_bin)
    sd = flashgen.list_variants("single_decode", head_dim=128, variant="s*")
    assert sd and [r["uri"] for r in sd] == _cli_uris(flashgen_bin, "--module", "single_decode", "--where",
                                                      "head_dim=128", "--where", "variant=s*")
    assert all(set(r) == {"uri", "module", "params", "codes", "aot", "backend", "arch_limit", "precompiled"}
               for r in sd)
    assert {r["backend"] for r in sd} == {"sm90", "portable"}, "single_decode's backend axis"
    assert all(r["arch_limit"] == (["9.0a"] if r["backend"] == "sm90" else None) for r in sd)
    bd = flashgen.list_variants("batch_decode", head_dim=128, variant="s*")
    assert bd and all(r["backend"] is None and r["arch_limit"] is None for r in bd), "no backend axis there"
    # Globs the CLI's matcher reads its own way ({a,b} alternation) mean the same from Python.
    alt = flashgen.list_variants(head_dim="{64,256}", page_size=1)
    assert alt and [r["uri"] for r in alt] == _cli_uris(flashgen_bin, "--where", "head_dim={64,256}",
                                                        "--where", "page_size=1")
    assert flashgen.list_variants("single_decode", head_dim="9*") == []
    with pytest.raises(ValueError, match="unknown axis `heads`"):
        flashgen.list_variants(heads=3)
    assert flashgen.is_precompiled("single_decode", dtype="bf16", head_dim=128, pos_encoding="none",
                                   variant="default", backend="portable") is False
    with pytest.raises(ValueError, match="no value given for axis pos_encoding, variant"):
        flashgen.is_precompiled("single_decode", dtype="bf16", head_dim=128)
    with pytest.raises(ValueError, match="unknown module 'prefill'"):
        flashgen.is_precompiled("prefill", dtype="bf16")


def test_import_is_stdlib_only() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import flashgen; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'cupy'));"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, str(Path(flashgen.__file__).parents[1])], check=True)


# ---- against an installed wheel and the pinned nvcc (fresh interpreters) -------------------------

PRELUDE = r"""
import hashlib, json, subprocess, sys
from flashgen import _loader

def no_spawn(*a, **k):
    raise AssertionError(f"the warm path spawned a process: {a!r}")

def report(loaded):
    data = open(loaded.path, "rb").read()
    print(json.dumps({"uri": loaded.uri, "source": loaded.source, "path": str(loaded.path),
                      "seconds": loaded.seconds, "codes": loaded.codes,
                      "sha256": hashlib.sha256(data).hexdigest()}), flush=True)
"""


DEVICE = {"FLASHGEN_DEVICE_CC": "9.0"}  # the CI wheel is built for sm_90a: an H100/H200


def _aot_instance(manifest: dict[str, Any]) -> dict[str, Any]:
    """The wheel's portable single_decode instance (no arch limit of its own; the wheel also holds
    the sm90 one, which only 9.0a devices take)."""
    return next(i for i in manifest["instances"]
                if i["module"] == "single_decode" and i["params"].get("backend", "portable") == "portable")


def _missing_instance(installed: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """A single_decode instance the wheel does not precompile (f16, head_dim 64 if possible)."""
    shipped = {i["uri"] for i in manifest["instances"]}
    matrix = whole_matrix(lambda rel: (installed / "flashgen" / rel).read_text())
    candidates = [i for i in matrix["instances"] if i["module"] == "single_decode" and i["uri"] not in shipped]
    if not candidates:
        pytest.skip("the wheel under test precompiles every single_decode instance")
    candidates.sort(key=lambda i: (i["params"]["variant"] != "default", i["params"]["head_dim"] != 64))
    return candidates[0]


def _load_snippet(module: str, params: dict[str, Any], *, warm: bool = False, extra: str = "") -> str:
    code = PRELUDE
    if warm:
        code += "subprocess.Popen = no_spawn\n"
    code += extra
    code += f"report(_loader.load({module!r}, {params!r}))\n"
    return code


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _objects(cache: Path) -> list[Path]:
    return sorted((cache / "objects").glob("*/*.so")) if (cache / "objects").is_dir() else []


def test_aot_hit_is_verified_and_spawns_nothing(run_py: RunPy, installed: Path, wheel_manifest: dict[str, Any]) -> None:
    inst = _aot_instance(wheel_manifest)
    proc = run_py(_load_snippet(inst["module"], inst["params"], warm=True) +
                  "print(_loader.load(%r, %r).kernels._fns['flashgen_abi_version']())\n"
                  % (inst["module"], inst["params"]), **DEVICE)
    got = json.loads(proc.stdout.splitlines()[0])
    assert got["source"] == "aot" and got["uri"] == inst["uri"]
    assert Path(got["path"]) == installed / "flashgen" / "_aot" / inst["path"]
    assert got["sha256"] == inst["sha256"] and got["codes"] == inst["codes"]
    assert proc.stdout.splitlines()[1] == "3", "the .so loads (from memory) without a GPU: ABI version 3"
    assert wheel_manifest["runs_on"] == [{"target": "sm_90a", "min": [9, 0], "max": [9, 0]}]


def test_aot_skipped_when_its_archs_cannot_run(run_py: RunPy, wheel_manifest: dict[str, Any]) -> None:
    inst = _aot_instance(wheel_manifest)
    proc = run_py(_load_snippet(inst["module"], inst["params"]), check=False,
                  FLASHGEN_DEVICE_CC="8.0", FLASHGEN_DISABLE_JIT="1")
    assert proc.returncode != 0
    assert "JITDisabledError" in proc.stderr and inst["uri"] in proc.stderr
    assert "does not run on this GPU (it holds sm_90a)" in proc.stderr and "--arch 8.0" in proc.stderr


def test_tampered_aot_file_is_refused(run_py: RunPy, installed: Path, wheel_manifest: dict[str, Any], tmp_path: Path) -> None:
    copy = tmp_path / "site"
    shutil.copytree(installed, copy)
    inst = _aot_instance(wheel_manifest)
    so = copy / "flashgen" / "_aot" / inst["path"]
    data = bytearray(so.read_bytes())
    data[-100] ^= 0xFF
    so.write_bytes(bytes(data))
    proc = run_py(_load_snippet(inst["module"], inst["params"]), check=False, PYTHONPATH=str(copy), **DEVICE)
    assert proc.returncode != 0 and "does not match the sha256" in proc.stderr
    assert "Reinstall the flashgen wheel" in proc.stderr


def test_manifest_path_leading_out_of_the_package_is_refused(run_py: RunPy, installed: Path,
                                                             wheel_manifest: dict[str, Any], tmp_path: Path) -> None:
    copy = tmp_path / "site"
    shutil.copytree(installed, copy)
    inst = _aot_instance(wheel_manifest)
    evil = tmp_path / "evil.so"
    shutil.copy(copy / "flashgen" / "_aot" / inst["path"], evil)
    rows = copy / "flashgen" / "_aot" / "rows" / f"{inst['module']}.json"
    data = json.loads(rows.read_text())
    next(i for i in data if i["uri"] == inst["uri"])["path"] = os.path.relpath(evil, rows.parent.parent)
    rows.write_text(json.dumps(data))
    proc = run_py(_load_snippet(inst["module"], inst["params"]), check=False, PYTHONPATH=str(copy), **DEVICE)
    assert proc.returncode != 0 and "not a plain .so file name" in proc.stderr


def test_jit_miss_then_cache_hit_then_corruption_rebuilt(run_py: RunPy, installed: Path,
                                                         wheel_manifest: dict[str, Any], tmp_path: Path) -> None:
    inst = _missing_instance(installed, wheel_manifest)
    cache = tmp_path / "cache"
    logs = "import logging\nlogging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
    proc = run_py(_load_snippet("single_decode", inst["params"], extra=logs), **DEVICE)
    cold = _result(proc)
    assert cold["source"] == "jit" and cold["uri"] == inst["uri"] and cold["codes"] == inst["codes"]
    # Nobody waits in silence: the compile is logged when it starts (with why) and when it ends.
    started = f"flashgen compiling {inst['uri']} for 9.0a: it is not precompiled in this installation"
    assert started in proc.stderr, proc.stderr
    assert re.search(rf"flashgen compiled {inst['uri']} for 9\.0a in \d+\.\d s", proc.stderr), proc.stderr
    so = Path(cold["path"])
    assert _objects(cache) == [so], "the JIT stores each .so once, as a cache object"
    assert (cache / "CACHEDIR.TAG").is_file() and (cache.stat().st_mode & 0o777) == 0o700
    assert not [p for p in (cache / "tmp").rglob("*") if p.is_file()], "nothing is left in the cache's tmp"

    proc = run_py(_load_snippet("single_decode", inst["params"], extra=logs), **DEVICE)
    warm = _result(proc)
    assert warm["source"] == "cache" and warm["sha256"] == cold["sha256"] and warm["path"] == cold["path"]
    assert "compil" not in proc.stderr, "a cache hit logs no compile"
    assert warm["seconds"] < 1.0, f"warm load took {warm['seconds']:.3f} s"

    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    again = _result(run_py(_load_snippet("single_decode", inst["params"]), **DEVICE))
    assert again["source"] == "jit" and again["sha256"] == cold["sha256"], "a corrupted entry is rebuilt, never loaded"

    other = dict(inst["params"], dtype="bf16" if inst["params"]["dtype"] == "f16" else "f16")
    if flashgen_uri_shipped(wheel_manifest, other):
        return
    proc = run_py(_load_snippet("single_decode", other), check=False, FLASHGEN_DISABLE_JIT="1", **DEVICE)
    assert proc.returncode != 0
    msg = proc.stderr
    assert "JITDisabledError" in msg and "FLASHGEN_DISABLE_JIT=1 forbids compiling it" in msg
    assert "Unset FLASHGEN_DISABLE_JIT" in msg and str(cache) in msg
    where = " ".join(f"--where {k}={v}" for k, v in other.items())
    assert f"flashgen build-wheel --arch 9.0a --module single_decode {where}" in msg


def flashgen_uri_shipped(manifest: dict[str, Any], params: dict[str, Any]) -> bool:
    return any(i["module"] == "single_decode" and i["params"] == params for i in manifest["instances"])


def test_eight_processes_race_for_one_instance(run_py: RunPy, installed: Path, build_env: dict[str, str],
                                               wheel_manifest: dict[str, Any], tmp_path: Path) -> None:
    inst = _missing_instance(installed, wheel_manifest)
    go = tmp_path / "go"
    code = (
        "import os, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
        + _load_snippet("single_decode", inst["params"])
    )
    cache = tmp_path / "cache"
    env = dict(build_env, PYTHONPATH=str(installed), FLASHGEN_CACHE_DIR=str(cache), **DEVICE)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    time.sleep(1.0)  # let all eight start and wait at the line
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    sources = sorted(r["source"] for r in results)
    assert sources == ["cache"] * 7 + ["jit"], sources
    assert len({r["sha256"] for r in results}) == 1 and len({r["path"] for r in results}) == 1
    assert len(_objects(cache)) == 1
    assert not [p for p in (cache / "tmp").rglob("*") if p.is_file()]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def test_compile_killed_midway_leaves_nothing_that_blocks_or_poisons(
        run_py: RunPy, installed: Path, build_env: dict[str, str], nvcc: Path,
        wheel_manifest: dict[str, Any], tmp_path: Path) -> None:
    inst = _missing_instance(installed, wheel_manifest)
    marker = tmp_path / "nvcc-started"
    slow_nvcc = tmp_path / "nvcc"
    # An nvcc that says when a real compile (one with -o) starts, then is the real nvcc.
    slow_nvcc.write_text(
        "#!/bin/sh\n"
        f"case \" $* \" in *' -o '*) touch {str(marker)!r};; esac\n"
        f"exec {str(nvcc)!r} \"$@\"\n"
    )
    slow_nvcc.chmod(0o755)
    cache = tmp_path / "cache"
    env = dict(build_env, PYTHONPATH=str(installed), FLASHGEN_CACHE_DIR=str(cache),
               FLASHGEN_NVCC=str(slow_nvcc), **DEVICE)
    victim = subprocess.Popen([sys.executable, "-c", _load_snippet("single_decode", inst["params"])],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert victim.poll() is None, victim.communicate()[1]
        assert time.monotonic() < deadline, "nvcc never started"
        time.sleep(0.02)
    time.sleep(0.5)  # nvcc is compiling now
    assert victim.poll() is None, "the compile finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    # The binary dies with the loader, and nvcc (with everything it started) with the binary.
    deadline = time.monotonic() + 20
    while _processes_mentioning(str(cache)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_mentioning(str(cache)), _processes_mentioning(str(cache))
    assert not _objects(cache), "no object was published"
    t0 = time.monotonic()
    after = _result(run_py(_load_snippet("single_decode", inst["params"]), **DEVICE))
    assert after["source"] == "jit" and time.monotonic() - t0 < 600
    warm = _result(run_py(_load_snippet("single_decode", inst["params"]), **DEVICE))
    assert warm["source"] == "cache" and warm["sha256"] == after["sha256"]


def test_custom_variant_compiles_through_the_jit(run_py: RunPy) -> None:
    from conftest import FLASH_SIGMOID_PARAMS, flash_sigmoid_source

    code = PRELUDE + (
        "import flashgen\n"
        f"v = flashgen.Variant('user_flash_sigmoid', {flash_sigmoid_source()!r}, params={FLASH_SIGMOID_PARAMS!r})\n"
        "report(_loader.load('single_decode', {'dtype': 'bf16', 'head_dim': 128, 'pos_encoding': 'none'}, v))\n"
    )
    logs = "import logging\nlogging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
    proc = run_py(logs + code, **DEVICE)
    cold = _result(proc)
    # On a 9.0 device single_decode takes its sm90 backend.
    assert cold["source"] == "jit" and cold["uri"].endswith("variant_user_flash_sigmoid_backend_sm90")
    assert "the user variant 'user_flash_sigmoid' is compiled on first use" in proc.stderr, proc.stderr
    warm = _result(run_py(code, **DEVICE))
    assert warm["source"] == "cache" and warm["sha256"] == cold["sha256"]
    assert warm["codes"]["variant"] == cold["codes"]["variant"]
    # Another source under the same name is another entry, never the stale one.
    changed = code.replace("sigmoid_bias_log2e = params.sigmoid_bias", "sigmoid_bias_log2e = 2.f * params.sigmoid_bias")
    other = _result(run_py(changed, **DEVICE))
    assert other["source"] == "jit" and other["path"] != cold["path"]


def test_jit_build_is_byte_identical_to_the_wheel(run_py: RunPy, wheel_manifest: dict[str, Any]) -> None:
    """AOT is JIT run ahead of time: the same instance built by the loader into a fresh cache,
    for the wheel's archs with the same toolchain, has the wheel's exact bytes."""
    inst = _aot_instance(wheel_manifest)
    code = PRELUDE + f"report(_loader.load({inst['module']!r}, {inst['params']!r}, prefer_aot=False))\n"
    got = _result(run_py(code, **DEVICE))
    assert got["source"] == "jit"
    assert got["sha256"] == inst["sha256"]


# ---- one owner for every rule: the CLI and the loader agree because only the CLI decides ---------

# A variant no cache can hold (its source names a fresh token), so the lookup misses and the
# JIT-disabled error carries the binary's answer whatever the user-level cache (HOME unset: the
# passwd home's) already holds.
PARITY_SNIPPET = PRELUDE + r"""
import uuid
import flashgen
from flashgen._errors import JITDisabledError
probe = flashgen.Variant("parity_probe", "template <typename P>\nstruct ParityProbe { };  // " + uuid.uuid4().hex)
try:
    _loader.load('single_decode', {'dtype': 'f16', 'head_dim': 64, 'pos_encoding': 'none', 'backend': 'portable'},
                 variant=probe)
except JITDisabledError as e:
    print(json.dumps({"cache_dir": e.answer["cache_dir"], "archs": e.answer["archs"]}))
"""


@pytest.mark.parametrize("env", [
    {"FLASHGEN_CACHE_DIR": "~/fg-cache"},
    {"FLASHGEN_CACHE_DIR": "", "XDG_CACHE_HOME": "{tmp}/xdg"},
    {"FLASHGEN_CACHE_DIR": "", "XDG_CACHE_HOME": "relative/ignored"},
    {"FLASHGEN_CACHE_DIR": "", "HOME": None},
    {"FLASHGEN_CUDA_ARCH_LIST": "90a"},
    {"FLASHGEN_CUDA_ARCH_LIST": "sm_90a"},
    {"FLASHGEN_CUDA_ARCH_LIST": "9.0a 8.0+PTX"},
])
def test_cli_and_loader_agree_on_cache_and_archs(run_py: RunPy, flashgen_bin: Path, build_env: dict[str, str],
                                                 installed: Path, tmp_path: Path, env: dict[str, Any]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    full = dict(build_env, HOME=str(home), FLASHGEN_DISABLE_JIT="1", **DEVICE)
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v.replace("{tmp}", str(tmp_path))
    full.setdefault("FLASHGEN_CACHE_DIR", str(tmp_path / "cache"))
    for k in [k for k, v in full.items() if k not in env and k in ("XDG_CACHE_HOME",)]:
        full.pop(k)
    cli_env = dict(full)
    doctor = subprocess.run([str(installed / "flashgen" / "_bin" / "flashgen"), "doctor", "--json"]
                            + (["--arch", full["FLASHGEN_CUDA_ARCH_LIST"]] if "FLASHGEN_CUDA_ARCH_LIST" in full else []),
                            capture_output=True, text=True, env=cli_env, cwd=tmp_path)
    cli = json.loads(doctor.stdout)
    proc = subprocess.run([sys.executable, "-c", PARITY_SNIPPET], capture_output=True, text=True,
                          env=dict(full, PYTHONPATH=str(installed)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    loader = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loader["cache_dir"] == cli["cache_dir"]
    if "FLASHGEN_CUDA_ARCH_LIST" in full:
        assert loader["archs"] == cli["archs"]["targets"]
    else:
        assert loader["archs"] == ["sm_90a"]
    if env.get("FLASHGEN_CACHE_DIR") == "~/fg-cache":
        assert cli["cache_dir"] == str(home / "fg-cache")


def test_param_types_come_from_the_binary(flashgen_bin: Path) -> None:
    """The one type table is the binary's (describe's param_types); Python maps its rows to
    ctypes and reads the user's spelling as the binary does."""
    from conftest import REPO

    from flashgen import _install

    proc = subprocess.run([str(flashgen_bin), "--config", str(REPO / "variants.json"), "describe", "--json"],
                          capture_output=True, text=True, check=True)
    rows = json.loads(proc.stdout)["param_types"]
    _install._matrix_cache = {"param_types": rows}  # the autouse fixture resets it
    _variant._reset_for_tests()
    for row in rows:
        pointer = row["c"].endswith("*")
        assert _variant.ctype_of(row["c"]) == (getattr(ctypes, row["ctypes"]), row["dtype"] if pointer else None)
    assert _variant.ctype_of(" const  float\t* ") == (ctypes.c_void_p, "f32")
    for bad in ("int8_t", "int", "float\n; evil", "const float", "std::string", "float**", "float const*", "void*"):
        with pytest.raises(TypeError, match="unsupported C type"):
            _variant.ctype_of(bad)


# ---- the per-call plan (fast path for torch tensors) ---------------------------------------------


class _FakeTorch:
    """Just enough of torch's surface for the fast path: a Tensor class, dtypes, empty, streams."""

    def __init__(self) -> None:
        import types

        class DType(str):
            pass

        for name in ("float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "int8", "bool"):
            setattr(self, name, DType(name))
        fake = self

        class Tensor:
            is_cuda = True
            _next = 0x100000

            def __init__(self, shape: tuple[int, ...], dtype: Any, strides: tuple[int, ...] | None = None) -> None:
                self.shape, self.dtype = tuple(shape), dtype
                acc, rev = 1, []
                for n in reversed(self.shape):
                    rev.append(acc)
                    acc *= n
                self._strides = strides or tuple(reversed(rev))
                Tensor._next += 0x10000
                self._ptr = Tensor._next

            def data_ptr(self) -> int:
                return self._ptr

            def stride(self) -> tuple[int, ...]:
                return self._strides

            def get_device(self) -> int:
                return 0

        self.Tensor = Tensor
        self._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda d: 0xABC)
        self.cuda = types.SimpleNamespace(is_initialized=lambda: False)
        self.device = lambda kind, index: (kind, index)
        self.empty = lambda shape, dtype, device: fake.Tensor(shape, dtype)


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch, fake_matrix: Any) -> Any:
    from flashgen import _cuda, _loader, _tensor

    torch = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(_tensor, "_torch_tensor", None)
    monkeypatch.setattr(_tensor, "_by_type", {})
    monkeypatch.setattr(_cuda, "driver", lambda: None)
    monkeypatch.setattr(_cuda, "needs_guard", lambda: False)
    calls: list[tuple[Any, ...]] = []

    class Kernels:
        """Records each call's arguments struct as a dict (the variant's first parameter, a float,
        read through additional_params), as the C entry would read it."""

        path = "/nonexistent"

        def workspace_size(self, module: str, args: Any) -> int:
            return 1 << 20

        def last_error(self) -> str:
            return "fake"

        def entry(self, module: str) -> Any:
            args_type = _kernels.args_struct(module)

            def fn(addr: int) -> int:
                time.sleep(0)  # let other threads run between the caller's writes and this read
                a = args_type.from_address(addr)
                rec = {name: getattr(a, name) for name, _ in args_type._fields_}
                ap = rec.get("additional_params")  # a module without variants has none
                rec["params"] = ctypes.c_float.from_address(ap).value if ap else None
                rec["addr"] = addr
                calls.append(rec)
                return 0

            return fn

    def load(module: str, params: dict[str, Any], variant: Any = None, device: Any = None, **kw: Any) -> Any:
        inst = next(i for i in fake_matrix["instances"] if i["module"] == module and i["params"] == params)
        loaded = _loader.Loaded(inst["uri"], module, params, inst["codes"], Path("/nonexistent"), "aot", b"")
        loaded._kernels = Kernels()
        return loaded

    monkeypatch.setattr(_loader, "load", load)
    torch.calls = calls  # type: ignore[attr-defined]
    return torch


def test_threads_on_one_stream_hold_its_workspace_until_their_kernels_are_enqueued(
        fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One call's kernels pass tables to each other through the stream's workspace, and growing the
    workspace drops the old buffer: a launch must have the buffer to itself, and alive, from taking
    it until its entry point returns, however many threads share the stream."""
    import threading
    import weakref

    from flashgen import _loader

    T, bf16 = fake_torch.Tensor, fake_torch.bfloat16
    alive: dict[int, Any] = {}  # address -> weak reference to the buffer allocated there
    plain_empty = fake_torch.empty

    def empty(shape: Any, dtype: Any, device: Any) -> Any:
        t = plain_empty(shape, dtype, device)
        alive[t.data_ptr()] = weakref.ref(t)
        return t

    fake_torch.empty = empty
    # Longer kv, bigger workspace: calls of growing lengths make the buffer grow under the others.
    monkeypatch.setattr(_common, "workspace_bytes", lambda what, loaded, module, fields: fields["kv_len"] << 16)
    in_use: set[int] = set()
    problems: list[str] = []
    lock = threading.Lock()
    load = _loader.load

    def load_watched(*args: Any, **kw: Any) -> Any:
        loaded = load(*args, **kw)
        entry = loaded._kernels.entry

        def watched_entry(module: str) -> Any:
            fn, args_type = entry(module), _kernels.args_struct(module)

            def watched(addr: int) -> int:
                ws = args_type.from_address(addr).workspace
                with lock:
                    if ws in in_use:
                        problems.append(f"two launches at once on the workspace at {ws:#x}")
                    in_use.add(ws)
                time.sleep(0.001)  # the C entry enqueueing its kernels
                ref = alive.get(ws)
                if ref is None or ref() is None:
                    problems.append(f"the workspace at {ws:#x} was freed during a launch on it")
                with lock:
                    in_use.discard(ws)
                return fn(addr)

            return watched

        loaded._kernels.entry = watched_entry
        return loaded

    monkeypatch.setattr(_loader, "load", load_watched)
    q = T((32, 128), bf16)

    def caller(i: int) -> None:
        for n in range(12):
            kv = 16 + 8 * n + i
            flashgen.single_decode(q, T((kv, 8, 128), bf16), T((kv, 8, 128), bf16))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_torch.calls) == 72
    assert problems == []


def test_plans_launch_exactly_what_the_checked_path_does(fake_torch: Any) -> None:
    T, bf16 = fake_torch.Tensor, fake_torch.bfloat16
    calls = fake_torch.calls
    q, k, v = T((32, 128), bf16), T((8, 100, 128), bf16), T((8, 100, 128), bf16)
    for cap in (30.0, 2.5):
        o = flashgen.single_decode(q, k, v, kv_layout="HND", variant="soft_cap", logits_soft_cap=cap)
        assert o.shape == (32, 128)
    first, second = calls
    ptrs = ("q", "k", "v")
    assert [first[n] for n in ptrs] == [second[n] for n in ptrs] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    consts = ("num_qo_heads", "num_kv_heads", "kv_len", "head_dim", "q_stride_h", "k_stride_n", "k_stride_h",
              "v_stride_n", "v_stride_h", "o_stride_h", "dtype_code", "variant_code", "sm_scale")
    assert ([first[n] for n in consts] == [second[n] for n in consts]
            == [32, 8, 100, 128, 128, 128, 12800, 128, 12800, 128, 1, 1, pytest.approx(1 / math.sqrt(128))])
    assert (first["params"], second["params"]) == (30.0, 2.5), "variant parameters are read on every call"
    assert first["lse"] is None and first["o"] is not None and first["o"] != second["o"]
    assert first["workspace"] == second["workspace"] and first["workspace_bytes"] == second["workspace_bytes"] >= 1 << 20
    assert first["stream"] == second["stream"] == 0xABC
    assert len(flashgen._op._PLANS["single_decode"]) == 1
    # Anything the checks read changes the key: a bad call after good ones still fails its check.
    with pytest.raises(ValueError, match="must be a multiple of num_kv_heads"):
        flashgen.single_decode(T((30, 128), bf16), k, v, kv_layout="HND", variant="soft_cap", logits_soft_cap=1.0)
    with pytest.raises(TypeError, match="missing parameter 'logits_soft_cap'"):
        flashgen.single_decode(q, k, v, kv_layout="HND", variant="soft_cap")
    with pytest.raises(TypeError, match="logits_soft_cap must be a number"):
        flashgen.single_decode(q, k, v, kv_layout="HND", variant="soft_cap", logits_soft_cap="x")
    out = T((32, 128), bf16)
    res = flashgen.single_decode(q, k, v, kv_layout="HND", variant="soft_cap", logits_soft_cap=1.0, out=out,
                                 return_lse=True)
    assert res[0] is out and res[1].shape == (32,) and calls[-1]["o"] == out.data_ptr()
    assert calls[-1]["lse"] == res[1].data_ptr()


def test_batch_plans_keep_the_page_table_order(fake_torch: Any) -> None:
    T, f16, i32 = fake_torch.Tensor, fake_torch.float16, fake_torch.int32
    calls = fake_torch.calls
    q, cache = T((4, 32, 64), f16), T((10, 2, 16, 8, 64), f16)
    indptr, indices, last = T((5,), i32), T((10,), i32), T((4,), i32)
    for _ in range(2):
        flashgen.batch_decode(q, cache, indptr, indices, last)
    assert {n: v for n, v in calls[0].items() if n != "o"} == {n: v for n, v in calls[1].items() if n != "o"}
    assert [calls[1][n] for n in ("q", "paged_kv", "kv_indptr", "kv_indices", "kv_last_page_len")] == [
        q.data_ptr(), cache.data_ptr(), indptr.data_ptr(), indices.data_ptr(), last.data_ptr()]
    consts = ("batch_size", "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "q_stride_b", "q_stride_h",
              "kv_stride_page", "kv_stride_kv", "kv_stride_n", "kv_stride_h", "o_stride_b", "o_stride_h",
              "dtype_code", "variant_code")
    assert [calls[1][n] for n in consts] == [
        4, 32, 8, 64, 16, 32 * 64, 64, 2 * 16 * 8 * 64, 16 * 8 * 64, 8 * 64, 64, 32 * 64, 64, 0, 0]
    assert calls[1]["sm_scale"] == pytest.approx(1 / 8) and calls[1]["params"] is None
    assert len(flashgen._op._PLANS["batch_decode"]) == 1


def test_threads_sharing_a_plan_never_share_its_struct(fake_torch: Any) -> None:
    """Two threads calling with one plan (same shapes, different tensors): every launch sees the
    pointers and parameters of its own call, each thread through a struct of its own."""
    import threading

    T, bf16 = fake_torch.Tensor, fake_torch.bfloat16
    calls = fake_torch.calls
    flashgen.single_decode(T((32, 128), bf16), T((100, 8, 128), bf16), T((100, 8, 128), bf16),
                           variant="soft_cap", logits_soft_cap=1.0)  # the plan, from the main thread
    expected: dict[int, tuple[int, int, int, float]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def worker(w: int) -> None:
        try:
            start.wait()
            for i in range(200):
                q, k, v = T((32, 128), bf16), T((100, 8, 128), bf16), T((100, 8, 128), bf16)
                cap = float(w * 1000 + i)
                expected[q.data_ptr()] = (k.data_ptr(), v.data_ptr(), threading.get_ident(), cap)
                flashgen.single_decode(q, k, v, variant="soft_cap", logits_soft_cap=cap)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(flashgen._op._PLANS["single_decode"]) == 1, "both threads used the one plan"
    launched = calls[1:]
    assert len(launched) == 400
    addrs: dict[int, set[int]] = {}
    for rec in launched:
        k_ptr, v_ptr, ident, cap = expected[rec["q"]]
        assert (rec["k"], rec["v"], rec["params"]) == (k_ptr, v_ptr, cap), "a launch saw another call's fields"
        addrs.setdefault(ident, set()).add(rec["addr"])
    assert all(len(a) == 1 for a in addrs.values()) and len(set.union(*addrs.values())) == 2, addrs


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler (cc)")
def test_args_structs_mirror_the_generated_c(flashgen_bin: Path, tmp_path: Path) -> None:
    """The ctypes mirror of each module's arguments struct (built from the declaration describe
    ships) has the size, alignment and field offsets of the C struct the binary generates from the
    same declaration, as the host C compiler lays it out (nvcc's host compiler: same ABI)."""
    from conftest import REPO

    from flashgen import _install, _kernels

    modules = [m for m, spec in _install.matrix_json()["modules"].items() if spec.get("args")]
    assert {"single_decode", "batch_decode"} <= set(modules)
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    body = ["int main(void) {"]
    expected = []
    for module in modules:
        inst = _install.module_instances(module)[0]
        where = [a for k, v in inst["params"].items() for a in ("--where", f"{k}={v}")]
        subprocess.run([str(flashgen_bin), "--config", str(REPO / "variants.json"), "generate", "--out",
                        str(tmp_path / "gen"), "--module", module, *where], check=True, capture_output=True)
        lines.append(f'#include "{tmp_path / "gen" / inst["uri"] / "flashgen_args.h"}"')
        st = _kernels.args_struct(module)
        c_name = st.__name__
        body.append(f'  printf("{c_name} %zu %zu\\n", sizeof({c_name}), _Alignof({c_name}));')
        expected.append(f"{c_name} {ctypes.sizeof(st)} {ctypes.alignment(st)}")
        for name, ctype in st._fields_:
            body.append(f'  printf("{c_name}.{name} %zu %zu\\n", offsetof({c_name}, {name}), '
                        f"sizeof((({c_name}*)0)->{name}));")
            expected.append(f"{c_name}.{name} {getattr(st, name).offset} {ctypes.sizeof(ctype)}")
        # Every field of the C struct is mirrored, by name, in order.
        text = (tmp_path / "gen" / inst["uri"] / "flashgen_args.h").read_text()
        import re

        declared = re.findall(r"^\s+[\w\s]+?\**\s*\b(\w+);", text, re.M)
        assert declared == [n for n, _ in st._fields_], module
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines + body + ["  return 0;", "}"]) + "\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")[:-1]
    assert got == expected
