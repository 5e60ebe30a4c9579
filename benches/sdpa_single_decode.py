"""SDPA peers for single decode (bf16, 32 qo / 8 kv heads, d128): the timing method of
benches/bench_decode.py (median of 50, L2 flushed by a 256 MB memset before each call).
    python3 benches/sdpa_single_decode.py
"""
import statistics, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
DEV = "cuda"; HQ, HKV, D = 32, 8, 128
flush = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
def timer(fn, iters=50):
    for _ in range(3): fn()
    s = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    e = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for a, b in zip(s, e):
        flush.zero_(); a.record(); fn(); b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(s, e)) * 1e-3
print(torch.cuda.get_device_name(), torch.__version__)
for kv in (32768, 8192, 1024):
    q = torch.randn(1, HQ, 1, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(1, HKV, kv, D, device=DEV, dtype=torch.bfloat16); v = torch.randn_like(k)
    nbytes = 2 * q.numel() * 2 + 2 * k.numel() * 2
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        def fn():
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        try:
            t = timer(fn)
            print(f"SDPA-{name} single {kv}: {t*1e6:8.2f} us {nbytes/t/1e12:6.3f} TB/s")
        except Exception as ex:
            print(f"SDPA-{name} single {kv}: n/a ({str(ex)[:80]})")
