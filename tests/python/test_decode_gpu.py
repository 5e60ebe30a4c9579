"""GPU correctness of single_decode and batch_decode against a plain PyTorch fp32 reference.

Instances come from a folder of `.so` files with a manifest.json (`flashgen build --out DIR`),
named by FLASHGEN_TEST_SO_DIR, and are called through flashgen._kernels. The case matrix
(`single_cases`, `batch_cases`), the data builders and the reference (`reference_decode`) are
plain functions so the same cases can run through the public API later.

Tolerances (see `check`), per query head:
  output:  ||o - ref|| / ||ref|| <= 2.5 u      (bf16 9.8e-3, f16 2.4e-3)
  LSE:     |lse - ref| <= 5e-5                  (natural log)
u is the input dtype's unit roundoff (2^-8 bf16, 2^-10 f16). The kernels round the softmax
weights and the output to that dtype, hence the output bound; the logits themselves are as exact
as fp32 (the transformed query enters the tensor cores as hi + lo parts), hence the flat LSE
bound. One dropped 16-token tile at 32k tokens moves the LSE by ln(1 - 16/32768) = -4.9e-4 and
a wrong scale by far more, so both fail it. Set FLASHGEN_TEST_ERRLOG=path to log every error.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import random
import zlib
from functools import lru_cache

import pytest
from conftest import whole_manifest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from flashgen._kernels import (  # noqa: E402
    BatchDecodeArgs, KernelLibrary, SingleDecodeArgs, params_struct)
from flashgen import FlashgenError  # noqa: E402

SO_DIR = os.environ.get("FLASHGEN_TEST_SO_DIR")
if not SO_DIR:
    pytest.skip("FLASHGEN_TEST_SO_DIR is not set (run `flashgen build --out DIR` and point it "
                "there)", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MATRIX = json.load(open(os.path.join(ROOT, "variants.json")))
VARIANTS = ["default", "soft_cap", "sliding_window", "alibi", "sigmoid"]
CUSTOM = "flash_sigmoid"  # the RFC's FlashSigmoid, renamed: tests/python/custom_variants/
CUSTOM_PARAMS = [{"name": "logits_scale", "type": "float"},
                 {"name": "sigmoid_bias", "type": "float"}]
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
UNIT_ROUNDOFF = {"f16": 2.0 ** -10, "bf16": 2.0 ** -8}
LSE_ATOL = 5e-5
ERRLOG = os.environ.get("FLASHGEN_TEST_ERRLOG")
# A module with a backend axis (single_decode) runs on this backend: FLASHGEN_TEST_BACKEND, else
# the first of the axis's values (the declared order of preference) built for this GPU's arch.
TEST_BACKEND = os.environ.get("FLASHGEN_TEST_BACKEND") or None


@lru_cache(maxsize=None)
def backend_for(module):
    """The backend a module's calls take here, or None for a module with one implementation."""
    from flashgen import _loader, _matrix

    table = _matrix.matrix().module(module).backends
    if table is None:
        return None
    if TEST_BACKEND:
        return TEST_BACKEND
    cc = _loader.device_capability()
    row = table.device(cc)  # the binary's choice for this GPU
    if row is None or not row.backends:
        pytest.fail(f"{module}: no backend runs on compute capability {cc[0]}.{cc[1]}")
    return row.backends[0]

# ---------------------------------------------------------------- case matrix (plain functions)

SINGLE_LENS = [1, 7, 16, 33, 129, 1000, 4097, 32749]
SINGLE_LENS_SHORT = [1, 33, 1000, 32768]


def single_cases():
    """Dicts of (variant, dtype, head_dim, group, kv_len, layout, num_kv_heads)."""
    cases = []
    for dtype in DTYPES:
        for head_dim in (64, 128, 256):
            for variant in VARIANTS:
                full = variant == "default" or head_dim == 128
                for group in (1, 4, 8):
                    for layout in ("NHD", "HND"):
                        lens = SINGLE_LENS if variant == "default" else SINGLE_LENS_SHORT
                        if not full:
                            if group != 4 or layout != "NHD":
                                continue
                            lens = [1000]
                        for kv_len in lens:
                            cases.append(dict(variant=variant, dtype=dtype, head_dim=head_dim,
                                              group=group, kv_len=kv_len, layout=layout,
                                              num_kv_heads=2))
    return cases


