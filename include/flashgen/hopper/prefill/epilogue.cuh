/**
 * @brief The epilogue of the sm90 prefill kernel, per consumer warpgroup and block: the row sums
 * reduced over the quad, then either the split unit's fp32 partials (normalized for softmax) and
 * base-2 LSE or plain sum into slot `unit` of the workspace (prefill/merge.cuh combines them), or
 * O / l through the variant's OutputTransform, staged in the warpgroup's own Q rows (once every
 * warp's last Q K^T has read them) and written with 16-byte stores, with the natural-log LSE.
 */
#pragma once

#include <cstdint>

#include "flashgen/lse.cuh"
#include "flashgen/prefill_io.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/prefill/consumer.cuh"
#include "flashgen/hopper/prefill/scheduler.cuh"
#include "flashgen/hopper/prefill/storage.cuh"

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

/** A split unit (b.w.splits > 1): fp32 partials (normalized for softmax) and base-2 LSE or the
 *  plain sum, in slot b.unit. o, m, l: the consumer's accumulators after the block's mainloop
 *  (consumer.cuh), l reduced. */
template <typename Traits, bool kSoftmax>
__device__ __forceinline__ void store_partials(const prefill::Partials& part, const HopperBlock& b,
                                               const ConsumerThread& t, uint32_t num_kv_heads,
                                               const float (&o)[Traits::kHeadDim / 2],
                                               const float (&m)[2], const float (&l)[2]) {
  constexpr int kD = Traits::kHeadDim;
  constexpr int kTileQ = Traits::kTileQ;
  constexpr int kO = kD / 2;
  const uint32_t quad = t.lane % 4;
  const int64_t slot_row0 = (int64_t(b.unit) * num_kv_heads + b.kv_head) * kTileQ;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t r = t.cw * 64 + t.warp4 * 16 + t.lane / 4 + 8 * h;
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
