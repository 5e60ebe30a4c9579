/**
 * @brief The kv_dtype axis of the modules that read an fp8 KV cache (batch_decode,
 * batch_prefill_paged, batch_prefill_ragged, single_prefill), host side: the cache's element
 * type of a kv_dtype code, the conditions of an fp8 call and its scales. Include after
 * <flashgen_instance.cuh> (its FLASHGEN_CODE_kv_dtype_* codes).
 *
 * rope_llama with an fp8 cache is no instance: variants.json declares it in those modules'
 * `unsupported` (the RoPE kernels rotate 16-bit keys only). Each module's `run` asserts it
 * statically there, not in its Instance class: a dispatching binary names the class of every
 * combination it reaches, and skips this one.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include <cuda_fp8.h>

#include "flashgen/dtype.cuh"
#include "flashgen/status.cuh"

namespace flashgen {

/** The cache's element type of kv_dtype code KV: `DType` itself, or an fp8 type. */
template <typename DType, int KV>
using CacheType = std::conditional_t<
    KV == FLASHGEN_CODE_kv_dtype_fp8_e4m3, __nv_fp8_e4m3,
    std::conditional_t<KV == FLASHGEN_CODE_kv_dtype_fp8_e5m2, __nv_fp8_e5m2, DType>>;

/** A stride of the cache as an error message names it. */
struct NamedStride {
  const char* name;
  int64_t value;
};

/**
 * An fp8 cache's conditions: every stride a multiple of 16 elements (a row is read as 16-byte
 * copies of 16 elements), finite scales; they become the params' k_scale and v_scale.
 * `tensor`: the cache's name in messages.
 */
template <typename Params, int N>
int fill_fp8_cache(Params& p, const char* module, const char* tensor,
                   const NamedStride (&strides)[N], float k_scale, float v_scale) {
  for (const NamedStride& s : strides) {
    if (s.value % 16 != 0) {
      char list[160];
      int at = 0;
      for (int i = 0; i < N && at < int(sizeof(list)); ++i) {
        at += std::snprintf(list + at, sizeof(list) - at, "%s%s %lld", i ? ", " : "",
                            strides[i].name, static_cast<long long>(strides[i].value));
      }
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "%s: an fp8 %s needs strides that are multiples of 16 elements (%s)", module,
                  tensor, list);
    }
  }
  if (!std::isfinite(k_scale) || !std::isfinite(v_scale)) {
    return fail(FLASHGEN_INVALID_ARGUMENT, "%s: k_scale and v_scale must be finite, got %g and %g",
                module, static_cast<double>(k_scale), static_cast<double>(v_scale));
  }
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  return FLASHGEN_OK;
}

/** Whether Params read a paged cache (batch_decode's, batch_prefill_paged's) rather than
 *  contiguous k and v. */
template <typename Params, typename = void>
constexpr bool kPagedParams = false;
template <typename Params>
constexpr bool kPagedParams<Params, std::void_t<decltype(&Params::paged_kv)>> = true;

/**
 * An fp8 call's K/V conditions and scales (fill_fp8_cache), nothing for a 16-bit cache: the
 * paged cache's strides (the arguments' kv_stride_*) or contiguous k's and v's (k_stride_*,
 * v_stride_*). `module`: the entry's name in messages.
 */
template <typename Params, typename Args>
int fill_fp8_kv(Params& p, const Args& a, const char* module) {
  if constexpr (!is_fp8<typename Params::DTypeKV>) {
    return FLASHGEN_OK;
  } else if constexpr (kPagedParams<Params>) {
    const NamedStride strides[] = {{"page", a.kv_stride_page}, {"kv", a.kv_stride_kv},
                                   {"n", a.kv_stride_n}, {"h", a.kv_stride_h}};
    return fill_fp8_cache(p, module, "paged_kv", strides, a.k_scale, a.v_scale);
  } else {
    const NamedStride strides[] = {{"k n", a.k_stride_n}, {"k h", a.k_stride_h},
                                   {"v n", a.v_stride_n}, {"v h", a.v_stride_h}};
    return fill_fp8_cache(p, module, "k and v", strides, a.k_scale, a.v_scale);
  }
}

}  // namespace flashgen
