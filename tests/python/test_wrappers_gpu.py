"""The engine-facing wrappers on a GPU: run() gives exactly the functional call's output over the
caller's workspace, for page sizes 1, 16, 32 and 64 and for fp8 caches (checked against a plain
fp32 PyTorch reference too); a run() captured once in a CUDA graph replays correctly after plan() with new
lengths (capture fails if run() synchronizes); a workspace too small is refused before a launch.
Skips cleanly without torch or a CUDA device."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashgen  # noqa: E402
from conftest import gpu_suite_cache  # noqa: E402

DEV = "cuda:0"
HQ, HKV, D = 32, 8, 128
BF16 = torch.bfloat16
I32 = torch.int32
PAGE_SIZES = (1, 16, 32, 64)


@pytest.fixture(scope="module")
def workspace() -> Any:
    return torch.empty(128 << 20, dtype=torch.uint8, device=DEV)


def instances() -> list[tuple[str, dict[str, Any]]]:
    """The instances the tests below call."""
    base = {"dtype": "bf16", "head_dim": D, "pos_encoding": "none"}
    backends = ["portable"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])
    out = [("batch_decode", {**base, "page_size": ps, "variant": "default", "kv_dtype": kv})
           for ps in PAGE_SIZES for kv in ("same", "fp8_e4m3")]
    out += [("batch_prefill_paged", {**base, "page_size": ps, "mask": "causal", "variant": "default", "backend": b,
                                     "kv_dtype": "same"}) for ps in PAGE_SIZES for b in backends]
    out += [("batch_prefill_ragged", {**base, "mask": "causal", "variant": v, "backend": backends[-1], "kv_dtype": "same"})
            for v in ("default", "sliding_window")]
    out += [("batch_prefill_paged", {**base, "page_size": 16, "mask": "causal", "variant": "default", "backend": b,
                                     "kv_dtype": "fp8_e4m3"}) for b in backends]
    out += [("batch_prefill_ragged", {**base, "mask": "causal", "variant": "default", "backend": b,
                                      "kv_dtype": "fp8_e5m2"}) for b in backends]
    return out


_gpu_cache, _shared_cache = gpu_suite_cache("wrappers", instances)


def page_table(lens: list[int], page_size: int, num_pages: int, gen: Any) -> tuple[Any, Any, Any]:
    """indptr, indices (scattered page ids out of num_pages) and last_page_len for these lengths."""
    npages = [-(-n // page_size) for n in lens]
    assert sum(npages) <= num_pages
    perm = torch.randperm(num_pages, generator=gen)[: sum(npages)]
    indptr = torch.tensor([0] + list(torch.tensor(npages).cumsum(0).tolist()), dtype=I32, device=DEV)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lens, npages)], dtype=I32, device=DEV)
    return indptr, perm.to(device=DEV, dtype=I32), last


def gather(cache: Any, indptr: Any, indices: Any, b: int, kv_len: int) -> tuple[Any, Any]:
    """Request b's K and V as [kv_len, HKV, D] float32 (NHD cache)."""
    pages = indices[indptr[b]: indptr[b + 1]].long()
    kv = cache[pages].float()  # [pages, 2, P, HKV, D]
    k = kv[:, 0].reshape(-1, HKV, D)[:kv_len]
    v = kv[:, 1].reshape(-1, HKV, D)[:kv_len]
    return k, v