BATCH_LENS = [[1], [5, 1, 16, 17, 300, 31, 1000, 2], [4097, 15, 33, 1], [32768, 3, 511]]


def batch_cases():
    """Dicts of (variant, dtype, head_dim, page_size, group, lens, layout, num_kv_heads)."""
    cases = []
    for dtype in DTYPES:
        for head_dim in (64, 128, 256):
            for page_size in (1, 16, 32, 64):
                for variant in VARIANTS:
                    if page_size > 16 and variant != "default":
                        continue  # the larger pages change the page walk only: one variant covers it
                    full = variant == "default" or (head_dim == 128 and page_size == 16)
                    for group in (1, 4, 8):
                        for layout in ("NHD", "HND"):
                            for lens in BATCH_LENS:
                                if not full and (group != 4 or layout != "NHD" or
                                                 lens is not BATCH_LENS[1]):
                                    continue
                                cases.append(dict(variant=variant, dtype=dtype,
                                                  head_dim=head_dim, page_size=page_size,
                                                  group=group, lens=lens, layout=layout,
                                                  num_kv_heads=2))
    return cases


def case_id(case):
    lens = case.get("lens", case.get("kv_len"))
    return "-".join(str(case[k]) for k in ("variant", "dtype", "head_dim") if k in case) + (
        f"-ps{case['page_size']}" if "page_size" in case else "") + (
        f"-g{case['group']}-{case['layout']}-{lens}".replace(" ", ""))


