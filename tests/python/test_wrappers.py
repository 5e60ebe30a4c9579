"""The engine-facing wrappers on a machine without a GPU (fake torch, fake kernels): plan() checks
its arguments and loads the instance, run() launches exactly what the functional call launches
but over the caller's workspace and the planned page table, with a plan cache of its own; CUDA
graph mode copies plan()'s tables into the fixed buffers run() reads."""

from __future__ import annotations

from typing import Any

import pytest

import flashgen
from flashgen import _common, _op
from test_loader import fake_torch  # noqa: F401 (a fixture)

WS_BYTES = 1 << 21


def _decode(fake_torch: Any, **kw: Any) -> tuple[Any, ...]:
    T, i32 = fake_torch.Tensor, fake_torch.int32
    ws = T((WS_BYTES,), fake_torch.uint8)
    w = flashgen.BatchDecodeWithPagedKVCacheWrapper(ws, **kw)
    return w, ws, T((5,), i32), T((30,), i32), T((4,), i32)


def _per_shape(rec: dict[str, Any]) -> dict[str, Any]:
    """A launch's struct without what changes per call (outputs, workspace, addresses)."""
    return {k: v for k, v in rec.items() if k not in ("o", "lse", "workspace", "workspace_bytes", "addr",
                                                      "additional_params", "stream")}


def test_decode_run_is_the_functional_call_over_the_callers_workspace(fake_torch: Any) -> None:
    T, bf16 = fake_torch.Tensor, fake_torch.bfloat16
    w, ws, indptr, indices, last = _decode(fake_torch)
    w.plan(indptr, indices, last, 32, 8, 128, 16, logits_soft_cap=30.0, q_data_type=bf16)
    q, cache = T((4, 32, 128), bf16), T((40, 2, 16, 8, 128), bf16)
    o1 = w.run(q, cache)
    o2, lse = w.run(q, cache, return_lse=True)
    flashgen.batch_decode(q, cache, indptr, indices, last, variant="soft_cap", logits_soft_cap=30.0)
    first, second, functional = fake_torch.calls[-3:]
    for rec in (first, second):
        assert (rec["workspace"], rec["workspace_bytes"]) == (ws.data_ptr(), WS_BYTES)
        assert (rec["kv_indptr"], rec["kv_indices"], rec["kv_last_page_len"]) == (
            indptr.data_ptr(), indices.data_ptr(), last.data_ptr())
        assert rec["params"] == 30.0
        assert _per_shape(rec) == _per_shape(functional)
    assert first["o"] == o1.data_ptr() and first["lse"] is None
    assert second["o"] == o2.data_ptr() and second["lse"] == lse.data_ptr() and lse.shape == (4, 32)
    assert functional["workspace"] != ws.data_ptr()  # the functional call keeps the shared one
    assert len(w._plans) == 2  # its own plans (with and without the LSE), not the functional call's


def test_run_writes_into_out_and_lse(fake_torch: Any) -> None:
    T, bf16, f32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.float32
    w, _, indptr, indices, last = _decode(fake_torch)
    w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type="bfloat16")
    out, lse = T((4, 32, 128), bf16), T((4, 32), f32)
    got = w.run(T((4, 32, 128), bf16), T((40, 2, 16, 8, 128), bf16), out=out, lse=lse)
    assert got == (out, lse)
    assert (fake_torch.calls[-1]["o"], fake_torch.calls[-1]["lse"]) == (out.data_ptr(), lse.data_ptr())
    with pytest.raises(ValueError, match=r"lse must have shape \[4, 32\]"):
        w.run(T((4, 32, 128), bf16), T((40, 2, 16, 8, 128), bf16), lse=T((4, 8), f32))


