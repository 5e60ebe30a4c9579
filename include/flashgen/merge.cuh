/**
 * @brief Split-KV merge: combines the partial results of a row's splits by log-sum-exp.
 *
 * Softmax partials are normalized outputs with their base-2 LSE: out = sum_s 2^(lse_s - M) o_s /
 * sum_s 2^(lse_s - M). Non-softmax partials are plain sums and add up. The variant's
 * OutputTransform runs here, on the final value, as it does in decode.cuh for one split.
 */
#pragma once

#include <cstdint>

#include "flashgen/decode.cuh"
#include "flashgen/decode_traits.cuh"
#include "flashgen/math.cuh"
#include "flashgen/variant_hooks.cuh"

namespace flashgen {
namespace decode {

constexpr int kMergeThreads = 128;

/** Output rows [rows = batch * heads] of a merge: row r is request r / heads, head r % heads. */
template <typename DTypeO>
struct MergeOutput {
  DTypeO* o;
  float* lse;  // may be null; [rows]
  int64_t o_stride_b, o_stride_h;
  uint32_t num_heads, rows;
};

/** One block per output row. */
template <int HEAD_DIM, typename Variant, typename Params>
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const __grid_constant__ Params params, const float* part_o, const float* part_w,
                 uint32_t num_splits, MergeOutput<typename Params::DTypeO> out) {
  __shared__ float scale[kMergeMaxSplits];
  __shared__ float total;
  __shared__ uint8_t variant_smem[256];
  constexpr bool kSoftmax = Variant::use_softmax;
  const uint32_t row = blockIdx.x;
  const uint32_t batch_idx = row / out.num_heads, head = row % out.num_heads;

  float m_ref = 0.f;
  if constexpr (kSoftmax) {
    float mx = -math::inf;
    for (uint32_t s = 0; s < num_splits; ++s) mx = fmaxf(mx, part_w[s * out.rows + row]);
    m_ref = mx == -math::inf ? 0.f : mx;
  }
  for (uint32_t s = threadIdx.x; s < num_splits; s += kMergeThreads) {
    const float w = part_w[s * out.rows + row];
    scale[s] = kSoftmax ? math::ptx_exp2(w - m_ref) : 1.f;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (uint32_t s = 0; s < num_splits; ++s) {
      t += kSoftmax ? scale[s] : part_w[s * out.rows + row];
    }
    total = t;
  }
  __syncthreads();

  Variant variant(params, batch_idx, variant_smem);
  const float den = total;
  typename Params::DTypeO* o = out.o + batch_idx * out.o_stride_b + head * out.o_stride_h;
  for (uint32_t d = threadIdx.x; d < HEAD_DIM; d += kMergeThreads) {
    float num = 0.f;
    for (uint32_t s = 0; s < num_splits; ++s) {
      num += scale[s] * part_o[(static_cast<int64_t>(s) * out.rows + row) * HEAD_DIM + d];
    }
    const float value = kSoftmax ? (den > 0.f ? num / den : 0.f) : num;
    o[d] = from_float<typename Params::DTypeO>(
        hooks::output_transform(variant, params, value, batch_idx, 0, head));
  }
  if (threadIdx.x == 0 && out.lse != nullptr) {
    out.lse[row] = kSoftmax ? (den > 0.f ? (m_ref + math::ptx_log2(den)) * math::ln2 : -math::inf)
                            : logf(den);
  }
}

}  // namespace decode
}  // namespace flashgen
