/**
 * @brief Prefill-only views of a variant's hooks (decode keeps flashgen/variant_hooks.cuh as is).
 *
 *  - `has_own_logits_mask` / `has_own_logits_transform`: the hook exists and is not the identity
 *    inherited from AttentionVariantBase. variant_hooks.cuh detects any callable hook, and the
 *    base class defines all of them, so every variant deriving from the base would look masked:
 *    every kv tile would take the per-element mask path and the mask-free loop would never run.
 *  - `LogitsTransformPrefill` (optional, same signature as LogitsTransform): a cheaper form the
 *    prefill kernel calls instead when present (soft_cap: tanh.approx; decode keeps the accurate
 *    LogitsTransform, whose LSE bound is 5e-5).
 *  - `MaskBounds(params, batch_idx, qo_len, kv_len, qo_idx, int32_t& lo, int32_t& hi)`
 *    (optional): the variant's LogitsMask keeps key kv for query qo of a request of qo_len
 *    queries and kv_len keys exactly when lo <= kv <= hi, with lo and hi nondecreasing in qo.
 *    The kernel passes the lengths it already holds, so the hook needs no length of its own
 *    (one read from params would be a page-table load per block and role). The kernel then
 *    visits only kv tiles that intersect [lo(first query), hi(last query)], runs tiles inside
 *    [lo(last), hi(first)] mask-free and tests the others against the bounds instead of calling
 *    LogitsMask (mask.cuh's row_keys; sliding window).
 *  - `LinearBias(params, batch_idx, qo_idx, qo_head_idx, kv_head_idx, float& slope,
 *    int32_t& origin)` (optional): the variant's LogitsTransform is exactly
 *    `logits + slope * float(int32_t(kv_idx) - origin)` for that query row and head (ALiBi). The
 *    kernel then reads slope and origin once per row (at the Q load) and never calls
 *    LogitsTransform: per kv tile and row one float base, per logit one FFMA with a constant
 *    column offset (the logit's kv_idx - origin is exact in int32 either way). Decode keeps
 *    calling LogitsTransform, so a variant with this hook works unchanged in both.
 *  - `LogitsRange(params, float& lo, float& hi)` (optional, softmax variants): every logit the
 *    prefill transform returns lies in [lo, hi] (base 2; soft_cap: +-cap * log2 e). When the
 *    weights 2^(x - hi) stay normal (hi - lo <= 120) and P is bf16 (8 exponent bits, as fp32),
 *    the kernel uses hi as a fixed softmax reference: no running max, no rescale of O.
 *  - `bool TanhCap(params, float& scale)` (optional, softmax variants): LogitsTransformPrefill is
 *    exactly `scale * tanh.approx(logits)` (scale > 0) when it returns true, the identity when it
 *    returns false (the same for every logit of the call). The kernel then applies tanh.approx
 *    itself (a warp-uniform branch around one MUFU op per logit) and folds scale into the
 *    softmax's FFMA (`scale * t - reference`) and into the row max (a max over t, then one FMUL
 *    per row): no FMUL and no select per logit.
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <cuda_bf16.h>

#include "flashgen/variant.cuh"
#include "flashgen/variant_hooks.cuh"

namespace flashgen {
namespace prefill {

template <typename V, typename P, typename = void>
struct logits_mask_is_base : std::false_type {};
template <typename V, typename P>
struct logits_mask_is_base<V, P, std::void_t<decltype(&V::LogitsMask)>>
    : std::is_same<decltype(&V::LogitsMask), decltype(&AttentionVariantBase<P>::LogitsMask)> {};

template <typename V, typename P, typename = void>
struct logits_transform_is_base : std::false_type {};
template <typename V, typename P>
struct logits_transform_is_base<V, P,
                                std::void_t<decltype(&V::template LogitsTransform<float>)>>
    : std::is_same<decltype(&V::template LogitsTransform<float>),
                   decltype(&AttentionVariantBase<P>::template LogitsTransform<float>)> {};

template <typename V, typename P>
constexpr bool has_own_logits_mask() {
  return hooks::has_logits_mask<V, P>::value && !logits_mask_is_base<V, P>::value;
}

template <typename V, typename P>
using logits_transform_prefill_call = decltype(std::declval<V&>().LogitsTransformPrefill(
    std::declval<const P&>(), 0.f, uint32_t(), uint32_t(), uint32_t(), uint32_t(), uint32_t()));
template <typename V, typename P>
using has_logits_transform_prefill = hooks::is_detected<logits_transform_prefill_call, V, P>;

template <typename V, typename P>
constexpr bool has_own_logits_transform() {
  return has_logits_transform_prefill<V, P>::value ||
         (hooks::has_logits_transform<V, P>::value && !logits_transform_is_base<V, P>::value);
}

template <typename V, typename P>
using mask_bounds_call = decltype(std::declval<V&>().MaskBounds(
    std::declval<const P&>(), uint32_t(), int32_t(), int32_t(), uint32_t(),
    std::declval<int32_t&>(), std::declval<int32_t&>()));
template <typename V, typename P>
using has_mask_bounds = hooks::is_detected<mask_bounds_call, V, P>;

template <typename V, typename P>
using linear_bias_call = decltype(std::declval<V&>().LinearBias(
    std::declval<const P&>(), uint32_t(), uint32_t(), uint32_t(), uint32_t(),
    std::declval<float&>(), std::declval<int32_t&>()));
template <typename V, typename P>
using has_linear_bias = hooks::is_detected<linear_bias_call, V, P>;

template <typename V, typename P>
using logits_range_call = decltype(std::declval<V&>().LogitsRange(
    std::declval<const P&>(), std::declval<float&>(), std::declval<float&>()));
template <typename V, typename P>
using has_logits_range = hooks::is_detected<logits_range_call, V, P>;

/** Whether a prefill kernel whose P is DTypeP may take its softmax reference from the variant's
 *  LogitsRange: P needs 8 exponent bits (bf16; f16 P would underflow). The caller adds that the
 *  variant uses softmax. The one rule of both prefill kernels (portable and sm90). */
