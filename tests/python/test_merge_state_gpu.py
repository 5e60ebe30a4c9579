"""The merge functions on a GPU: merge_state, merge_state_in_place and merge_states against a
plain PyTorch fp32 reference, and the attention of one pass over all the keys against the merge
of two prefill passes over disjoint halves of them (single_prefill, and batch_prefill over a
ragged batch whose split differs per request, empty halves included). Skips cleanly without
torch or a CUDA device.

Tolerances: a merge is computed in fp32 and rounded once, so against the fp32 reference it is
within one unit of the dtype's precision (rtol = the dtype's eps) and its LSE within 1e-4. A merge
of two prefill passes against the one-pass prefill: outputs by relative L2 error per head as in
test_api_gpu.py (2e-2 bf16, 4e-3 f16; each side is rounded to the dtype on its own), LSE by
absolute error 2e-3.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashgen  # noqa: E402

DEV = "cuda:0"
TORCH_DT = {"bf16": torch.bfloat16, "f16": torch.float16}
TOL = {"bf16": 2e-2, "f16": 4e-3}
LSE_ATOL = 2e-3
MERGE_LSE_ATOL = 1e-4
NUM_QO, NUM_KV = 32, 8
NEG_INF = float("-inf")


@pytest.fixture(scope="session")
def _gpu_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gpu-cache"))


@pytest.fixture(autouse=True)
def _shared_cache(_gpu_cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One JIT cache for the module, so each instance compiles once."""
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", _gpu_cache)


def _gen(*key: Any) -> Any:
    return torch.Generator(device=DEV).manual_seed(zlib.crc32(repr(key).encode()))


def reference(v: Any, s: Any) -> tuple[Any, Any]:
    """fp32 merge of the states along dimension 1: v [n, S, H, D], s [n, S, H] -> ([n, H, D], [n, H])."""
    s = s.float()
    lse = torch.logsumexp(s, dim=1)
    w = torch.exp(s - lse[:, None]).nan_to_num(0.0)  # rows whose states are all empty: 0
    w = torch.where(torch.isneginf(s), 0.0, w)  # an empty state's values are never added
    vv = torch.where(w[..., None] > 0, v.float(), 0.0)
    return torch.einsum("nsh,nshd->nhd", w, vv), lse


def random_states(n: int, states: int, heads: int, head_dim: int, dtype: str, *key: Any) -> tuple[Any, Any]:
    """Values ~N(0, 1) and LSEs spread over [-8, 8], with some states empty (LSE -inf, values NaN:
    they must not be read into the result) and rows 3 and 5 empty in every state."""
    gen = _gen(n, states, heads, head_dim, dtype, *key)
    v = torch.randn(n, states, heads, head_dim, device=DEV, generator=gen).to(TORCH_DT[dtype])
    s = torch.rand(n, states, heads, device=DEV, generator=gen) * 16 - 8
    empty = torch.rand(n, states, heads, device=DEV, generator=gen) < 0.1
    empty[3], empty[5] = True, True
    s[empty] = NEG_INF
    v[empty] = float("nan")
    return v, s


def check_merge(v: Any, s: Any, ref_v: Any, ref_s: Any, dtype: str, what: str) -> None:
    assert v.dtype == TORCH_DT[dtype] and s.dtype == torch.float32 and v.shape == ref_v.shape
    assert not torch.isnan(v).any() and not torch.isnan(s).any(), f"{what}: NaN in the result"
    eps = torch.finfo(TORCH_DT[dtype]).eps
    torch.testing.assert_close(v.float(), ref_v, rtol=eps, atol=1e-5, msg=lambda m: f"{what}: {m}")
    empty = torch.isneginf(ref_s)
    assert torch.equal(torch.isneginf(s), empty), f"{what}: -inf LSE rows differ"
    assert (v[empty] == 0).all(), f"{what}: a row with no keys must be 0"
    err = (s[~empty] - ref_s[~empty]).abs().max().item()
    assert err <= MERGE_LSE_ATOL, f"{what}: LSE error {err:.2e} > {MERGE_LSE_ATOL:.0e}"