def variant_params(variant, kv_len, num_qo_heads, device, rng):
    """Additional params per variant, drawn so that each one visibly changes the output."""
    if variant == "soft_cap":
        return {"logits_soft_cap": rng.choice([1.5, 4.0])}
    if variant == "sliding_window":
        return {"window_left": rng.choice([-1, 0, 15, max(1, kv_len // 3)])}
    if variant == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / num_qo_heads) for i in range(num_qo_heads)],
                              dtype=torch.float32, device=device)
        return {"alibi_slopes": slopes}
    if variant == "sigmoid":
        return {"sigmoid_bias": rng.choice([-2.0, 0.5])}
    if variant == CUSTOM:
        return {"logits_scale": 0.11, "sigmoid_bias": -1.0}
    return {}


# ---------------------------------------------------------------- reference (plain PyTorch fp32)

def reference_decode(q, k, v, variant, sm_scale, params):
    """One request. q [H, D]; k, v [N, Hkv, D] -> (out [H, D], lse [H], n_eff [H]), fp32."""
    q, k, v = q.float(), k.float(), v.float()
    num_heads, n = q.shape[0], k.shape[0]
    group = num_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("hd,nhd->hn", q, k)
    q_pos = n - 1
    kv_pos = torch.arange(n, device=q.device, dtype=torch.float32)
    if variant in ("sigmoid", CUSTOM):
        scale = params["logits_scale"] if variant == CUSTOM else sm_scale
        w = torch.sigmoid(s * scale + params["sigmoid_bias"])
        out = torch.einsum("hn,nhd->hd", w, v)
        total = w.sum(-1)
        return out, torch.log(total), total ** 2 / (w ** 2).sum(-1)
    logits = s * sm_scale
    if variant == "soft_cap":
        cap = params["logits_soft_cap"]
        logits = cap * torch.tanh(logits / cap)
    elif variant == "alibi":
        logits = logits + params["alibi_slopes"][:, None] * (kv_pos - q_pos)[None, :]
    elif variant == "sliding_window" and params["window_left"] >= 0:
        keep = kv_pos >= q_pos - params["window_left"]
        logits = logits.masked_fill(~keep[None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse[:, None])
    return torch.einsum("hn,nhd->hd", p, v), lse, 1.0 / (p ** 2).sum(-1)


def check(out, lse, ref_out, ref_lse, n_eff, dtype, what):
    """Asserts the per-head tolerances stated in the module docstring."""
    u = UNIT_ROUNDOFF[dtype]
    out, lse = out.float(), lse.float()
    assert torch.isfinite(out).all(), f"{what}: non-finite output (unwritten or NaN)"
    assert torch.isfinite(lse).all(), f"{what}: non-finite lse"
    err = (out - ref_out).norm(dim=-1) / ref_out.norm(dim=-1).clamp_min(1e-30)
    lse_err = (lse - ref_lse).abs()
    worst = lse_err.argmax()
    if ERRLOG:
        with open(ERRLOG, "a") as f:
            f.write(json.dumps({"case": what, "dtype": dtype, "out_rel_l2": err.max().item(),
                                "lse_abs": lse_err.max().item()}) + "\n")
    assert err.max().item() <= 2.5 * u, f"{what}: output rel L2 {err.max().item():.3e} > {2.5 * u:.3e}"
    assert lse_err.max().item() <= LSE_ATOL, (
        f"{what}: lse error {lse_err[worst].item():.3e} > {LSE_ATOL:.1e} "
        f"(n_eff {n_eff[worst].item():.1f})")
    return err.max().item(), lse_err.max().item()


# ---------------------------------------------------------------- instances and calls

@lru_cache(maxsize=None)
def manifest():
    path = os.path.join(SO_DIR, "manifest.json")
    if not os.path.exists(path):
        pytest.skip(f"{path} missing: build instances with `flashgen build --out {SO_DIR}`")
    # A build folder's manifest holds its rows; a wheel's _aot/ keeps them in a file per module.
    # SO_DIR stands where a package keeps _aot/.
    return whole_manifest(lambda rel: open(os.path.join(SO_DIR, os.path.relpath(rel, "_aot"))).read())


@lru_cache(maxsize=None)
def instance(module, **params):
    """(KernelLibrary, codes) of the instance with these axis values, or skip."""
    for inst in manifest()["instances"]:
        if inst["module"] == module and inst["params"] == params:
            return KernelLibrary(os.path.join(SO_DIR, inst["path"])), inst["codes"]
    pytest.skip(f"no {module} instance {params} in {SO_DIR}")


def find_instance(module, **params):
    params.setdefault("pos_encoding", "none")  # RoPE decode is tested through the API (test_prefill_gpu)
    if module == "batch_decode":
        params.setdefault("kv_dtype", "same")  # an fp8 cache is tested through the API (test_fp8_gpu)
    backend = backend_for(module)
    if backend is not None:
        params.setdefault("backend", backend)
    return instance(module, **params)


@lru_cache(maxsize=None)
def _struct(variant):
    if variant == CUSTOM:
        return params_struct(variant, CUSTOM_PARAMS)
    return params_struct(variant, MATRIX["variants"][variant]["params"])


def pack_params(variant, params):
    """(ctypes struct or None, keepalive). Tensors go in as device pointers."""
    fields = _struct(variant)._fields_
    if not fields:
        return None
    values = {k: (v.data_ptr() if torch.is_tensor(v) else v) for k, v in params.items()}
    return _struct(variant)(**values)


def _ptr(struct):
    return ctypes.addressof(struct) if struct is not None else None


def run_single(lib, codes, q, k, v, layout, variant, sm_scale, params, with_lse=True):
    """Calls flashgen_single_decode; k, v in NHD [N, Hkv, D] or HND [Hkv, N, D]."""
    num_heads, head_dim = q.shape
    if layout == "NHD":
        kv_len, num_kv_heads = k.shape[0], k.shape[1]
        ksn, ksh, vsn, vsh = k.stride(0), k.stride(1), v.stride(0), v.stride(1)
    else:
        num_kv_heads, kv_len = k.shape[0], k.shape[1]
        ksn, ksh, vsn, vsh = k.stride(1), k.stride(0), v.stride(1), v.stride(0)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((num_heads,), float("nan"), device=q.device) if with_lse else None
    st = pack_params(variant, params)
    args = SingleDecodeArgs(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
        lse=lse.data_ptr() if lse is not None else None,
        stream=torch.cuda.current_stream().cuda_stream, additional_params=_ptr(st),
        num_qo_heads=num_heads,
        num_kv_heads=num_kv_heads, kv_len=kv_len, head_dim=head_dim, q_stride_h=q.stride(0),
        k_stride_n=ksn, k_stride_h=ksh, v_stride_n=vsn, v_stride_h=vsh, o_stride_h=o.stride(0),
        dtype_code=codes["dtype"], variant_code=codes["variant"],
        backend_code=codes.get("backend", 0), sm_scale=sm_scale)
    ws_bytes = lib.workspace_size("single_decode", args)
    ws = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=q.device)
    args.workspace, args.workspace_bytes = ws.data_ptr(), ws_bytes
    lib.single_decode(args)
    return o, lse


def make_paged(lens, page_size, num_kv_heads, head_dim, layout, dtype, device, gen):
    """Random shuffled pages for `lens`: (paged_kv, indptr, indices, last, per-request (k, v))."""
    npages = [-(-n // page_size) for n in lens]
    total = sum(npages) + 3  # a few pages nobody uses
    if layout == "NHD":
        shape = (total, 2, page_size, num_kv_heads, head_dim)
    else:
        shape = (total, 2, num_kv_heads, page_size, head_dim)
    paged = torch.randn(shape, generator=gen, device=device).to(dtype)
    perm = torch.randperm(total, generator=gen, device=device)[: sum(npages)].to(torch.int32)
    indptr = torch.tensor([0] + list(torch.tensor(npages).cumsum(0).tolist()),
                          dtype=torch.int32, device=device)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lens, npages)],
                        dtype=torch.int32, device=device)
    per_request = []
    for b, n in enumerate(lens):
        pages = perm[indptr[b]:indptr[b + 1]].long()
        kv = paged[pages]  # [np, 2, ...]
        if layout == "HND":
            kv = kv.transpose(2, 3)  # -> [np, 2, ps, Hkv, D]
        kv = kv.transpose(0, 1).reshape(2, -1, num_kv_heads, head_dim)[:, :n]
        per_request.append((kv[0], kv[1]))
    return paged, indptr, perm, last, per_request


