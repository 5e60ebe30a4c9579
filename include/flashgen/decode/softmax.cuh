/**
 * @brief The online softmax of one decode tile, shared by the portable single/batch decode
 * (decode/kernel.cuh) and the Hopper single decode (hopper/decode.cuh), which hold a tile's
 * scores in the same mma.m16n8k16 fragment: s[j] and s[j + 2] are two tokens of head
 * 2 * pair + j, and the 8 lanes of a group share a head (the max reduces over lanes 4, 8, 16).
 */
#pragma once

#include "flashgen/math.cuh"

namespace flashgen {
namespace decode {

/**
 * Softmax variants: raises each head's running max m (base 2), rescales its share of the
 * denominator dsum and its accumulators acc by the change, and turns s into the weights P.
 * Others: s stays as it is (the variant's own weights) and only dsum grows.
 */
template <bool kSoftmax, int kMTiles>
__device__ __forceinline__ void online_softmax_tile(float (&s)[4], float (&m)[2], float (&dsum)[2],
                                                    float (&acc)[kMTiles][4]) {
  if constexpr (kSoftmax) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float mx = fmaxf(s[j], s[j + 2]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(m[j], mx);
      const float m_ref = m_new == -math::inf ? 0.f : m_new;
      const float scale = math::ptx_exp2(m[j] - m_ref);
      s[j] = math::ptx_exp2(s[j] - m_ref);
      s[j + 2] = math::ptx_exp2(s[j + 2] - m_ref);
      dsum[j] = dsum[j] * scale + s[j] + s[j + 2];
      m[j] = m_new;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        acc[mt][j] *= scale;
        acc[mt][j + 2] *= scale;
      }
    }
  } else {
    dsum[0] += s[0] + s[2];
    dsum[1] += s[1] + s[3];
  }
}

}  // namespace decode
}  // namespace flashgen
