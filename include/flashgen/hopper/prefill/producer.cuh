/**
 * @brief The producer of the sm90 prefill kernel: warpgroup 0's K/V copies into the stage
 * buffers (storage.cuh), each stage published on its full barrier and taken back on its empty
 * one. Three ways, by how K/V are laid out:
 *  - contiguous K/V (single, ragged; PAGE_SIZE 0): one thread issues 3-D TMA boxes (one per
 *    64-column block) through the tensor maps; with RoPE the keys come from the rotated copy the
 *    pre-pass wrote into the workspace (the launch points maps.k at it);
 *  - paged, page sizes that are multiples of 8 dividing the kv tile (hopper_paged_tma): warp 0
 *    issues one 5-D box per page and column block, a box per lane, and zeroes the rows of the
 *    last page past kv_len;
 *  - other page sizes (1): the 128 threads gather rows with 16-byte cp.async into the same
 *    swizzled layout, each arriving on the stage's full barrier when its copies land.
 *
 * Here: where a request's K/V rows start in the tensor maps. The three producer loops are still
 * in the kernel body (kernel.cuh): they call the scheduler's lambdas, and moved into functions
 * they compiled to different SASS in some instances (include/flashgen/README.md).
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace flashgen {
namespace hopper {

/** Where a request's K/V rows start in the tensor maps (single: 0; ragged: kv_indptr[b]). */
template <typename Params, typename = void>
struct has_kv_indptr : std::false_type {};
template <typename Params>
struct has_kv_indptr<Params, std::void_t<decltype(std::declval<Params>().kv_indptr)>>
    : std::true_type {};

template <typename Params>
__device__ __forceinline__ int32_t request_kv_row0(const Params& p, uint32_t batch) {
  if constexpr (has_kv_indptr<Params>::value) {
    return p.kv_indptr[batch];
  } else {
    return 0;
  }
}

}  // namespace hopper
}  // namespace flashgen
