"""An fp8 KV cache: which cache dtypes a module with a ``kv_dtype`` axis takes, and its scales.

A cache tensor (``T(kind="cache")``) holds the attention dtype (q's: float16 or bfloat16) or an
fp8 type; the ``kv_dtype`` axis names which (``same``, ``fp8_e4m3``, ``fp8_e5m2``). An fp8 cache
stores K / k_scale and V / v_scale: the kernel multiplies the (transformed) query by ``k_scale``
and the output by ``v_scale``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

__all__ = ["FP8_DTYPES", "cache_dtype", "check_caches_agree", "scale_options", "check_cache_call"]

# Our dtype names (as _tensor.describe spells them) of the fp8 cache types, and torch's.
FP8_DTYPES = {"fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2"}
SAME = "same"  # the kv_dtype value of a cache in the attention dtype


def cache_dtype(what: str, name: str, dtype: str, attn_dtype: str) -> str:
    """The ``kv_dtype`` value of cache tensor ``name`` of ``dtype`` beside attention tensors of
    ``attn_dtype``."""
    if dtype == attn_dtype:
        return SAME
    if dtype in FP8_DTYPES:
        return dtype
    raise TypeError(f"{what}: {name} must be {attn_dtype} like q, or an fp8 type "
                    f"({' or '.join(FP8_DTYPES.values())}), got {dtype}")


def check_caches_agree(what: str, cache_dtypes: Mapping[str, str]) -> None:
    """The cache tensors of one call (ragged ``k`` and ``v``) share one dtype."""
    if len(set(cache_dtypes.values())) > 1:
        got = ", ".join(f"{name} {dtype}" for name, dtype in cache_dtypes.items())
        raise TypeError(f"{what}: {' and '.join(cache_dtypes)} must share one dtype, got {got}")


def scale_options(what: str, k_scale: Any, v_scale: Any) -> dict[str, float]:
    """``k_scale`` and ``v_scale`` as struct fields: real, finite numbers."""
    scales = {}
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{what}: {name} must be a real number (a Python float), got {value!r}")
        scales[name] = float(value)
        if not math.isfinite(scales[name]):
            raise ValueError(f"{what}: {name} must be finite, got {value}")
    return scales


def check_cache_call(what: str, params: Mapping[str, Any], options: Mapping[str, Any]) -> None:
    """Scales only with an fp8 cache. (What an fp8 cache cannot combine with is declared in
    variants.json, ``modules.<m>.unsupported``, and refused where the instance is looked up.)"""
    if params["kv_dtype"] == SAME and (options["k_scale"] != 1.0 or options["v_scale"] != 1.0):
        raise ValueError(f"{what}: k_scale and v_scale apply to an fp8 KV cache, but the cache is "
                         f"{params['dtype']} like q; leave them at 1.0 (scale the tensors instead)")
