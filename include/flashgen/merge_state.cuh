/**
 * @brief Merging attention states by their LSE (the merge_state module): partial outputs of the
 * same queries over disjoint KV sets, each with its natural-log LSE, combined into the output
 * over the union of the sets (a shared prefix and a request's own tokens, cascade attention).
 *
 * For a row's states (v_k, s_k): s = log(sum_k e^{s_k}) and v = sum_k e^{s_k - s} v_k, in fp32
 * and rounded once. That is the split-KV merge of lse.cuh (lse::Merge, base 2) with the
 * caller's natural-log LSE brought to base 2 as it is read. A state of LSE -inf (no keys)
 * weighs nothing and its values are never added (an empty pass's output need not be finite);
 * a row whose states are all empty gets v = 0 and s = -inf.
 *
 * Layout (every tensor contiguous, rows 16-byte aligned): row r is (token r / num_heads, head r %
 * num_heads). The states of a token are `stack` consecutive [num_heads, head_dim] slices of v_a
 * (their LSE likewise in s_a), then, when v_b is not null, one more in v_b / s_b. Memory-bound:
 * each lane moves 16-byte vectors, min(head_dim / 8, 32) lanes share a row, so one warp covers
 * 32 / that many rows (two at head_dim 128), and the loads of a row's states are issued together.
 */
#pragma once

#include <cstdint>

#include "flashgen/dtype.cuh"
#include "flashgen/launch.cuh"
#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"
#include "flashgen/status.cuh"

namespace flashgen {
namespace merge_state {

constexpr int kThreads = 256;
constexpr uint32_t kVec = 8;  // 16-bit elements per 16-byte vector

/** One merge: the states, the optional token mask and the output, with the warp geometry. */
template <typename T>
struct Problem {
  const T* v_a;          // [tokens, stack, heads, head_dim]
  const float* s_a;      // [tokens, stack, heads]
  const T* v_b;          // [tokens, heads, head_dim], or null
  const float* s_b;      // [tokens, heads] (with v_b)
  const uint8_t* mask;   // [tokens]: 0 leaves the token's rows as they are; null: every token
  T* v_out;              // [tokens, heads, head_dim]; may be v_a when stack is 1
  float* s_out;          // [tokens, heads]; may be s_a when stack is 1
  uint32_t rows;         // tokens * heads
  uint32_t num_heads, stack, head_dim;
  uint32_t row_lanes;    // lanes sharing a row: min(head_dim / kVec, 32)
  uint32_t rows_per_warp;  // 32 / row_lanes
};

/** Where a state of a row lives: its values and its LSE. */
template <typename T>
struct StateRef {
  const T* v;
  float w;  // its LSE in base 2
};

/** State k of a row, chosen without a branch so that the loads of a row's states issue together. */
template <typename T>
__device__ __forceinline__ StateRef<T> state(const Problem<T>& p, uint32_t k, uint32_t row,
                                             uint32_t token, uint32_t head) {
  const bool in_a = k < p.stack;
  const int64_t slice = (int64_t(token) * p.stack + k) * p.num_heads + head;
  const T* v = in_a ? p.v_a + slice * p.head_dim : p.v_b + int64_t(row) * p.head_dim;
  const float* s = in_a ? p.s_a + slice : p.s_b + row;
  return {v, *s * math::log2e};
}

/**
 * kStates: the number of states per row when known at compile time (its loads are unrolled and
 * issued together), 0 when it is p.stack + (v_b != null) at run time.
 */
template <typename T, int kStates>
__global__ void __launch_bounds__(kThreads) merge_kernel(const __grid_constant__ Problem<T> p) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t slot = lane / p.row_lanes, sub = lane % p.row_lanes;
  const uint32_t warp = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5);
  const uint32_t row = warp * p.rows_per_warp + slot;
  const uint32_t token = row / p.num_heads, head = row % p.num_heads;
  const uint32_t states = kStates != 0 ? kStates : p.stack + (p.v_b != nullptr ? 1 : 0);
  bool active = slot < p.rows_per_warp && row < p.rows;
  if (active && p.mask != nullptr) active = p.mask[token] != 0;

  float w_max = -math::inf;
  if (active) {
#pragma unroll
    for (uint32_t k = 0; k < states; ++k) w_max = fmaxf(w_max, state(p, k, row, token, head).w);
  }
  lse::Merge<true> mg(w_max);
  if (active) {
#pragma unroll
    for (uint32_t k = 0; k < states; ++k) mg.add(state(p, k, row, token, head).w);
    const float inv = mg.inverse();  // 0 when every state is empty
    T* out = p.v_out + int64_t(row) * p.head_dim;
    for (uint32_t c = sub * kVec; c < p.head_dim; c += p.row_lanes * kVec) {
      float acc[kVec] = {};
#pragma unroll
      for (uint32_t k = 0; k < states; ++k) {
        const StateRef<T> st = state(p, k, row, token, head);
        float x[kVec];
        unpack8<T>(*reinterpret_cast<const uint4*>(st.v + c), x);
        const float f = mg.factor(st.w) * inv;
#pragma unroll
        for (uint32_t i = 0; i < kVec; ++i) acc[i] += f != 0.f ? f * x[i] : 0.f;
      }
      *reinterpret_cast<uint4*>(out + c) = pack8<T>(acc);
    }
  }
  // Every lane of the warp has read the LSE of its row (a row belongs to one warp): an in-place
  // merge may overwrite it now.
  __syncwarp();
  if (active && sub == 0) p.s_out[row] = mg.lse();
}

/** Launches the merge of `p` (its geometry filled here) on `stream`; nothing for no rows. */
template <typename T>
int launch_merge(Problem<T> p, cudaStream_t stream) {
  if (p.rows == 0) return FLASHGEN_OK;
  p.row_lanes = p.head_dim / kVec < 32 ? p.head_dim / kVec : 32;
  p.rows_per_warp = 32 / p.row_lanes;
  const uint32_t warps = (p.rows + p.rows_per_warp - 1) / p.rows_per_warp;
  const dim3 grid((warps + kThreads / 32 - 1) / (kThreads / 32));
  const uint32_t states = p.stack + (p.v_b != nullptr ? 1 : 0);
  return states == 2
             ? launch("merge_state kernel", merge_kernel<T, 2>, grid, kThreads, 0, stream, false, p)
             : launch("merge_state kernel", merge_kernel<T, 0>, grid, kThreads, 0, stream, false, p);
}

}  // namespace merge_state
}  // namespace flashgen