@pytest.mark.parametrize("plan_kw, run_shapes, match", [
    ({}, ((4, 32, 64), (40, 2, 16, 8, 64)), r"run: q has head_dim 64 but plan\(\) was given 128"),
    ({}, ((4, 32, 128), (40, 2, 32, 8, 128)), r"run: paged_kv_cache has page_size 32 but plan\(\) was given 16"),
    ({"q_data_type": "float16"}, ((4, 32, 128), (40, 2, 16, 8, 128)),
     r"run: q has dtype bf16 but plan\(\) was given f16"),
])
def test_run_refuses_tensors_unlike_the_plan(fake_torch: Any, plan_kw: dict[str, Any],
                                             run_shapes: tuple[Any, ...], match: str) -> None:
    T, bf16 = fake_torch.Tensor, fake_torch.bfloat16
    w, _, indptr, indices, last = _decode(fake_torch)
    w.plan(indptr, indices, last, 32, 8, 128, 16, **{"q_data_type": bf16, **plan_kw})
    with pytest.raises(ValueError, match=match):
        w.run(T(run_shapes[0], bf16), T(run_shapes[1], bf16))


@pytest.mark.parametrize("plan_kw, exc, match", [
    ({"window_left": 8, "logits_soft_cap": 30.0}, ValueError, "no built-in one does"),
    ({"pos_encoding_mode": "ALIBI"}, ValueError, "pos_encoding_mode must be one of NONE, ROPE_LLAMA"),
    ({"q_data_type": "float32"}, TypeError, "q_data_type must be float16 or bfloat16"),
    ({"kv_data_type": "float16"}, TypeError, r"kv_data_type must be q_data_type"),
    ({"variant": "alibi", "window_left": 8}, TypeError, "window_left"),
    ({"num_qo_heads": 30}, ValueError, r"num_qo_heads \(30\) must be a multiple of num_kv_heads \(8\)"),
    ({"head_dim": 96}, ValueError, "head_dim=96 is not in the variant matrix"),
    ({"head_dim": 0}, ValueError, "head_dim must be a positive int"),
])
def test_plan_errors_name_the_argument(fake_torch: Any, plan_kw: dict[str, Any], exc: type, match: str) -> None:
    w, _, indptr, indices, last = _decode(fake_torch)
    kw = {"num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "page_size": 16, "q_data_type": "bfloat16",
          **plan_kw}
    with pytest.raises(exc, match=match):
        w.plan(indptr, indices, last, **kw)


def test_run_before_plan_and_a_small_workspace_are_errors(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    T, bf16 = fake_torch.Tensor, fake_torch.bfloat16
    w, _, indptr, indices, last = _decode(fake_torch)
    with pytest.raises(RuntimeError, match=r"BatchDecodeWithPagedKVCacheWrapper.run: call plan\(\) first"):
        w.run(T((4, 32, 128), bf16), T((40, 2, 16, 8, 128), bf16))
    monkeypatch.setattr(_common, "workspace_bytes", lambda *a: WS_BYTES + 1)
    with pytest.raises(ValueError, match=f"needs a workspace of {WS_BYTES + 1} bytes but workspace_buffer "
                                         f"holds {WS_BYTES}"):
        w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=bf16)


def test_cuda_graph_mode_fills_the_fixed_buffers(fake_torch: Any) -> None:
    T, bf16, i32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.int32
    copies: list[tuple[int, int, int]] = []

    class Buffer(T):  # type: ignore[misc, valid-type]
        """A fixed buffer: a slice is a view at the same address that records copies into it."""

        def __getitem__(self, s: slice) -> Any:
            view = Buffer((s.stop,), self.dtype)
            view._ptr = self._ptr
            return view

        def copy_(self, src: Any, non_blocking: bool = False) -> None:
            copies.append((self._ptr, src.data_ptr(), self.shape[0]))

    ws = T((WS_BYTES,), fake_torch.uint8)
    with pytest.raises(ValueError, match="use_cuda_graph=True needs the fixed index buffers "
                                         "paged_kv_indices_buffer, paged_kv_last_page_len_buffer"):
        flashgen.BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True,
                                                    paged_kv_indptr_buffer=Buffer((9,), i32))
    bufs = Buffer((9,), i32), Buffer((64,), i32), Buffer((8,), i32)
    w = flashgen.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", True, *bufs)
    indptr, indices, last = T((5,), i32), T((30,), i32), T((4,), i32)
    w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=bf16)
    assert copies == [(bufs[0].data_ptr(), indptr.data_ptr(), 5), (bufs[1].data_ptr(), indices.data_ptr(), 30),
                      (bufs[2].data_ptr(), last.data_ptr(), 4)]
    w.run(T((4, 32, 128), bf16), T((40, 2, 16, 8, 128), bf16))
    rec = fake_torch.calls[-1]
    assert (rec["kv_indptr"], rec["kv_indices"], rec["kv_last_page_len"]) == tuple(b.data_ptr() for b in bufs)
    assert (rec["batch_size"], rec["num_page_ids"]) == (4, 64)  # every plan launches the whole page buffer
    with pytest.raises(ValueError, match="indices has 65 entries but its fixed buffer paged_kv_indices_buffer holds 64"):
        w.plan(indptr, T((65,), i32), last, 32, 8, 128, 16, q_data_type=bf16)