def run_batch(lib, codes, q, paged, indptr, indices, last, page_size, layout, variant, sm_scale,
              params, with_lse=True):
    batch, num_heads, head_dim = q.shape
    if layout == "NHD":
        num_kv_heads = paged.shape[3]
        s_n, s_h = paged.stride(2), paged.stride(3)
    else:
        num_kv_heads = paged.shape[2]
        s_n, s_h = paged.stride(3), paged.stride(2)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((batch, num_heads), float("nan"), device=q.device) if with_lse else None
    st = pack_params(variant, params)
    args = BatchDecodeArgs(
        q=q.data_ptr(), paged_kv=paged.data_ptr(), kv_indptr=indptr.data_ptr(),
        kv_indices=indices.data_ptr(), kv_last_page_len=last.data_ptr(), o=o.data_ptr(),
        lse=lse.data_ptr() if lse is not None else None,
        stream=torch.cuda.current_stream().cuda_stream, additional_params=_ptr(st),
        batch_size=batch,
        num_qo_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        page_size=page_size, q_stride_b=q.stride(0), q_stride_h=q.stride(1),
        kv_stride_page=paged.stride(0), kv_stride_kv=paged.stride(1), kv_stride_n=s_n,
        kv_stride_h=s_h, o_stride_b=o.stride(0), o_stride_h=o.stride(1),
        dtype_code=codes["dtype"], variant_code=codes["variant"], kv_dtype_code=codes["kv_dtype"],
        sm_scale=sm_scale)
    ws_bytes = lib.workspace_size("batch_decode", args)
    ws = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=q.device)
    args.workspace, args.workspace_bytes = ws.data_ptr(), ws_bytes
    lib.batch_decode(args)
    return o, lse


# ---------------------------------------------------------------- tests

def _seed(case):
    return zlib.crc32(case_id(case).encode())


@pytest.mark.parametrize("case", single_cases(), ids=case_id)
def test_single_decode(case):
    lib, codes = find_instance("single_decode", dtype=case["dtype"], head_dim=case["head_dim"],
                               variant=case["variant"])
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(_seed(case))
    rng = random.Random(_seed(case))
    dtype, d, hkv = DTYPES[case["dtype"]], case["head_dim"], case["num_kv_heads"]
    h, n = hkv * case["group"], case["kv_len"]
    q = torch.randn(h, d, generator=gen, device=dev).to(dtype)
    k = torch.randn(n, hkv, d, generator=gen, device=dev).to(dtype)
    v = torch.randn(n, hkv, d, generator=gen, device=dev).to(dtype)
    params = variant_params(case["variant"], n, h, dev, rng)
    sm_scale = 1.0 / math.sqrt(d)
    if case["layout"] == "HND":
        kk, vv = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    else:
        kk, vv = k, v
    o, lse = run_single(lib, codes, q, kk, vv, case["layout"], case["variant"], sm_scale, params)
    ref_o, ref_lse, n_eff = reference_decode(q, k, v, case["variant"], sm_scale, params)
    check(o, lse, ref_o, ref_lse, n_eff, case["dtype"], case_id(case))