# ---- against the fp32 reference -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256, 96, 512])
def test_merge_state_matches_the_fp32_reference(dtype: str, head_dim: int) -> None:
    n, heads = 1001, 7  # an odd number of rows: a warp's last row slot is past the end
    v, s = random_states(n, 2, heads, head_dim, dtype)
    v_a, v_b, s_a, s_b = v[:, 0].contiguous(), v[:, 1].contiguous(), s[:, 0].contiguous(), s[:, 1].contiguous()
    out, lse = flashgen.merge_state(v_a, s_a, v_b, s_b)
    ref_v, ref_s = reference(v, s)
    check_merge(out, lse, ref_v, ref_s, dtype, f"merge_state {dtype} d{head_dim}")
    assert torch.isneginf(lse[3]).all() and torch.isneginf(lse[5]).all()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_merge_state_in_place_with_and_without_a_mask(dtype: str) -> None:
    n, heads, head_dim = 513, 8, 128
    v, s = random_states(n, 2, heads, head_dim, dtype, "in-place")
    v_a, v_b, s_a, s_b = v[:, 0].contiguous(), v[:, 1].contiguous(), s[:, 0].contiguous(), s[:, 1].contiguous()
    want_v, want_s = flashgen.merge_state(v_a, s_a, v_b, s_b)

    x, y = v_a.clone(), s_a.clone()
    assert flashgen.merge_state_in_place(x, y, v_b, s_b) is None
    # The same kernel and arithmetic: bit for bit the out-of-place result.
    assert torch.equal(x, want_v) and torch.equal(y, want_s)

    for mask_dtype in (torch.bool, torch.uint8):
        mask = (torch.arange(n, device=DEV) % 3 != 1).to(mask_dtype)
        x, y = v_a.clone(), s_a.clone()
        flashgen.merge_state_in_place(x, y, v_b, s_b, mask=mask)
        keep = mask.bool()
        assert torch.equal(x[keep], want_v[keep]) and torch.equal(y[keep], want_s[keep])
        # Rows whose mask is false are left exactly as they were (NaN values of empty states too).
        assert torch.equal(x[~keep].nan_to_num(7.0), v_a[~keep].nan_to_num(7.0))
        assert torch.equal(y[~keep], s_a[~keep])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("states", [1, 2, 5])
def test_merge_states(dtype: str, states: int) -> None:
    n, heads, head_dim = 300, 16, 128
    v, s = random_states(n, states, heads, head_dim, dtype, "stack")
    out, lse = flashgen.merge_states(v, s)
    ref_v, ref_s = reference(v, s)
    check_merge(out, lse, ref_v, ref_s, dtype, f"merge_states {dtype} x{states}")
    if states == 1:  # one state: its values, and 0 where it is empty
        assert torch.equal(out, torch.where(torch.isneginf(s[:, 0])[..., None], 0.0, v[:, 0]).to(out.dtype))
    if states == 2:  # two states merge as merge_state merges them
        pair = flashgen.merge_state(v[:, 0].contiguous(), s[:, 0].contiguous(), v[:, 1].contiguous(),
                                    s[:, 1].contiguous())
        assert torch.equal(out, pair[0]) and torch.equal(lse, pair[1])


def test_rows_whose_states_are_all_empty_are_zero_with_lse_minus_inf() -> None:
    v_a = torch.full((4, 2, 64), float("nan"), device=DEV, dtype=torch.bfloat16)
    s_a = torch.full((4, 2), NEG_INF, device=DEV)
    out, lse = flashgen.merge_state(v_a, s_a, v_a.clone(), s_a.clone())
    assert (out == 0).all() and torch.isneginf(lse).all()
    v, s = flashgen.merge_states(v_a[:, None].contiguous(), s_a[:, None].contiguous())
    assert (v == 0).all() and torch.isneginf(s).all()


