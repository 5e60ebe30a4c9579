/**
 * @brief Element types to and from float: the one conversion the kernels of every family use
 * (round to nearest even on the way back), one value at a time or eight of 16 bits as one
 * 16-byte vector; and the exact widening of an fp8 KV cache to the 16-bit type of the
 * tensor-core products.
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "flashgen/ptx_sm80.cuh"

namespace flashgen {

__device__ __forceinline__ float to_float(half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ half from_float<half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/**
 * 8 packed 16-bit values <-> floats. `v` is taken by value on purpose: bound by reference to a
 * dereferenced global pointer (`*reinterpret_cast<const uint4*>(src)`), the element reads below
 * go to memory one by one (eight 2-byte loads per 16-byte chunk instead of one 16-byte load).
 */
template <typename T>
__device__ __forceinline__ void unpack8(const uint4 v, float (&x)[8]) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
}
template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  uint4 v;
  v.x = ptx::pack2<T>(x[0], x[1]);
  v.y = ptx::pack2<T>(x[2], x[3]);
  v.z = ptx::pack2<T>(x[4], x[5]);
  v.w = ptx::pack2<T>(x[6], x[7]);
  return v;
}

/** The fp8 cache types (one byte: sign, exponent, mantissa). */
template <typename T>
constexpr bool is_fp8 = std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

namespace fp8 {

/**
 * fp8 to f16 / bf16, exact for every finite value, subnormals included. Without hardware fp8
 * conversion (sm_80 has none): the sign stays in bit 15, the exponent and mantissa bits move
 * under the 16-bit type's (a subnormal fp8 lands on a subnormal or normal 16-bit value with the
 * same mantissa bits), which gives the value times 2^-(difference of the exponent biases); one
 * multiply by that power of two, exact, restores it. e5m2 -> f16 is the byte shifted into the
 * high half as it stands (same exponent width and bias). On sm_89 and later e4m3 -> f16 is the
 * hardware's conversion (one instruction a pair, where the shifts take four).
 *
 * Not finite values: e4m3fn's NaN (S.1111.111) becomes +-480 (a value past e4m3's largest, 448)
 * in the shifted form and NaN in the hardware's; e5m2's Inf and NaN stay Inf and NaN in f16 and
 * become finite +-65536 .. +-114688 in bf16.
 *
 * The pair form works on two bytes each sign-extended to its 16-bit half of a word (spread2):
 * one shift puts both bytes' exponent and mantissa bits in place and brings the sign copies
 * along to bit 15, and one mask clears what lies between and below.
 */
template <typename To, typename Fp8>
struct Widen;

// f16: 5 exponent bits, bias 15. e4m3 (bias 7) is placed 1 bit lower: value * 2^-8.
template <>
struct Widen<half, __nv_fp8_e4m3> {
  static constexpr uint32_t kLeft = 7, kMask = 0xbf80u, kScaleBits = 0x5c00u;  // 2^8
};
template <>
struct Widen<half, __nv_fp8_e5m2> {
  static constexpr uint32_t kLeft = 8, kMask = 0xff00u, kScaleBits = 0;  // as it stands
};
// bf16: 8 exponent bits, bias 127: e4m3 placed 4 bits lower (value * 2^-120), e5m2 3 bits lower
// (value * 2^-112).
template <>
struct Widen<__nv_bfloat16, __nv_fp8_e4m3> {
  static constexpr uint32_t kLeft = 4, kMask = 0x87f0u, kScaleBits = 0x7b80u;  // 2^120
};
template <>
struct Widen<__nv_bfloat16, __nv_fp8_e5m2> {
  static constexpr uint32_t kLeft = 5, kMask = 0x8fe0u, kScaleBits = 0x7780u;  // 2^112
};

/** Bytes 0 and 1 of `x` (`hi`: bytes 2 and 3), each sign-extended to 16 bits, in the low and
 *  high halves. A shift left by kLeft <= 8 moves the low half's sign copies into the high half's
 *  low bits only, which every kMask clears. */
__host__ __device__ __forceinline__ uint32_t spread2(uint32_t x, bool hi) {
#ifdef __CUDA_ARCH__
  // prmt's own mode (not __byte_perm, which drops it): a selector nibble of 8 + i is byte i's
  // sign replicated.
  uint32_t out;
  if (hi) {
    asm("prmt.b32 %0, %1, 0, 0xb3a2;" : "=r"(out) : "r"(x));
  } else {
    asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(out) : "r"(x));
  }
  return out;
#else
  const uint32_t b0 = (x >> (hi ? 16 : 0)) & 0xffu, b1 = (x >> (hi ? 24 : 8)) & 0xffu;
  const auto extend = [](uint32_t b) { return b | ((b & 0x80u) ? 0xff00u : 0u); };
  return extend(b0) | (extend(b1) << 16);
#endif
}