@pytest.mark.parametrize("case", batch_cases(), ids=case_id)
def test_batch_decode(case):
    lib, codes = find_instance("batch_decode", dtype=case["dtype"], head_dim=case["head_dim"],
                               page_size=case["page_size"], variant=case["variant"])
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(_seed(case))
    rng = random.Random(_seed(case))
    dtype, d, hkv = DTYPES[case["dtype"]], case["head_dim"], case["num_kv_heads"]
    h, lens = hkv * case["group"], case["lens"]
    paged, indptr, indices, last, per_req = make_paged(lens, case["page_size"], hkv, d,
                                                      case["layout"], dtype, dev, gen)
    # q rows strided (a sliced [B, H, 2D] buffer) to exercise q_stride_b.
    q = torch.randn(len(lens), h, 2 * d, generator=gen, device=dev).to(dtype)[:, :, :d]
    params = variant_params(case["variant"], min(lens), h, dev, rng)
    sm_scale = 1.0 / math.sqrt(d)
    o, lse = run_batch(lib, codes, q, paged, indptr, indices, last, case["page_size"],
                       case["layout"], case["variant"], sm_scale, params)
    for b, (k, v) in enumerate(per_req):
        ref_o, ref_lse, n_eff = reference_decode(q[b], k, v, case["variant"], sm_scale, params)
        check(o[b], lse[b], ref_o, ref_lse, n_eff, case["dtype"], f"{case_id(case)} request {b}")


