/**
 * @brief RoPE pre-pass over the keys: the rotated keys go to the workspace once per call, so the
 * attention kernel does not rotate each K tile again in every q tile that reads it (an 8192-token
 * causal prefill reads each K tile from ~32 q tiles on average).
 *
 * Output rows [rows][num_kv_heads][head_dim] in the input dtype: single: row = kv position;
 * ragged: row = k row (kv_indptr order); paged: row = slot * PAGE_SIZE + offset for the
 * slot-th entry of kv_indices (positions past a request's kv_len are left unwritten and never
 * read). Key position = j + kv_rope_offset[b].
 */
#pragma once

#include <cstdint>

#include "flashgen/params.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/prefill/kernel.cuh"
#include "flashgen/prefill/rope.cuh"

namespace flashgen {
namespace prefill {

constexpr int kRopeThreads = 256;

/** Last b in [0, n) with indptr[b] <= x (indptr non-decreasing, indptr[0] <= x). */
__device__ __forceinline__ uint32_t find_request(const int32_t* indptr, uint32_t n, int64_t x) {
  uint32_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (int64_t(__ldg(indptr + mid)) <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <int D, typename T>
__device__ __forceinline__ void rope_row(const T* src, T* dst, float pos, const rope::LlamaRope& rp,
                                         uint32_t c) {
  float lo[8], hi[8];
  unpack8<T>(*reinterpret_cast<const uint4*>(src + c * 8), lo);
  unpack8<T>(*reinterpret_cast<const uint4*>(src + D / 2 + c * 8), hi);
  rope::rotate8<D>(lo, hi, pos, int(c * 8), rp);
  *reinterpret_cast<uint4*>(dst + c * 8) = pack8<T>(lo);
  *reinterpret_cast<uint4*>(dst + D / 2 + c * 8) = pack8<T>(hi);
}

/** Work item: (row, kv head, half chunk c < D/16), grid-stride over rows * heads * D/16. */
template <int D, typename Q, typename K, typename O>
__global__ void __launch_bounds__(kRopeThreads)
    rope_k_single_kernel(const __grid_constant__ SinglePrefillParams<Q, K, O> p, K* out,
                         int64_t rows) {
  ptx::wait_prerequisite_grid();
  ptx::launch_dependents();
  const rope::LlamaRope rp = rope::LlamaRope::make(p.rope_theta, p.rope_scale);
  constexpr int kHalf = D / 16;
  const int64_t n = rows * p.num_kv_heads * kHalf;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t c = uint32_t(i % kHalf);
    const int64_t rh = i / kHalf;
    const uint32_t h = uint32_t(rh % p.num_kv_heads);
    const int64_t row = rh / p.num_kv_heads;
    rope_row<D>(p.k + row * p.k_stride_n + h * p.k_stride_h, out + rh * D, float(row), rp, c);
  }
}

template <int D, typename Q, typename K, typename O>
__global__ void __launch_bounds__(kRopeThreads)
    rope_k_ragged_kernel(const __grid_constant__ BatchPrefillRaggedParams<Q, K, O> p, K* out,
                  int64_t rows) {
  ptx::wait_prerequisite_grid();
  ptx::launch_dependents();
  const rope::LlamaRope rp = rope::LlamaRope::make(p.rope_theta, p.rope_scale);
  constexpr int kHalf = D / 16;
  const int64_t n = rows * p.num_kv_heads * kHalf;
  const int64_t end = p.kv_indptr[p.batch_size];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t c = uint32_t(i % kHalf);
    const int64_t rh = i / kHalf;
    const uint32_t h = uint32_t(rh % p.num_kv_heads);
    const int64_t row = rh / p.num_kv_heads;
    if (row < p.kv_indptr[0] || row >= end) continue;
    const uint32_t b = find_request(p.kv_indptr, p.batch_size, row);
    const int64_t pos = row - p.kv_indptr[b] + (p.kv_rope_offset ? p.kv_rope_offset[b] : 0);
    rope_row<D>(p.k + row * p.k_stride_n + h * p.k_stride_h, out + rh * D, float(pos), rp, c);
  }
}

template <int D, int PAGE_SIZE, typename Q, typename K, typename O>
__global__ void __launch_bounds__(kRopeThreads)
    rope_k_paged_kernel(const __grid_constant__ BatchPrefillPagedParams<Q, K, O> p, K* out,
                  int64_t rows) {
  ptx::wait_prerequisite_grid();
  ptx::launch_dependents();
  const rope::LlamaRope rp = rope::LlamaRope::make(p.rope_theta, p.rope_scale);
  constexpr int kHalf = D / 16;
  const int64_t n = rows * p.num_kv_heads * kHalf;
  const int64_t first = int64_t(p.kv_indptr[0]) * PAGE_SIZE;
  const int64_t end = int64_t(p.kv_indptr[p.batch_size]) * PAGE_SIZE;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t c = uint32_t(i % kHalf);
    const int64_t rh = i / kHalf;
    const uint32_t h = uint32_t(rh % p.num_kv_heads);
    const int64_t row = rh / p.num_kv_heads;
    if (row < first || row >= end) continue;
    const int64_t slot = row / PAGE_SIZE;
    const uint32_t b = find_request(p.kv_indptr, p.batch_size, slot);
    const int64_t pos = (slot - p.kv_indptr[b]) * PAGE_SIZE + row % PAGE_SIZE;
    if (pos >= p.get_kv_len(b)) continue;
    const int64_t page = p.kv_indices[slot];
    const K* src = p.paged_kv + page * p.kv_stride_page + (row % PAGE_SIZE) * p.kv_stride_n +
                   h * p.kv_stride_h;
    rope_row<D>(src, out + rh * D, float(pos + (p.kv_rope_offset ? p.kv_rope_offset[b] : 0)), rp,
                c);
  }
}

/** The pre-pass kernel of a params kind (PAGE_SIZE: paged only). */
template <int D, int PAGE_SIZE, typename Q, typename K, typename O>
constexpr auto rope_k_kernel(const SinglePrefillParams<Q, K, O>&) {
  return rope_k_single_kernel<D, Q, K, O>;
}
template <int D, int PAGE_SIZE, typename Q, typename K, typename O>
constexpr auto rope_k_kernel(const BatchPrefillRaggedParams<Q, K, O>&) {
  return rope_k_ragged_kernel<D, Q, K, O>;
}
template <int D, int PAGE_SIZE, typename Q, typename K, typename O>
constexpr auto rope_k_kernel(const BatchPrefillPagedParams<Q, K, O>&) {
  return rope_k_paged_kernel<D, PAGE_SIZE, Q, K, O>;
}

}  // namespace prefill
}  // namespace flashgen
