"""The attention_sink variant (gpt-oss's attention sinks) on a GPU, against a plain PyTorch fp32
reference: every module, on both backends where the module has a backend axis (sm90 only on an
sm_90 device), f16 and bf16, window_left -1 (gpt-oss's full layers) and 7 (a window, as its
sliding layers' 128), GQA 32 query heads over 8 kv heads, head_dim 64 (gpt-oss's). Skips cleanly
without torch or a CUDA device.

The reference appends each head's sink as one more column of the masked logits, takes the
softmax, drops that column and multiplies by V; its LSE is the logsumexp over the logits and the
sink. The variant's mask is sliding_window's: key j is visible to query i of a request when
j <= kv_len - qo_len + i (always, with or without causal) and, for window_left >= 0, when
j >= kv_len - qo_len + i - window_left. A row that sees no key has output 0 and LSE = its sink.

Cases that reach the split-KV paths: a 6000-token single decode and a batch decode of two
requests (6000 and 9 tokens; 9 fit in one page), a prefill of 16 queries over 8192 keys. A
request with kv_len 0 and one with qo_len > kv_len (causal: leading rows see nothing) are in
the ragged batch.

Tolerances follow test_api_gpu.py: outputs per (row, head) by relative L2 error, at most 2e-2
for bf16 and 4e-3 for f16; the decode LSE by absolute error 2e-3 (decode's logits are exact in
fp32). The prefill LSE takes test_prefill_gpu.py's bound, 0.5 u + 4 u / sqrt(n_eff) (u = 2^-8
bf16, 2^-10 f16; n_eff = 1 / sum p_j^2 over the keys' softmax weights, the sink in their
denominator), because prefill rounds the scaled query to the input dtype before the tensor
cores: a row over a handful of keys (window 7) may be off by ~1e-2 in bf16. Rows that see no key:
output exactly 0, LSE the sink within 1e-4.

A sink of -inf is checked to give sliding_window's outputs and LSE (and, without a window, the
default variant's under the causal mask).
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashgen  # noqa: E402
from conftest import gpu_suite_cache  # noqa: E402
from test_api_gpu import gather_kv, make_paged  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False  # the reference is fp32, not TF32

DEV = "cuda:0"
TOL = {"bf16": 2e-2, "f16": 4e-3}
DECODE_LSE_ATOL = 2e-3
UNIT = {"bf16": 2.0**-8, "f16": 2.0**-10}
TORCH_DT = {"bf16": torch.bfloat16, "f16": torch.float16}
NUM_QO, NUM_KV, HEAD_DIM = 32, 8, 64
SM90 = torch.cuda.get_device_capability(0) == (9, 0)
DTYPES = ["bf16", "f16"]
WINDOWS = [-1, 7]
BACKENDS = ["sm90", "portable"]


def need(backend: str | None) -> None:
    if backend == "sm90" and not SM90:
        pytest.skip(f"backend sm90 runs on sm_90 only; this device is sm_{''.join(map(str, torch.cuda.get_device_capability(0)))}")


def make_sinks(seed: int) -> Any:
    """One sink per query head, natural log, from -3 (negligible next to a few keys) to 9 (above
    the logsumexp of thousands of keys), in a shuffled order so that a wrong head shows."""
    gen = torch.Generator().manual_seed(seed)
    return torch.linspace(-3.0, 9.0, NUM_QO)[torch.randperm(NUM_QO, generator=gen)].to(DEV)


def reference(q: Any, k: Any, v: Any, sinks: Any, window_left: int, sm_scale: float) -> tuple[Any, Any, Any]:
    """One request in fp32: q [Lq, Hq, D], k/v [L, Hk, D] -> (o [Lq, Hq, D], lse [Lq, Hq] natural
    log with the sink, n_eff [Lq, Hq] of the keys' weights; inf for a row without keys)."""
    q, k, v = q.float(), k.float(), v.float()
    lq, n = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    q_pos = torch.arange(lq, device=q.device)[:, None] + (n - lq)
    kv_pos = torch.arange(n, device=q.device)[None, :]
    keep = kv_pos <= q_pos
    if window_left >= 0:
        keep &= kv_pos >= q_pos - window_left
    s = s.masked_fill(~keep[None], float("-inf"))
    full = torch.cat([s, sinks[:, None, None].float().expand(-1, lq, 1)], dim=-1)
    lse = torch.logsumexp(full, dim=-1)  # [Hq, Lq]
    p = torch.exp(full - lse[..., None])[..., :-1].nan_to_num(0.0)  # no key and a -inf sink: 0
    o = torch.einsum("hqk,khd->qhd", p, v)
    sq = (p * p).sum(-1)
    n_eff = torch.where(sq > 0, 1.0 / sq.clamp_min(1e-30), torch.full_like(sq, float("inf")))
    return o, lse.transpose(0, 1), n_eff.transpose(0, 1)


def check(o: Any, lse: Any, ref: tuple[Any, Any, Any], dtype: str, what: str, prefill: bool) -> None:
    """o [rows, Hq, D] and lse [rows, Hq] against the reference of those rows."""
    ref_o, ref_lse, n_eff = ref
    o, lse = o.float(), lse.float()
    assert torch.isfinite(o).all(), f"{what}: non-finite output"
    seen = torch.isfinite(n_eff)  # rows (and heads) that see at least one key
    if (~seen).any():
        assert (o[~seen] == 0).all(), f"{what}: a row without visible keys has a nonzero output"
        lerr = (lse[~seen] - ref_lse[~seen]).abs().max().item()
        assert lerr <= 1e-4, f"{what}: a row without visible keys: lse off the sink by {lerr:.2e}"
    if seen.any():
        err = ((o - ref_o).norm(dim=-1) / ref_o.norm(dim=-1).clamp_min(1e-20))[seen].max().item()
        assert err <= TOL[dtype], f"{what}: relative L2 error {err:.2e} > {TOL[dtype]:.0e}"
        u = UNIT[dtype]
        bound = 0.5 * u + 4 * u / n_eff.clamp_min(1.0).sqrt() if prefill else torch.full_like(n_eff, DECODE_LSE_ATOL)
        excess = ((lse - ref_lse).abs() - bound)[seen].max().item()
        assert excess <= 0, f"{what}: lse error above its bound by {excess:.2e}"


def randn(*shape: int, dtype: str, gen: Any) -> Any:
    return torch.randn(*shape, device=DEV, dtype=TORCH_DT[dtype], generator=gen)


def start(*case: Any) -> tuple[Any, Any]:
    """A test case's generator and sinks, seeded by the case (its first item names the test);
    skips an sm90 case on another device."""
    need(case[1])
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(repr(case).encode()))
    return gen, make_sinks(zlib.crc32(case[0].encode()))


