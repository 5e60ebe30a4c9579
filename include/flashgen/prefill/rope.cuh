/**
 * @brief Llama RoPE (half split) of the prefill kernels, which decode's rope_llama calls use too.
 *
 * For a head of D dims and pair i < D/2: freq_i = 1 / rope_theta^(2i/D),
 * angle = (pos / rope_scale) * freq_i, and
 *   out[i]       = x[i] cos(angle) - x[i + D/2] sin(angle)
 *   out[i + D/2] = x[i + D/2] cos(angle) + x[i] sin(angle).
 * Angles are fp32: the error grows with pos like pos * 2^-24 radians.
 */
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flashgen {
namespace rope {

/** Per-call constants: log2(theta) and 1 / rope_scale. */
struct LlamaRope {
  float log2_theta, rcp_scale;
  __host__ __device__ static LlamaRope make(float rope_theta, float rope_scale) {
    LlamaRope r;
#ifdef __CUDA_ARCH__
    r.log2_theta = log2f(rope_theta);
#else
    r.log2_theta = static_cast<float>(__builtin_log2(static_cast<double>(rope_theta)));
#endif
    r.rcp_scale = 1.f / rope_scale;
    return r;
  }
  /** freq_i / rope_scale for pair i of a head of `dim` dims. */
  __device__ __forceinline__ float freq(int i, int dim) const {
    return rcp_scale * exp2f(-(2.f * float(i) / float(dim)) * log2_theta);
  }
};

/**
 * Rotates one pair (x[i], x[i + D/2]) by angle pos * freq, reduced in half-turns: x = pos *
 * (freq / pi), r = x - 2 rint(x / 2) in [-1, 1] (exact), then one MUFU sin and cos of pi r
 * (absolute error ~2^-21 on [-pi, pi]). The fp32 rounding of x is the same order as that of
 * pos * freq (~pos * 2^-24 radians); the accurate sincosf is ~40 instructions a pair.
 */
__device__ __forceinline__ void rotate_pair(float& lo, float& hi, float pos, float freq_over_pi) {
  const float x = pos * freq_over_pi;
  const float r = fmaf(-2.f, rintf(0.5f * x), x);
  float s, c;
  __sincosf(3.14159265358979f * r, &s, &c);
  const float a = lo * c - hi * s;
  const float b = hi * c + lo * s;
  lo = a;
  hi = b;
}

/** The prefill call sites: 8 consecutive pairs i0..i0+7 of a head of D dims. */
template <int D>
__device__ __forceinline__ void rotate8(float (&lo)[8], float (&hi)[8], float pos, int i0,
                                        const LlamaRope& r) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    rotate_pair(lo[j], hi[j], pos, r.freq(i0 + j, D) * 0.318309886183791f);
  }
}

}  // namespace rope
}  // namespace flashgen
