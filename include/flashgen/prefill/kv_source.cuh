/**
 * @brief Where a request's rows live: per-params-kind request info and K/V row sources.
 *
 * request_info() turns a batch index into lengths and row offsets (reading indptrs on the
 * device for the batch kinds); make_kv() gives the CTA's K/V source for one kv head. With RoPE
 * on, K comes from the pre-rotated copy in the workspace (rope_k.cuh), laid out as
 * [kv rows][num_kv_heads][head_dim], rows in the request order of the kind (paged: slot
 * kv_indptr[b] * PAGE_SIZE + pos); V always comes from the caller's tensors.
 */
#pragma once

#include <cstdint>

#include "flashgen/params.cuh"

namespace flashgen {
namespace prefill {

struct RequestInfo {
  uint32_t qo_len, kv_len;
  int64_t q_row0;   // token index (in q, o and lse) of the request's query 0
  int64_t kv_row0;  // row of key 0 in the rotated-K workspace (ragged/single: k row; paged: slot)
  int32_t page0;    // kv_indptr[b] (paged)
  int32_t q_rope_offset, kv_rope_offset;
};

template <typename Q, typename K, typename O>
__device__ __forceinline__ RequestInfo request_info(const SinglePrefillParams<Q, K, O>& p,
                                                    uint32_t) {
  return {p.qo_len, p.kv_len, 0, 0, 0, 0, 0};
}

/** Ragged: kv_indptr [k0, k1) counts k rows. */
template <typename Q, typename K, typename O>
__device__ __forceinline__ void set_kv_range(const BatchPrefillRaggedParams<Q, K, O>&, uint32_t,
                                             int32_t k0, int32_t k1, RequestInfo& r) {
  r.kv_len = k1 > k0 ? uint32_t(k1 - k0) : 0u;
  r.kv_row0 = k0;
  r.page0 = 0;
}

/** Paged: kv_indptr [p0, p1) counts pages, the last one kv_last_page_len[b] rows long. */
template <typename Q, typename K, typename O>
__device__ __forceinline__ void set_kv_range(const BatchPrefillPagedParams<Q, K, O>& p, uint32_t b,
                                             int32_t p0, int32_t p1, RequestInfo& r) {
  r.kv_len = p1 > p0 ? uint32_t(p1 - p0 - 1) * p.page_size + uint32_t(p.kv_last_page_len[b]) : 0u;
  r.kv_row0 = int64_t(p0) * p.page_size;
  r.page0 = p0;
}

/** The batch kinds (ragged, paged): request b's spans of qo_indptr and kv_indptr. */
template <typename Params>
__device__ __forceinline__ RequestInfo request_info(const Params& p, uint32_t b) {
  RequestInfo r;
  const int32_t q0 = p.qo_indptr[b], q1 = p.qo_indptr[b + 1];
  const int32_t k0 = p.kv_indptr[b], k1 = p.kv_indptr[b + 1];
  r.qo_len = q1 > q0 ? uint32_t(q1 - q0) : 0u;
  set_kv_range(p, b, k0, k1, r);
  r.q_row0 = q0;
  r.q_rope_offset = p.q_rope_offset ? p.q_rope_offset[b] : 0;
  r.kv_rope_offset = p.kv_rope_offset ? p.kv_rope_offset[b] : 0;
  return r;
}

/** K and V rows held densely (single and ragged): row pos at base + pos * stride. */
template <typename T>
struct DenseKV {
  static constexpr bool kPaged = false;
  const T* k;
  const T* v;
  int64_t k_stride_n, v_stride_n;
  __device__ __forceinline__ int32_t page(uint32_t) const { return 0; }
  __device__ __forceinline__ const T* k_row(int32_t, uint32_t pos) const {
    return k + pos * k_stride_n;
  }
  __device__ __forceinline__ const T* v_row(int32_t, uint32_t pos) const {
    return v + pos * v_stride_n;
  }
};

/** Paged K/V; with K_DENSE the keys come from the dense rotated copy instead. */
template <typename T, int PAGE_SIZE, bool K_DENSE>
struct PagedKVSource {
  static constexpr bool kPaged = true;
  static constexpr bool kKDense = K_DENSE;
  const T* base;         // paged_kv + kv_head * stride_h
  const int32_t* pages;  // kv_indices + kv_indptr[b]
  int64_t stride_page, stride_kv, stride_n;
  const T* k_dense;      // K_DENSE: rotated keys of this request and head
  int64_t k_dense_stride;
  __device__ __forceinline__ int32_t page(uint32_t pos) const {
    return __ldg(pages + pos / PAGE_SIZE);
  }
  __device__ __forceinline__ const T* k_row(int32_t pg, uint32_t pos) const {
    if constexpr (K_DENSE) {
      return k_dense + pos * k_dense_stride;
    } else {
      return base + pg * stride_page + (pos % PAGE_SIZE) * stride_n;
    }
  }
  __device__ __forceinline__ const T* v_row(int32_t pg, uint32_t pos) const {
    return base + pg * stride_page + stride_kv + (pos % PAGE_SIZE) * stride_n;
  }
};

/** The K/V source of one kv head of a request (rope_k: the rotated-K workspace, ROPE only);
 *  single and ragged (single: kv_row0 is 0). */
template <int HEAD_DIM, int PAGE_SIZE, bool ROPE, typename Params, typename K>
__device__ __forceinline__ DenseKV<K> make_kv(const Params& p, const RequestInfo& rq,
                                              uint32_t kv_head, const K* rope_k) {
  DenseKV<K> kv;
  if constexpr (ROPE) {
    kv.k = rope_k + (rq.kv_row0 * p.num_kv_heads + kv_head) * HEAD_DIM;
    kv.k_stride_n = int64_t(p.num_kv_heads) * HEAD_DIM;
  } else {
    kv.k = p.k + rq.kv_row0 * p.k_stride_n + kv_head * p.k_stride_h;
    kv.k_stride_n = p.k_stride_n;
  }
  kv.v = p.v + rq.kv_row0 * p.v_stride_n + kv_head * p.v_stride_h;
  kv.v_stride_n = p.v_stride_n;
  return kv;
}

/** Paged. */
template <int HEAD_DIM, int PAGE_SIZE, bool ROPE, typename Q, typename K, typename O>
__device__ __forceinline__ PagedKVSource<K, PAGE_SIZE, ROPE> make_kv(
    const BatchPrefillPagedParams<Q, K, O>& p, const RequestInfo& rq, uint32_t kv_head,
    const K* rope_k) {
  PagedKVSource<K, PAGE_SIZE, ROPE> kv;
  kv.base = p.paged_kv + kv_head * p.kv_stride_h;
  kv.pages = p.kv_indices + rq.page0;
  kv.stride_page = p.kv_stride_page;
  kv.stride_kv = p.kv_stride_kv;
  kv.stride_n = p.kv_stride_n;
  if constexpr (ROPE) {
    kv.k_dense = rope_k + (rq.kv_row0 * p.num_kv_heads + kv_head) * HEAD_DIM;
    kv.k_dense_stride = int64_t(p.num_kv_heads) * HEAD_DIM;
  } else {
    kv.k_dense = nullptr;
    kv.k_dense_stride = 0;
  }
  return kv;
}

}  // namespace prefill
}  // namespace flashgen
