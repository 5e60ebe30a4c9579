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

namespace flashgen {
namespace hooks {

template <typename V, typename P, typename = void>
struct has_query_transform : std::false_type {};
template <typename V, typename P>
struct has_query_transform<
    V, P, std::void_t<decltype(std::declval<V&>().QueryTransform(std::declval<const P&>(), 0.f))>>
    : std::true_type {};

template <typename V, typename P, typename = void>
struct has_logits_transform : std::false_type {};
template <typename V, typename P>
struct has_logits_transform<
    V, P,
    std::void_t<decltype(std::declval<V&>().LogitsTransform(
        std::declval<const P&>(), 0.f, uint32_t(), uint32_t(), uint32_t(), uint32_t(), uint32_t()))>>
    : std::true_type {};

template <typename V, typename P, typename = void>
struct has_logits_mask : std::false_type {};
template <typename V, typename P>
struct has_logits_mask<
    V, P,
    std::void_t<decltype(std::declval<V&>().LogitsMask(std::declval<const P&>(), uint32_t(),
                                                       uint32_t(), uint32_t(), uint32_t(),
                                                       uint32_t()))>> : std::true_type {};

template <typename V, typename P, typename = void>
struct has_output_transform : std::false_type {};
template <typename V, typename P>
struct has_output_transform<
    V, P,
    std::void_t<decltype(std::declval<V&>().OutputTransform(std::declval<const P&>(), 0.f,
                                                            uint32_t(), uint32_t(), uint32_t()))>>
    : std::true_type {};

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

}  // namespace hooks
}  // namespace flashgen
