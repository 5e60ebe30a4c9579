/**
 * @brief The variant interface: a base struct with the default hooks a variant may leave out.
 *
 * A variant is a struct template over the kernel's params type. It names `ParamsT` and the dtype
 * aliases, says `static constexpr bool use_softmax`, is constructed on the device as
 * `Variant(params, batch_idx, smem_ptr)` and offers any of these hooks:
 *
 *   T    QueryTransform(params, T q)                       applied to every query element (float)
 *   T    LogitsTransform(params, T logits, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx)
 *   bool LogitsMask(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx)
 *   T    OutputTransform(params, T out, batch_idx, qo_idx, qo_head_idx)  on the final output
 *   float SinkLogit(params, batch_idx, qo_idx, qo_head_idx)  softmax variants only, no default
 *
 * SinkLogit (an attention sink, as gpt-oss has): a logit in the units LogitsTransform returns
 * (base 2: a natural-log sink times log2(e)) that joins each row's softmax denominator and brings
 * no value, o = sum_j 2^(x_j) v_j / (2^sink + sum_j 2^(x_j)). The kernels add 2^(sink - max)
 * once per row where they finalize it (never in a split-KV partial: the merge adds it), so the
 * per-logit work is unchanged; the LSE they return is that of the whole denominator, sink
 * included, and a row with no visible key has output 0 and LSE sink. AttentionVariantBase does
 * not declare it: a variant has a sink only when it defines the hook (variant_hooks.cuh).
 *
 * The kernels add no scale of their own. With `use_softmax` the kernel takes exp2 of what
 * LogitsTransform returns (so a softmax variant returns logits times log2(e)) and normalizes;
 * without it, the output is the plain sum of the transformed logits times V. `qo_idx` is the
 * query's index within its request (0 in decode); its position in the sequence is
 * `kv_len - qo_len + qo_idx`.
 *
 * Deriving from AttentionVariantBase is optional: the kernels call hooks through
 * flashgen/variant_hooks.cuh, which falls back to these defaults when a hook is missing.
 */
#pragma once

#include <cstdint>

#include "flashgen/math.cuh"

namespace flashgen {

template <typename ParamsT_>
struct AttentionVariantBase {
  using ParamsT = ParamsT_;
  using DTypeQ = typename ParamsT::DTypeQ;
  using DTypeKV = typename ParamsT::DTypeKV;
  using DTypeO = typename ParamsT::DTypeO;
  using IdType = typename ParamsT::IdType;

  static constexpr bool use_softmax = true;

  template <typename T>
  __device__ __forceinline__ T QueryTransform(const ParamsT&, T q) {
    return q;
  }

  template <typename T>
  __device__ __forceinline__ T LogitsTransform(const ParamsT&, T logits, uint32_t, uint32_t,
                                               uint32_t, uint32_t, uint32_t) {
    return logits;
  }

  __device__ __forceinline__ bool LogitsMask(const ParamsT&, uint32_t, uint32_t, uint32_t,
                                             uint32_t, uint32_t) {
    return true;
  }

  template <typename T>
  __device__ __forceinline__ T OutputTransform(const ParamsT&, T out, uint32_t, uint32_t,
                                               uint32_t) {
    return out;
  }
};

}  // namespace flashgen

// Variant headers live at global scope (the generated header names their structs unqualified).
using flashgen::AttentionVariantBase;
