"""The loader on a machine without a GPU: arch rules, the cache's lock and verification, variant
parameters, tensor reading and argument validation (in-process), then the real thing against an
installed wheel and the pinned PyPI nvcc (fresh interpreters): AOT hit, JIT miss, cache hit,
corrupted entry, FLASHGEN_DISABLE_JIT, eight racing processes, a compile killed mid-way, a
custom variant, and AOT/JIT byte parity.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import flashgen
from flashgen import _arch, _cache, _common, _tensor, _variant
from flashgen._errors import NoGPUError

from conftest import FakeCudaTensor, RunPy

# ---- arch rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["8.0 9.0a", "80;90a", "sm_80,sm_90a", ["9.0a", "8.0"], " 8.0  9.0a "])
def test_arch_spellings_agree(text: Any) -> None:
    assert _arch.arch_key(_arch.parse_arch_list(text)) == "sm_80-sm_90a"


def test_arch_ptx_suffix() -> None:
    names = [a.name for a in _arch.parse_arch_list("8.6 9.0+PTX")]
    assert names == ["sm_86", "sm_90", "compute_90"]
    assert [a.name for a in _arch.parse_arch_list("100a 12.0")] == ["sm_100a", "sm_120"]


@pytest.mark.parametrize("bad", ["", "9", "sm_9x", "nine"])
def test_arch_bad_spelling(bad: str) -> None:
    with pytest.raises(ValueError, match="arch"):
        _arch.parse_arch_list(bad)


@pytest.mark.parametrize("arch, cc, ok", [
    ("sm_80", (8, 0), True), ("sm_80", (8, 6), True), ("sm_80", (9, 0), False),
    ("sm_86", (8, 0), False), ("sm_90a", (9, 0), True), ("sm_90a", (10, 0), False),
    ("compute_80", (9, 0), True), ("compute_90", (8, 9), False), ("sm_100a", (10, 0), True),
    ("sm_100f", (10, 3), True), ("compute_90a", (10, 0), False),
])
def test_arch_runs_on(arch: str, cc: tuple[int, int], ok: bool) -> None:
    (a,) = _arch.parse_arch_list(arch)
    assert _arch.runs_on(a, cc) is ok


def test_jit_arch_for_device() -> None:
    assert _arch.jit_arch_for((9, 0)) == "9.0a"
    assert _arch.jit_arch_for((8, 6)) == "8.6"
    assert _arch.jit_arch_for((10, 0)) == "10.0"


def test_arch_env_overrides_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashgen import _loader

    monkeypatch.setenv("FLASHGEN_CUDA_ARCH_LIST", "90a;80")
    archs, arg = _loader.target_archs()
    assert arg == "90a;80" and _arch.arch_key(archs) == "sm_80-sm_90a"
    monkeypatch.setenv("FLASHGEN_CUDA_ARCH_LIST", "9.x")
    with pytest.raises(ValueError, match="FLASHGEN_CUDA_ARCH_LIST"):
        _loader.target_archs()


# ---- cache entries: lock, install, verification --------------------------------------------------


def _entry(tmp_path: Path, key: str = "single_decode_dtype_bf16_head_dim_128_variant_default") -> _cache.Entry:
    return _cache.Entry(tmp_path / "0.1.0" / "sm_90a", key)


def _flock_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_lock_is_released_when_its_holder_is_killed(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from flashgen import _cache; from pathlib import Path\n"
        "e = _cache.Entry(Path(sys.argv[2]), sys.argv[3])\n"
        "with e.lock():\n    print('locked', flush=True); time.sleep(600)\n"
    )
    src = str(Path(flashgen.__file__).parents[1])
    child = subprocess.Popen([sys.executable, "-c", code, src, str(entry.dir), entry.key],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        assert not _flock_free(entry.lock_path), "the child should hold the lock"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        t0 = time.monotonic()
        with entry.lock():
            assert time.monotonic() - t0 < 1.0
        assert entry.lock_path.exists(), "lock files are never deleted (deleting them races)"
    finally:
        if child.poll() is None:
            child.kill()


def test_lock_excludes_within_one_process(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    with entry.lock():
        assert not _flock_free(entry.lock_path)
    assert _flock_free(entry.lock_path)


def _fake_build(tmp_path: Path, data: bytes = b"\x7fELF fake kernel module" * 100) -> tuple[Path, str]:
    built = tmp_path / "out" / "x.so"
    built.parent.mkdir(parents=True, exist_ok=True)
    built.write_bytes(data)
    return built, hashlib.sha256(data).hexdigest()


def test_install_then_verify_then_reject_tampering(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    built, sha = _fake_build(tmp_path)
    meta = {"instance": {"uri": entry.key, "module": "single_decode", "params": {}, "codes": {}}, "toolchain": {}}
    assert entry.read_valid() is None
    entry.install(built, sha, meta)
    got = entry.read_valid()
    assert got is not None and got["sha256"] == sha
    assert not list(entry.dir.glob(".*.part")), "no partial files after an install"
    # A flipped byte: never loaded.
    data = bytearray(entry.so_path.read_bytes())
    data[5] ^= 0xFF
    entry.so_path.write_bytes(bytes(data))
    assert entry.read_valid() is None
    # A truncated sidecar (a crash mid-write would never leave one, but a disk might).
    entry.install(built, sha, meta)
    entry.meta_path.write_text(entry.meta_path.read_text()[:20])
    assert entry.read_valid() is None
    # The .so alone, without its sidecar, is a miss.
    entry.meta_path.unlink()
    assert entry.read_valid() is None


def test_install_refuses_bytes_that_do_not_match_the_build(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    built, _ = _fake_build(tmp_path)
    with pytest.raises(OSError, match="flashgen clean"):
        entry.install(built, "0" * 64, {"instance": {}})
    assert not entry.so_path.exists() and not list(entry.dir.glob(".*.part"))


def test_changed_toolchain_invalidates(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text("#!/bin/sh\n")
    built, sha = _fake_build(tmp_path)
    entry.install(built, sha, {"instance": {}, "toolchain": {"nvcc": str(fake_nvcc), "nvcc_version": "13.0.88"}})
    assert entry.read_valid() is not None
    fake_nvcc.write_text("#!/bin/sh\n# a newer nvcc\n")
    assert entry.read_valid() is None


def test_stale_build_folders_are_cleared_under_the_lock(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    dead = entry.make_tmp()
    (dead / "half.so").write_bytes(b"partial")
    other = _cache.Entry(entry.dir, "another_entry").make_tmp()
    (entry.dir / f".{entry.key}.999999.so.part").write_bytes(b"partial")
    with entry.lock():
        entry.clear_stale_tmp()
    assert not dead.exists() and other.exists()
    assert not list(entry.dir.glob(".*.part"))


# ---- variants and their parameters ---------------------------------------------------------------

FLASH_SIGMOID = Path(__file__).with_name("flash_sigmoid.cuh")


def test_variant_finds_its_struct() -> None:
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
])
def test_variant_rejects(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        flashgen.Variant(**kwargs)


def test_param_struct_layout_is_natural_c_alignment() -> None:
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
    with pytest.raises(NoGPUError, match="FLASHGEN_CUDA_ARCH_LIST"):
        _bd(fake_matrix, kv_layout="HND", cache=FakeCudaTensor((10, 2, 8, 16, 128)))


@pytest.mark.parametrize("kw, exc, match", [
    ({"kv_layout": "NDH"}, ValueError, "kv_layout must be one of NHD, HND, got 'NDH'"),
    ({"q": FakeCudaTensor((32, 128), "f32")}, TypeError, "q must be float16 or bfloat16, got f32"),
    ({"k": FakeCudaTensor((100, 8, 128), "f16")}, TypeError, "k is f16 but q is bf16"),
    ({"q": FakeCudaTensor((32, 96)), "k": FakeCudaTensor((9, 8, 96)), "v": FakeCudaTensor((9, 8, 96))},
     ValueError, "head_dim=96 is not in the variant matrix; head_dim takes 64, 128"),
    ({"k": FakeCudaTensor((100, 8, 64))}, ValueError, "k and v must have the same shape"),
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
     "no instance of batch_decode has dtype=bf16, head_dim=256, page_size=1, variant=default; instances exist for "
     r"head_dim=64\|128 \(with dtype=bf16, page_size=1, variant=default\); or page_size=16"),
    ({"indptr": FakeCudaTensor((5,), "i64")}, TypeError, "kv_indptr must be an int32 tensor, got i64"),
    ({"indptr": FakeCudaTensor((4,), "i32")}, ValueError, r"kv_indptr must have batch \+ 1 = 5 entries, got 4"),
    ({"last": FakeCudaTensor((5,), "i32")}, ValueError, "kv_last_page_len must have batch = 4 entries"),
    ({"cache": FakeCudaTensor((10, 3, 16, 8, 128))}, ValueError, "second dimension must be 2"),
    ({"cache": FakeCudaTensor((10, 2, 16, 8, 64))}, ValueError, "q has head_dim 128 but paged_kv_cache has 64"),
    ({"kv_layout": "HND", "cache": FakeCudaTensor((10, 2, 12, 16, 128))}, ValueError, "num_qo_heads \\(32\\) must be a multiple of num_kv_heads \\(12\\)"),
    ({"variant": "alibi", "alibi_slopes": FakeCudaTensor((32,), "f16")}, TypeError, "alibi_slopes must be a f32 tensor, got f16"),
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


def test_list_variants_and_is_precompiled(fake_matrix: Any) -> None:
    everything = flashgen.list_variants()
    assert len(everything) == len(fake_matrix["instances"])
    sd = flashgen.list_variants("single_decode", head_dim=128, variant="soft*")
    assert [r["params"] for r in sd] == [
        {"dtype": "f16", "head_dim": 128, "variant": "soft_cap"},
        {"dtype": "bf16", "head_dim": 128, "variant": "soft_cap"},
    ]
    assert all(set(r) == {"uri", "module", "params", "codes", "aot", "precompiled"} for r in sd)
    assert flashgen.list_variants(head_dim="*6*", page_size=1) and all(
        r["module"] == "batch_decode" for r in flashgen.list_variants(head_dim="*6*", page_size=1))
    with pytest.raises(ValueError, match="unknown axis 'heads'; axes: dtype, head_dim, page_size, variant"):
        flashgen.list_variants(heads=3)
    assert flashgen.is_precompiled("single_decode", dtype="bf16", head_dim=128, variant="default") is False
    with pytest.raises(ValueError, match="no value given for axis variant"):
        flashgen.is_precompiled("single_decode", dtype="bf16", head_dim=128)
    with pytest.raises(ValueError, match="unknown module 'prefill'"):
        flashgen.is_precompiled("prefill", dtype="bf16")


def test_import_is_stdlib_only() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import flashgen; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'cupy'));"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, str(Path(flashgen.__file__).parents[1])], check=True)
