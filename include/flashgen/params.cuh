/**
 * @brief The params structs of the attention modules, which their kernels pass to variants (core
 * members + the variant's additional ones).
 *
 * The variant's additional parameters come from the generated ADDITIONAL_PARAMS_DECL
 * (`float logits_soft_cap;` ...) as members of AdditionalParams, a base of every params struct,
 * so a variant reads them as `params.<name>`. The entry point copies the caller's
 * `additional_params` struct into that base: it must be laid out as ADDITIONAL_PARAMS_DECL of the
 * header the binary was built from (in the instance form: the variant's own parameters).
 */
#pragma once

#include <cstdint>

#include "flashgen/dtype.cuh"

#ifndef ADDITIONAL_PARAMS_DECL
#error "include <flashgen_instance.cuh> (the generated header) before flashgen/params.cuh"
#endif

namespace flashgen {

/** The variant's additional parameters, in declared order with natural C alignment. */
struct AdditionalParams {
  ADDITIONAL_PARAMS_DECL
};

/** The element types and index type every params struct names; the variant's parameters. */
template <typename DTypeQ_, typename DTypeKV_, typename DTypeO_>
struct ParamsBase : AdditionalParams {
  using DTypeQ = DTypeQ_;
  using DTypeKV = DTypeKV_;
  using DTypeO = DTypeO_;
  using IdType = int32_t;
};

/** Length of CSR row b (0 when the indptr is not increasing): call on the device only. */
__host__ __device__ __forceinline__ uint32_t indptr_len(const int32_t* indptr, uint32_t b) {
  const int32_t n = indptr[b + 1] - indptr[b];
  return n > 0 ? uint32_t(n) : 0u;
}

/** Tokens of request b of a paged cache, from its page table: call on the device only. */
__host__ __device__ __forceinline__ uint32_t paged_len(const int32_t* kv_indptr,
                                                       const int32_t* kv_last_page_len,
                                                       uint32_t page_size, uint32_t b) {
  const int32_t num_pages = kv_indptr[b + 1] - kv_indptr[b];
  return num_pages <= 0 ? 0u
                        : uint32_t(num_pages - 1) * page_size + uint32_t(kv_last_page_len[b]);
}

/** One request: q [num_qo_heads, head_dim], k/v [kv_len, heads, head_dim] through strides. */
template <typename DTypeQ_, typename DTypeKV_, typename DTypeO_>
struct SingleDecodeParams : ParamsBase<DTypeQ_, DTypeKV_, DTypeO_> {
  const DTypeQ_* q;
  const DTypeKV_* k;
  const DTypeKV_* v;
  DTypeO_* o;
  float* lse;  // may be null
  int64_t q_stride_h, k_stride_n, k_stride_h, v_stride_n, v_stride_h, o_stride_h;
  uint32_t num_qo_heads, num_kv_heads, kv_len;
  float sm_scale;

  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t) const { return 1; }
  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t) const { return kv_len; }
};

/**
 * The per-tensor scales of an fp8 KV cache (K = k_scale * stored K, V likewise); an empty base
 * for a 16-bit cache, so its params keep their layout.
 */
template <typename DTypeKV, bool = is_fp8<DTypeKV>>
struct KVScales {};
template <typename DTypeKV>
struct KVScales<DTypeKV, true> {
  float k_scale = 1.f, v_scale = 1.f;
};

/** A batch over a paged KV cache with an int32 CSR page table. */
template <typename DTypeQ_, typename DTypeKV_, typename DTypeO_>
struct BatchDecodeParams : ParamsBase<DTypeQ_, DTypeKV_, DTypeO_>, KVScales<DTypeKV_> {
  const DTypeQ_* q;
  const DTypeKV_* paged_kv;
  DTypeO_* o;
  float* lse;  // may be null
  const int32_t* kv_indptr;
  const int32_t* kv_indices;
  const int32_t* kv_last_page_len;
  int64_t q_stride_b, q_stride_h, kv_stride_page, kv_stride_kv, kv_stride_n, kv_stride_h;
  int64_t o_stride_b, o_stride_h;
  uint32_t batch_size, num_qo_heads, num_kv_heads, page_size;
  float sm_scale;

  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t) const { return 1; }
  /** Reads the page table: call on the device only. */
  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t b) const {
    return paged_len(kv_indptr, kv_last_page_len, page_size, b);
  }
};

