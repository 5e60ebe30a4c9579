/**
 * @brief Filling a prefill params struct from its module's generated arguments struct: the fields
 * every prefill module declares under the same name (q and o with their strides, heads, scale,
 * RoPE), and the contiguous K/V of single and ragged prefill. Each entry point adds its own.
 */
#pragma once

#include <cstdint>

namespace flashgen {
namespace prefill {

template <typename Params, typename Args>
void fill_q_o(Params& p, const Args& a) {
  p.q = static_cast<const typename Params::DTypeQ*>(a.q);
  p.o = static_cast<typename Params::DTypeO*>(a.o);
  p.lse = a.lse;
  p.q_stride_n = a.q_stride_n;
  p.q_stride_h = a.q_stride_h;
  p.o_stride_n = a.o_stride_n;
  p.o_stride_h = a.o_stride_h;
  p.num_qo_heads = static_cast<uint32_t>(a.num_qo_heads);
  p.num_kv_heads = static_cast<uint32_t>(a.num_kv_heads);
  p.sm_scale = a.sm_scale;
  p.rope_scale = a.rope_scale;
  p.rope_theta = a.rope_theta;
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

}  // namespace prefill
}  // namespace flashgen
