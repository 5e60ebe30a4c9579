/**
 * @brief The log-sum-exp rules that every split, warp combine and merge shares.
 *
 * A partial result (a split of the keys, a warp's share of them, a cluster peer's) carries a
 * weight. For softmax variants the weight is the base-2 log-sum-exp of the logits it saw; for
 * the others (sigmoid and user variants without softmax) it is the plain sum of its weights.
 * Merging partials, normalizing the merged value and turning a weight into the natural-log LSE
 * that callers read are written here once, for the decode kernel, the decode merge, the prefill
 * merge and the sm90 decode's two combines.
 */
#pragma once

#include "flashgen/math.cuh"

namespace flashgen {
namespace lse {

/** The reference a merge subtracts before exp2: the largest weight, 0 when all are -inf. */
__device__ __forceinline__ float reference(float w_max) {
  return w_max == -math::inf ? 0.f : w_max;
}

/**
 * The weight of a state: for softmax, reference m and den = sum of 2^(logit - m) give the base-2
 * LSE (-inf when empty); otherwise den is the plain sum and the weight itself.
 */
template <bool kSoftmax>
__device__ __forceinline__ float weight(float m, float den) {
  return kSoftmax ? (den > 0.f ? m + math::ptx_log2(den) : -math::inf) : den;
}

/** A state's output from its numerator: num / den for softmax (0 when empty), else num. */
template <bool kSoftmax>
__device__ __forceinline__ float normalized(float num, float den) {
  return kSoftmax ? (den > 0.f ? num / den : 0.f) : num;
}

/** The factor that normalizes a state's output: 1 / den for softmax (0 when empty), else 1. */
template <bool kSoftmax>
__device__ __forceinline__ float inverse(float den) {
  return kSoftmax ? (den > 0.f ? 1.f / den : 0.f) : 1.f;
}

/** The LSE callers read (natural log) from a result's weight. */
template <bool kSoftmax>
__device__ __forceinline__ float natural(float weight) {
  return kSoftmax ? weight * math::ln2 : logf(weight);
}

/**
 * Merge of partials that are normalized outputs with their weights (split-KV, cluster peers):
 * out = sum_s f_s o_s / den, with f_s = 2^(w_s - ref) and den = sum_s f_s for softmax; without
 * softmax f_s = 1 and den = sum_s w_s, and the partial sums just add up.
 *
 *   Merge<kSoftmax> mg(largest weight);  // (any value without softmax)
 *   for each partial: num += mg.add(w_s) * o_s;
 *   value = mg.value(num); lse = mg.lse();
 *
 * `den` is public so that a merge spread over lanes can reduce it before `value`.
 */
template <bool kSoftmax>
struct Merge {
  float ref;
  float den = 0.f;

  __device__ __forceinline__ explicit Merge(float w_max) : ref(kSoftmax ? reference(w_max) : 0.f) {}
  /** The factor of a partial of weight w in the merged sum. */
  __device__ __forceinline__ float factor(float w) const {
    return kSoftmax ? math::ptx_exp2(w - ref) : 1.f;
  }
  /** Adds a partial of weight w to the denominator and returns its factor. */
  __device__ __forceinline__ float add(float w) {
    const float f = factor(w);
    den += kSoftmax ? f : w;
    return f;
  }
  /** The merged value from num = sum of factor * partial. */
  __device__ __forceinline__ float value(float num) const { return normalized<kSoftmax>(num, den); }
  /** value(num) as a multiply (for vectors): lse::inverse of the denominator. */
  __device__ __forceinline__ float inverse() const { return lse::inverse<kSoftmax>(den); }
  /** The merged result's weight, to merge again or to report. */
  __device__ __forceinline__ float weight() const { return lse::weight<kSoftmax>(ref, den); }
  /** The merged result's LSE for the caller (natural log). */
  __device__ __forceinline__ float lse() const { return natural<kSoftmax>(weight()); }
};

}  // namespace lse
}  // namespace flashgen