def test_no_rows_and_a_side_stream() -> None:
    v0, s0 = torch.empty(0, 4, 64, device=DEV, dtype=torch.float16), torch.empty(0, 4, device=DEV)
    out, lse = flashgen.merge_state(v0, s0, v0, s0)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)
    v, s = random_states(64, 2, 4, 64, "f16", "stream")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the inputs were written on the default stream
    with torch.cuda.stream(side):
        out, lse = flashgen.merge_states(v, s)
    side.synchronize()
    ref_v, ref_s = reference(v, s)
    check_merge(out, lse, ref_v, ref_s, "f16", "merge_states on a side stream")


def test_bad_arguments_are_clear_errors() -> None:
    v = torch.randn(8, 4, 64, device=DEV, dtype=torch.bfloat16)
    s = torch.randn(8, 4, device=DEV)
    with pytest.raises(ValueError, match="merge_state: v_b must be contiguous"):
        flashgen.merge_state(v, s, v.transpose(0, 1).contiguous().transpose(0, 1), s)
    inside = torch.randn(8 * 4 * 64 + 4, device=DEV, dtype=torch.bfloat16)[4:].view(8, 4, 64)  # 8 bytes in
    with pytest.raises(ValueError, match="merge_state: v_a's data must be 16-byte aligned"):
        flashgen.merge_state(inside, s, v, s)
    with pytest.raises(ValueError, match=r"merge_states: s must have shape \[n, num_states, num_heads\]"):
        flashgen.merge_states(v[:, None].contiguous(), s)


# ---- one pass against two merged passes ----------------------------------------------------------


def assert_close(out: Any, ref: Any, dtype: str, what: str, lse: Any, ref_lse: Any) -> None:
    out, ref = out.float(), ref.float()
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    err = ((out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-20)).max().item()
    assert err <= TOL[dtype], f"{what}: relative L2 error {err:.2e} > {TOL[dtype]:.0e}"
    lerr = (lse - ref_lse).abs().max().item()
    assert lerr <= LSE_ATOL, f"{what}: lse error {lerr:.2e} > {LSE_ATOL:.0e}"


def qkv(qo_len: int, kv_len: int, head_dim: int, dtype: str, *key: Any) -> tuple[Any, Any, Any]:
    gen = _gen(qo_len, kv_len, head_dim, dtype, *key)
    t = TORCH_DT[dtype]
    q = torch.randn(qo_len, NUM_QO, head_dim, device=DEV, dtype=t, generator=gen)
    k = torch.randn(kv_len, NUM_KV, head_dim, device=DEV, dtype=t, generator=gen)
    v = torch.randn(kv_len, NUM_KV, head_dim, device=DEV, dtype=t, generator=gen)
    return q, k, v


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_two_single_prefill_passes_merge_into_one(dtype: str, head_dim: int) -> None:
    # Every query sees every key: any split point.
    q, k, v = qkv(77, 1000, head_dim, dtype, "single")
    o, lse = flashgen.single_prefill(q, k, v, return_lse=True)
    split = 371
    o_a, s_a = flashgen.single_prefill(q, k[:split], v[:split], return_lse=True)
    o_b, s_b = flashgen.single_prefill(q, k[split:], v[split:], return_lse=True)
    m, s = flashgen.merge_state(o_a, s_a, o_b, s_b)
    assert_close(m, o, dtype, f"single_prefill {dtype} d{head_dim} split", s, lse)
    # Cascade: a shared prefix every query sees, then the queries' own tokens under the causal mask.
    prefix = 600
    q, _, _ = qkv(1000 - prefix, 1, head_dim, dtype, "cascade")
    o, lse = flashgen.single_prefill(q, k, v, causal=True, return_lse=True)
    o_a, s_a = flashgen.single_prefill(q, k[:prefix], v[:prefix], return_lse=True)
    o_b, s_b = flashgen.single_prefill(q, k[prefix:], v[prefix:], causal=True, return_lse=True)
    m, s = flashgen.merge_state(o_a, s_a, o_b, s_b)
    assert_close(m, o, dtype, f"single_prefill {dtype} d{head_dim} causal prefix", s, lse)


