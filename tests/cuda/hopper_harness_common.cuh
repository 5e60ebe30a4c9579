/**
 * What the Hopper harnesses (hopper_prefill_harness.cu, hopper_paged_harness.cu) share beyond
 * prefill_harness_common.cuh: one launch and one workspace size for either implementation of
 * each prefill kind (H: the Hopper kernels, else the portable ones), so that one case or bench
 * can run both.
 */
#pragma once

#include "prefill_harness_common.cuh"
#include "flashgen/hopper/launch.cuh"

template <bool H, Kind K, int D, int MASK, int POS, int PAGE, typename Variant, typename Params>
static int call_kernel(const Params& p, int64_t total_q, int64_t kv_rows, void* ws, int64_t bytes,
                       const DeviceInfo& dev, cudaStream_t st) {
  if constexpr (K == kSingle) {
    if constexpr (H) return hopper::launch_single_prefill<D, MASK, POS, Variant>(p, ws, bytes, dev, st);
    else return prefill::launch_single_prefill<D, MASK, POS, Variant>(p, ws, bytes, dev, st);
  } else if constexpr (K == kRagged) {
    if constexpr (H) {
      return hopper::launch_batch_prefill_ragged<D, MASK, POS, Variant>(p, total_q, kv_rows, ws,
                                                                         bytes, dev, st);
    } else {
      return prefill::launch_batch_prefill_ragged<D, MASK, POS, Variant>(p, total_q, kv_rows, ws,
                                                                          bytes, dev, st);
    }
  } else {
    if constexpr (H) {
      return hopper::launch_batch_prefill_paged<D, PAGE, MASK, POS, Variant>(p, total_q, kv_rows,
                                                                              ws, bytes, dev, st);
    } else {
      return prefill::launch_batch_prefill_paged<D, PAGE, MASK, POS, Variant>(p, total_q, kv_rows,
                                                                               ws, bytes, dev, st);
    }
  }
}

template <bool H, Kind K, int D, int POS, typename T, typename Variant, typename Params>
static int64_t ws_bytes(const Params& p, int64_t total_q, int64_t kv_rows, int64_t batch,
                        const DeviceInfo& dev) {
  if constexpr (K == kSingle) {
    if constexpr (H) {
      return hopper::single_prefill_workspace_bytes<D, POS, Variant, Params>(
          p.qo_len, p.kv_len, p.num_qo_heads, p.num_kv_heads, dev.sm_count);
    } else {
      return prefill::single_prefill_workspace_bytes<D, POS, Variant, Params>(
          p.qo_len, p.kv_len, p.num_qo_heads, p.num_kv_heads, dev.sm_count);
    }
  } else {
    if constexpr (H) {
      return hopper::batch_prefill_workspace_bytes<D, POS, Variant, Params>(
          total_q, kv_rows, batch, p.num_qo_heads, p.num_kv_heads, dev.sm_count);
    } else {
      return prefill::batch_prefill_workspace_bytes<D, POS, Variant, Params>(
          total_q, kv_rows, batch, p.num_qo_heads, p.num_kv_heads, dev.sm_count);
    }
  }
}
