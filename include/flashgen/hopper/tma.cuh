/**
 * @brief Bulk tensor copies (TMA, sm_90): the device-side 3-D tile load completing on an
 * mbarrier, and the host-side tensor map of a K or V tensor [rows][heads][head_dim] (any row and
 * head strides), encoded through the driver's cuTensorMapEncodeTiled, found with
 * cudaGetDriverEntryPointByVersion so that nothing links against libcuda.
 *
 * A map's box is 64 elements of head_dim (128 bytes, the widest a 128-byte swizzle allows) x
 * ROWS rows x 1 head; a tile of head_dim D is D / 64 boxes, one per column block. Rows past the
 * tensor's end are zero-filled and still count towards the transaction bytes. A map of an fp8
 * tensor (one byte an element) has the same boxes, 64 bytes wide and not swizzled: the staging
 * ring the prefill kernel widens from (hopper/prefill/widen.cuh) holds them as they land.
 */
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "flashgen/status.cuh"

namespace flashgen {
namespace hopper {

/** The maps of one launch, passed by value as a __grid_constant__ kernel parameter. */
struct KVTensorMaps {  // CUtensorMap is itself 64-byte aligned
  CUtensorMap k, v;
};

/** Box (c0 = column, c1, c2) of the map into shared memory at `dst`, completing on `bar`. The
 *  map's dimension order is (head_dim, rows, heads) or (head_dim, heads, rows): see make_kv_map. */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int32_t c0, int32_t c1, int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

/** 5-D box (the paged map: see make_paged_map); coordinates may be negative (zero fill). */
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                                            int32_t c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
      "r"(bar)
      : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

/** Host: the driver function `name` of `version`, looked up once per call site (`slot`). */
template <typename Fn>
inline int driver_entry(const char* name, int version, std::atomic<Fn>& slot, Fn* fn) {
  Fn f = slot.load(std::memory_order_acquire);
  if (f == nullptr) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
      return fail(FLASHGEN_CUDA_ERROR,
                  "%s not found in the CUDA driver (%s): the Hopper kernels need a driver for CUDA "
                  "12.0 or newer",
                  name, cudaGetErrorString(err));
    }
    f = reinterpret_cast<Fn>(p);
    slot.store(f, std::memory_order_release);
  }
  *fn = f;
  return FLASHGEN_OK;
}

/**
 * Host: gives the calling thread a current context, which the driver's tensor-map encoder needs.
 * The runtime binds its device's primary context to a thread lazily, at the thread's first
 * launch or allocation, so a thread whose first CUDA work is a call of a Hopper kernel had none,
 * and cuTensorMapEncodeTiled failed with CUDA_ERROR_INVALID_CONTEXT (201): seen on the H200 when
 * worker threads' first CUDA call was the sm90 single decode. cudaSetDevice of the runtime's
 * current device binds that device's primary context (CUDA 12 and later), which is what the
 * first launch would have done; a thread that has a context pays one cuCtxGetCurrent.
 */
inline int bind_current_context() {
  static std::atomic<PFN_cuCtxGetCurrent_v4000> slot{nullptr};
  PFN_cuCtxGetCurrent_v4000 get_current;
  if (int st = driver_entry("cuCtxGetCurrent", 4000, slot, &get_current)) return st;
  CUcontext ctx = nullptr;
  if (get_current(&ctx) == CUDA_SUCCESS && ctx != nullptr) return FLASHGEN_OK;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaSetDevice(dev);
  if (err != cudaSuccess) {
    return fail(FLASHGEN_CUDA_ERROR, "binding device %d's context to this thread: %s", dev,
                cudaGetErrorString(err));
  }
  return FLASHGEN_OK;
}

/** Host: cuTensorMapEncodeTiled from the driver, with a context current on this thread. */
inline int get_encode_tiled(PFN_cuTensorMapEncodeTiled_v12000* fn) {
  static std::atomic<PFN_cuTensorMapEncodeTiled_v12000> slot{nullptr};
  if (int st = driver_entry("cuTensorMapEncodeTiled", 12000, slot, fn)) return st;
  return bind_current_context();
}

/** The element of a K/V tensor map: 16-bit (the copy engine moves bytes, so bf16 stands for f16
 *  too) swizzled as wgmma reads it, or one byte (an fp8 cache) unswizzled, for the widening. */
template <typename T>
struct MapElement {
  static_assert(sizeof(T) == 2 || sizeof(T) == 1, "16-bit or fp8 K/V");
  static constexpr CUtensorMapDataType kType =
      sizeof(T) == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  static constexpr CUtensorMapSwizzle kSwizzle =
      sizeof(T) == 2 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE;
};

/**
 * Host: encodes `map` of `rank` dimensions (element strides 1, swizzle `swizzle`, 256-byte L2
 * promotion, no out-of-bounds fill) with cuTensorMapEncodeTiled; a failure's error names the
 * tensor with `tensor` (a printf format) and its arguments.
 */
