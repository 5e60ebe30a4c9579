/**
 * @brief Element types to and from float: the one conversion the kernels of every family use
 * (round to nearest even on the way back).
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace flashgen
