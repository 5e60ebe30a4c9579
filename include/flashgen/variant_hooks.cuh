/**
 * @brief How kernels call a variant's hooks: the hook when the variant has it, else the default.
 *
 * Detection (not a required base class) lets a variant written like the RFC's FlashSigmoid, with
 * no base and no OutputTransform, compile unchanged. Hooks are called on a non-const variant
 * object with float values, so `template <typename T> T Hook(..., T x)` sees T = float.
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"

namespace flashgen {
namespace hooks {

template <typename, template <typename...> class Op, typename... Args>
struct detector : std::false_type {};
template <template <typename...> class Op, typename... Args>
struct detector<std::void_t<Op<Args...>>, Op, Args...> : std::true_type {};

/** true_type when Op<Args...> names a type (a call expression Op spells is valid), else false. */
template <template <typename...> class Op, typename... Args>
using is_detected = detector<void, Op, Args...>;

template <typename V, typename P>
using query_transform_call =
    decltype(std::declval<V&>().QueryTransform(std::declval<const P&>(), 0.f));
template <typename V, typename P>
using has_query_transform = is_detected<query_transform_call, V, P>;

template <typename V, typename P>
using logits_transform_call = decltype(std::declval<V&>().LogitsTransform(
    std::declval<const P&>(), 0.f, uint32_t(), uint32_t(), uint32_t(), uint32_t(), uint32_t()));
template <typename V, typename P>
using has_logits_transform = is_detected<logits_transform_call, V, P>;

template <typename V, typename P>
using logits_mask_call = decltype(std::declval<V&>().LogitsMask(
    std::declval<const P&>(), uint32_t(), uint32_t(), uint32_t(), uint32_t(), uint32_t()));
template <typename V, typename P>
using has_logits_mask = is_detected<logits_mask_call, V, P>;

template <typename V, typename P>
using output_transform_call = decltype(std::declval<V&>().OutputTransform(
    std::declval<const P&>(), 0.f, uint32_t(), uint32_t(), uint32_t()));
template <typename V, typename P>
using has_output_transform = is_detected<output_transform_call, V, P>;

template <typename V, typename P>
using sink_logit_call = decltype(float(std::declval<V&>().SinkLogit(
    std::declval<const P&>(), uint32_t(), uint32_t(), uint32_t())));
template <typename V, typename P>
using has_sink_logit = is_detected<sink_logit_call, V, P>;

template <typename V, typename P>
__device__ __forceinline__ float query_transform(V& v, const P& params, float q) {
  if constexpr (has_query_transform<V, P>::value) {
    return static_cast<float>(v.QueryTransform(params, q));
  } else {
    return q;
  }
}

template <typename V, typename P>
__device__ __forceinline__ float logits_transform(V& v, const P& params, float logits,
                                                  uint32_t batch_idx, uint32_t qo_idx,
                                                  uint32_t kv_idx, uint32_t qo_head_idx,
                                                  uint32_t kv_head_idx) {
  if constexpr (has_logits_transform<V, P>::value) {
    return static_cast<float>(
        v.LogitsTransform(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx));
  } else {
    return logits;
  }
}

template <typename V, typename P>
__device__ __forceinline__ bool logits_mask(V& v, const P& params, uint32_t batch_idx,
                                            uint32_t qo_idx, uint32_t kv_idx,
                                            uint32_t qo_head_idx, uint32_t kv_head_idx) {
  if constexpr (has_logits_mask<V, P>::value) {
    return v.LogitsMask(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx);
  } else {
    return true;
  }
}

template <typename V, typename P>
__device__ __forceinline__ float output_transform(V& v, const P& params, float out,
                                                  uint32_t batch_idx, uint32_t qo_idx,
                                                  uint32_t qo_head_idx) {
  if constexpr (has_output_transform<V, P>::value) {
    return static_cast<float>(v.OutputTransform(params, out, batch_idx, qo_idx, qo_head_idx));
  } else {
    return out;
  }
}

/**
 * Finishes a softmax row with the variant's SinkLogit, where a kernel turns a whole row's
 * running max m and denominator den (den = sum of 2^(logit - lse::reference(m))) into its output
 * and LSE: m becomes the reference itself and den gains 2^(sink - m), so the row's output
 * o / den and its LSE (m + log2 den) are those of one softmax over the logits and the sink. A
 * row with no visible key (m = -inf, den = 0) gets reference 0, den = 2^sink: output 0, LSE
 * the sink. Call it once per row, on the final state only: never on a split's partial (the
 * merge adds it). Nothing at all for a variant without the hook.
 */
template <typename V, typename P>
__device__ __forceinline__ void add_sink(V& v, const P& params, float& m, float& den,
                                         uint32_t batch_idx, uint32_t qo_idx,
                                         uint32_t qo_head_idx) {
  if constexpr (has_sink_logit<V, P>::value) {
    static_assert(V::use_softmax, "SinkLogit: only a softmax variant may have a sink");
    m = lse::reference(m);
    den += math::ptx_exp2(float(v.SinkLogit(params, batch_idx, qo_idx, qo_head_idx)) - m);
  }
}

}  // namespace hooks
}  // namespace flashgen
