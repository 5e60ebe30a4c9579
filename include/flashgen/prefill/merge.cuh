/**
 * @brief Split-KV merge for prefill: combines the s_b partial slots of a q tile by LSE.
 *
 * decode/merge.cuh merges a fixed number of splits per output row laid out [split][row]; here
 * the splits of a q tile are s_b consecutive unit slots of a ragged unit table and rows map to
 * (token, head) through the GQA packing, so the combine is the same math over another indexing:
 * out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M) (softmax), plain sums otherwise; the
 * variant's OutputTransform and its sink (hooks::add_sink; no partial includes it) run here on
 * the final value. One block per (unit slot, kv head);
 * blocks whose slot is not chunk 0 of a split tile exit at once (the grid is sized on the host).
 */
#pragma once

#include <cstdint>

#include "flashgen/dtype.cuh"
#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"
#include "flashgen/prefill/kernel.cuh"
#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/prefill/scheduler.cuh"

namespace flashgen {
namespace prefill {

constexpr int kMergeThreads = 256;

template <typename Traits, typename Variant, typename Params, typename Sched>
__global__ void __launch_bounds__(kMergeThreads)
    prefill_merge_kernel(const __grid_constant__ Params params, const Sched sched,
                         const Partials part) {
  constexpr int kD = Traits::kHeadDim;
  constexpr bool kSoftmax = Variant::use_softmax;
  using DTypeO = typename Params::DTypeO;
  __shared__ uint8_t variant_smem[256];
  ptx::wait_prerequisite_grid();
  const uint32_t num_kv_heads = params.num_kv_heads;
  const uint32_t kv_head = blockIdx.x % num_kv_heads;
  const uint32_t unit = blockIdx.x / num_kv_heads;
  WorkUnit w;
  if (!sched.get(unit, w) || w.splits <= 1 || w.chunk != 0) return;
  const RequestInfo rq = request_info(params, w.batch);
  const uint32_t G = params.num_qo_heads / num_kv_heads;
  Variant variant(params, w.batch, variant_smem);
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t p0 = w.tile * uint32_t(Traits::kTileQ);
  const int64_t slot_stride = int64_t(num_kv_heads) * Traits::kTileQ;  // rows between slots
  const int64_t row_base = (int64_t(unit) * num_kv_heads + kv_head) * Traits::kTileQ;
  for (uint32_t r = warp; r < uint32_t(Traits::kTileQ); r += kMergeThreads / 32) {
    const uint32_t p = p0 + r;
    const uint32_t token = p / G;
    if (token >= rq.qo_len) break;
    const uint32_t head = kv_head * G + p % G;
    const int64_t row = row_base + r;
    float mx = -math::inf;
    if constexpr (kSoftmax) {
      for (uint32_t s = lane; s < w.splits; s += 32) mx = fmaxf(mx, part.lse[row + s * slot_stride]);
      mx = math::warp_max(mx);
    }
    lse::Merge<kSoftmax> mg(mx);  // the lanes' shares of the denominator, then their sum
    for (uint32_t s = lane; s < w.splits; s += 32) mg.add(part.lse[row + s * slot_stride]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mg.den += __shfl_xor_sync(~0u, mg.den, off);
    hooks::add_sink(variant, params, mg.ref, mg.den, w.batch, token, head);  // not in the partials
    float acc[kD / 32];
#pragma unroll
    for (int j = 0; j < kD / 32; ++j) acc[j] = 0.f;
    for (uint32_t s = 0; s < w.splits; ++s) {
      const float wt = mg.factor(part.lse[row + s * slot_stride]);
      const float* src = part.o + (row + s * slot_stride) * kD;
#pragma unroll
      for (int j = 0; j < kD / 32; ++j) acc[j] += wt * src[j * 32 + lane];
    }
    DTypeO* dst = params.o + (rq.q_row0 + token) * params.o_stride_n + int64_t(head) * params.o_stride_h;
#pragma unroll
    for (int j = 0; j < kD / 32; ++j) {
      dst[j * 32 + lane] = from_float<DTypeO>(
          hooks::output_transform(variant, params, mg.value(acc[j]), w.batch, token, head));
    }
    if (lane == 0 && params.lse != nullptr) {
      params.lse[(rq.q_row0 + token) * params.num_qo_heads + head] = mg.lse();
    }
  }
}

}  // namespace prefill
}  // namespace flashgen
