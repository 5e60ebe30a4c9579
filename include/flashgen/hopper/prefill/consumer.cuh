/**
 * @brief A consumer warpgroup of the sm90 prefill kernel: warpgroup cw (0-based among the
 * consumers) owns packed query rows [64 cw, 64 cw + 64) of the block.
 *
 * Here: the block's Q staged in shared memory. The mainloop (wgmma Q K^T and P V, the online
 * softmax, the ping-pong) and the output store are still in the kernel body (kernel.cuh): as
 * functions they compiled to different SASS (include/flashgen/README.md).
 */
#pragma once

#include <cstdint>

#include "flashgen/prefill_io.cuh"
#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/prefill/rope.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/prefill/storage.cuh"

namespace flashgen {
namespace hopper {

/** Q: the warpgroup's 64 rows of the block (packed row p: token p / G, query head
 *  kv_head * G + p % G), RoPE + QueryTransform in fp32, stored 128-byte-swizzled in the Q
 *  buffer (smem); ctid: the thread within the warpgroup. Ends on the warpgroup's barrier. */
template <typename Traits, bool kRope, typename Variant, typename Params>
__device__ __forceinline__ void stage_query(const Params& params, Variant& variant, uint8_t* smem,
                                            const prefill::RequestInfo& rq, int32_t qo_len,
                                            int32_t kv_len, uint32_t kv_head, uint32_t p0,
                                            uint32_t G, uint32_t cw, uint32_t ctid) {
  using DTypeQ = typename Params::DTypeQ;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kTileQ = Traits::kTileQ;
  constexpr int kHalf = kD / 16;  // 16-byte chunks per half row
  constexpr int kUnits = 64 * kHalf;
  rope::LlamaRope rp;
  if constexpr (kRope) rp = rope::LlamaRope::make(params.rope_theta, params.rope_scale);
#pragma unroll
  for (int it = 0; it < kUnits / 128; ++it) {
    const uint32_t idx = it * 128 + ctid;
    const uint32_t r = cw * 64 + idx / kHalf;
    const uint32_t c = idx % kHalf;
    const uint32_t p = p0 + r;
    const int32_t token = int32_t(p / G);
    const uint32_t head = kv_head * G + p % G;
    float lo[8], hi[8];
    prefill::load_query_chunks<kD, kRope>(params, variant, rq, qo_len, kv_len, token, head, c,
                                          rp, lo, hi);
    *reinterpret_cast<uint4*>(smem + sw128<kTileQ>(r, c)) = prefill::pack8<DTypeQ>(lo);
    *reinterpret_cast<uint4*>(smem + sw128<kTileQ>(r, c + kHalf)) = prefill::pack8<DTypeQ>(hi);
  }
  fence_proxy_async();
  named_barrier(1 + cw, 128);
}

}  // namespace hopper
}  // namespace flashgen