@pytest.mark.parametrize("module", ["single_decode", "batch_decode"])
def test_custom_variant_rfc_flash_sigmoid(module):
    """The RFC's FlashSigmoid, unchanged but for its name, built through the same path."""
    extra = {"page_size": 16} if module == "batch_decode" else {}
    lib, codes = find_instance(module, dtype="bf16", head_dim=128, variant=CUSTOM, **extra)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(7)
    params = variant_params(CUSTOM, 0, 0, dev, random)
    hkv, h, d = 2, 8, 128
    for n in (1, 77, 5000):
        k = torch.randn(n, hkv, d, generator=gen, device=dev).to(torch.bfloat16)
        v = torch.randn(n, hkv, d, generator=gen, device=dev).to(torch.bfloat16)
        q = torch.randn(h, d, generator=gen, device=dev).to(torch.bfloat16)
        if module == "single_decode":
            o, lse = run_single(lib, codes, q, k, v, "NHD", CUSTOM, 0.5, params)
        else:
            npg = -(-n // 16)
            paged = torch.zeros(npg, 2, 16, hkv, d, dtype=torch.bfloat16, device=dev)
            for j, t in enumerate((k, v)):
                padded = torch.zeros(npg * 16, hkv, d, dtype=torch.bfloat16, device=dev)
                padded[:n] = t
                paged[:, j] = padded.view(npg, 16, hkv, d)
            indptr = torch.tensor([0, npg], dtype=torch.int32, device=dev)
            indices = torch.arange(npg, dtype=torch.int32, device=dev)
            last = torch.tensor([n - (npg - 1) * 16], dtype=torch.int32, device=dev)
            o, lse = run_batch(lib, codes, q[None], paged, indptr, indices, last, 16, "NHD",
                               CUSTOM, 0.5, params)
            o, lse = o[0], lse[0]
        ref_o, ref_lse, n_eff = reference_decode(q, k, v, CUSTOM, 0.5, params)
        check(o, lse, ref_o, ref_lse, n_eff, "bf16", f"{module} {CUSTOM} n={n}")


@pytest.mark.parametrize("variant", ["default", "sigmoid"])
def test_single_decode_reuses_one_workspace(variant):
    """Split-KV calls back to back on one workspace, first filled with garbage (0xff bytes):
    the in-kernel merge must neither trust stale completion flags nor leave any behind."""
    lib, codes = find_instance("single_decode", dtype="bf16", head_dim=128, variant=variant)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(11)
    hkv, h, d = 2, 8, 128
    sizes = {n: lib.workspace_size("single_decode", SingleDecodeArgs(
        num_qo_heads=h, num_kv_heads=hkv, kv_len=n, head_dim=d, dtype_code=codes["dtype"],
        variant_code=codes["variant"], backend_code=codes.get("backend", 0))) for n in (32768, 1000, 129)}
    ws = torch.full((max(sizes.values()),), 255, dtype=torch.uint8, device=dev)
    for i, n in enumerate([32768, 32768, 1000, 32768, 129, 1000]):
        q = torch.randn(h, d, generator=gen, device=dev).to(torch.bfloat16)
        k = torch.randn(n, hkv, d, generator=gen, device=dev).to(torch.bfloat16)
        v = torch.randn(n, hkv, d, generator=gen, device=dev).to(torch.bfloat16)
        params = variant_params(variant, n, h, dev, random.Random(i))
        o = torch.full_like(q, float("nan"))
        lse = torch.full((h,), float("nan"), device=dev)
        st = pack_params(variant, params)
        lib.single_decode(SingleDecodeArgs(
            q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=lse.data_ptr(),
            stream=torch.cuda.current_stream().cuda_stream, additional_params=_ptr(st),
            workspace=ws.data_ptr(), workspace_bytes=sizes[n], num_qo_heads=h, num_kv_heads=hkv,
            kv_len=n, head_dim=d, q_stride_h=q.stride(0), k_stride_n=k.stride(0),
            k_stride_h=k.stride(1), v_stride_n=v.stride(0), v_stride_h=v.stride(1),
            o_stride_h=o.stride(0), dtype_code=codes["dtype"], variant_code=codes["variant"],
            backend_code=codes.get("backend", 0), sm_scale=1 / math.sqrt(d)))
        ref_o, ref_lse, n_eff = reference_decode(q, k, v, variant, 1 / math.sqrt(d), params)
        check(o, lse, ref_o, ref_lse, n_eff, "bf16", f"reuse {variant} call {i} n={n}")


def test_errors_are_statuses_not_crashes():
    lib, codes = find_instance("single_decode", dtype="bf16", head_dim=128, variant="default")
    dev = torch.device("cuda")
    q = torch.randn(8, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(100, 2, 128, device=dev, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    stream = torch.cuda.current_stream().cuda_stream

    def call(**kw):
        a = dict(q=q.data_ptr(), k=k.data_ptr(), v=k.data_ptr(), o=o.data_ptr(), lse=None,
                 num_qo_heads=8, num_kv_heads=2, kv_len=60, head_dim=128, q_stride_h=128,
                 k_stride_n=256, k_stride_h=128, v_stride_n=256, v_stride_h=128, o_stride_h=128,
                 dtype_code=codes["dtype"], variant_code=codes["variant"],
                 backend_code=codes.get("backend", 0), sm_scale=0.1,
                 additional_params=None, workspace=None, workspace_bytes=0, stream=stream)
        a.update(kw)
        lib.single_decode(SingleDecodeArgs(**a))

    for kw, status in [(dict(num_kv_heads=3), 1), (dict(kv_len=0), 1), (dict(k=None), 1),
                       (dict(k=k.data_ptr() + 2), 1), (dict(k_stride_n=250), 1),
                       (dict(dtype_code=codes["dtype"] ^ 1), 2), (dict(head_dim=96), 2),
                       (dict(variant_code=99), 2), (dict(kv_len=100000), 3)]:
        with pytest.raises(FlashgenError) as e:
            call(**kw)
        assert e.value.status == status, (kw, e.value)
        assert e.value.message, kw
    with pytest.raises(FlashgenError) as e:
        lib.single_decode(0)  # a NULL arguments struct
    assert e.value.status == 1 and "NULL" in e.value.message
    call()  # still works after the failures
    torch.cuda.synchronize()
    q_codes = [codes["dtype"], 128, codes["pos_encoding"], codes["variant"]]
    want = "dtype=bf16 head_dim=128 pos_encoding=none variant=default"
    tail = []
    if "backend" in codes:  # the backend axis is the last one
        tail = [codes["backend"]]
        want += f" backend={backend_for('single_decode')}"
    assert lib.query("single_decode", q_codes + tail) == want
    with pytest.raises(FlashgenError) as e:
        lib.query("single_decode", [codes["dtype"], 64, codes["pos_encoding"], codes["variant"]] + tail)
    assert e.value.status == 2
