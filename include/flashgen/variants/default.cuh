/**
 * @brief DefaultAttention: softmax(sm_scale * q.k) V, the scale folded into the query.
 */
#pragma once

#include "flashgen/variant.cuh"

template <typename ParamsT_>
struct DefaultAttention : AttentionVariantBase<ParamsT_> {
  using ParamsT = ParamsT_;
  static constexpr bool use_softmax = true;

  float scale_log2e;  // sm_scale * log2(e): the kernel's softmax is base 2

  __device__ __host__ DefaultAttention(const ParamsT& params, uint32_t /*batch_idx*/,
                                       uint8_t* /*smem_ptr*/)
      : scale_log2e(params.sm_scale * math::log2e) {}

  template <typename T>
  __device__ __forceinline__ T QueryTransform(const ParamsT&, T q) {
    return q * scale_log2e;
  }
};
