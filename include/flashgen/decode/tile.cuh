/**
 * @brief One 16-token kv tile of a decode warp, shared by the portable decode
 * (decode/kernel.cuh) and the Hopper single decode (hopper/decode.cuh).
 *
 * The two kernels bring K and V into shared memory differently (a cp.async ring with its own
 * swizzle against TMA boxes with the 128-byte one), so the caller says where a lane's ldmatrix
 * rows lie; everything from there on is this one step: S^T = K Q^T with the
 * query split in hi and lo parts (query.cuh), the variant's mask and transform per logit, the
 * online softmax (softmax.cuh), and O^T += V^T P^T.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashgen/decode/query.cuh"
#include "flashgen/decode/softmax.cuh"
#include "flashgen/math.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"

namespace flashgen {
namespace decode {

/** Which query heads a warp's tiles serve: heads [head0, head0 + num_heads) of kv_head in
 *  request batch_idx; a lane holds the scores of tokens `group` (+8) and heads 2 * pair (+1). */
struct WarpHeads {
  uint32_t batch_idx, kv_head, head0, num_heads;
  uint32_t group, pair;
};

/** K's A fragment of k step ks: `k_frag(ks)` is the shared-memory address of this lane's
 *  ldmatrix_x4 row, or `k_frag(ks, a)` fills the fragment itself (an fp8 cache widens it). */
template <typename KFrag>
__device__ __forceinline__ void load_k_frag(const KFrag& k_frag, int ks, uint32_t (&a)[4]) {
  if constexpr (std::is_invocable_v<const KFrag&, int, uint32_t (&)[4]>) {
    k_frag(ks, a);
  } else {
    ptx::ldmatrix_x4(a, k_frag(ks));
  }
}

/**
 * The tile of tokens [tpos, tpos + 16), of which those below `end` exist.
 * `k_frag(ks)`: the shared-memory address of this lane's ldmatrix_x4 row for k step ks of the K
 * tile (rows = tokens: 16-byte chunks 2 * ks and 2 * ks + 1), or a loader (load_k_frag);
 * `v_frag(mt)`: the same address for dims 16 * mt.. of the V tile (read transposed);
 * `logit_scale` maps the products to the logits (Times{2^-shift} undoes f16_query_shift).
 */
template <typename Traits, bool kSoftmax, typename DTypeKV, typename KFrag, typename VFrag,
          typename Variant, typename Params, typename LogitScale = AsIs>
__device__ __forceinline__ void kv_tile_step(const KFrag& k_frag, const VFrag& v_frag,
                                             uint32_t tpos, uint32_t end, const WarpHeads& w,
                                             const uint32_t (&qf)[Traits::kKSteps][2],
                                             const uint32_t (&qf_lo)[Traits::kKSteps][2],
                                             Variant& variant, const Params& params,
                                             float (&m)[2], float (&dsum)[2],
                                             float (&acc)[Traits::kMTiles][4],
                                             const LogitScale& logit_scale = {}) {
  constexpr float kMasked = kSoftmax ? -math::inf : 0.f;

  // Independent accumulators (hi / lo query part, alternate k steps): the scores are a chain of
  // kKSteps * 2 / kScoreChains dependent mma instead of kKSteps * 2, which is most of a tile's
  // latency per warp.
  constexpr int kSChains = Traits::kScoreChains;
  float sc[kSChains][4];
#pragma unroll
  for (int c = 0; c < kSChains; ++c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[c][e] = 0.f;
  }
#pragma unroll
  for (int ks = 0; ks < Traits::kKSteps; ++ks) {
    uint32_t a[4];
    load_k_frag(k_frag, ks, a);
    const int c = (ks * 2) % kSChains;
    ptx::mma_16816<DTypeKV>(sc[c], a, qf[ks][0], qf[ks][1]);
    ptx::mma_16816<DTypeKV>(sc[(c + 1) % kSChains], a, qf_lo[ks][0], qf_lo[ks][1]);
  }
  float s[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    s[e] = sc[0][e];
#pragma unroll
    for (int c = 1; c < kSChains; ++c) s[e] += sc[c][e];
    s[e] = logit_scale(s[e]);
  }

  // s[e]: token group + 8 * (e >> 1), head 2 * pair + (e & 1).
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t pos = tpos + w.group + 8 * (e >> 1);
    const uint32_t h = 2 * w.pair + (e & 1);
    float x = kMasked;
    if (pos < end && h < w.num_heads &&
        hooks::logits_mask(variant, params, w.batch_idx, 0, pos, w.head0 + h, w.kv_head)) {
      x = hooks::logits_transform(variant, params, s[e], w.batch_idx, 0, pos, w.head0 + h,
                                  w.kv_head);
    }
    s[e] = x;
  }

  online_softmax_tile<kSoftmax>(s, m, dsum, acc);

  // P^T as the B operand of O^T = V^T P^T: transpose the two 8x8 token x head blocks.
  const uint32_t b0 = ptx::movmatrix_trans(ptx::pack2<DTypeKV>(s[0], s[1]));
  const uint32_t b1 = ptx::movmatrix_trans(ptx::pack2<DTypeKV>(s[2], s[3]));
#pragma unroll
  for (int mt = 0; mt < Traits::kMTiles; ++mt) {
    uint32_t a[4];
    ptx::ldmatrix_x4_trans(a, v_frag(mt));
    ptx::mma_16816<DTypeKV>(acc[mt], a, b0, b1);
  }
}

}  // namespace decode
}  // namespace flashgen