template <typename V, typename P, typename DTypeP>
__host__ __device__ constexpr bool fixed_reference_able() {
  return has_logits_range<V, P>::value &&
         std::is_same<DTypeP, __nv_bfloat16>::value;
}

/** The call's fixed softmax reference: true, with `ref` = hi, when every logit lies in [lo, hi]
 *  with hi - lo <= 120 (the weights 2^(x - hi) >= 2^-120 stay normal in fp32 and bf16). */
template <typename V, typename P>
__device__ __forceinline__ bool fixed_reference(V& v, const P& params, float& ref) {
  float lo, hi;
  v.LogitsRange(params, lo, hi);
  ref = hi;
  return hi - lo <= 120.f;
}

template <typename V, typename P>
using tanh_cap_call =
    decltype(bool(std::declval<V&>().TanhCap(std::declval<const P&>(), std::declval<float&>())));
template <typename V, typename P>
using has_tanh_cap = hooks::is_detected<tanh_cap_call, V, P>;

/** The call's TanhCap: true, with `scale` the cap's factor, when the kernel applies tanh itself;
 *  false, with `scale` 1, when the transform is the identity. Both prefill kernels. */
template <typename V, typename P>
__device__ __forceinline__ bool tanh_cap(V& v, const P& params, float& scale) {
  float sc = 1.f;
  const bool on = v.TanhCap(params, sc);
  if (on) scale = sc;
  return on;
}

template <typename V, typename P>
__device__ __forceinline__ float logits_transform(V& v, const P& params, float logits,
                                                  uint32_t batch_idx, uint32_t qo_idx,
                                                  uint32_t kv_idx, uint32_t qo_head_idx,
                                                  uint32_t kv_head_idx) {
  if constexpr (has_logits_transform_prefill<V, P>::value) {
    return static_cast<float>(v.LogitsTransformPrefill(params, logits, batch_idx, qo_idx, kv_idx,
                                                       qo_head_idx, kv_head_idx));
  } else {
    return hooks::logits_transform(v, params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx,
                                   kv_head_idx);
  }
}

}  // namespace prefill
}  // namespace flashgen
