"""The prefill functions on a machine without a GPU: every bad input is a clear Python exception
before any launch (fake matrix, fake CUDA tensors), and a plan launches exactly what the checked
path fills into the arguments struct (fake torch), as the decode functions are tested."""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import pytest

import flashgen
from conftest import REPO, FakeCudaTensor
from flashgen._errors import NoGPUError
from test_loader import _bd, fake_torch, needs_no_driver  # noqa: F401 (fake_torch is a fixture)

I32 = "i32"


def _sp(**kw: Any) -> Any:
    q = kw.pop("q", FakeCudaTensor((100, 32, 128)))
    k = kw.pop("k", FakeCudaTensor((300, 8, 128)))
    v = kw.pop("v", FakeCudaTensor((300, 8, 128)))
    return flashgen.single_prefill(q, k, v, **kw)


def _bp(**kw: Any) -> Any:
    q = kw.pop("q", FakeCudaTensor((100, 32, 128)))
    qo = kw.pop("qo_indptr", FakeCudaTensor((5,), I32))
    k = kw.pop("k", FakeCudaTensor((300, 8, 128)))
    v = kw.pop("v", FakeCudaTensor((300, 8, 128)))
    kv = kw.pop("kv_indptr", FakeCudaTensor((5,), I32))
    return flashgen.batch_prefill(q, qo, k, v, kv, **kw)


def _pp(page_size: int = 16, **kw: Any) -> Any:
    q = kw.pop("q", FakeCudaTensor((100, 32, 128)))
    qo = kw.pop("qo_indptr", FakeCudaTensor((5,), I32))
    cache = kw.pop("cache", FakeCudaTensor((40, 2, page_size, 8, 128)))
    kv = kw.pop("kv_indptr", FakeCudaTensor((5,), I32))
    ix = kw.pop("kv_indices", FakeCudaTensor((30,), I32))
    last = kw.pop("kv_last_page_len", FakeCudaTensor((4,), I32))
    return flashgen.batch_prefill_paged(q, qo, cache, kv, ix, last, **kw)


@needs_no_driver
def test_valid_calls_without_a_driver_are_a_clear_error(fake_matrix: Any) -> None:
    for call in (lambda: _sp(causal=True), lambda: _bp(pos_encoding="rope_llama"), lambda: _pp(causal=True)):
        with pytest.raises(NoGPUError, match="no CUDA driver"):
            call()


_E5M2_KV = FakeCudaTensor((300, 8, 128), "fp8_e5m2")


@needs_no_driver
@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_single_prefill_passes_validation(fake_matrix: Any, kv_dtype: str) -> None:
    # Every check passes (k's kv_dtype finds an instance); only the missing driver stops it.
    k, v = (FakeCudaTensor((300, 8, 128), kv_dtype) for _ in range(2))
    with pytest.raises(NoGPUError, match="no CUDA driver"):
        _sp(k=k, v=v, causal=True, k_scale=0.5, v_scale=3)


