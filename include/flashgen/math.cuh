/**
 * @brief Math helpers every variant may use: fast PTX exp2/log2/rcp/tanh and log2(e).
 *
 * Reachable unqualified from a variant as `math::...` (a namespace alias at global scope), as in
 * the RFC's variant examples. The softmax path of every kernel works in base 2.
 */
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace flashgen {
namespace math {

constexpr float log2e = 1.4426950408889634f;  // log2(e): natural-log logits to base 2
constexpr float ln2 = 0.6931471805599453f;    // ln(2): base-2 LSE back to natural log
constexpr float inf = __builtin_huge_valf();

/** 2^x, one MUFU instruction (flushes denormals; exact enough for softmax weights). */
__device__ __forceinline__ float ptx_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/** log2(x), one MUFU instruction. */
__device__ __forceinline__ float ptx_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/** 1/x, one MUFU instruction. */
__device__ __forceinline__ float ptx_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/** tanh(x) in one MUFU instruction (sm_75+); relative error about 2^-11. */
__device__ __forceinline__ float ptx_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/**
 * 2^x without the MUFU unit (the FMA and integer pipes), for kernels whose special-function unit
 * is the bottleneck (FA4's trick): j = round(x) by the 1.5 * 2^23 shift, 2^f for f = x - j in
 * [-0.5, 0.5] by a degree-3 polynomial with p(0) = 1 exactly (relative error <= 1.1e-4, mean
 * 4e-5), j added to the exponent field. x is clamped to >= -127, where the result is exactly +0
 * (so -inf gives 0, as ex2 does); results between 2^-127 and 2^-126 are not accurate (they are
 * below every weight that matters). Valid for x <= 127. 9 instructions, none on the MUFU pipe.
 */
__device__ __forceinline__ float exp2_fma(float x) {
  x = fmaxf(x, -127.f);
  const float t = x + 12582912.f;        // 1.5 * 2^23: round(x) sits in t's low mantissa bits
  const float f = x - (t - 12582912.f);  // x - round(x), exact
  const float p = fmaf(fmaf(fmaf(0.0550086908f, f, 0.242210627f), f, 0.693282902f), f, 1.f);
  // The low 9 bits of t's bit pattern are round(x) mod 512: shifted by 23 they add round(x) to
  // p's exponent (mod 2^32, so negative values need no special case).
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

/** tanh(x) to full float precision; costs a few more instructions than ptx_tanh. */
__device__ __forceinline__ float tanh(float x) { return ::tanhf(x); }

}  // namespace math
}  // namespace flashgen

// Variant headers are written at global scope and say `math::ptx_exp2`, `math::log2e`.
namespace math = ::flashgen::math;
