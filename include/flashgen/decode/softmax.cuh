/**
 * @brief One warp's online-softmax state in the decode kernels, shared by the portable
 * single/batch decode (decode/kernel.cuh) and the Hopper single decode (hopper/decode.cuh),
 * which hold a tile's scores in the same mma.m16n8k16 fragment: s[j] and s[j + 2] are two tokens
 * of head 2 * pair + j, the 8 lanes with the same pair share a head (reductions over lanes 4, 8,
 * 16), and acc[mt][e] is O^T at dim mt * 16 + group + 8 * (e >> 1), head 2 * pair + (e & 1).
 * The online softmax of one tile (tile.cuh runs the whole tile step around it), the denominator's
 * reduction, and the store for the cross-warp combine.
 */
#pragma once

#include <cstdint>

#include "flashgen/lse.cuh"
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
      const float m_ref = lse::reference(m_new);
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

/** The denominator over all of this warp's tokens: the sum over the lanes that share a head. */
__device__ __forceinline__ void reduce_denominator(float (&dsum)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    dsum[j] += __shfl_xor_sync(0xffffffffu, dsum[j], 4);
    dsum[j] += __shfl_xor_sync(0xffffffffu, dsum[j], 8);
    dsum[j] += __shfl_xor_sync(0xffffffffu, dsum[j], 16);
  }
}

/**
 * Stores warp `warp`'s running max, denominator and accumulators for the cross-warp combine:
 * c_m and c_d are [warp][head] with kH heads, c_o is [warp][head][kD].
 */
template <int kMTiles, int kH, int kD>
__device__ __forceinline__ void store_warp_state(float* c_m, float* c_d, float* c_o, uint32_t warp,
                                                 uint32_t group, uint32_t pair,
                                                 const float (&m)[2], const float (&dsum)[2],
                                                 const float (&acc)[kMTiles][4]) {
  if (group == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      c_m[warp * kH + 2 * pair + j] = m[j];
      c_d[warp * kH + 2 * pair + j] = dsum[j];
    }
  }
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = 2 * pair + (e & 1);
      const int d = mt * 16 + group + 8 * (e >> 1);
      c_o[(warp * kH + h) * kD + d] = acc[mt][e];
    }
  }
}

}  // namespace decode
}  // namespace flashgen
