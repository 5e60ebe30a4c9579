/**
 * @brief SlidingWindow: default attention over kv positions [q_pos - window_left, q_pos] only;
 * window_left < 0 means no window (causal only).
 */
#pragma once

#include "flashgen/variants/default.cuh"

template <typename ParamsT_>
struct SlidingWindow : DefaultAttention<ParamsT_> {
  using ParamsT = ParamsT_;
  static constexpr bool use_softmax = true;

  int64_t q_pos_base;  // position of query 0: kv_len - qo_len
  int32_t window_left;

  __device__ __host__ SlidingWindow(const ParamsT& params, uint32_t batch_idx, uint8_t* smem_ptr)
      : DefaultAttention<ParamsT_>(params, batch_idx, smem_ptr),
        q_pos_base(int64_t(params.get_kv_len(batch_idx)) - params.get_qo_len(batch_idx)),
        window_left(params.window_left) {}

  __device__ __forceinline__ bool LogitsMask(const ParamsT&, uint32_t, uint32_t qo_idx,
                                             uint32_t kv_idx, uint32_t, uint32_t) {
    const int64_t q_pos = q_pos_base + qo_idx;
    return int64_t(kv_idx) <= q_pos && (window_left < 0 || int64_t(kv_idx) + window_left >= q_pos);
  }

  /** LogitsMask keeps exactly lo <= kv <= hi (prefill/hooks.cuh: tiles outside are skipped,
   *  tiles inside run mask-free, the others test the bounds). From the kernel's lengths, not
   *  q_pos_base: the prefill kernels then never read the lengths for the variant. */
  __device__ __forceinline__ void MaskBounds(const ParamsT&, uint32_t, int32_t qo_len,
                                             int32_t kv_len, uint32_t qo_idx, int32_t& lo,
                                             int32_t& hi) {
    const int64_t q_pos = int64_t(kv_len) - qo_len + qo_idx;
    hi = int32_t(q_pos);
    const int64_t lo64 = window_left < 0 ? 0 : q_pos - window_left;
    lo = lo64 < 0 ? 0 : int32_t(lo64);
  }
};
