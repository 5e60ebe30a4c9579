/**
 * @brief What both prefill backends (the portable kernel, prefill/kernel.cuh, and the sm90 one,
 * hopper/prefill/) read and write alike: the query as a kernel stages it (RoPE and the variant's QueryTransform applied), and the split-KV partials. Neutral: no backend's kernel is included here.
 */
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashgen/dtype.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"
#include "flashgen/prefill/rope.cuh"
#include "flashgen/prefill/kv_source.cuh"

namespace flashgen {
namespace prefill {

/**
 * The query as both prefill kernels stage it: 8-dim chunk c of row `token`, head `head` in each
 * half of the row (lo: dims 8c.., hi: dims D/2 + 8c..), rotated at the token's position (RoPE)
 * and passed through the variant's QueryTransform, in fp32. Zeros for a row past qo_len.
 */
template <int kD, bool kRope, typename Variant, typename Params>
__device__ __forceinline__ void load_query_chunks(const Params& params, Variant& variant,
                                                  const RequestInfo& rq, int32_t qo_len,
                                                  int32_t kv_len, int32_t token, uint32_t head,
                                                  uint32_t c, const rope::LlamaRope& rp,
                                                  float (&lo)[8], float (&hi)[8]) {
  using DTypeQ = typename Params::DTypeQ;
  if (token < qo_len) {
    const DTypeQ* src = params.q + (rq.q_row0 + token) * params.q_stride_n +
                        int64_t(head) * params.q_stride_h + c * 8;
    unpack8<DTypeQ>(*reinterpret_cast<const uint4*>(src), lo);
    unpack8<DTypeQ>(*reinterpret_cast<const uint4*>(src + kD / 2), hi);
    if constexpr (kRope) {
      const float pos = float(kv_len - qo_len + token + rq.q_rope_offset);
      rope::rotate8<kD>(lo, hi, pos, int(c * 8), rp);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      lo[j] = hooks::query_transform(variant, params, lo[j]);
      hi[j] = hooks::query_transform(variant, params, hi[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) lo[j] = hi[j] = 0.f;
  }
}

/** Split-KV partials of the whole launch: slot-major [slot][kv_head][kTileQ][head_dim] + LSE. */
struct Partials {
  float* o;    // null: no split unit writes partials in this launch
  float* lse;  // base-2 LSE (softmax) or the plain sum of weights
};

}  // namespace prefill
}  // namespace flashgen
