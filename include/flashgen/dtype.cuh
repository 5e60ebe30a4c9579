/**
 * @brief Element types to and from float: the one conversion the kernels of every family use
 * (round to nearest even on the way back), one value at a time or eight of 16 bits as one
 * 16-byte vector.
 */
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace flashgen
