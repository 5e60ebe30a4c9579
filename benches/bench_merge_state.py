"""merge_state's bandwidth on one GPU: two states of n=8192 tokens, 32 heads, head_dim 128 merged
into a third, against a plain device-to-device copy of the same bytes.

    python benches/bench_merge_state.py [--iters 50] [--dtype bf16]

Through the public API (the instance comes from the wheel, the cache or the JIT). Bytes are what
the call must move: both states' values and LSEs read, the merged values and LSE written. The
copy moves as many bytes (read and write), the ceiling a memory-bound kernel can aim for.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from _timing import Timer  # noqa: E402

import flashgen  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    n, h, d = args.n, args.heads, args.head_dim
    v_a, v_b = (torch.randn(n, h, d, device="cuda", dtype=dt) for _ in range(2))
    s_a, s_b = (torch.randn(n, h, device="cuda") * 4 for _ in range(2))
    timer = Timer(args.iters)
    moved = 3 * v_a.numel() * v_a.element_size() + 3 * s_a.numel() * 4
    merge_s = timer(lambda: flashgen.merge_state(v_a, s_a, v_b, s_b))
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_s = timer(lambda: dst.copy_(src))
    print(f"merge_state {args.dtype} n={n} heads={h} head_dim={d}: {merge_s * 1e6:.1f} us, "
          f"{moved / merge_s / 1e9:.0f} GB/s; a copy of as many bytes: {copy_s * 1e6:.1f} us, "
          f"{moved / copy_s / 1e9:.0f} GB/s ({merge_s / copy_s:.2f}x its time)")


if __name__ == "__main__":
    main()