@pytest.mark.parametrize("kw, exc, match", [
    ({"q": FakeCudaTensor((32, 128))}, ValueError, r"q must be 3-D \[total_q, num_qo_heads, head_dim\]"),
    ({"k": FakeCudaTensor((300, 8, 64))}, ValueError, "k has head_dim 64 but q has 128"),
    ({"v": FakeCudaTensor((299, 8, 128))}, ValueError, "v has kv_len 299 but k has 300"),
    ({"q": FakeCudaTensor((100, 30, 128))}, ValueError, r"num_qo_heads \(30\) must be a multiple of num_kv_heads \(8\)"),
    ({"q": FakeCudaTensor((100, 32, 128), "f32")}, TypeError, "q must be float16 or bfloat16"),
    ({"causal": 1}, TypeError, "causal must be True or False"),
    ({"pos_encoding": "rope"}, ValueError, "pos_encoding=rope is not in the variant matrix; pos_encoding takes none, rope_llama"),
    ({"rope_theta": -1.0}, ValueError, "rope_theta and rope_scale must be positive"),
    ({"rope_scale": "x"}, TypeError, "rope_theta and rope_scale must be numbers"),
    ({"kv_layout": "HND"}, ValueError, r"must be a multiple of num_kv_heads \(300\)"),
    ({"out": FakeCudaTensor((100, 32, 64))}, ValueError, r"out must have shape \[100, 32, 128\]"),
    ({"variant": "soft_cap"}, TypeError, "variant 'soft_cap' missing parameter 'logits_soft_cap'"),
    ({"q": FakeCudaTensor((100, 32, 96)), "k": FakeCudaTensor((9, 8, 96)), "v": FakeCudaTensor((9, 8, 96))},
     ValueError, "head_dim=96 is not in the variant matrix; head_dim takes 64, 128"),
    # fp8 k and v: one fp8 type for both, scales for fp8 only, no in-kernel RoPE.
    ({"k": FakeCudaTensor((300, 8, 128), "fp8_e4m3")}, TypeError, "k and v must share one dtype"),
    ({"k_scale": 2.0}, ValueError, "k_scale and v_scale apply to an fp8 KV cache"),
    ({"k": _E5M2_KV, "v": _E5M2_KV, "pos_encoding": "rope_llama"}, ValueError, "kv_dtype='fp8_e5m2' is not supported"),
])
def test_single_prefill_validation(fake_matrix: Any, kw: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _sp(**kw)


@pytest.mark.parametrize("kw, exc, match", [
    ({"qo_indptr": FakeCudaTensor((5,), "i64")}, TypeError, "qo_indptr must be an int32 tensor, got i64"),
    ({"kv_indptr": FakeCudaTensor((4,), I32)}, ValueError, r"kv_indptr must have batch \+ 1 = 5 entries, got 4"),
    ({"qo_indptr": FakeCudaTensor((1,), I32), "kv_indptr": FakeCudaTensor((1,), I32)}, ValueError,
     "batch must be at least 1"),
    ({"q_rope_offset": FakeCudaTensor((3,), I32)}, ValueError, "q_rope_offset has batch 3 but qo_indptr has 4"),
    ({"kv_rope_offset": FakeCudaTensor((4,), "f32")}, TypeError, "kv_rope_offset must be an int32 tensor"),
    ({"qo_indptr": FakeCudaTensor((5, 1), I32)}, ValueError, "qo_indptr must be 1-D"),
    ({"k": FakeCudaTensor((300, 8, 128), device=1), "v": FakeCudaTensor((300, 8, 128), device=1)}, ValueError,
     "k is on cuda:1 but q is on cuda:0"),
])
def test_batch_prefill_validation(fake_matrix: Any, kw: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _bp(**kw)


@pytest.mark.parametrize("kw, exc, match", [
    ({"page_size": 8}, ValueError, "page_size=8 is not in the variant matrix; page_size takes 1, 16"),
    ({"cache": FakeCudaTensor((40, 3, 16, 8, 128))}, ValueError, "paged_kv_cache's dimension 1 must be 2"),
    ({"kv_last_page_len": FakeCudaTensor((5,), I32)}, ValueError, "kv_last_page_len has batch 5 but qo_indptr has 4"),
    ({"kv_indices": FakeCudaTensor((30,), "i64")}, TypeError, "kv_indices must be an int32 tensor"),
])
def test_batch_prefill_paged_validation(fake_matrix: Any, kw: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _pp(**kw)


def test_prefill_plans_fill_the_struct_as_declared(fake_torch: Any) -> None:
    T, bf16, i32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.int32
    calls = fake_torch.calls
    q, k, v = T((100, 32, 128), bf16), T((8, 300, 128), bf16), T((8, 300, 128), bf16)
    for _ in range(2):
        flashgen.single_prefill(q, k, v, kv_layout="HND", causal=True, pos_encoding="rope_llama", rope_theta=5e5)
    first, second = calls
    consts = ("qo_len", "kv_len", "num_qo_heads", "num_kv_heads", "head_dim", "q_stride_n", "q_stride_h",
              "k_stride_n", "k_stride_h", "v_stride_n", "v_stride_h", "o_stride_n", "o_stride_h", "dtype_code",
              "mask_code", "pos_encoding_code", "variant_code", "rope_theta", "rope_scale", "sm_scale")
    want = [100, 300, 32, 8, 128, 32 * 128, 128, 128, 300 * 128, 128, 300 * 128, 32 * 128, 128, 1, 1, 1, 0,
            5e5, 1.0, pytest.approx(1 / math.sqrt(128))]
    assert [first[n] for n in consts] == [second[n] for n in consts] == want
    assert (first["q"], first["k"], first["v"]) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    assert len(flashgen._op._PLANS["single_prefill"]) == 1
    # A batch with its optional offsets absent: NULL pointers in the struct.
    qo, kv = T((5,), i32), T((5,), i32)
    flashgen.batch_prefill(q, qo, T((300, 8, 128), bf16), T((300, 8, 128), bf16), kv, causal=False)
    rec = calls[-1]
    assert (rec["qo_indptr"], rec["kv_indptr"], rec["q_rope_offset"], rec["kv_rope_offset"]) == (
        qo.data_ptr(), kv.data_ptr(), None, None)
    assert (rec["batch_size"], rec["total_q"], rec["total_kv"], rec["mask_code"]) == (4, 100, 300, 0)
    off = T((4,), i32)
    flashgen.batch_prefill(q, qo, T((300, 8, 128), bf16), T((300, 8, 128), bf16), kv, q_rope_offset=off)
    assert calls[-1]["q_rope_offset"] == off.data_ptr() and calls[-1]["kv_rope_offset"] is None


FP8 = "fp8_e5m2"


@pytest.mark.parametrize("what, module, call", [
    ("batch_decode", "batch_decode",
     lambda fm: _bd(fm, cache=FakeCudaTensor((10, 2, 16, 8, 128), FP8), pos_encoding="rope_llama")),
    ("single_prefill", "single_prefill",
     lambda fm: _sp(k=FakeCudaTensor((300, 8, 128), FP8), v=FakeCudaTensor((300, 8, 128), FP8),
                    pos_encoding="rope_llama")),
    ("batch_prefill", "batch_prefill_ragged",
     lambda fm: _bp(k=FakeCudaTensor((300, 8, 128), FP8), v=FakeCudaTensor((300, 8, 128), FP8),
                    pos_encoding="rope_llama")),
    ("batch_prefill_paged", "batch_prefill_paged",
     lambda fm: _pp(cache=FakeCudaTensor((40, 2, 16, 8, 128), FP8), pos_encoding="rope_llama")),
])
def test_an_unsupported_combination_is_refused_with_its_declared_reason_before_any_compile(
        fake_matrix: Any, monkeypatch: pytest.MonkeyPatch, what: str, module: str,
        call: Callable[[Any], Any]) -> None:
    """rope_llama with an fp8 cache is declared in variants.json (modules.<m>.unsupported): no
    instance holds it, and the call is refused with the declaration's reason before the driver or
    the loader (which would compile) is reached."""
    from flashgen import _cuda, _loader

    reason = json.loads((REPO / "variants.json").read_text())["modules"][module]["unsupported"][0]["reason"]
    reached: list[str] = []
    monkeypatch.setattr(_loader, "load", lambda *a, **kw: reached.append("load"))
    monkeypatch.setattr(_cuda, "driver", lambda: reached.append("driver"))
    with pytest.raises(ValueError) as refused:
        call(fake_matrix)
    assert str(refused.value) == (f"{what}: pos_encoding='rope_llama' with kv_dtype='{FP8}' is not supported: "
                                  f"{reason}")
    assert reached == []
