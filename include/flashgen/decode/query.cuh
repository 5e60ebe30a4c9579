/**
 * @brief The query fragments of the decode kernels' S^T = K Q^T (the mma.m16n8k16 B operand),
 * shared by the portable decode (decode/kernel.cuh) and the Hopper single decode
 * (hopper/decode.cuh).
 *
 * The variant's QueryTransform runs in fp32; the transformed query is then split as hi + lo, both
 * in the K/V dtype, and the scores take two mma: the logits come out as exact as fp32 (one
 * rounding of the scaled query would put a 2^-9 relative error on every logit, which an LSE over
 * 32k tokens does not average away).
 */
#pragma once

#include <cstdint>

#include "flashgen/dtype.cuh"
#include "flashgen/math.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"

namespace flashgen {
namespace decode {

/** A value as it is: the query as the variant's QueryTransform leaves it, the logits as the mma
 *  leaves them (a 16-bit cache). */
struct AsIs {
  __device__ __forceinline__ float operator()(float x) const { return x; }
};

/** A value times a scale: the query times an fp8 cache's k_scale (the logits are then those of
 *  the scaled K) and the power of two that puts it in f16's range, and the logits times the
 *  inverse power of two. */
struct Times {
  float scale;
  __device__ __forceinline__ float operator()(float x) const { return x * scale; }
};

/**
 * Where k index `2 * pair + 8 * half_k` (and the next) of k step ks reads the head: dim
 * ks * 16 + half_k * 8 + 2 * pair, as ldmatrix lays K out; or, in the fp8 cache's order
 * (kFp8Order), dim (ks / 4) * 64 + pair * 16 + (ks % 4) * 4 + half_k * 2, where a lane's four
 * consecutive bytes of a K row are its fragment of one k step (the dot product sums over every
 * dim, so K and Q need only agree on the order).
 */
template <bool kFp8Order>
__device__ __forceinline__ int query_dim(int ks, int half_k, uint32_t pair) {
  if constexpr (kFp8Order) {
    return (ks / 4) * 64 + static_cast<int>(pair) * 16 + (ks % 4) * 4 + half_k * 2;
  } else {
    return ks * 16 + half_k * 8 + 2 * pair;
  }
}

/**
 * Head row `qh` (read only when `valid`; zeros otherwise), dims 2 * pair.. of each of the kKSteps
 * k steps: qf[ks][half_k] holds the hi parts of dim query_dim(ks, half_k, pair) and the next,
 * qf_lo the rest. `scale` maps each transformed value (AsIs, or Times for an fp8 cache);
 * DTypeKV is the 16-bit type of the mma.
 */
template <typename DTypeKV, int kKSteps, typename DTypeQ, typename Variant, typename Params,
          typename Scale = AsIs, bool kFp8Order = false>
__device__ __forceinline__ void load_query_split(const DTypeQ* qh, bool valid, uint32_t pair,
                                                 Variant& variant, const Params& params,
                                                 uint32_t (&qf)[kKSteps][2],
                                                 uint32_t (&qf_lo)[kKSteps][2],
                                                 const Scale& scale = {}) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int half_k = 0; half_k < 2; ++half_k) {
      const int d = query_dim<kFp8Order>(ks, half_k, pair);
      float x0 = 0.f, x1 = 0.f;
      if (valid) {
        x0 = scale(hooks::query_transform(variant, params, to_float(qh[d])));
        x1 = scale(hooks::query_transform(variant, params, to_float(qh[d + 1])));
      }
      const float h0 = to_float(from_float<DTypeKV>(x0));
      const float h1 = to_float(from_float<DTypeKV>(x1));
      qf[ks][half_k] = ptx::pack2<DTypeKV>(h0, h1);
      qf_lo[ks][half_k] = ptx::pack2<DTypeKV>(x0 - h0, x1 - h1);
    }
  }
}

/**
 * fp8::f16_shift (dtype.cuh) of the largest |QueryTransform(q) * k_scale| the warp's lanes read
 * (head rows `qh`, the dims load_query_split<.., true> reads): the power of two that puts an fp8
 * cache's query in f16's range. Every lane returns the same shift.
 */
template <int kKSteps, typename DTypeQ, typename Variant, typename Params>
__device__ __forceinline__ int f16_query_shift(const DTypeQ* qh, bool valid, uint32_t pair,
                                               Variant& variant, const Params& params,
                                               float k_scale) {
  float mx = 0.f;
  if (valid) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half_k = 0; half_k < 2; ++half_k) {
        const int d = query_dim<true>(ks, half_k, pair);
        mx = fmaxf(mx, fabsf(hooks::query_transform(variant, params, to_float(qh[d]))));
        mx = fmaxf(mx, fabsf(hooks::query_transform(variant, params, to_float(qh[d + 1]))));
      }
    }
  }
  return fp8::f16_shift(math::warp_max(mx) * fabsf(k_scale));
}

}  // namespace decode
}  // namespace flashgen
