"""The merge functions on a machine without a GPU: every bad argument is a clear Python
exception naming it before any launch (fake matrix, fake CUDA tensors), and a call launches
exactly what its checks filled into the merge_state module's arguments struct (fake torch)."""

from __future__ import annotations

from typing import Any

import pytest

import flashgen
from conftest import FakeCudaTensor
from flashgen._errors import NoGPUError
from test_loader import fake_torch, needs_no_driver  # noqa: F401 (fake_torch is a fixture)

F32 = "f32"


def _ms(**kw: Any) -> Any:
    v_a = kw.pop("v_a", FakeCudaTensor((100, 32, 128)))
    s_a = kw.pop("s_a", FakeCudaTensor((100, 32), F32))
    v_b = kw.pop("v_b", FakeCudaTensor((100, 32, 128)))
    s_b = kw.pop("s_b", FakeCudaTensor((100, 32), F32))
    return flashgen.merge_state(v_a, s_a, v_b, s_b)


def _inplace(**kw: Any) -> Any:
    v = kw.pop("v", FakeCudaTensor((100, 32, 128)))
    s = kw.pop("s", FakeCudaTensor((100, 32), F32))
    v_other = kw.pop("v_other", FakeCudaTensor((100, 32, 128)))
    s_other = kw.pop("s_other", FakeCudaTensor((100, 32), F32))
    return flashgen.merge_state_in_place(v, s, v_other, s_other, **kw)


def _stack(**kw: Any) -> Any:
    v = kw.pop("v", FakeCudaTensor((100, 3, 32, 128)))
    s = kw.pop("s", FakeCudaTensor((100, 3, 32), F32))
    return flashgen.merge_states(v, s)


@needs_no_driver
def test_valid_calls_without_a_driver_are_a_clear_error(fake_matrix: Any) -> None:
    mask = FakeCudaTensor((100,), "bool")
    for call in (_ms, lambda: _inplace(mask=mask), _stack):
        with pytest.raises(NoGPUError, match="no CUDA driver"):
            call()