/**
 * Prefill params. Positions for RoPE: query i of a request sits at kv_len - qo_len + i (plus the
 * request's q_rope_offset), key j at j (plus kv_rope_offset); the offset arrays may be null (0).
 * Strides in elements; the head dimension is contiguous. o has q's shape, lse (optional) is
 * float32 [q tokens, num_qo_heads], natural log. k and v in q's dtype or an fp8 one (KVScales).
 */
template <typename DTypeQ_, typename DTypeKV_, typename DTypeO_>
struct SinglePrefillParams : ParamsBase<DTypeQ_, DTypeKV_, DTypeO_>, KVScales<DTypeKV_> {
  const DTypeQ_* q;   // [qo_len, num_qo_heads, head_dim] through q_stride_n / q_stride_h
  const DTypeKV_* k;  // [kv_len, num_kv_heads, head_dim] (NHD) or HND, through strides
  const DTypeKV_* v;
  DTypeO_* o;         // like q, through o strides
  float* lse;        // may be null; [qo_len, num_qo_heads]
  int64_t q_stride_n, q_stride_h, k_stride_n, k_stride_h, v_stride_n, v_stride_h;
  int64_t o_stride_n, o_stride_h;
  uint32_t qo_len, kv_len, num_qo_heads, num_kv_heads;
  float sm_scale;
  float rope_scale, rope_theta;  // rope_llama only (defaults 1 and 1e4)

  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t) const { return qo_len; }
  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t) const { return kv_len; }
};

/** Batch over ragged (token-packed) q, k and v with int32 CSR indptrs on the device; k and v
 *  in q's dtype or an fp8 one (KVScales). */
template <typename DTypeQ_, typename DTypeKV_, typename DTypeO_>
struct BatchPrefillRaggedParams : ParamsBase<DTypeQ_, DTypeKV_, DTypeO_>, KVScales<DTypeKV_> {
  const DTypeQ_* q;   // [total_q, num_qo_heads, head_dim]
  const DTypeKV_* k;  // [total_kv, num_kv_heads, head_dim]
  const DTypeKV_* v;
  DTypeO_* o;         // like q
  float* lse;        // may be null; [total_q, num_qo_heads]
  const int32_t* qo_indptr;       // [batch_size + 1]
  const int32_t* kv_indptr;       // [batch_size + 1]
  const int32_t* q_rope_offset;   // [batch_size] or null
  const int32_t* kv_rope_offset;  // [batch_size] or null
  int64_t q_stride_n, q_stride_h, k_stride_n, k_stride_h, v_stride_n, v_stride_h;
  int64_t o_stride_n, o_stride_h;
  uint32_t batch_size, num_qo_heads, num_kv_heads;
  float sm_scale;
  float rope_scale, rope_theta;

  /** Read the indptrs: call on the device only. */
  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t b) const {
    return indptr_len(qo_indptr, b);
  }
  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t b) const {
    return indptr_len(kv_indptr, b);
  }
};

/** Batch with token-packed q and K/V in the paged cache of BatchDecodeParams (q's dtype or an
 *  fp8 one, KVScales). */
template <typename DTypeQ_, typename DTypeKV_, typename DTypeO_>
struct BatchPrefillPagedParams : ParamsBase<DTypeQ_, DTypeKV_, DTypeO_>, KVScales<DTypeKV_> {
  const DTypeQ_* q;          // [total_q, num_qo_heads, head_dim]
  const DTypeKV_* paged_kv;  // pages: k of token t of page p at p*kv_stride_page + t*kv_stride_n
  DTypeO_* o;                // like q
  float* lse;               // may be null
  const int32_t* qo_indptr;         // [batch_size + 1]
  const int32_t* kv_indptr;         // [batch_size + 1], in pages
  const int32_t* kv_indices;        // page ids
  const int32_t* kv_last_page_len;  // [batch_size], 1..page_size for a request with pages
  const int32_t* q_rope_offset;     // [batch_size] or null
  const int32_t* kv_rope_offset;    // [batch_size] or null
  int64_t q_stride_n, q_stride_h, kv_stride_page, kv_stride_kv, kv_stride_n, kv_stride_h;
  int64_t o_stride_n, o_stride_h;
  uint32_t batch_size, num_qo_heads, num_kv_heads, page_size;
  float sm_scale;
  float rope_scale, rope_theta;

  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t b) const {
    return indptr_len(qo_indptr, b);
  }
  /** Reads the page table: call on the device only. */
  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t b) const {
    return paged_len(kv_indptr, kv_last_page_len, page_size, b);
  }
};

}  // namespace flashgen