def attend(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """fp32 attention of q [Lq, HQ, D] over k, v [Lk, HKV, D], bottom-right causal."""
    group = HQ // HKV
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) / math.sqrt(D)
    if causal:
        lq, lk = q.shape[0], k.shape[0]
        qpos = torch.arange(lq, device=DEV)[:, None] + (lk - lq)
        s = s.masked_fill(torch.arange(lk, device=DEV)[None, :] > qpos, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num()
    return torch.einsum("hqk,khd->qhd", p, v)


def close(got: Any, want: Any, tol: float = 2e-2) -> None:
    err = (got.float() - want).norm() / want.norm().clamp_min(1e-6)
    assert err < tol, f"relative L2 error {err:.3g}"


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_decode_wrapper_matches_the_functional_call_and_the_reference(workspace: Any, page_size: int) -> None:
    gen = torch.Generator().manual_seed(page_size)
    lens = [1, 17, 300, 1000, page_size, 2 * page_size + 1, 4096]
    num_pages = sum(-(-n // page_size) for n in lens) + 3
    cache = torch.randn(num_pages, 2, page_size, HKV, D, dtype=BF16, device=DEV)
    indptr, indices, last = page_table(lens, page_size, num_pages, gen)
    q = torch.randn(len(lens), HQ, D, dtype=BF16, device=DEV)
    w = flashgen.BatchDecodeWithPagedKVCacheWrapper(workspace)
    w.plan(indptr, indices, last, HQ, HKV, D, page_size, q_data_type=BF16)
    o, lse = w.run(q, cache, return_lse=True)
    fo, flse = flashgen.batch_decode(q, cache, indptr, indices, last, return_lse=True)
    assert torch.equal(o, fo) and torch.equal(lse, flse)
    for b, n in enumerate(lens):
        k, v = gather(cache, indptr, indices, b, n)
        close(o[b: b + 1], attend(q[b: b + 1], k, v, causal=False))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("backend", ["sm90", "portable"])
def test_paged_prefill_wrapper_matches_the_functional_call_and_the_reference(
        workspace: Any, page_size: int, backend: str) -> None:
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 backend runs on sm_90 only")
    gen = torch.Generator().manual_seed(100 + page_size)
    kv_lens, qo_lens = [1, 100, 777, 64, 2048], [1, 100, 300, 0, 129]
    num_pages = sum(-(-n // page_size) for n in kv_lens) + 5
    cache = torch.randn(num_pages, 2, page_size, HKV, D, dtype=BF16, device=DEV)
    indptr, indices, last = page_table(kv_lens, page_size, num_pages, gen)
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=I32, device=DEV)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=BF16, device=DEV)
    w = flashgen.BatchPrefillWithPagedKVCacheWrapper(workspace, backend=backend)
    w.plan(qo_indptr, indptr, indices, last, HQ, HKV, D, page_size, causal=True, q_data_type=BF16)
    o = w.run(q, cache)
    fo = flashgen.batch_prefill_paged(q, qo_indptr, cache, indptr, indices, last, causal=True, backend=backend)
    assert torch.equal(o, fo)
    for b, (lq, lk) in enumerate(zip(qo_lens, kv_lens)):
        if lq:
            k, v = gather(cache, indptr, indices, b, lk)
            r0 = int(qo_indptr[b])
            close(o[r0: r0 + lq], attend(q[r0: r0 + lq], k, v, causal=True))


def test_ragged_prefill_wrapper_matches_the_functional_call(workspace: Any) -> None:
    qo_lens, kv_lens = [5, 200, 0, 64], [5, 1000, 10, 64]
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=I32, device=DEV)
    kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=I32, device=DEV)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=BF16, device=DEV)
    k = torch.randn(sum(kv_lens), HKV, D, dtype=BF16, device=DEV)
    v = torch.randn_like(k)
    w = flashgen.BatchPrefillWithRaggedKVCacheWrapper(workspace)
    w.plan(qo_indptr, kv_indptr, HQ, HKV, D, causal=True, window_left=33, q_data_type=BF16)
    o, lse = w.run(q, k, v, return_lse=True)
    fo, flse = flashgen.batch_prefill(q, qo_indptr, k, v, kv_indptr, causal=True, variant="sliding_window",
                                      window_left=33, return_lse=True)
    assert torch.equal(o, fo) and torch.equal(lse, flse)


