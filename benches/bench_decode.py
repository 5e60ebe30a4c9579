"""Decode bandwidth on one GPU: flashgen single/batch decode against PyTorch SDPA and a copy.

    FLASHGEN_BENCH_SO_DIR=DIR python benches/bench_decode.py [--iters 50] [--json out.json]

DIR holds instance .so files and manifest.json (`flashgen build --out DIR`). Each timing is the
median over --iters runs of CUDA events around one call, with the L2 flushed before every run
(a 256 MB memset, which also gives the host time to queue the call). Bytes are what the call
must move: Q + K + V + O (the page table and the LSE are left out).

At 128 x 8192 the batch decode also runs over an fp8 (e4m3) cache when DIR holds that instance
(`flashgen build --module batch_decode --where dtype=bf16 --where head_dim=128 --where
page_size=16 --where pos_encoding=none --where variant=default --where 'kv_dtype=*'`): its row
gives the speedup over the bf16 cache, and, with --fp8-ceiling TB/s (read_ceiling.cu's best
plain read of the same bytes: its 64 x 8192 rows, 2.15 GB), its share of that ceiling.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from _timing import Timer  # noqa: E402
from flashgen._kernels import (  # noqa: E402
    BatchDecodeArgs, KernelLibrary, SingleDecodeArgs, params_struct)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX = json.load(open(os.path.join(ROOT, "variants.json")))
DEV = torch.device("cuda")
HQ, HKV, D, PS = 32, 8, 128, 16
DT = torch.bfloat16


def load(so_dir):
    man = json.load(open(os.path.join(so_dir, "manifest.json")))
    libs = {}
    for inst in man["instances"]:
        key = (inst["module"],) + tuple(sorted(inst["params"].items()))
        libs[key] = (inst, os.path.join(so_dir, inst["path"]))
    return libs


_loaded = {}


def instance(libs, module, **params):
    params.setdefault("pos_encoding", "none")
    if module == "batch_decode":
        params.setdefault("kv_dtype", "same")
    key = (module,) + tuple(sorted(params.items()))
    inst, path = libs[key]
    if path not in _loaded:
        _loaded[path] = KernelLibrary(path)
    return _loaded[path], inst["codes"]


def variant_args(variant):
    if variant == "soft_cap":
        vals = {"logits_soft_cap": 30.0}
    elif variant == "sliding_window":
        vals = {"window_left": 1024}
    elif variant == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / HQ) for i in range(HQ)], device=DEV)
        vals = {"alibi_slopes": slopes}
    elif variant == "sigmoid":
        vals = {"sigmoid_bias": 0.0}
    else:
        return None, []
    st = params_struct(variant, MATRIX["variants"][variant]["params"])(
        **{k: (v.data_ptr() if torch.is_tensor(v) else v) for k, v in vals.items()})
    return st, [vals]


def batch_setup(batch, kv_len, cache_dtype=DT):
    npg = kv_len // PS
    total = batch * npg
    paged = torch.randn(total, 2, PS, HKV, D, device=DEV, dtype=DT).to(cache_dtype)
    indices = torch.randperm(total, device=DEV).to(torch.int32)
    indptr = torch.arange(0, total + 1, npg, device=DEV, dtype=torch.int32)
    last = torch.full((batch,), PS, device=DEV, dtype=torch.int32)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=DT)
    o = torch.empty_like(q)
    nbytes = 2 * q.numel() * 2 + batch * kv_len * HKV * D * 2 * paged.element_size()
    return paged, indices, indptr, last, q, o, nbytes


def batch_call(lib, codes, variant, batch, st_setup):
    paged, indices, indptr, last, q, o, _ = st_setup
    st, keep = variant_args(variant)
    ws_bytes = lib.workspace_size("batch_decode", BatchDecodeArgs(
        batch_size=batch, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PS,
        dtype_code=codes["dtype"], variant_code=codes["variant"], kv_dtype_code=codes["kv_dtype"]))
    ws = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device=DEV)  # zeroed once (abi.h)
    stream = torch.cuda.current_stream().cuda_stream
    args = BatchDecodeArgs(
        q=q.data_ptr(), paged_kv=paged.data_ptr(), kv_indptr=indptr.data_ptr(),
        kv_indices=indices.data_ptr(), kv_last_page_len=last.data_ptr(), o=o.data_ptr(), lse=None,
        stream=stream, additional_params=ctypes.addressof(st) if st is not None else None,
        workspace=ws.data_ptr(), workspace_bytes=ws_bytes, batch_size=batch, num_qo_heads=HQ,
        num_kv_heads=HKV, head_dim=D, page_size=PS, q_stride_b=q.stride(0), q_stride_h=q.stride(1),
        kv_stride_page=paged.stride(0), kv_stride_kv=paged.stride(1), kv_stride_n=paged.stride(2),
        kv_stride_h=paged.stride(3), o_stride_b=o.stride(0), o_stride_h=o.stride(1),
        dtype_code=codes["dtype"], variant_code=codes["variant"], kv_dtype_code=codes["kv_dtype"],
        sm_scale=1 / math.sqrt(D), k_scale=1.0, v_scale=1.0)
    fn, addr = lib.batch_decode, ctypes.addressof(args)
    return lambda: fn(addr), (st, keep, ws, args)


def fp8_row(row, timer, libs, batch, kv_len, t_bf16, ceiling):
    """The same batch decode over an e4m3 cache: its time, its speedup over the bf16 cache and
    its share of the read ceiling of its bytes."""
    try:
        lib, codes = instance(libs, "batch_decode", dtype="bf16", head_dim=D, page_size=PS,
                              variant="default", kv_dtype="fp8_e4m3")
    except KeyError:
        print("  (no kv_dtype=fp8_e4m3 instance in the build folder: fp8 row skipped)", flush=True)
        return
    setup = batch_setup(batch, kv_len, torch.float8_e4m3fn)
    fn, keep = batch_call(lib, codes, "default", batch, setup)
    t = timer(fn)
    nbytes = setup[-1]
    share = (f", {nbytes / t / 1e12 / ceiling * 100:.0f}% of the {ceiling:.2f} TB/s ceiling"
             if ceiling else "")
    row(f"  fp8_e4m3 cache {batch}x{kv_len} ({t_bf16 / t:.2f}x bf16{share})", t, nbytes,
        ">= 1.8x bf16, >= 90% of the fp8 bytes' read ceiling")
    del setup, keep
    torch.cuda.empty_cache()


def sdpa_fns(q4, k4, v4):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = {}
    for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        def fn(backend=backend):
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True)
        try:
            fn()
            torch.cuda.synchronize()
            out[name] = fn
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is reported
            out[name] = repr(e).splitlines()[0][:80]
    return out


def profile_kernels(fn, timer):
    """Average device time per kernel over 20 flushed calls."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                timer.flush_buf.zero_()
                fn()
            torch.cuda.synchronize()
        for evt in prof.key_averages():
            if "decode" in evt.key or "merge" in evt.key:
                total = getattr(evt, "device_time_total", None) or evt.cuda_time_total
                print(f"    kernel {evt.key[:70]}: {total / evt.count:.1f} us x{evt.count}")
    except Exception as e:  # noqa: BLE001 - profiling is optional
        print(f"    (profiler failed: {e!r})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--so-dir", default=os.environ.get("FLASHGEN_BENCH_SO_DIR"))
    ap.add_argument("--quick", action="store_true", help="flashgen default rows only")
    ap.add_argument("--profile", action="store_true", help="per-kernel times (torch.profiler)")
    ap.add_argument("--single-only", action="store_true", help="single_decode rows only")
    ap.add_argument("--fp8-ceiling", type=float, default=None,
                    help="TB/s of read_ceiling.cu's best read of the fp8 cache's bytes (its "
                         "64 x 8192 rows), to report the fp8 batch decode's share of it")
    ap.add_argument("--backend", default=None,
                    help="single_decode's backend (default: sm90 on compute capability 9.x, else "
                         "portable)")
    a = ap.parse_args()
    libs = load(a.so_dir)
    timer = Timer(a.iters)
    rows = []

    def row(name, seconds, nbytes, goal=""):
        tbs = nbytes / seconds / 1e12 if isinstance(seconds, float) else float("nan")
        rows.append({"case": name, "us": seconds * 1e6 if isinstance(seconds, float) else None,
                     "TB/s": tbs, "goal": goal})
        us = f"{seconds * 1e6:10.1f}" if isinstance(seconds, float) else f"{'n/a':>10}"
        print(f"{name:44s} {us} us {tbs:7.2f} TB/s  {goal}"
              + ("" if isinstance(seconds, float) else f"  ({seconds})"), flush=True)

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}, median of {a.iters}, "
          "L2 flushed", flush=True)
    # Ceiling: a device-to-device copy of 2 GB.
    if not a.quick and not a.single_only:
        src = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
        dst = torch.empty_like(src)
        row("copy 1 GiB (read + write)", timer(lambda: dst.copy_(src)), 2 * src.numel())
        del src, dst

    for batch, kv_len, goal in (() if a.single_only else
                                ((64, 4096, ">= 4.2 TB/s"), (128, 8192, ">= 4.4 TB/s"))):
        setup = batch_setup(batch, kv_len)
        nbytes = setup[-1]
        lib, codes = instance(libs, "batch_decode", dtype="bf16", head_dim=D, page_size=PS,
                              variant="default")
        fn, keep = batch_call(lib, codes, "default", batch, setup)
        t_default = timer(fn)
        row(f"batch_decode {batch}x{kv_len} default", t_default, nbytes, goal)
        if batch == 128:
            fp8_row(row, timer, libs, batch, kv_len, t_default, a.fp8_ceiling)
        if a.profile:
            profile_kernels(fn, timer)
        if a.quick:
            del setup, keep
            torch.cuda.empty_cache()
            continue
        q4 = setup[4].view(batch, HQ, 1, D)
        k4 = torch.randn(batch, HKV, kv_len, D, device=DEV, dtype=DT)
        v4 = torch.randn_like(k4)
        for name, f in sdpa_fns(q4, k4, v4).items():
            row(f"  {name} {batch}x{kv_len} (contiguous)", timer(f) if callable(f) else f, nbytes)
        del k4, v4, q4
        if batch == 64:
            for variant in ("soft_cap", "sliding_window", "alibi", "sigmoid"):
                try:
                    lib, codes = instance(libs, "batch_decode", dtype="bf16", head_dim=D,
                                          page_size=PS, variant=variant)
                except KeyError:
                    continue
                fn, keep = batch_call(lib, codes, variant, batch, setup)
                t = timer(fn)
                row(f"  {variant} {batch}x{kv_len} (+{(t / t_default - 1) * 100:.1f}%)", t, nbytes,
                    "< 5% over default")
        del setup, keep
        torch.cuda.empty_cache()

    sd = {}
    if any(ax["type"] == "backend" for ax in MATRIX["modules"]["single_decode"]["axes"]):
        sd["backend"] = a.backend or ("sm90" if torch.cuda.get_device_capability()[0] == 9
                                      else "portable")
    lib, codes = instance(libs, "single_decode", dtype="bf16", head_dim=D, variant="default", **sd)
    tag = f" [{sd['backend']}]" if sd else ""
    for kv_len, goal in ((32768, "> 3.8 TB/s"), (1024, "< 8 us")):
        q = torch.randn(HQ, D, device=DEV, dtype=DT)
        k = torch.randn(kv_len, HKV, D, device=DEV, dtype=DT)
        v = torch.randn_like(k)
        o = torch.empty_like(q)
        ws_bytes = lib.workspace_size("single_decode", SingleDecodeArgs(
            num_qo_heads=HQ, num_kv_heads=HKV, kv_len=kv_len, head_dim=D, dtype_code=codes["dtype"],
            variant_code=codes["variant"], backend_code=codes.get("backend", 0)))
        ws = torch.zeros(max(ws_bytes, 16), dtype=torch.uint8, device=DEV)  # zeroed once (abi.h)
        stream = torch.cuda.current_stream().cuda_stream
        args = SingleDecodeArgs(
            q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=None,
            stream=stream, additional_params=None, workspace=ws.data_ptr(),
            workspace_bytes=ws_bytes, num_qo_heads=HQ, num_kv_heads=HKV, kv_len=kv_len,
            head_dim=D, q_stride_h=D, k_stride_n=HKV * D, k_stride_h=D, v_stride_n=HKV * D,
            v_stride_h=D, o_stride_h=D, dtype_code=codes["dtype"], variant_code=codes["variant"],
            backend_code=codes.get("backend", 0), sm_scale=1 / math.sqrt(D))
        f, addr = lib.single_decode, ctypes.addressof(args)
        nbytes = 2 * q.numel() * 2 + 2 * k.numel() * 2
        row(f"single_decode {kv_len} default{tag}", timer(lambda: f(addr)), nbytes, goal)
        if a.profile:
            profile_kernels(lambda: f(addr), timer)
        if a.quick:
            continue
        q4 = q.view(1, HQ, 1, D)
        k4 = k.permute(1, 0, 2).contiguous()[None]
        v4 = v.permute(1, 0, 2).contiguous()[None]
        for name, fn in sdpa_fns(q4, k4, v4).items():
            row(f"  {name} single {kv_len}", timer(fn) if callable(fn) else fn, nbytes)

    # Host cost of one ctypes call (a call the C side rejects at once: no launch).
    raw = lib.entry("single_decode")
    bad = SingleDecodeArgs.from_buffer_copy(args)
    bad.num_kv_heads = 3  # does not divide 32: INVALID_ARGUMENT before any CUDA call
    bad_addr = ctypes.addressof(bad)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        raw(bad_addr)
    host_us = (time.perf_counter() - t0) / n * 1e6
    print(f"ctypes call of flashgen_single_decode (args struct, rejected): {host_us:.2f} us",
          flush=True)
    rows.append({"case": "ctypes call overhead", "us": host_us})
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
