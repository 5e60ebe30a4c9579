/**
 * @brief Filling a prefill params struct from its module's generated arguments struct: the fields
 * every prefill module declares under the same name (the variant's parameters, q and o with their
 * strides, heads, scale, RoPE), the contiguous K/V of single and ragged prefill, the token-packed
 * batch of ragged and paged prefill, and the paged cache that batch prefill and batch decode
 * share. Each entry point adds its own. Also the shape checks the prefill modules share.
 */
#pragma once

#include <cstdint>

#include "flashgen/launch.cuh"
#include "flashgen/status.cuh"

namespace flashgen {
namespace prefill {

/** What every module takes from its call alike: the variant's parameters (copied from the
 *  call's), then q, o, the LSE, their head strides, the head counts and the scale. */
template <typename Params, typename Args>
int start_common(Params& p, const Args& a, const char* module) {
  if (int st = copy_additional_params(&p, a.additional_params, module)) return st;
  p.q = static_cast<const typename Params::DTypeQ*>(a.q);
  p.o = static_cast<typename Params::DTypeO*>(a.o);
  p.lse = a.lse;
  p.q_stride_h = a.q_stride_h;
  p.o_stride_h = a.o_stride_h;
  p.num_qo_heads = static_cast<uint32_t>(a.num_qo_heads);
  p.num_kv_heads = static_cast<uint32_t>(a.num_kv_heads);
  p.sm_scale = a.sm_scale;
  return FLASHGEN_OK;
}

/** A prefill's start: the common fields, then the token strides and RoPE. */
template <typename Params, typename Args>
int start_params(Params& p, const Args& a, const char* module) {
  if (int st = start_common(p, a, module)) return st;
  p.q_stride_n = a.q_stride_n;
  p.o_stride_n = a.o_stride_n;
  p.rope_scale = a.rope_scale;
  p.rope_theta = a.rope_theta;
  return FLASHGEN_OK;
}

/** A token-packed batch (ragged and paged): q's indptr, the RoPE offsets, the batch size. */
template <typename Params, typename Args>
void fill_packed_batch(Params& p, const Args& a) {
  p.qo_indptr = a.qo_indptr;
  p.q_rope_offset = a.q_rope_offset;
  p.kv_rope_offset = a.kv_rope_offset;
  p.batch_size = static_cast<uint32_t>(a.batch_size);
}

template <typename Params, typename Args>
void fill_contiguous_kv(Params& p, const Args& a) {
  p.k = static_cast<const typename Params::DTypeKV*>(a.k);
  p.v = static_cast<const typename Params::DTypeKV*>(a.v);
  p.k_stride_n = a.k_stride_n;
  p.k_stride_h = a.k_stride_h;
  p.v_stride_n = a.v_stride_n;
  p.v_stride_h = a.v_stride_h;
}

/** The paged cache and its page table (batch_prefill_paged, and batch_decode's params too). */
template <typename Params, typename Args>
void fill_paged_kv(Params& p, const Args& a) {
  p.paged_kv = static_cast<const typename Params::DTypeKV*>(a.paged_kv);
  p.kv_indptr = a.kv_indptr;
  p.kv_indices = a.kv_indices;
  p.kv_last_page_len = a.kv_last_page_len;
  p.kv_stride_page = a.kv_stride_page;
  p.kv_stride_kv = a.kv_stride_kv;
  p.kv_stride_n = a.kv_stride_n;
  p.kv_stride_h = a.kv_stride_h;
}

/** q, k, v and o all given (the modules whose K/V are two tensors). */
template <typename Args>
int check_qkvo(const Args& a, const char* module) {
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.o == nullptr) {
    return fail(FLASHGEN_INVALID_ARGUMENT, "%s: q, k, v and o must not be NULL", module);
  }
  return FLASHGEN_OK;
}

/** num_qo_heads a positive multiple of num_kv_heads, which is at most 65535. */
template <typename Args>
int check_shape_heads(const Args& a, const char* module) {
  if (a.num_qo_heads <= 0 || a.num_kv_heads <= 0 || a.num_kv_heads > 65535 ||
      a.num_qo_heads % a.num_kv_heads != 0) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "%s: num_qo_heads (%lld) must be a positive multiple of num_kv_heads "
                "(%lld, at most 65535)",
                module, static_cast<long long>(a.num_qo_heads),
                static_cast<long long>(a.num_kv_heads));
  }
  return FLASHGEN_OK;
}

/** The batch modules' batch_size in [1, 65535] and total_q in [0, 2^30]. */
template <typename Args>
int check_shape_batch(const Args& a, const char* module) {
  if (a.batch_size < 1 || a.batch_size > 65535 || a.total_q < 0 ||
      a.total_q > (int64_t{1} << 30)) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "%s: batch_size %lld must be in [1, 65535] and total_q %lld in [0, 2^30]", module,
                static_cast<long long>(a.batch_size), static_cast<long long>(a.total_q));
  }
  return FLASHGEN_OK;
}

}  // namespace prefill
}  // namespace flashgen