def _replay_with_new_lengths(w: Any, plan_for: Any, run: Any, functional: Any, lengths: list[Any]) -> None:
    """plan(lengths[0]), a warm-up run, capture run() once, then for every lengths: plan() and
    replay, and compare with the functional call on the same tables."""
    plan_for(lengths[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for lens in lengths:
        valid = plan_for(lens)
        graph.replay()
        torch.cuda.synchronize()
        want = functional()
        assert torch.equal(out[:valid], want[:valid]), f"replay with lengths {lens}"


def test_decode_run_replays_in_a_cuda_graph_with_new_lengths(workspace: Any) -> None:
    gen = torch.Generator().manual_seed(7)
    batch, page_size, num_pages = 8, 16, 1024
    bufs = (torch.empty(batch + 1, dtype=I32, device=DEV), torch.empty(num_pages, dtype=I32, device=DEV),
            torch.empty(batch, dtype=I32, device=DEV))
    w = flashgen.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", True, *bufs)
    cache = torch.randn(num_pages, 2, page_size, HKV, D, dtype=BF16, device=DEV)
    q = torch.randn(batch, HQ, D, dtype=BF16, device=DEV)
    out = torch.empty_like(q)
    tables: dict[str, Any] = {}

    def plan_for(lens: list[int]) -> int:
        tables["t"] = page_table(lens, page_size, num_pages, gen)
        w.plan(*tables["t"], HQ, HKV, D, page_size, q_data_type=BF16)
        return batch

    _replay_with_new_lengths(
        w, plan_for, lambda: w.run(q, cache, out=out),
        lambda: flashgen.batch_decode(q, cache, *tables["t"]),
        [[100] * batch, [1, 5000, 17, 16, 33, 2048, 999, 4], [8000, 1, 1, 1, 1, 1, 1, 7000]])


def test_paged_prefill_run_replays_in_a_cuda_graph_with_new_lengths(workspace: Any) -> None:
    gen = torch.Generator().manual_seed(8)
    batch, page_size, num_pages, rows = 4, 16, 1024, 512
    bufs = (torch.empty(batch + 1, dtype=I32, device=DEV), torch.empty(batch + 1, dtype=I32, device=DEV),
            torch.empty(num_pages, dtype=I32, device=DEV), torch.empty(batch, dtype=I32, device=DEV))
    w = flashgen.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", True, *bufs)
    cache = torch.randn(num_pages, 2, page_size, HKV, D, dtype=BF16, device=DEV)
    q = torch.randn(rows, HQ, D, dtype=BF16, device=DEV)
    out = torch.empty_like(q)
    tables: dict[str, Any] = {}

    def plan_for(lens: tuple[list[int], list[int]]) -> int:
        qo_lens, kv_lens = lens
        qo = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=I32, device=DEV)
        tables["t"] = (qo, *page_table(kv_lens, page_size, num_pages, gen))
        w.plan(*tables["t"], HQ, HKV, D, page_size, causal=True, q_data_type=BF16)
        return sum(qo_lens)

    _replay_with_new_lengths(
        w, plan_for, lambda: w.run(q, cache, out=out),
        lambda: flashgen.batch_prefill_paged(q, tables["t"][0], cache, *tables["t"][1:], causal=True),
        [([128] * 4, [1000] * 4), ([1, 300, 0, 200], [1, 4000, 7, 2500]), ([512, 0, 0, 0], [512, 1, 1, 1])])


def test_ragged_prefill_run_replays_in_a_cuda_graph_with_new_lengths(workspace: Any) -> None:
    batch, rows, kv_rows = 4, 512, 8192
    bufs = (torch.empty(batch + 1, dtype=I32, device=DEV), torch.empty(batch + 1, dtype=I32, device=DEV))
    w = flashgen.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", True, *bufs)
    q = torch.randn(rows, HQ, D, dtype=BF16, device=DEV)
    k = torch.randn(kv_rows, HKV, D, dtype=BF16, device=DEV)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    tables: dict[str, Any] = {}

    def plan_for(lens: tuple[list[int], list[int]]) -> int:
        qo = torch.tensor([0] + torch.tensor(lens[0]).cumsum(0).tolist(), dtype=I32, device=DEV)
        kv = torch.tensor([0] + torch.tensor(lens[1]).cumsum(0).tolist(), dtype=I32, device=DEV)
        tables["t"] = (qo, kv)
        w.plan(qo, kv, HQ, HKV, D, causal=True, q_data_type=BF16)
        return sum(lens[0])

    _replay_with_new_lengths(
        w, plan_for, lambda: w.run(q, k, v, out=out),
        lambda: flashgen.batch_prefill(q, tables["t"][0], k, v, tables["t"][1], causal=True),
        [([128] * 4, [2048] * 4), ([1, 300, 0, 200], [1, 4000, 7, 2500]), ([512, 0, 0, 0], [8000, 1, 1, 1])])


def test_a_small_workspace_is_refused_before_a_launch() -> None:
    tiny = torch.empty(1024, dtype=torch.uint8, device=DEV)
    indptr = torch.tensor([0, 512], dtype=I32, device=DEV)
    indices = torch.arange(512, dtype=I32, device=DEV)
    last = torch.full((1,), 16, dtype=I32, device=DEV)
    w = flashgen.BatchDecodeWithPagedKVCacheWrapper(tiny)
    # one request over 8 kv heads: decode splits its KV, and the partials need far more than 1 KiB
    with pytest.raises(ValueError, match="needs a workspace of"):
        w.plan(indptr, indices, last, HQ, HKV, D, 16, q_data_type=BF16)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this torch has no float8_e4m3fn")
def test_decode_wrapper_reads_an_fp8_cache(workspace: Any) -> None:
    gen = torch.Generator().manual_seed(9)
    lens = [1, 300, 4096, 17]
    num_pages = sum(-(-n // 16) for n in lens) + 2
    cache = torch.randn(num_pages, 2, 16, HKV, D, device=DEV).to(torch.float8_e4m3fn)
    indptr, indices, last = page_table(lens, 16, num_pages, gen)
    q = torch.randn(len(lens), HQ, D, dtype=BF16, device=DEV)
    w = flashgen.BatchDecodeWithPagedKVCacheWrapper(workspace)
    w.plan(indptr, indices, last, HQ, HKV, D, 16, q_data_type=BF16, kv_data_type=torch.float8_e4m3fn)
    o = w.run(q, cache, k_scale=0.5, v_scale=2.0)
    assert torch.equal(o, flashgen.batch_decode(q, cache, indptr, indices, last, k_scale=0.5, v_scale=2.0))
    for b, n in enumerate(lens):
        k, v = gather(cache, indptr, indices, b, n)
        close(o[b: b + 1], attend(q[b: b + 1], k * 0.5, v * 2.0, causal=False))


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this torch has no float8 dtypes")
@pytest.mark.parametrize("backend", ["sm90", "portable"])
def test_prefill_wrappers_read_an_fp8_cache(workspace: Any, backend: str) -> None:
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 backend runs on sm_90 only")
    gen = torch.Generator().manual_seed(10)
    kv_lens, qo_lens = [1, 100, 777, 2048], [1, 100, 300, 129]
    qo_indptr = torch.tensor([0] + torch.tensor(qo_lens).cumsum(0).tolist(), dtype=I32, device=DEV)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=BF16, device=DEV)
    num_pages = sum(-(-n // 16) for n in kv_lens) + 2
    cache = torch.randn(num_pages, 2, 16, HKV, D, device=DEV).to(torch.float8_e4m3fn)
    indptr, indices, last = page_table(kv_lens, 16, num_pages, gen)
    paged = flashgen.BatchPrefillWithPagedKVCacheWrapper(workspace, backend=backend)
    paged.plan(qo_indptr, indptr, indices, last, HQ, HKV, D, 16, causal=True, q_data_type=BF16,
               kv_data_type=torch.float8_e4m3fn)
    o = paged.run(q, cache, k_scale=0.5, v_scale=2.0)
    assert torch.equal(o, flashgen.batch_prefill_paged(q, qo_indptr, cache, indptr, indices, last, causal=True,
                                                       k_scale=0.5, v_scale=2.0, backend=backend))
    for b, (lq, lk) in enumerate(zip(qo_lens, kv_lens)):
        k, v = gather(cache, indptr, indices, b, lk)
        r0 = int(qo_indptr[b])
        close(o[r0: r0 + lq], attend(q[r0: r0 + lq], k * 0.5, v * 2.0, causal=True))

    kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=I32, device=DEV)
    k = torch.randn(sum(kv_lens), HKV, D, device=DEV).to(torch.float8_e5m2)
    v = torch.randn(sum(kv_lens), HKV, D, device=DEV).to(torch.float8_e5m2)
    ragged = flashgen.BatchPrefillWithRaggedKVCacheWrapper(workspace, backend=backend)
    ragged.plan(qo_indptr, kv_indptr, HQ, HKV, D, causal=True, q_data_type=BF16, kv_data_type=torch.float8_e5m2)
    o, lse = ragged.run(q, k, v, k_scale=0.25, v_scale=3.0, return_lse=True)
    fo, flse = flashgen.batch_prefill(q, qo_indptr, k, v, kv_indptr, causal=True, k_scale=0.25, v_scale=3.0,
                                      return_lse=True, backend=backend)
    assert torch.equal(o, fo) and torch.equal(lse, flse)
    for b, (lq, lk) in enumerate(zip(qo_lens, kv_lens)):
        r0, k0 = int(qo_indptr[b]), int(kv_indptr[b])
        close(o[r0: r0 + lq], attend(q[r0: r0 + lq], k[k0: k0 + lk].float() * 0.25, v[k0: k0 + lk].float() * 3.0,
                                     causal=True))
