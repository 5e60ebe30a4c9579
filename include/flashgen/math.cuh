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

// NAME(x): one MUFU instruction, INSTR, on one float.
#define FLASHGEN_MUFU(NAME, INSTR)                 \
  __device__ __forceinline__ float NAME(float x) { \
    float y;                                       \
    asm(INSTR " %0, %1;" : "=f"(y) : "f"(x));      \
    return y;                                      \
  }

/** 2^x (flushes denormals; exact enough for softmax weights). */
FLASHGEN_MUFU(ptx_exp2, "ex2.approx.ftz.f32")
/** log2(x). */
FLASHGEN_MUFU(ptx_log2, "lg2.approx.ftz.f32")
/** 1/x. */
FLASHGEN_MUFU(ptx_rcp, "rcp.approx.ftz.f32")
/** tanh(x) (sm_75+); relative error about 2^-11. */
FLASHGEN_MUFU(ptx_tanh, "tanh.approx.f32")
#undef FLASHGEN_MUFU

/** tanh(x) to full float precision; costs a few more instructions than ptx_tanh. */
__device__ __forceinline__ float tanh(float x) { return ::tanhf(x); }

/** The largest x of the warp's 32 lanes, in every lane. */
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

}  // namespace math
}  // namespace flashgen

// Variant headers are written at global scope and say `math::ptx_exp2`, `math::log2e`.
namespace math = ::flashgen::math;