def _ragged(lens: list[int]) -> Any:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_two_batch_prefill_passes_merge_into_one(dtype: str, causal: bool) -> None:
    """A ragged batch whose split differs per request: request 1's first part is empty (its LSE
    is -inf there), request 3's second part is empty without the causal mask."""
    head_dim = 128
    kv_lens = [300, 257, 1000, 64]
    splits = [120, 0, 777, 64] if not causal else [120, 0, 777, 10]
    # Causal: the queries are each request's second part (a prefix, then the request's own tokens).
    qo_lens = [kv - p for kv, p in zip(kv_lens, splits)] if causal else [50, 1, 129, 17]
    q, _, _ = qkv(sum(qo_lens), 1, head_dim, dtype, "batch-q", causal)
    ks, vs = [], []
    for b, n in enumerate(kv_lens):
        _, kb, vb = qkv(1, n, head_dim, dtype, "batch-kv", b)
        ks.append(kb)
        vs.append(vb)
    qo_indptr = _ragged(qo_lens)
    full = flashgen.batch_prefill(q, qo_indptr, torch.cat(ks), torch.cat(vs), _ragged(kv_lens), causal=causal,
                                  return_lse=True)
    first = flashgen.batch_prefill(q, qo_indptr, torch.cat([kb[:p] for kb, p in zip(ks, splits)]),
                                   torch.cat([vb[:p] for vb, p in zip(vs, splits)]), _ragged(splits),
                                   return_lse=True)
    second = flashgen.batch_prefill(q, qo_indptr, torch.cat([kb[p:] for kb, p in zip(ks, splits)]),
                                    torch.cat([vb[p:] for vb, p in zip(vs, splits)]),
                                    _ragged([n - p for n, p in zip(kv_lens, splits)]), causal=causal,
                                    return_lse=True)
    q_start = qo_indptr.tolist()
    assert torch.isneginf(first[1][q_start[1]:q_start[2]]).all(), "an empty part's LSE is -inf"
    m, s = flashgen.merge_state(first[0], first[1], second[0], second[1])
    assert_close(m, full[0], dtype, f"batch_prefill {dtype} causal={causal}", s, full[1])
    # The same merge in place, the empty request masked out of it and left as the first pass gave it.
    mask = torch.ones(q.shape[0], dtype=torch.bool, device=DEV)
    mask[q_start[1]:q_start[2]] = False
    o, lse = first[0].clone(), first[1].clone()
    flashgen.merge_state_in_place(o, lse, second[0], second[1], mask=mask)
    assert torch.equal(o[mask], m[mask]) and torch.equal(lse[mask], s[mask])
    assert torch.equal(o[~mask], first[0][~mask]) and torch.isneginf(lse[~mask]).all()


def test_merge_of_three_decode_splits_is_the_whole_decode() -> None:
    """merge_states over the LSEs of single_decode on three parts of the keys."""
    q, k, v = qkv(1, 3000, 128, "bf16", "decode")
    o, lse = flashgen.single_decode(q[0], k, v, return_lse=True)
    parts = [flashgen.single_decode(q[0], k[a:b], v[a:b], return_lse=True) for a, b in ((0, 1000), (1000, 1001),
                                                                                       (1001, 3000))]
    vs = torch.stack([p[0] for p in parts])[None]  # [1, 3, heads, head_dim]
    ss = torch.stack([p[1] for p in parts])[None]
    m, s = flashgen.merge_states(vs, ss)
    assert_close(m[0], o, "bf16", "three decode parts", s[0], lse)
