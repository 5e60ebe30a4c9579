/**
 * @brief The epilogue of the sm90 prefill kernel, per consumer warpgroup and block: the row sums
 * reduced over the quad of threads that share a row, and a split unit's fp32 partials.
 *
 * The whole unit's output (O / l through the OutputTransform, staged in the warpgroup's Q rows,
 * 16-byte stores, the natural-log LSE) is still in the kernel body (kernel.cuh): as a function
 * it compiled to different SASS (include/flashgen/README.md).
 */
#pragma once

#include <cstdint>

#include "flashgen/lse.cuh"
#include "flashgen/prefill_io.cuh"

namespace flashgen {
namespace hopper {

/** The row sums of the thread's two rows, reduced over the quad that shares them. */
__device__ __forceinline__ void reduce_row_sums(float (&l)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
}

/** A split unit: fp32 partials (normalized for softmax) and base-2 LSE or the plain sum, in
 *  slot `unit` (prefill/merge.cuh combines them). o, m, l: the consumer's accumulators after
 *  the block's mainloop, l reduced; the thread's rows are 64 cw + 16 warp4 + lane / 4 + 8 h. */
template <typename Traits, bool kSoftmax>
__device__ __forceinline__ void store_partials(const prefill::Partials& part, uint32_t unit,
                                               uint32_t kv_head, uint32_t num_kv_heads,
                                               uint32_t cw, uint32_t warp4, uint32_t lane,
                                               uint32_t quad,
                                               const float (&o)[Traits::kHeadDim / 2],
                                               const float (&m)[2], const float (&l)[2]) {
  constexpr int kD = Traits::kHeadDim;
  constexpr int kO = kD / 2;
  const int64_t slot_row0 = (int64_t(unit) * num_kv_heads + kv_head) * Traits::kTileQ;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t r = cw * 64 + warp4 * 16 + lane / 4 + 8 * h;
    const float inv = lse::inverse<kSoftmax>(l[h]);
    float* dst = part.o + (slot_row0 + r) * kD + 2 * quad;
#pragma unroll
    for (int j = 0; j < kO / 4; ++j) {
      *reinterpret_cast<float2*>(dst + 8 * j) =
          make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    }
    if (quad == 0) {
      part.lse[slot_row0 + r] = lse::weight<kSoftmax>(m[h], l[h]);
    }
  }
}

}  // namespace hopper
}  // namespace flashgen