def test_prefill_wrappers_run_the_functional_calls(fake_torch: Any) -> None:
    T, bf16, i32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.int32
    ws = T((WS_BYTES,), fake_torch.uint8)
    qo, kv, q = T((5,), i32), T((5,), i32), T((100, 32, 128), bf16)
    k, v = T((8, 300, 128), bf16), T((8, 300, 128), bf16)
    ragged = flashgen.BatchPrefillWithRaggedKVCacheWrapper(ws, kv_layout="HND")
    ragged.plan(qo, kv, 32, 8, 128, causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5,
                q_data_type=bf16)
    ragged.run(q, k, v)
    flashgen.batch_prefill(q, qo, k, v, kv, kv_layout="HND", causal=True, pos_encoding="rope_llama", rope_theta=5e5)
    wrapped, functional = fake_torch.calls[-2:]
    assert _per_shape(wrapped) == _per_shape(functional)
    assert (wrapped["workspace"], wrapped["mask_code"], wrapped["rope_theta"]) == (ws.data_ptr(), 1, 5e5)

    ix, last, cache = T((30,), i32), T((4,), i32), T((40, 2, 16, 8, 128), bf16)
    paged = flashgen.BatchPrefillWithPagedKVCacheWrapper(ws)
    paged.plan(qo, kv, ix, last, 32, 8, 128, 16, window_left=7, q_data_type=bf16)
    paged.run(q, cache)
    flashgen.batch_prefill_paged(q, qo, cache, kv, ix, last, variant="sliding_window", window_left=7)
    wrapped, functional = fake_torch.calls[-2:]
    assert _per_shape(wrapped) == _per_shape(functional) and wrapped["workspace"] == ws.data_ptr()
    with pytest.raises(ValueError, match=r"head_dim_vo \(64\) must equal head_dim_qk \(128\)"):
        paged.plan(qo, kv, ix, last, 32, 8, 128, 16, head_dim_vo=64, q_data_type=bf16)
    assert len(flashgen.BatchPrefillWithPagedKVCacheWrapper._shared_plans) == 1 and len(paged._plans) == 1


def _batches(fake_torch: Any, ws: Any) -> list[tuple[Any, Any, Any, Any, Any]]:
    """Per batch function: (function, its class, its call's tensors as the function takes them,
    a wrapper planned for them, the data tensors its run() takes)."""
    T, bf16, i32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.int32
    qd, cache, q = T((4, 32, 128), bf16), T((40, 2, 16, 8, 128), bf16), T((100, 32, 128), bf16)
    k = v = T((300, 8, 128), bf16)
    indptr, ix, last, qo = T((5,), i32), T((30,), i32), T((4,), i32), T((5,), i32)
    decode = flashgen.BatchDecodeWithPagedKVCacheWrapper(ws)
    decode.plan(indptr, ix, last, 32, 8, 128, 16, q_data_type=bf16)
    paged = flashgen.BatchPrefillWithPagedKVCacheWrapper(ws)
    paged.plan(qo, indptr, ix, last, 32, 8, 128, 16, q_data_type=bf16)
    ragged = flashgen.BatchPrefillWithRaggedKVCacheWrapper(ws)
    ragged.plan(qo, indptr, 32, 8, 128, q_data_type=bf16)
    return [(flashgen.batch_decode, type(decode), (qd, cache, indptr, ix, last), decode, (qd, cache)),
            (flashgen.batch_prefill_paged, type(paged), (q, qo, cache, indptr, ix, last), paged, (q, cache)),
            (flashgen.batch_prefill, type(ragged), (q, qo, k, v, indptr), ragged, (q, k, v))]


