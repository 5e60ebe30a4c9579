/**
 * @brief Sigmoid: out = sum_j sigmoid(sm_scale * q.k_j + sigmoid_bias) v_j, not normalized.
 */
#pragma once

#include <type_traits>
#include <cuda_bf16.h>

#include "flashgen/variant.cuh"

template <typename ParamsT_>
struct Sigmoid : AttentionVariantBase<ParamsT_> {
  using ParamsT = ParamsT_;
  static constexpr bool use_softmax = false;

  float scale_log2e;  // sm_scale * log2(e), folded into the query
  float bias_log2e;   // sigmoid_bias * log2(e)
  float half_bias;    // sigmoid_bias / 2 (prefill's tanh form)

  __device__ __host__ Sigmoid(const ParamsT& params, uint32_t /*batch_idx*/, uint8_t* /*smem_ptr*/)
      : scale_log2e(params.sm_scale * math::log2e),
        bias_log2e(params.sigmoid_bias * math::log2e),
        half_bias(0.5f * params.sigmoid_bias) {}

  template <typename T>
  __device__ __forceinline__ T QueryTransform(const ParamsT&, T q) {
    return q * scale_log2e;
  }

  template <typename T>
  __device__ __forceinline__ T LogitsTransform(const ParamsT&, T logits, uint32_t, uint32_t,
                                               uint32_t, uint32_t, uint32_t) {
    return math::ptx_rcp(1.f + math::ptx_exp2(-(logits + bias_log2e)));
  }

  /** Prefill's form (prefill/hooks.cuh) for bf16: sigmoid(z) = (1 + tanh(z / 2)) / 2, one MUFU
   *  op (tanh.approx; absolute error <= 2^-12 on the weight, below bf16's rounding of P for
   *  weights >= 1/8) instead of two (ex2 + rcp); f16 (u = 2^-10) keeps the form above, and so does
   *  decode. */
  template <typename T>
  __device__ __forceinline__ T LogitsTransformPrefill(const ParamsT& params, T logits, uint32_t b,
                                                      uint32_t qo, uint32_t kv, uint32_t qh,
                                                      uint32_t kh) {
    if constexpr (std::is_same<typename ParamsT::DTypeQ, __nv_bfloat16>::value) {
      return fmaf(0.5f, math::ptx_tanh(fmaf(logits, 0.5f * math::ln2, half_bias)), 0.5f);
    } else {
      return LogitsTransform(params, logits, b, qo, kv, qh, kh);
    }
  }
};
