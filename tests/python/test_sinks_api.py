"""The attention_sink variant's arguments on a machine without a GPU: ``sinks`` missing, of the
wrong length, dtype, device or layout is a clear Python exception before any launch (fake matrix,
fake CUDA tensors), in decode and prefill alike; ``alibi_slopes``, the other per-head pointer
parameter, is held to its length the same way. The kernels' results are test_sinks_gpu.py's."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import flashgen
from conftest import FakeCudaTensor
from flashgen._errors import NoGPUError
from test_loader import needs_no_driver

I32 = "i32"
NUM_QO = 32  # the calls below have 32 query heads and 8 kv heads


def _single_decode(**kw: Any) -> Any:
    return flashgen.single_decode(FakeCudaTensor((NUM_QO, 128)), FakeCudaTensor((100, 8, 128)),
                                  FakeCudaTensor((100, 8, 128)), **kw)


def _batch_decode(**kw: Any) -> Any:
    return flashgen.batch_decode(FakeCudaTensor((4, NUM_QO, 128)), FakeCudaTensor((10, 2, 16, 8, 128)),
                                 FakeCudaTensor((5,), I32), FakeCudaTensor((10,), I32), FakeCudaTensor((4,), I32),
                                 **kw)


def _single_prefill(**kw: Any) -> Any:
    return flashgen.single_prefill(FakeCudaTensor((100, NUM_QO, 128)), FakeCudaTensor((300, 8, 128)),
                                   FakeCudaTensor((300, 8, 128)), causal=True, **kw)


def _batch_prefill(**kw: Any) -> Any:
    return flashgen.batch_prefill(FakeCudaTensor((100, NUM_QO, 128)), FakeCudaTensor((5,), I32),
                                  FakeCudaTensor((300, 8, 128)), FakeCudaTensor((300, 8, 128)),
                                  FakeCudaTensor((5,), I32), **kw)


def _batch_prefill_paged(**kw: Any) -> Any:
    return flashgen.batch_prefill_paged(FakeCudaTensor((100, NUM_QO, 128)), FakeCudaTensor((5,), I32),
                                        FakeCudaTensor((40, 2, 16, 8, 128)), FakeCudaTensor((5,), I32),
                                        FakeCudaTensor((30,), I32), FakeCudaTensor((4,), I32), **kw)


CALLS: list[Callable[..., Any]] = [_single_decode, _batch_decode, _single_prefill, _batch_prefill,
                                   _batch_prefill_paged]
SINK = {"variant": "attention_sink", "window_left": -1}


@pytest.mark.parametrize("call", CALLS, ids=lambda c: c.__name__.strip("_"))
@pytest.mark.parametrize("kw, exc, match", [
    ({}, TypeError, "variant 'attention_sink' missing parameter 'sinks'; it takes sinks, window_left"),
    ({"sinks": FakeCudaTensor((NUM_QO - 1,), "f32")}, ValueError,
     r"sinks must be 1-D with num_qo_heads = 32 values \(one per query head\), got shape \[31\]"),
    ({"sinks": FakeCudaTensor((1, NUM_QO), "f32")}, ValueError,
     r"sinks must be 1-D with num_qo_heads = 32 values \(one per query head\), got shape \[1, 32\]"),
    ({"sinks": FakeCudaTensor((NUM_QO,), "bf16")}, TypeError, "sinks must be a f32 tensor, got bf16"),
    ({"sinks": FakeCudaTensor((NUM_QO,), "f32", device=1)}, ValueError, "sinks is on cuda:1, the other tensors on cuda:0"),
    ({"sinks": FakeCudaTensor((NUM_QO,), "f32", device_type=1)}, ValueError, "sinks is on cpu"),
    ({"sinks": FakeCudaTensor((NUM_QO,), "f32", strides=(2,))}, ValueError, "sinks must be contiguous"),
    ({"sinks": [0.0] * NUM_QO}, TypeError, "sinks must be a tensor"),
])
def test_sinks_argument_errors(fake_matrix: Any, call: Callable[..., Any], kw: dict[str, Any], exc: type,
                               match: str) -> None:
    with pytest.raises(exc, match=f"{call.__name__.strip('_')}: .*{match}"):
        call(**SINK, **kw)


def test_window_left_is_required_and_an_integer(fake_matrix: Any) -> None:
    sinks = FakeCudaTensor((NUM_QO,), "f32")
    with pytest.raises(TypeError, match="missing parameter 'window_left'"):
        _single_decode(variant="attention_sink", sinks=sinks)
    with pytest.raises(TypeError, match="window_left must be an integer"):
        _single_prefill(variant="attention_sink", sinks=sinks, window_left=1.5)


def test_alibi_slopes_length_is_checked_too(fake_matrix: Any) -> None:
    with pytest.raises(ValueError, match=r"alibi_slopes must be 1-D with num_qo_heads = 32 values"):
        _batch_decode(variant="alibi", alibi_slopes=FakeCudaTensor((8,), "f32"))


@needs_no_driver
@pytest.mark.parametrize("call", CALLS, ids=lambda c: c.__name__.strip("_"))
def test_valid_sinks_pass_every_check(fake_matrix: Any, call: Callable[..., Any]) -> None:
    """Right arguments get as far as loading the kernel (no driver here): no check refused them."""
    with pytest.raises(NoGPUError):
        call(**SINK, sinks=FakeCudaTensor((NUM_QO,), "f32"))
