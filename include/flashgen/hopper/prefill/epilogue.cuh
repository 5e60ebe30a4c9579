/**
 * @brief The epilogue of the sm90 prefill kernel, per consumer warpgroup and block, after the
 * mainloop (consumer.cuh): the row sums reduced over the quad of threads that share a row, then
 * either a split unit's fp32 partials (merged later by prefill/merge.cuh) or the whole unit's
 * output: O / l through the OutputTransform, staged in the warpgroup's own Q rows (free once
 * its last Q K^T is done) so that the global stores are 16 bytes wide, and the natural-log LSE.
 *
 * The functions take the consumer's registers (o, m, l, the thread's rows) by reference and are
 * __forceinline__: they are the consumer loop's code, named, and compile to the same SASS as
 * when they were written inline (benches/sass_identity.sh).
 */
#pragma once

#include <cstdint>

#include "flashgen/lse.cuh"
#include "flashgen/prefill_io.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"
#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/prefill/scheduler.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/wgmma.cuh"
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

/** A whole unit (not split): O / l through the OutputTransform into the output rows of the
 *  warpgroup's 64 packed rows, and the natural-log LSE when params.lse is set. The tile is first
 *  staged in the warpgroup's Q rows (smem, 128-byte swizzle) between two warpgroup barriers,
 *  then each thread copies 16-byte chunks, so the stores are coalesced whatever the GQA packing;
 *  rows past qo_len are dropped. tok, qo_head: the token and query head of the thread's two rows
 *  (64 cw + 16 warp4 + lane / 4 + 8 h); ctid: the thread within the warpgroup. */
template <typename Traits, bool kSoftmax, typename Params, typename Variant>
__device__ __forceinline__ void store_output(
    const Params& params, Variant& variant, uint8_t* smem, const prefill::WorkUnit& w,
    const prefill::RequestInfo& rq, const float (&o)[Traits::kHeadDim / 2], const float (&m)[2],
    const float (&l)[2], const int32_t (&tok)[2], const uint32_t (&qo_head)[2],
    const int32_t& qo_len, const uint32_t& p0, const uint32_t& G, const uint32_t& kv_head,
    const uint32_t& cw, const uint32_t& warp4, const uint32_t& lane, const uint32_t& quad,
    const uint32_t& ctid) {
  using DTypeO = typename Params::DTypeO;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kTileQ = Traits::kTileQ;
  constexpr int kO = kD / 2;
  named_barrier(1 + cw, 128);  // every warp's last Q K^T has read Q
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t r = cw * 64 + warp4 * 16 + lane / 4 + 8 * h;
    const float inv = lse::inverse<kSoftmax>(l[h]);
#pragma unroll
    for (int j = 0; j < kO / 4; ++j) {
      float y0 = o[4 * j + 2 * h] * inv, y1 = o[4 * j + 2 * h + 1] * inv;
      y0 = hooks::output_transform(variant, params, y0, w.batch, uint32_t(tok[h]), qo_head[h]);
      y1 = hooks::output_transform(variant, params, y1, w.batch, uint32_t(tok[h]), qo_head[h]);
      *reinterpret_cast<uint32_t*>(smem + sw128<kTileQ>(r, j) + quad * 4) =
          ptx::pack2<DTypeO>(y0, y1);
    }
    // `&`, not `&&`: the two row-independent tests form one predicate. With `&&` here the
    // hoisted predicate comes out negated (quad != 0 || lse == nullptr) and the SASS differs.
    if ((quad == 0) & (params.lse != nullptr) && tok[h] < qo_len) {
      params.lse[(rq.q_row0 + tok[h]) * params.num_qo_heads + qo_head[h]] =
          lse::natural<kSoftmax>(lse::weight<kSoftmax>(m[h], l[h]));
    }
  }
  named_barrier(1 + cw, 128);
  constexpr int kChunks = kD / 8;
#pragma unroll 4
  for (int it = 0; it < 64 * kChunks / 128; ++it) {
    const uint32_t idx = it * 128 + ctid;
    const uint32_t r = cw * 64 + idx / kChunks;
    const uint32_t c = idx % kChunks;
    const uint32_t p = p0 + r;
    const int32_t token = int32_t(p / G);
    if (token < qo_len) {
      const uint32_t head = kv_head * G + p % G;
      DTypeO* dst = params.o + (rq.q_row0 + token) * params.o_stride_n +
                    int64_t(head) * params.o_stride_h + c * 8;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(smem + sw128<kTileQ>(r, c));
    }
  }
}

}  // namespace hopper
}  // namespace flashgen