template <typename... A>
inline int encode_tiled(CUtensorMap* map, CUtensorMapDataType dt, CUtensorMapSwizzle swizzle,
                        cuuint32_t rank, const void* base, const cuuint64_t* dims,
                        const cuuint64_t* strides, const cuuint32_t* box, const char* tensor,
                        A... args) {
  PFN_cuTensorMapEncodeTiled_v12000 encode;
  if (int st = get_encode_tiled(&encode)) return st;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, dt, rank, const_cast<void*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return FLASHGEN_OK;
  char what[256];
  std::snprintf(what, sizeof what, tensor, args...);
  return fail(FLASHGEN_CUDA_ERROR, "cuTensorMapEncodeTiled failed (%d) for %s at %p", int(r), what,
              base);
}

/** Whether make_kv_map put rows in dimension 1 (else heads are dimension 1, rows dimension 2). */
struct KVMapOrder {
  bool rows_first;
};

/**
 * Host: map of a 16-bit or fp8 tensor with `rows` rows and `heads` heads of head_dim elements at
 * `base` (strides in elements; head_dim contiguous), box 64 x box_rows x 1. The two outer
 * dimensions are ordered by stride (smaller first), which covers NHD and HND.
 */
template <typename T>
inline int make_kv_map(CUtensorMap* map, KVMapOrder* order, const T* base, int64_t rows,
                       int64_t heads, int64_t head_dim, int64_t stride_n, int64_t stride_h,
                       int box_rows) {
  const bool rows_first = stride_n <= stride_h;
  order->rows_first = rows_first;
  cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(rows_first ? rows : heads),
                        cuuint64_t(rows_first ? heads : rows)};
  cuuint64_t strides[2] = {cuuint64_t((rows_first ? stride_n : stride_h) * sizeof(T)),
                           cuuint64_t((rows_first ? stride_h : stride_n) * sizeof(T))};
  cuuint32_t box[3] = {64, cuuint32_t(rows_first ? box_rows : 1), cuuint32_t(rows_first ? 1 : box_rows)};
  return encode_tiled(map, MapElement<T>::kType, MapElement<T>::kSwizzle, 3, base, dims, strides,
                      box,
                      "a K/V tensor of %lld rows, %lld heads, strides %lld/%lld elements",
                      static_cast<long long>(rows), static_cast<long long>(heads),
                      static_cast<long long>(stride_n), static_cast<long long>(stride_h));
}

/** Which logical coordinate (0 row in page, 1 head, 2 k/v, 3 page) each of the paged map's
 *  dimensions 1..4 holds (dimensions ordered by stride). */
struct PagedMapOrder {
  uint8_t at[4];
};

/**
 * Host: 5-D map of a page pool (16-bit or fp8): element (d, row in page, head, kv, page) at base
 * + page * stride_page + kv * stride_kv + row * stride_n + head * stride_h + d (strides in
 * elements), box 64 x page_size rows x 1 x 1 x 1, MapElement's swizzle. The pool's page count is
 * not known to the host: the page extent is 2^31 - 1 (page ids come from kv_indices), and a
 * page coordinate of -1 reads zeros (pages past a request's end).
 */
template <typename T>
inline int make_paged_map(CUtensorMap* map, PagedMapOrder* order, const T* base, int64_t heads,
                          int64_t head_dim, int64_t page_size, int64_t stride_page,
                          int64_t stride_kv, int64_t stride_n, int64_t stride_h) {
  const int64_t ext[4] = {page_size, heads, 2, (int64_t{1} << 31) - 1};
  const int64_t str[4] = {stride_n, stride_h, stride_kv, stride_page};
  int idx[4] = {0, 1, 2, 3};
  std::sort(idx, idx + 4, [&](int a, int b) { return str[a] < str[b] || (str[a] == str[b] && a < b); });
  cuuint64_t dims[5] = {cuuint64_t(head_dim)};
  cuuint64_t strides[4];
  cuuint32_t box[5] = {64, 1, 1, 1, 1};
  for (int k = 0; k < 4; ++k) {
    order->at[k] = uint8_t(idx[k]);
    dims[k + 1] = cuuint64_t(ext[idx[k]]);
    strides[k] = cuuint64_t(str[idx[k]] * int64_t(sizeof(T)));
    if (idx[k] == 0) box[k + 1] = cuuint32_t(page_size);
  }
  return encode_tiled(map, MapElement<T>::kType, MapElement<T>::kSwizzle, 5, base, dims, strides,
                      box,
                      "a page pool of page size %lld, %lld heads, strides page/kv/n/h "
                      "%lld/%lld/%lld/%lld elements",
                      static_cast<long long>(page_size), static_cast<long long>(heads),
                      static_cast<long long>(stride_page), static_cast<long long>(stride_kv),
                      static_cast<long long>(stride_n), static_cast<long long>(stride_h));
}

}  // namespace hopper
}  // namespace flashgen
