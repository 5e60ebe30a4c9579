/**
 * @brief Split-KV merge: combines the partial results of a row's splits by log-sum-exp.
 *
 * Softmax partials are normalized outputs with their base-2 LSE: out = sum_s 2^(lse_s - M) o_s /
 * sum_s 2^(lse_s - M). Non-softmax partials are plain sums and add up. The variant's
 * OutputTransform runs here, on the final value, as it does in decode/kernel.cuh for one split,
 * and so does the variant's sink (hooks::add_sink), which no partial includes.
 */
#pragma once

#include <cstdint>

#include "flashgen/decode/kernel.cuh"
#include "flashgen/decode/traits.cuh"
#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"
#include "flashgen/ptx_sm80.cuh"
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

template <bool kMax>
__device__ __forceinline__ float block_reduce(float x, float* scratch) {
  constexpr int kWarps = kMergeThreads / 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, off);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
  __syncthreads();
  x = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  __syncthreads();
  return x;
}

/**
 * One block per output row. Threads split as kGroups groups of HEAD_DIM/4 lanes: a lane owns
 * four dims (float4 loads) and a group owns every kGroups-th split, so all loads are
 * independent; the groups are summed in shared memory at the end.
 */
template <int HEAD_DIM, typename Variant, typename Params>
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const __grid_constant__ Params params, const float* part_o, const float* part_w,
                 uint32_t num_splits, MergeOutput<typename Params::DTypeO> out) {
  constexpr int kLanes = HEAD_DIM / 4;
  constexpr int kGroups = kMergeThreads / kLanes;
  static_assert(kGroups * kLanes == kMergeThreads, "head_dim must divide the merge block");
  __shared__ float scale[kMergeMaxSplits];
  __shared__ float scratch[kMergeThreads / 32];
  __shared__ __align__(16) float partial[kGroups][HEAD_DIM];
  __shared__ uint8_t variant_smem[256];
  constexpr bool kSoftmax = Variant::use_softmax;
  const uint32_t row = blockIdx.x;
  const uint32_t batch_idx = row / out.num_heads, head = row % out.num_heads;
  ptx::wait_prerequisite_grid();  // launched as a dependent of the decode kernel (sm_90)

  float w_max = -math::inf;
  for (uint32_t s = threadIdx.x; s < num_splits; s += kMergeThreads) {
    const float w = part_w[static_cast<int64_t>(s) * out.rows + row];
    scale[s] = w;
    w_max = fmaxf(w_max, w);
  }
  if constexpr (kSoftmax) {
    w_max = block_reduce<true>(w_max, scratch);  // also orders the writes to scale[]
  } else {
    __syncthreads();
  }
  lse::Merge<kSoftmax> mg(w_max);  // this thread's splits' share of the denominator
  for (uint32_t s = threadIdx.x; s < num_splits; s += kMergeThreads) scale[s] = mg.add(scale[s]);
  mg.den = block_reduce<false>(mg.den, scratch);  // also orders the writes to scale[]

  const uint32_t lane = threadIdx.x % kLanes, grp = threadIdx.x / kLanes;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4* src = reinterpret_cast<const float4*>(part_o) + lane;
#pragma unroll 4
  for (uint32_t s = grp; s < num_splits; s += kGroups) {
    const float4 x = src[(static_cast<int64_t>(s) * out.rows + row) * kLanes];
    const float sc = scale[s];
    acc.x += sc * x.x;
    acc.y += sc * x.y;
    acc.z += sc * x.z;
    acc.w += sc * x.w;
  }
  reinterpret_cast<float4*>(partial[grp])[lane] = acc;
  __syncthreads();

  Variant variant(params, batch_idx, variant_smem);
  hooks::add_sink(variant, params, mg.ref, mg.den, batch_idx, 0, head);  // the splits left it out
  typename Params::DTypeO* o = out.o + batch_idx * out.o_stride_b + head * out.o_stride_h;
  for (uint32_t d = threadIdx.x; d < HEAD_DIM; d += kMergeThreads) {
    float num = 0.f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) num += partial[g][d];
    o[d] = from_float<typename Params::DTypeO>(
        hooks::output_transform(variant, params, mg.value(num), batch_idx, 0, head));
  }
  if (threadIdx.x == 0 && out.lse != nullptr) out.lse[row] = mg.lse();
}

}  // namespace decode
}  // namespace flashgen