/** The 16-bit value of a 16-bit pattern, as float (host side of the scale multiply). */
template <typename To>
__host__ __device__ __forceinline__ float bits_to_float(uint32_t bits) {
  if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    const uint32_t f = bits << 16;
    float out;
    std::memcpy(&out, &f, 4);
    return out;
  } else {
    __half_raw raw;
    raw.x = static_cast<unsigned short>(bits);
    return __half2float(half(raw));
  }
}

template <typename To>
__host__ __device__ __forceinline__ uint32_t float_to_bits(float x) {
  if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    uint32_t f;
    std::memcpy(&f, &x, 4);
    return f >> 16;  // exact here: every result has a bf16 value
  } else {
    return static_cast<__half_raw>(__float2half_rn(x)).x;
  }
}

/** Two fp8 values, spread as spread2 leaves them, as a packed pair of `To` (element 0 low). */
template <typename To, typename Fp8>
__host__ __device__ __forceinline__ uint32_t widen2(uint32_t spread) {
  using W = Widen<To, Fp8>;
  const uint32_t bits = (spread << W::kLeft) & (W::kMask | (W::kMask << 16));
  if constexpr (W::kScaleBits == 0) {
    return bits;
  } else {
#ifdef __CUDA_ARCH__
    // One packed multiply by the power of two (exact: every product is a 16-bit value).
    using Pair = std::conditional_t<std::is_same_v<To, half>, __half2, __nv_bfloat162>;
    const uint32_t scale = W::kScaleBits | (W::kScaleBits << 16);
    Pair a, s;
    std::memcpy(&a, &bits, 4);
    std::memcpy(&s, &scale, 4);
    const Pair r = __hmul2(a, s);
    uint32_t out;
    std::memcpy(&out, &r, 4);
    return out;
#else
    const float s = bits_to_float<To>(W::kScaleBits);
    return float_to_bits<To>(bits_to_float<To>(bits & 0xffffu) * s) |
           (float_to_bits<To>(bits_to_float<To>(bits >> 16) * s) << 16);
#endif
  }
}

/** Four fp8 values (byte i = element i) as two packed pairs of `To`: elements 0, 1 and 2, 3. */
template <typename To, typename Fp8>
__host__ __device__ __forceinline__ void widen4(uint32_t x, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (std::is_same_v<To, half> && std::is_same_v<Fp8, __nv_fp8_e4m3>) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
    return;
  }
#endif
  if constexpr (std::is_same_v<To, half> && std::is_same_v<Fp8, __nv_fp8_e5m2>) {
    // The bytes into the high halves as they stand: one byte permutation a pair.
#ifdef __CUDA_ARCH__
    lo = __byte_perm(x, 0u, 0x1404u);
    hi = __byte_perm(x, 0u, 0x3424u);
#else
    lo = ((x & 0xffu) << 8) | ((x & 0xff00u) << 16);
    hi = ((x >> 8) & 0xff00u) | (x & 0xff000000u);
#endif
    return;
  }
  lo = widen2<To, Fp8>(spread2(x, false));
  hi = widen2<To, Fp8>(spread2(x, true));
}

#ifdef __CUDACC__  // device helpers (tests compile the rest of this header as plain C++)
/**
 * An fp8 cache's products run in f16 whatever q's type (e4m3 and e5m2 widen to f16 in one
 * instruction a pair on sm_89+, bf16 takes four): the query is multiplied by 2^shift, which
 * brings `mx` (the largest |QueryTransform(q) * k_scale| of the rows staged together) into
 * [2^14, 2^15), and the logits by 2^-shift. f16 then keeps every element down to 2^-28 of the
 * largest as a normal number, with more bits than bf16 has. 0 for a zero or non-finite mx;
 * clamped to +-100, so both powers stay normal floats. The rule of every kernel over an fp8
 * cache (decode, both prefill backends).
 */
__device__ __forceinline__ int f16_shift(float mx) {
  if (!(mx > 0.f) || !isfinite(mx)) return 0;
  int e;
  frexpf(mx, &e);  // mx = f * 2^e, f in [0.5, 1)
  return max(-100, min(100, 15 - e));
}

/** 2^n exactly, for |n| <= 126 (f16_shift's powers). */
__device__ __forceinline__ float pow2(int n) { return __int_as_float((127 + n) << 23); }

/** The factors of an fp8 cache's f16 products: the query's (k_scale * 2^shift) and the
 *  logits' (2^-shift), for `mx` the largest |QueryTransform(q)| of the rows staged together. */
struct F16Scales {
  float query, logits;
};
__device__ __forceinline__ F16Scales f16_scales(float mx, float k_scale) {
  const int shift = f16_shift(mx * fabsf(k_scale));
  return {k_scale * pow2(shift), pow2(-shift)};
}
#endif

/** One fp8 byte as the bits of its `To` value (the scalar form of widen2, for tests). */
template <typename To, typename Fp8>
__host__ __device__ __forceinline__ uint32_t widen1(uint8_t b) {
  return widen2<To, Fp8>(spread2(b, false)) & 0xffffu;
}

}  // namespace fp8
}  // namespace flashgen
