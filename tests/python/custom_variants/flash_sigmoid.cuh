/**
 * @brief The RFC's FlashSigmoid example ("Unifying AOT and JIT C++ Code via C Macros"), unchanged
 * but for its name: a user variant with no base class and no OutputTransform.
 */
#pragma once

#include <flashgen/variant.cuh>

template <typename ParamsT_>
struct RfcFlashSigmoid {
  using ParamsT = ParamsT_;
  using DTypeQ = typename ParamsT::DTypeQ;
  using DTypeKV = typename ParamsT::DTypeKV;
  using DTypeO = typename ParamsT::DTypeO;
  using IdType = typename ParamsT::IdType;

  static constexpr bool use_softmax = false;

  uint32_t window_left, qo_len, kv_len;
  float sigmoid_bias_log2e;

  // Create closure
  __device__ __host__ RfcFlashSigmoid(const ParamsT& params, uint32_t batch_idx, uint8_t* smem_ptr) {
    qo_len = params.get_qo_len(batch_idx);
    kv_len = params.get_kv_len(batch_idx);
    window_left = kv_len;
    sigmoid_bias_log2e = params.sigmoid_bias * math::log2e;
  }

  template <typename T>
  __device__ __forceinline__ T QueryTransform(const ParamsT& params, T q) {
    return float(q) * params.logits_scale * math::log2e;
  }

  template <typename T>
  __device__ __forceinline__ T LogitsTransform(
      const ParamsT& params,
      T logits,
      uint32_t batch_idx,
      uint32_t qo_idx,
      uint32_t kv_idx,
      uint32_t qo_head_idx,
      uint32_t kv_head_idx) {
    return math::ptx_rcp(1.f + math::ptx_exp2(-float(logits + sigmoid_bias_log2e)));
  }

  __device__ __forceinline__ bool LogitsMask(
      const ParamsT& params,
      uint32_t batch_idx,
      uint32_t qo_idx,
      uint32_t kv_idx,
      uint32_t qo_head_idx,
      uint32_t kv_head_idx) {
    return true;
  }
};
