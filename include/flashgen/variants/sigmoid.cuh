/**
 * @brief Sigmoid: out = sum_j sigmoid(sm_scale * q.k_j + sigmoid_bias) v_j, not normalized.
 */
#pragma once

#include "flashgen/variant.cuh"

template <typename ParamsT_>
struct Sigmoid : AttentionVariantBase<ParamsT_> {
  using ParamsT = ParamsT_;
  static constexpr bool use_softmax = false;

  float scale_log2e;  // sm_scale * log2(e), folded into the query
  float bias_log2e;   // sigmoid_bias * log2(e)

  __device__ __host__ Sigmoid(const ParamsT& params, uint32_t /*batch_idx*/, uint8_t* /*smem_ptr*/)
      : scale_log2e(params.sm_scale * math::log2e),
        bias_log2e(params.sigmoid_bias * math::log2e) {}

  template <typename T>
  __device__ __forceinline__ T QueryTransform(const ParamsT&, T q) {
    return q * scale_log2e;
  }

  template <typename T>
  __device__ __forceinline__ T LogitsTransform(const ParamsT&, T logits, uint32_t, uint32_t,
                                               uint32_t, uint32_t, uint32_t) {
    return math::ptx_rcp(1.f + math::ptx_exp2(-(logits + bias_log2e)));
  }
};