# (backend, dtype, window_left) of a module with a backend axis.
per_backend = pytest.mark.parametrize("backend, dtype, window_left",
                                      [(b, d, w) for b in BACKENDS for d in DTYPES for w in WINDOWS])


# ---- the instances, compiled up front ------------------------------------------------------------


def instances() -> list[tuple[str, dict[str, Any]]]:
    """attention_sink in every module and dtype; sliding_window and default where the -inf test
    calls them (bf16: single decode, causal single and ragged prefill)."""
    out: list[tuple[str, dict[str, Any]]] = []
    backends = BACKENDS if SM90 else ["portable"]
    for dt in DTYPES:
        base = {"dtype": dt, "head_dim": HEAD_DIM, "pos_encoding": "none", "variant": "attention_sink"}
        out.append(("batch_decode", dict(base, page_size=16, kv_dtype="same")))
        for be in backends:
            out.append(("single_decode", dict(base, backend=be)))
            out.append(("single_prefill", dict(base, mask="none", backend=be)))
            out.append(("batch_prefill_paged", dict(base, mask="causal", page_size=16, backend=be, kv_dtype="same")))
    for variant in ("attention_sink", "sliding_window", "default"):
        for dt in (DTYPES if variant == "attention_sink" else ["bf16"]):
            base = {"dtype": dt, "head_dim": HEAD_DIM, "pos_encoding": "none", "variant": variant}
            for be in backends:
                if variant != "attention_sink":
                    out.append(("single_decode", dict(base, backend=be)))
                out.append(("single_prefill", dict(base, mask="causal", backend=be)))
                out.append(("batch_prefill_ragged", dict(base, mask="causal", backend=be, kv_dtype="same")))
    return out


_gpu_cache, _shared_cache = gpu_suite_cache("sinks", instances)


# ---- decode ------------------------------------------------------------------------------------


