/**
 * @brief Work units of the prefill kernels and the CUDA-graph-safe batch plan.
 *
 * A unit is (request, q tile, kv chunk) for every kv head: the grid is 1-D, block L serves kv
 * head L % num_kv_heads and unit L / num_kv_heads (heads of one unit run side by side and share
 * the L2 lines of the request's K/V). Within a request, q tiles go last-first, so under causal
 * masking the longest tiles are dispatched first; batch plans also order the requests by kv
 * tiles, descending (heavy-first across requests while a request's units, which share K/V in
 * L2, stay together).
 *
 * Split-KV: when the q tiles of all requests together give fewer than `split_units` units per
 * kv head (split_units = ceil(SMs * CTAs per SM / num_kv_heads), i.e. less than one wave), the kv
 * range of each q tile is cut into s_b chunks (s_b from a common chunk length C, the smallest
 * multiple of the kv tile, at least tuning::kMinChunkTiles tiles, for which the units
 * still fit in split_units). Units of a split request write fp32 partials (output and base-2
 * LSE) into workspace slot u, and the merge kernel combines the s_b consecutive slots of a tile.
 *
 * Batch kinds: lengths live on the device, so the host sizes everything from shapes
 * (grid_units = max(ceil(total_q * G / kTileQ) + batch, split_units) per kv head) and a one-block
 * prep kernel writes the unit table [grid_units] of int4 {request or -1, q tile, chunk, s_b} into
 * the workspace on every call: a captured graph replayed with new lengths stays right.
 */
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashgen/params.cuh"
#include "flashgen/portable_tuning.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/prefill/traits.cuh"

