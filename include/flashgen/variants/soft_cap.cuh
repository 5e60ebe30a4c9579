/**
 * @brief LogitsSoftCap: softmax over cap * tanh(sm_scale * q.k / cap); cap <= 0 means no cap.
 */
#pragma once

#include "flashgen/variant.cuh"

template <typename ParamsT_>
struct LogitsSoftCap : AttentionVariantBase<ParamsT_> {
  using ParamsT = ParamsT_;
  static constexpr bool use_softmax = true;

  float q_scale;    // sm_scale / cap, so that the logit reaching tanh is already divided by cap
  float cap_log2e;  // cap * log2(e), or 0 when there is no cap

  __device__ __host__ LogitsSoftCap(const ParamsT& params, uint32_t /*batch_idx*/,
                                    uint8_t* /*smem_ptr*/) {
    const float cap = params.logits_soft_cap;
    q_scale = cap > 0.f ? params.sm_scale / cap : params.sm_scale * math::log2e;
    cap_log2e = cap > 0.f ? cap * math::log2e : 0.f;
  }

  template <typename T>
  __device__ __forceinline__ T QueryTransform(const ParamsT&, T q) {
    return q * q_scale;
  }

  template <typename T>
  __device__ __forceinline__ T LogitsTransform(const ParamsT&, T logits, uint32_t, uint32_t,
                                               uint32_t, uint32_t, uint32_t) {
    return cap_log2e > 0.f ? cap_log2e * math::tanh(logits) : logits;
  }

  /** Prefill's form (prefill/hooks.cuh): one MUFU tanh.approx per logit (rel. error ~2^-11);
   *  decode keeps the accurate LogitsTransform above. */
  template <typename T>
  __device__ __forceinline__ T LogitsTransformPrefill(const ParamsT&, T logits, uint32_t, uint32_t,
                                                      uint32_t, uint32_t, uint32_t) {
    return cap_log2e > 0.f ? cap_log2e * math::ptx_tanh(logits) : logits;
  }

  /** Prefill (prefill/hooks.cuh): LogitsTransformPrefill is cap_log2e * tanh.approx(logits)
   *  with a cap, the identity without one; the kernel applies it in this factored form. */
  __device__ __forceinline__ bool TanhCap(const ParamsT&, float& scale) {
    scale = cap_log2e;
    return cap_log2e > 0.f;
  }

  /** Prefill (prefill/hooks.cuh): capped logits lie in [-cap, cap] * log2(e); unbounded without
   *  a cap. */
  __device__ __forceinline__ void LogitsRange(const ParamsT&, float& lo, float& hi) {
    hi = cap_log2e > 0.f ? cap_log2e : math::inf;
    lo = -hi;
  }
};