@per_backend
def test_single_decode(backend: str, dtype: str, window_left: int) -> None:
    gen, sinks = start("single_decode", backend, dtype, window_left)
    sm_scale = 1 / math.sqrt(HEAD_DIM)
    for kv_len in (1, 300, 6000):  # 6000: split over the CTAs (a cluster on sm90) and merged
        q = randn(NUM_QO, HEAD_DIM, dtype=dtype, gen=gen)
        k = randn(kv_len, NUM_KV, HEAD_DIM, dtype=dtype, gen=gen)
        v = randn(kv_len, NUM_KV, HEAD_DIM, dtype=dtype, gen=gen)
        o, lse = flashgen.single_decode(q, k, v, variant="attention_sink", sinks=sinks, window_left=window_left,
                                        return_lse=True, backend=backend)
        ref = reference(q[None], k, v, sinks, window_left, sm_scale)
        check(o[None], lse[None], ref, dtype, f"single_decode {backend} {dtype} w{window_left} n{kv_len}", False)


@pytest.mark.parametrize("window_left", WINDOWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_decode(dtype: str, window_left: int) -> None:
    """Two requests: 6000 tokens (a batch this small splits its KV) and 9 (a single page)."""
    gen, sinks = start("batch_decode", None, dtype, window_left)
    lens = [6000, 9]
    cache, indptr, indices, last = make_paged(lens, 16, HEAD_DIM, "NHD", TORCH_DT[dtype], gen)
    q = randn(len(lens), NUM_QO, HEAD_DIM, dtype=dtype, gen=gen)
    o, lse = flashgen.batch_decode(q, cache, indptr, indices, last, variant="attention_sink", sinks=sinks,
                                   window_left=window_left, return_lse=True)
    for b in range(len(lens)):
        k, v = gather_kv(cache, indptr, indices, lens, b, "NHD")
        ref = reference(q[b][None], k, v, sinks, window_left, 1 / math.sqrt(HEAD_DIM))
        check(o[b][None], lse[b][None], ref, dtype, f"batch_decode {dtype} w{window_left} b{b}", False)


# ---- prefill -----------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@per_backend
def test_single_prefill(backend: str, dtype: str, window_left: int, causal: bool) -> None:
    """causal=False gives the same result: the variant's mask is causal itself."""
    gen, sinks = start("single_prefill", backend, dtype, window_left, causal)
    for qo_len, kv_len in ((100, 300), (16, 8192), (77, 77)):  # 16 x 8192: split-KV and its merge
        q = randn(qo_len, NUM_QO, HEAD_DIM, dtype=dtype, gen=gen)
        k = randn(kv_len, NUM_KV, HEAD_DIM, dtype=dtype, gen=gen)
        v = randn(kv_len, NUM_KV, HEAD_DIM, dtype=dtype, gen=gen)
        o, lse = flashgen.single_prefill(q, k, v, causal=causal, variant="attention_sink", sinks=sinks,
                                         window_left=window_left, return_lse=True, backend=backend)
        ref = reference(q, k, v, sinks, window_left, 1 / math.sqrt(HEAD_DIM))
        check(o, lse, ref, dtype, f"single_prefill {backend} {dtype} w{window_left} causal={causal} "
              f"{qo_len}x{kv_len}", True)


# (qo_len, kv_len) per request: kv_len 0 (every row sees nothing), qo_len > kv_len (the first
# rows see nothing), one query over many keys, a square block.
RAGGED = [(17, 300), (5, 0), (64, 30), (1, 1000), (40, 40)]


@per_backend
def test_batch_prefill_ragged(backend: str, dtype: str, window_left: int) -> None:
    gen, sinks = start("batch_prefill", backend, dtype, window_left)
    qo = [a for a, _ in RAGGED]
    kv = [b for _, b in RAGGED]
    q = randn(sum(qo), NUM_QO, HEAD_DIM, dtype=dtype, gen=gen)
    k = randn(sum(kv), NUM_KV, HEAD_DIM, dtype=dtype, gen=gen)
    v = randn(sum(kv), NUM_KV, HEAD_DIM, dtype=dtype, gen=gen)
    qo_indptr = torch.tensor([0, *torch.tensor(qo).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    kv_indptr = torch.tensor([0, *torch.tensor(kv).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    o, lse = flashgen.batch_prefill(q, qo_indptr, k, v, kv_indptr, causal=True, variant="attention_sink",
                                    sinks=sinks, window_left=window_left, return_lse=True, backend=backend)
    for b in range(len(RAGGED)):
        qs, ks = slice(int(qo_indptr[b]), int(qo_indptr[b + 1])), slice(int(kv_indptr[b]), int(kv_indptr[b + 1]))
        ref = reference(q[qs], k[ks], v[ks], sinks, window_left, 1 / math.sqrt(HEAD_DIM))
        check(o[qs], lse[qs], ref, dtype, f"batch_prefill {backend} {dtype} w{window_left} b{b} {RAGGED[b]}", True)
    # kv_len 0: every row's output is 0 and its LSE the sink, in every head.
    empty = slice(int(qo_indptr[1]), int(qo_indptr[2]))
    assert (o[empty] == 0).all()
    torch.testing.assert_close(lse[empty], sinks[None].expand(RAGGED[1][0], -1), atol=1e-4, rtol=0)


@per_backend
def test_batch_prefill_paged(backend: str, dtype: str, window_left: int) -> None:
    gen, sinks = start("batch_prefill_paged", backend, dtype, window_left)
    reqs = [(33, 500), (1, 16), (70, 70), (9, 2000)]
    lens = [n for _, n in reqs]
    cache, kv_indptr, indices, last = make_paged(lens, 16, HEAD_DIM, "NHD", TORCH_DT[dtype], gen)
    qo = [a for a, _ in reqs]
    q = randn(sum(qo), NUM_QO, HEAD_DIM, dtype=dtype, gen=gen)
    qo_indptr = torch.tensor([0, *torch.tensor(qo).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    o, lse = flashgen.batch_prefill_paged(q, qo_indptr, cache, kv_indptr, indices, last, causal=True,
                                          variant="attention_sink", sinks=sinks, window_left=window_left,
                                          return_lse=True, backend=backend)
    for b in range(len(reqs)):
        k, v = gather_kv(cache, kv_indptr, indices, lens, b, "NHD")
        qs = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        ref = reference(q[qs], k, v, sinks, window_left, 1 / math.sqrt(HEAD_DIM))
        check(o[qs], lse[qs], ref, dtype, f"batch_prefill_paged {backend} {dtype} w{window_left} b{b}", True)


# ---- a sink of -inf is no sink -------------------------------------------------------------------


def _same(got: tuple[Any, Any], want: tuple[Any, Any], what: str) -> None:
    """Outputs within bf16's tolerance of each other (the default variant's sm90 prefill takes
    other tile shapes, so its P rounds at other references), LSEs within 1e-4 (the same logits,
    summed in another order), -inf where no key."""
    (o, lse), (o2, lse2) = got, want
    err = ((o.float() - o2.float()).norm(dim=-1) / o2.float().norm(dim=-1).clamp_min(1e-20)).max().item()
    assert err <= TOL["bf16"], f"{what}: outputs differ by {err:.2e} (relative L2)"
    torch.testing.assert_close(lse, lse2, atol=1e-4, rtol=0, msg=what)


@pytest.mark.parametrize("backend", BACKENDS)
def test_minus_inf_sink_is_sliding_window_and_default(backend: str) -> None:
    gen, _ = start("minus_inf", backend)
    none = torch.full((NUM_QO,), float("-inf"), device=DEV)
    dt = "bf16"
    q1 = randn(NUM_QO, HEAD_DIM, dtype=dt, gen=gen)
    q = randn(64, NUM_QO, HEAD_DIM, dtype=dt, gen=gen)
    k = randn(3000, NUM_KV, HEAD_DIM, dtype=dt, gen=gen)
    v = randn(3000, NUM_KV, HEAD_DIM, dtype=dt, gen=gen)
    qo_indptr = torch.tensor([0, 5, 64], dtype=torch.int32, device=DEV)  # request 0 has no keys
    kv_indptr = torch.tensor([0, 0, 3000], dtype=torch.int32, device=DEV)
    for w in WINDOWS:
        calls = {
            "single_decode": lambda **kw: flashgen.single_decode(q1, k, v, return_lse=True, backend=backend, **kw),
            "single_prefill": lambda **kw: flashgen.single_prefill(q, k, v, causal=True, return_lse=True,
                                                                   backend=backend, **kw),
            "batch_prefill": lambda **kw: flashgen.batch_prefill(q, qo_indptr, k, v, kv_indptr, causal=True,
                                                                 return_lse=True, backend=backend, **kw),
        }
        for name, call in calls.items():
            got = call(variant="attention_sink", sinks=none, window_left=w)
            _same(got, call(variant="sliding_window", window_left=w), f"{name} {backend} w{w} vs sliding_window")
            if w < 0:
                _same(got, call(), f"{name} {backend} vs default")