namespace flashgen {
namespace prefill {

struct WorkUnit {
  uint32_t batch, tile, chunk, splits;
};

/** Single prefill: the plan is host arithmetic over the (host-known) lengths. */
struct SingleSched {
  uint32_t num_tiles, splits;
  __device__ __forceinline__ bool get(uint32_t u, WorkUnit& w) const {
    if (u >= num_tiles * splits) return false;
    w.batch = 0;
    w.tile = num_tiles - 1 - u / splits;
    w.chunk = u % splits;
    w.splits = splits;
    return true;
  }
};

/** Batch: the unit table the prep kernel wrote. */
struct BatchSched {
  const int4* table;
  __device__ __forceinline__ bool get(uint32_t u, WorkUnit& w) const {
    const int4 e = table[u];
    if (e.x < 0) return false;
    w.batch = uint32_t(e.x);
    w.tile = uint32_t(e.y);
    w.chunk = uint32_t(e.z);
    w.splits = uint32_t(e.w);
    return true;
  }
};

/** Host: resident CTAs of the whole GPU, from the traits (no occupancy query). */
template <typename Traits>
inline int64_t split_units_per_head(int64_t sm_count, int64_t num_kv_heads) {
  return ceil_div64(sm_count * Traits::kMinCtas, std::max<int64_t>(num_kv_heads, 1));
}

/** Host: splits of a single request (1 when its tiles already fill a wave). */
template <typename Traits>
inline int64_t single_splits(int64_t num_tiles, int64_t kv_len, int64_t split_units) {
  const int64_t kv_tiles = ceil_div64(kv_len, Traits::kTileKV);
  if (num_tiles <= 0 || num_tiles >= split_units || kv_tiles <= tuning::kMinChunkTiles) {
    return 1;
  }
  const int64_t max_splits = std::max<int64_t>(1, split_units / num_tiles);
  int64_t chunk = std::max<int64_t>(tuning::kMinChunkTiles,
                                    ceil_div64(kv_tiles, max_splits));
  return ceil_div64(kv_tiles, chunk);
}

constexpr int kPrepThreads = 512;
constexpr int kPrepBuckets = 2048;  // cost buckets of the heavy-first request order
constexpr int kPrepMaxPerm = 4096;  // requests that order handles (more: request order)

template <int N>
__device__ __forceinline__ int64_t block_sum(int64_t x, int64_t* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
  __syncthreads();
  int64_t t = 0;
#pragma unroll
  for (int w = 0; w < N / 32; ++w) t += scratch[w];
  return t;
}

/** v's inclusive scan over the thread's warp; each warp's total lands in scratch[warp] (between
 *  two barriers: every thread of the block calls it). */
__device__ __forceinline__ int64_t warp_scan_to_scratch(int64_t v, int64_t* scratch) {
  const uint32_t tid = threadIdx.x;
  int64_t x = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int64_t y = __shfl_up_sync(~0u, x, off);
    if ((tid & 31) >= uint32_t(off)) x += y;
  }
  __syncthreads();
  if ((tid & 31) == 31) scratch[tid >> 5] = x;
  __syncthreads();
  return x;
}

/**
 * One block: per-request q tiles and kv tiles, the split decision, the exclusive scan of units
 * per request (into unit_start[batch + 1]) and the unit table [grid_units]; zeroes
 * `block_counter` where the launch passes one.
 */
template <typename Traits, int MASK, typename Params>
__global__ void __launch_bounds__(kPrepThreads)
    prefill_prep_kernel(const __grid_constant__ Params params, uint32_t group_size,
                        uint32_t grid_units, uint32_t split_units, int32_t* unit_start,
                        int4* table, uint32_t* block_counter) {
  __shared__ int64_t scratch[kPrepThreads / 32];
  __shared__ int64_t carry;
  __shared__ int32_t bucket_pos[kPrepBuckets];
  __shared__ int32_t perm[kPrepMaxPerm];
  ptx::wait_prerequisite_grid();
  ptx::launch_dependents();
  const uint32_t B = params.batch_size;
  const uint32_t tid = threadIdx.x;
  // The Hopper kernel's dynamic block order starts from 0 (hopper/kernel.cuh); null elsewhere.
  if (block_counter != nullptr && tid == 0) *block_counter = 0u;
  auto q_tiles = [&](uint32_t b) -> int64_t {
    return ceil_div64(int64_t(params.get_qo_len(b)) * group_size, Traits::kTileQ);
  };
  auto kv_tiles = [&](uint32_t b) -> int64_t {
    return ceil_div64(int64_t(params.get_kv_len(b)), Traits::kTileKV);
  };
  int64_t mine = 0, max_kvt = 0;
  for (uint32_t b = tid; b < B; b += kPrepThreads) {
    mine += q_tiles(b);
    max_kvt = std::max<int64_t>(max_kvt, kv_tiles(b));
  }
  const int64_t total_tiles = block_sum<kPrepThreads>(mine, scratch);
  // Block max of kv tiles via sum of a one-hot trick is awkward; reduce with shuffles + smem.
  {
    int64_t x = max_kvt;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = std::max<int64_t>(x, __shfl_xor_sync(~0u, x, off));
    __syncthreads();
    if ((tid & 31) == 0) scratch[tid >> 5] = x;
    __syncthreads();
    x = 0;
    for (int w = 0; w < kPrepThreads / 32; ++w) x = std::max<int64_t>(x, scratch[w]);
    max_kvt = x;
  }
  // Chunk length C in kv tiles (0: no split).
  int64_t chunk = 0;
  if (total_tiles > 0 && total_tiles < split_units &&
      max_kvt > tuning::kMinChunkTiles) {
    int64_t lo = tuning::kMinChunkTiles, hi = max_kvt;  // cost(hi) = total_tiles fits
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      int64_t c = 0;
      for (uint32_t b = tid; b < B; b += kPrepThreads) {
        c += q_tiles(b) * std::max<int64_t>(1, ceil_div64(kv_tiles(b), mid));
      }
      c = block_sum<kPrepThreads>(c, scratch);
      if (c <= split_units) hi = mid; else lo = mid + 1;
    }
    chunk = lo;
  }
  auto splits_of = [&](uint32_t b) -> int64_t {
    return chunk > 0 ? std::max<int64_t>(1, ceil_div64(kv_tiles(b), chunk)) : 1;
  };
  // bucket_pos[i] <- number of items in buckets above i (descending exclusive scan).
  auto desc_scan = [&]() {
    constexpr int kPer = kPrepBuckets / kPrepThreads;
    int32_t cnt[kPer];
    int64_t mine_sum = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      cnt[j] = bucket_pos[kPrepBuckets - 1 - (int(tid) * kPer + j)];
      mine_sum += cnt[j];
    }
    int64_t off = warp_scan_to_scratch(mine_sum, scratch) - mine_sum;
    for (uint32_t w = 0; w < (tid >> 5); ++w) off += scratch[w];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      bucket_pos[kPrepBuckets - 1 - (int(tid) * kPer + j)] = int32_t(off);
      off += cnt[j];
    }
    __syncthreads();
  };
  const int64_t max_cost = std::max<int64_t>(max_kvt, 1);
  auto bucket_of_cost = [&](int64_t cost) -> int32_t {
    return max_cost < kPrepBuckets ? int32_t(cost)
                                   : int32_t(cost * (kPrepBuckets - 1) / max_cost);
  };
  // perm[k] = the k-th request by kv tiles, descending; each request's q tiles go last-first.
  const bool use_perm = B <= uint32_t(kPrepMaxPerm);
  if (use_perm) {
    for (int i = tid; i < kPrepBuckets; i += kPrepThreads) bucket_pos[i] = 0;
    __syncthreads();
    for (uint32_t b = tid; b < B; b += kPrepThreads) atomicAdd(&bucket_pos[bucket_of_cost(kv_tiles(b))], 1);
    __syncthreads();
    desc_scan();
    for (uint32_t b = tid; b < B; b += kPrepThreads) {
      perm[atomicAdd(&bucket_pos[bucket_of_cost(kv_tiles(b))], 1)] = int32_t(b);
    }
    __syncthreads();
  }
  auto req = [&](uint32_t k) -> uint32_t { return use_perm ? uint32_t(perm[k]) : k; };
  // Exclusive scan of units per request (in the order req(k)), in blocks of kPrepThreads.
  if (tid == 0) carry = 0;
  __syncthreads();
  for (uint32_t base = 0; base < B; base += kPrepThreads) {
    const uint32_t b = base + tid;
    const int64_t units = b < B ? q_tiles(req(b)) * splits_of(req(b)) : 0;
    const int64_t x = warp_scan_to_scratch(units, scratch);
    int64_t warp_off = 0;
    for (uint32_t w = 0; w < (tid >> 5); ++w) warp_off += scratch[w];
    const int64_t excl = carry + warp_off + x - units;
    if (b < B) unit_start[b] = int32_t(excl);
    __syncthreads();
    if (tid == kPrepThreads - 1) carry = excl + units;
    __syncthreads();
  }
  if (tid == 0) unit_start[B] = int32_t(carry);
  __syncthreads();
  const int64_t total_units = carry;
  auto unit_entry = [&](uint32_t u) -> int4 {
    // last k with unit_start[k] <= u (skips requests with no units)
    uint32_t lo = 0, hi = B - 1;
    while (lo < hi) {
      const uint32_t mid = (lo + hi + 1) / 2;
      if (unit_start[mid] <= int32_t(u)) lo = mid; else hi = mid - 1;
    }
    const uint32_t b = req(lo);
    const int64_t s = splits_of(b);
    const int64_t local = int64_t(u) - unit_start[lo];
    const int64_t nt = q_tiles(b);
    return make_int4(int(b), int(nt - 1 - local / s), int(local % s), int(s));
  };
  // Scan order (with a split the merge reads the s_b chunks of a tile from consecutive slots).
  for (uint32_t u = tid; u < grid_units; u += kPrepThreads) {
    table[u] = u < total_units ? unit_entry(u) : make_int4(-1, 0, 0, 0);
  }
}

}  // namespace prefill
}  // namespace flashgen