def test_the_batch_functions_are_their_classes_one_shots(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch function runs through its wrapper class: it plans once per shape into the
    class's shared plans (a later call takes the fast path), a bad argument gets the message the
    class's run() gives (each naming its caller), and errors found before any plan name the
    function."""
    planned: list[str] = []
    plan = _op._plan
    monkeypatch.setattr(_op, "_plan", lambda spec, *a: planned.append(spec.name) or plan(spec, *a))
    ws = fake_torch.Tensor((WS_BYTES,), fake_torch.uint8)
    for fn, cls, args, wrapper, data in _batches(fake_torch, ws):
        name = fn.__name__
        assert len(cls._shared_plans) == 0
        planned.clear()
        fn(*args)
        fn(*args)
        assert planned == [name] and len(cls._shared_plans) == 1, f"{name}: one plan, kept by its class"
        assert fake_torch.calls[-1]["workspace"] != ws.data_ptr()  # the stream's shared workspace
        with pytest.raises(TypeError) as functional:
            fn(*args, k_scale="2")
        with pytest.raises(TypeError) as wrapped:
            wrapper.run(*data, k_scale="2")
        assert str(functional.value) == f"{name}: k_scale must be a real number (a Python float), got '2'"
        assert str(wrapped.value) == f"{cls.__name__}.run: k_scale must be a real number (a Python float), got '2'"
        with pytest.raises(ValueError, match=f"^{name}: kv_layout must be one of NHD, HND, got 'NDH'$"):
            fn(*args, kv_layout="NDH")


def test_attention_sink_through_a_wrapper_takes_window_left_minus_one(fake_torch: Any) -> None:
    """A variant with a window_left parameter gets plan()'s window_left, -1 (no window) included;
    its sinks are checked at plan() as in the functional call."""
    T, bf16, f32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.float32
    w, _, indptr, indices, last = _decode(fake_torch)
    sinks = T((32,), f32)
    with pytest.raises(ValueError, match=r"plan: sinks must be 1-D with num_qo_heads = 32 values"):
        w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=bf16, variant="attention_sink", sinks=T((8,), f32))
    w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=bf16, variant="attention_sink", sinks=sinks)
    q, cache = T((4, 32, 128), bf16), T((40, 2, 16, 8, 128), bf16)
    w.run(q, cache)
    flashgen.batch_decode(q, cache, indptr, indices, last, variant="attention_sink", sinks=sinks, window_left=-1)
    wrapped, functional = fake_torch.calls[-2:]
    assert _per_shape(wrapped) == _per_shape(functional)


def test_decode_plans_an_fp8_cache_and_run_takes_its_scales(fake_torch: Any) -> None:
    fp8 = type(fake_torch.float16)("float8_e4m3fn")
    fake_torch.float8_e4m3fn = fp8  # before the first tensor is read: the adapter maps it
    T, bf16 = fake_torch.Tensor, fake_torch.bfloat16
    w, ws, indptr, indices, last = _decode(fake_torch)
    w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=bf16, kv_data_type=fp8)
    q, cache = T((4, 32, 128), bf16), T((40, 2, 16, 8, 128), fp8)
    w.run(q, cache, k_scale=2.0, v_scale=0.5)
    flashgen.batch_decode(q, cache, indptr, indices, last, k_scale=2.0, v_scale=0.5)
    wrapped, functional = fake_torch.calls[-2:]
    assert _per_shape(wrapped) == _per_shape(functional)
    assert (wrapped["k_scale"], wrapped["v_scale"]) == (2.0, 0.5) and wrapped["workspace"] == ws.data_ptr()
    with pytest.raises(ValueError, match=r"run: paged_kv_cache has dtype bf16 but plan\(\) was given fp8_e4m3"):
        w.run(q, T((40, 2, 16, 8, 128), bf16))


def test_prefill_wrappers_plan_an_fp8_cache_and_run_takes_its_scales(fake_torch: Any) -> None:
    """Both prefill wrappers take kv_data_type and run()'s scales through the decode wrapper's
    path: run() is the functional call with the same struct; the refusals name the argument."""
    fp8 = type(fake_torch.float16)("float8_e5m2")
    fake_torch.float8_e5m2 = fp8
    T, bf16, i32 = fake_torch.Tensor, fake_torch.bfloat16, fake_torch.int32
    ws = T((WS_BYTES,), fake_torch.uint8)
    qo, kv, q = T((5,), i32), T((5,), i32), T((100, 32, 128), bf16)
    k, v = T((300, 8, 128), fp8), T((300, 8, 128), fp8)
    ragged = flashgen.BatchPrefillWithRaggedKVCacheWrapper(ws)
    ragged.plan(qo, kv, 32, 8, 128, causal=True, q_data_type=bf16, kv_data_type=fp8)
    ragged.run(q, k, v, k_scale=0.25, v_scale=3.0)
    flashgen.batch_prefill(q, qo, k, v, kv, causal=True, k_scale=0.25, v_scale=3.0)
    wrapped, functional = fake_torch.calls[-2:]
    assert _per_shape(wrapped) == _per_shape(functional)
    assert (wrapped["k_scale"], wrapped["v_scale"], wrapped["kv_dtype_code"]) == (0.25, 3.0, 2)
    with pytest.raises(TypeError, match=r"batch_prefill: k and v must share one dtype, got k fp8_e5m2, v bf16"):
        flashgen.batch_prefill(q, qo, k, T((300, 8, 128), bf16), kv)
    with pytest.raises(ValueError, match=r"run: k has dtype bf16 but plan\(\) was given fp8_e5m2"):
        ragged.run(q, T((300, 8, 128), bf16), T((300, 8, 128), bf16))

    ix, last, cache = T((30,), i32), T((4,), i32), T((40, 2, 16, 8, 128), fp8)
    paged = flashgen.BatchPrefillWithPagedKVCacheWrapper(ws)
    paged.plan(qo, kv, ix, last, 32, 8, 128, 16, q_data_type=bf16, kv_data_type="float8_e5m2")
    paged.run(q, cache, v_scale=0.5)
    flashgen.batch_prefill_paged(q, qo, cache, kv, ix, last, v_scale=0.5)
    wrapped, functional = fake_torch.calls[-2:]
    assert _per_shape(wrapped) == _per_shape(functional)
    assert (wrapped["k_scale"], wrapped["v_scale"]) == (1.0, 0.5)
    with pytest.raises(ValueError, match="batch_prefill_paged: pos_encoding='rope_llama' with kv_dtype='fp8_e5m2' "
                                         "is not supported: in-kernel RoPE is not supported with an fp8 KV cache"):
        flashgen.batch_prefill_paged(q, qo, cache, kv, ix, last, pos_encoding="rope_llama")
    with pytest.raises(ValueError, match="plan: pos_encoding='rope_llama' with kv_dtype='fp8_e5m2' is not supported"):
        paged.plan(qo, kv, ix, last, 32, 8, 128, 16, pos_encoding_mode="ROPE_LLAMA", q_data_type=bf16,
                   kv_data_type=fp8)
    with pytest.raises(ValueError, match="batch_prefill_paged: k_scale and v_scale apply to an fp8 KV cache"):
        flashgen.batch_prefill_paged(q, qo, T((40, 2, 16, 8, 128), bf16), kv, ix, last, k_scale=2.0)
    with pytest.raises(TypeError, match=r"run: k_scale must be a real number \(a Python float\), got '2'"):
        paged.run(q, cache, k_scale="2")
