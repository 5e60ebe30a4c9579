/**
 * @brief ALiBi: softmax(sm_scale * q.k + slope[qo_head] * (kv_pos - q_pos)); slopes are a device
 * float array with one entry per query head.
 */
#pragma once

#include "flashgen/variants/default.cuh"

template <typename ParamsT_>
struct ALiBi : DefaultAttention<ParamsT_> {
  using ParamsT = ParamsT_;
  static constexpr bool use_softmax = true;

  int32_t q_pos_base;  // position of query 0: kv_len - qo_len (positions fit 32 bits)

  __device__ __host__ ALiBi(const ParamsT& params, uint32_t batch_idx, uint8_t* smem_ptr)
      : DefaultAttention<ParamsT_>(params, batch_idx, smem_ptr),
        q_pos_base(int32_t(params.get_kv_len(batch_idx)) - int32_t(params.get_qo_len(batch_idx))) {}

  template <typename T>
  __device__ __forceinline__ T LogitsTransform(const ParamsT& params, T logits, uint32_t,
                                               uint32_t qo_idx, uint32_t kv_idx,
                                               uint32_t qo_head_idx, uint32_t) {
    const float slope_log2e = __ldg(params.alibi_slopes + qo_head_idx) * math::log2e;
    // 32-bit integer distance (exact; the same float as the former 64-bit form).
    return logits + slope_log2e * float(int32_t(kv_idx) - (q_pos_base + int32_t(qo_idx)));
  }

  /** The same bias for prefill's hoisted form (prefill/hooks.cuh): logits + slope * (kv - origin). */
  __device__ __forceinline__ void LinearBias(const ParamsT& params, uint32_t, uint32_t qo_idx,
                                             uint32_t qo_head_idx, uint32_t, float& slope,
                                             int32_t& origin) {
    slope = __ldg(params.alibi_slopes + qo_head_idx) * math::log2e;
    origin = q_pos_base + int32_t(qo_idx);
  }
};