@pytest.mark.parametrize("kw, exc, match", [
    ({"v_a": FakeCudaTensor((100, 4096))}, ValueError, r"merge_state: v_a must be 3-D \[n, num_heads, head_dim\]"),
    ({"v_b": FakeCudaTensor((100, 32, 64))}, ValueError,
     r"merge_state: v_b has shape \[100, 32, 64\] but v_a has \[100, 32, 128\]"),
    ({"v_b": FakeCudaTensor((99, 32, 128)), "s_b": FakeCudaTensor((99, 32), F32)}, ValueError,
     r"v_b has shape \[99, 32, 128\] but v_a has"),
    ({"v_a": FakeCudaTensor((100, 32, 128), "f32")}, TypeError, "merge_state: v_a must be float16 or bfloat16"),
    ({"v_b": FakeCudaTensor((100, 32, 128), "f16")}, TypeError, "v_b is f16 but v_a is bf16"),
    ({"s_a": FakeCudaTensor((100, 32))}, TypeError, r"s_a \(the LSE of v_a\) must be float32, got bf16"),
    ({"s_b": FakeCudaTensor((100, 31), F32)}, ValueError,
     r"s_b must have shape \[n, num_heads\] = \[100, 32\] \(v_b's without head_dim\), got \[100, 31\]"),
    ({"s_a": FakeCudaTensor((100, 32, 1), F32)}, ValueError, "s_a must have shape"),
    ({"v_a": FakeCudaTensor((100, 32, 128), strides=(128, 100 * 128, 1))}, ValueError,
     r"v_a must be contiguous, got shape \[100, 32, 128\] with strides \[128, 12800, 1\]"),
    ({"s_b": FakeCudaTensor((100, 32), F32, strides=(1, 100))}, ValueError, "s_b must be contiguous"),
    ({"v_a": FakeCudaTensor((100, 32, 100)), "v_b": FakeCudaTensor((100, 32, 100))}, ValueError,
     "v_a's head_dim must be a multiple of 8 from 8 to 4096"),
    ({"v_a": FakeCudaTensor((1, 2, 8192)), "v_b": FakeCudaTensor((1, 2, 8192)),
      "s_a": FakeCudaTensor((1, 2), F32), "s_b": FakeCudaTensor((1, 2), F32)}, ValueError, "head_dim must be"),
    ({"v_b": FakeCudaTensor((100, 32, 128), device=1)}, ValueError, "v_b is on cuda:1 but v_a is on cuda:0"),
    ({"s_a": FakeCudaTensor((100, 32), F32, device_type=1)}, ValueError, "s_a is on cpu"),
    ({"v_a": None}, TypeError, "merge_state: v_a is required"),
    ({"s_b": [1.0]}, TypeError, "merge_state: s_b must be a tensor"),
    ({"v_a": FakeCudaTensor((100, 0, 128)), "v_b": FakeCudaTensor((100, 0, 128)),
      "s_a": FakeCudaTensor((100, 0), F32), "s_b": FakeCudaTensor((100, 0), F32)}, ValueError,
     "num_heads must be 1 to 65536"),
])
def test_merge_state_validation(fake_matrix: Any, kw: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _ms(**kw)


@pytest.mark.parametrize("kw, exc, match", [
    ({"mask": FakeCudaTensor((100,), "i32")}, TypeError, "merge_state_in_place: mask must be a bool or uint8 tensor"),
    ({"mask": FakeCudaTensor((99,), "u8")}, ValueError, r"mask must have shape \[n\] = \[100\], got \[99\]"),
    ({"mask": FakeCudaTensor((100, 1), "bool")}, ValueError, r"mask must have shape \[n\]"),
    ({"mask": FakeCudaTensor((100,), "bool", strides=(2,))}, ValueError, "mask must be contiguous"),
    ({"mask": FakeCudaTensor((100,), "bool", device=1)}, ValueError, "mask is on cuda:1 but v is on cuda:0"),
    ({"v_other": FakeCudaTensor((100, 8, 128)), "s_other": FakeCudaTensor((100, 8), F32)}, ValueError,
     r"v_other has shape \[100, 8, 128\] but v has \[100, 32, 128\]"),
    ({"s": FakeCudaTensor((100, 32))}, TypeError, r"s \(the LSE of v\) must be float32"),
])
def test_merge_state_in_place_validation(fake_matrix: Any, kw: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _inplace(**kw)


@pytest.mark.parametrize("kw, exc, match", [
    ({"v": FakeCudaTensor((100, 32, 128))}, ValueError,
     r"merge_states: v must be 4-D \[n, num_states, num_heads, head_dim\]"),
    ({"s": FakeCudaTensor((100, 32), F32)}, ValueError,
     r"s must have shape \[n, num_states, num_heads\] = \[100, 3, 32\]"),
    ({"v": FakeCudaTensor((100, 0, 32, 128)), "s": FakeCudaTensor((100, 0, 32), F32)}, ValueError,
     r"v must hold 1 to 65536 states per row \(its dimension 1\), got 0"),
])
def test_merge_states_validation(fake_matrix: Any, kw: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        _stack(**kw)


def test_the_merge_module_has_no_variant_and_no_backend(fake_matrix: Any) -> None:
    """A module without those axes is found by its dtype alone."""
    from flashgen import _matrix

    mod = _matrix.matrix().module("merge_state")
    assert mod.variant_axis is None and mod.backend_axis is None
    assert [r["params"] for r in flashgen.list_variants("merge_state")] == [{"dtype": "f16"}, {"dtype": "bf16"}]


def test_calls_fill_the_struct_as_declared(fake_torch: Any) -> None:
    T, bf16, f16, f32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.float16, fake_torch.float32
    calls = fake_torch.calls
    v_a, s_a, v_b, s_b = T((100, 32, 128), bf16), T((100, 32), f32), T((100, 32, 128), bf16), T((100, 32), f32)
    results = [flashgen.merge_state(v_a, s_a, v_b, s_b) for _ in range(2)]
    assert len(flashgen._merge._PLANS) == 1, "the second call took the first call's plan"
    shape = ("num_tokens", "num_states_a", "num_heads", "head_dim", "dtype_code")
    for (v, s), rec in zip(results, calls):
        assert v.shape == (100, 32, 128) and v.dtype == bf16 and s.shape == (100, 32) and s.dtype == f32
        assert [rec[n] for n in shape] == [100, 1, 32, 128, 1]
        assert (rec["v_a"], rec["s_a"], rec["v_b"], rec["s_b"]) == tuple(
            t.data_ptr() for t in (v_a, s_a, v_b, s_b))
        assert (rec["v_out"], rec["s_out"], rec["mask"], rec["stream"]) == (v.data_ptr(), s.data_ptr(), None, 0xABC)
    assert results[0][0].data_ptr() != results[1][0].data_ptr(), "each call allocates its outputs"

    # In place, with and without a mask: the outputs are v and s.
    v, s = T((7, 4, 64), f16), T((7, 4), f32)
    mask = T((7,), fake_torch.bool)
    for m in (mask, None, mask):
        v_b = T((7, 4, 64), f16)
        assert flashgen.merge_state_in_place(v, s, v_b, T((7, 4), f32), mask=m) is None
        rec = calls[-1]
        assert (rec["v_out"], rec["s_out"], rec["v_a"], rec["s_a"]) == (v.data_ptr(), s.data_ptr()) * 2
        assert rec["v_b"] == v_b.data_ptr() and rec["mask"] == (m.data_ptr() if m is not None else None)
        assert [rec[n] for n in shape] == [7, 1, 4, 64, 0]

    # Stacked states: no second state.
    vs, ss = T((5, 3, 8, 256), bf16), T((5, 3, 8), f32)
    o, lse = flashgen.merge_states(vs, ss)
    rec = calls[-1]
    assert o.shape == (5, 8, 256) and lse.shape == (5, 8)
    assert [rec[n] for n in shape] == [5, 3, 8, 256, 1]
    assert (rec["v_a"], rec["s_a"], rec["v_b"], rec["s_b"]) == (vs.data_ptr(), ss.data_ptr(), None, None)


def test_a_misaligned_tensor_is_refused_on_the_planned_path_too(fake_torch: Any) -> None:
    T, bf16, f32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.float32
    s = T((10, 2), f32)
    flashgen.merge_state(T((10, 2, 64), bf16), s, T((10, 2, 64), bf16), s)
    odd = T((10, 2, 64), bf16)
    odd._ptr += 8  # a view that starts inside a row
    with pytest.raises(ValueError, match="merge_state: v_b's data must be 16-byte aligned, got address"):
        flashgen.merge_state(T((10, 2, 64), bf16), s, odd, s)
    assert len(fake_torch.calls) == 1
