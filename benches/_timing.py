"""The GPU timer the benches share: the median of CUDA-event timings, each iteration after a
flush of the L2 (a 256 MiB write), after three warm-up calls."""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch

FLUSH_BYTES = 256 << 20


class Timer:
    def __init__(self, iters: int, device: Any = "cuda") -> None:
        self.iters = iters
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)

    def __call__(self, fn: Callable[[], Any]) -> float:
        """Seconds per call of ``fn`` (median)."""
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        for s, e in zip(starts, ends):
            self.flush_buf.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e-3
