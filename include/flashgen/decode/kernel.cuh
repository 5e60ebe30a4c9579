/**
 * @brief The decode kernels: one query per request against a contiguous or paged KV cache.
 *
 * Each warp streams its own 16-token tiles of K and V through a cp.async ring, computes
 * S^T = K Q^T and O^T += V^T P^T with mma.m16n8k16 (the query heads of one kv head are the
 * n = 8 dimension), keeps an online base-2 softmax per head, and the block's warps are combined
 * in shared memory. The block writes either the final output (one split) or a partial result
 * for merge.cuh (split-KV).
 *
 * An fp8 cache (traits.cuh) is streamed as it is stored and widened to f16 (the products' type),
 * exactly (dtype.cuh): K straight into each lane's fragments (k_fp8_frag), V a tile at a time
 * into shared memory (widen_tile); its k_scale multiplies the transformed query and its v_scale
 * the attention output before OutputTransform (and so every split's partial, which the merge
 * combines as it is).
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashgen/decode/query.cuh"
#include "flashgen/decode/softmax.cuh"
#include "flashgen/decode/tile.cuh"
#include "flashgen/decode/traits.cuh"
#include "flashgen/dtype.cuh"
#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"

namespace flashgen {
namespace decode {

/** K and V of one kv head stored densely by token: row `pos` at base + pos * stride_n. */
template <typename DTypeKV>
struct ContiguousKV {
  static constexpr bool kUsesHandle = false;
  const DTypeKV* k;
  const DTypeKV* v;
  int64_t k_stride_n, v_stride_n;

  __device__ __forceinline__ int32_t fetch(uint32_t, uint32_t) const { return 0; }
  __device__ __forceinline__ const DTypeKV* k_row(int32_t, uint32_t pos) const {
    return k + pos * k_stride_n;
  }
  __device__ __forceinline__ const DTypeKV* v_row(int32_t, uint32_t pos) const {
    return v + pos * v_stride_n;
  }
};

/** K and V of one kv head in a paged cache; the handle of a row is its page id. */
template <typename DTypeKV, int PAGE_SIZE>
struct PagedKV {
  static constexpr bool kUsesHandle = true;
  const DTypeKV* base;  // paged_kv + kv_head * stride_h
  const int32_t* pages; // kv_indices + kv_indptr[request]
  int64_t stride_page, stride_kv, stride_n;

  __device__ __forceinline__ int32_t fetch(uint32_t pos, uint32_t end) const {
    return pos < end ? __ldg(pages + pos / PAGE_SIZE) : 0;
  }
  __device__ __forceinline__ const DTypeKV* k_row(int32_t page, uint32_t pos) const {
    return base + page * stride_page + (pos % PAGE_SIZE) * stride_n;
  }
  __device__ __forceinline__ const DTypeKV* v_row(int32_t page, uint32_t pos) const {
    return k_row(page, pos) + stride_kv;
  }
};

/**
 * One fp8 V tile of a ring stage (16 rows of kChunks 16-byte chunks, ring_chunk's layout) widened
 * to the 16-bit tile the mma path reads (the 16-bit ring's swizzled layout, kFragChunks chunks a
 * row).
 * A lane widens whole chunks: 16 bytes into chunks 2c and 2c + 1 of its row. Lanes whose chunk
 * has bit 2 set read the chunk's two halves the other way round and so store chunk 2c + 1 first:
 * the eight lanes of a store phase then hit eight distinct 16-byte bank groups.
 */
template <typename Traits, typename Fp8, typename To>
__device__ __forceinline__ void widen_tile(const uint8_t* src, uint8_t* dst, uint32_t lane) {
  constexpr int kC = Traits::kChunks;
  static_assert(32 % kC == 0, "a lane's chunk column is the same for every row it widens");
  const uint32_t c = lane % kC;
  const uint32_t first = (c >> 2) & 1;  // which half of the chunk this lane widens first
#pragma unroll
  for (int j = 0; j < Traits::kTileTokens * kC / 32; ++j) {
    const uint32_t row = (lane + 32 * j) / kC;
    const uint8_t* chunk = src + Traits::ring_chunk(row, c) * 16;
    const uint2 x0 = *reinterpret_cast<const uint2*>(chunk + 8 * first);
    const uint2 x1 = *reinterpret_cast<const uint2*>(chunk + 8 * (1 - first));
    uint4 y0, y1;
    fp8::widen4<To, Fp8>(x0.x, y0.x, y0.y);
    fp8::widen4<To, Fp8>(x0.y, y0.z, y0.w);
    fp8::widen4<To, Fp8>(x1.x, y1.x, y1.y);
    fp8::widen4<To, Fp8>(x1.y, y1.z, y1.w);
    uint8_t* out = dst + row * Traits::kFragChunks * 16;
    *reinterpret_cast<uint4*>(out + ((2 * c + first) ^ (row & 7)) * 16) = y0;
    *reinterpret_cast<uint4*>(out + ((2 * c + 1 - first) ^ (row & 7)) * 16) = y1;
  }
}

/**
 * K's A fragment of k step ks from an fp8 stage, widened in registers. Lane (group, pair) holds
 * rows group and group + 8 at the k indices that query_dim<true> maps to dims
 * (ks / 4) * 64 + pair * 16 + (ks % 4) * 4 ..+ 4: word ks % 4 of 16-byte chunk 4 * (ks / 4) + pair
 * of each row, read once for four k steps into `raw`.
 */
template <typename Traits, typename Fp8, typename To>
__device__ __forceinline__ void k_fp8_frag(const uint8_t* stage, uint32_t group, uint32_t pair,
                                           int ks, uint4 (&raw)[2], uint32_t (&a)[4]) {
  if (ks % 4 == 0) {
    const uint32_t chunk = 4 * (ks / 4) + pair;
    raw[0] = *reinterpret_cast<const uint4*>(stage + Traits::ring_chunk(group, chunk) * 16);
    raw[1] = *reinterpret_cast<const uint4*>(stage + Traits::ring_chunk(group + 8, chunk) * 16);
  }
  const int w = ks % 4;
  const uint32_t r0 = w == 0 ? raw[0].x : w == 1 ? raw[0].y : w == 2 ? raw[0].z : raw[0].w;
  const uint32_t r1 = w == 0 ? raw[1].x : w == 1 ? raw[1].y : w == 2 ? raw[1].z : raw[1].w;
  fp8::widen4<To, Fp8>(r0, a[0], a[2]);  // row group: k 2 * pair (+1), then 8 + 2 * pair (+1)
  fp8::widen4<To, Fp8>(r1, a[1], a[3]);  // row group + 8
}

/** Where a block's result goes: the output rows (one split) or the workspace (split-KV). */
template <typename DTypeO>
struct BlockOutput {
  DTypeO* o;          // row of the block's first query head
  int64_t o_stride_h;
  float* lse;         // may be null
  float* part_o;      // non-null: write partial results here instead ([head][head_dim])
  float* part_w;      // base-2 LSE (softmax) or sum of weights, per head
};

/**
 * One block's work: query heads [head0, head0 + num_heads) of `kv_head` over kv positions
 * [begin, end) of request `batch_idx`. `q` points at head0's query row.
 */
template <typename Traits, typename Variant, typename Params, typename KV>
__device__ __forceinline__ void decode_block(const Params& params, Variant& variant, const KV& kv,
                                             const typename Params::DTypeQ* q, int64_t q_stride_h,
                                             uint32_t batch_idx, uint32_t kv_head, uint32_t head0,
                                             uint32_t num_heads, uint32_t begin, uint32_t end,
                                             uint8_t* smem,
                                             const BlockOutput<typename Params::DTypeO>& out) {
  using DTypeQ = typename Params::DTypeQ;
  using DTypeKV = typename Params::DTypeKV;
  using DTypeO = typename Params::DTypeO;
  constexpr bool kWiden = Traits::kWiden;
  static_assert(sizeof(DTypeQ) == 2 && (sizeof(DTypeKV) == 2 || is_fp8<DTypeKV>),
                "16-bit q, 16-bit or fp8 K/V");
  static_assert(kWiden == is_fp8<DTypeKV>, "traits of the cache's element size");
  // The type of the tensor-core products: the cache's, or f16 for a widened fp8 cache whatever
  // q's type: e4m3 widens to f16 in one instruction a pair on sm_89+ and e5m2 in one on any GPU,
  // where bf16 takes four (dtype.cuh); the query is brought into f16's range by a power of two
  // (f16_query_shift) and P is finer in f16 than in bf16.
  using DTypeMma = std::conditional_t<kWiden, half, DTypeKV>;
  constexpr bool kSoftmax = Variant::use_softmax;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kS = Traits::kStages;
  constexpr int kChunks = Traits::kChunks;
  constexpr int kFragChunks = Traits::kFragChunks;

  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warp = threadIdx.x >> 5;
  const uint32_t group = lane >> 2;  // fragment row
  const uint32_t pair = lane & 3;    // fragment column pair

  // This warp's tiles: j = warp, warp + kWarps, ... of the block's range.
  const uint32_t num_tiles = end > begin ? (end - begin + 15) / 16 : 0;
  const uint32_t my_tiles =
      num_tiles > warp ? (num_tiles - warp + Traits::kWarps - 1) / Traits::kWarps : 0;
  auto tile_pos = [&](uint32_t i) { return begin + 16 * (warp + Traits::kWarps * i); };

  uint8_t* ring = smem + Traits::kVariantSmemBytes + warp * Traits::kWarpRingBytes;
  const uint32_t ring_addr = ptx::smem_addr(ring);
  const uint32_t copy_row = lane / kChunks;
  const uint32_t copy_chunk = lane % kChunks;

  // Page handles two tiles ahead of the copies that use them: a page-table load that misses L2
  // has two tiles of this warp's work to land in, not one (under full DRAM load one tile's work
  // is shorter than a miss).
  int32_t next_handle = my_tiles > 0 ? kv.fetch(tile_pos(0) + (lane & 15), end) : 0;
  int32_t next2_handle = my_tiles > 1 ? kv.fetch(tile_pos(1) + (lane & 15), end) : 0;
  auto issue = [&](uint32_t i, uint32_t slot) {
    const uint32_t tpos = tile_pos(i);
    const int32_t handle = next_handle;
    if constexpr (KV::kUsesHandle) {
      next_handle = next2_handle;
      if (i + 2 < my_tiles) next2_handle = kv.fetch(tpos + 32 * Traits::kWarps + (lane & 15), end);
    }
    const uint32_t k_dst = ring_addr + slot * Traits::kStageBytes;
    const uint32_t v_dst = k_dst + Traits::kTileBytes;
#pragma unroll
    for (int c = 0; c < Traits::kCopiesPerTile; ++c) {
      const uint32_t row = c * Traits::kRowsPerCopy + copy_row;
      int32_t h = 0;
      if constexpr (KV::kUsesHandle) h = __shfl_sync(0xffffffffu, handle, row);
      const uint32_t pos = tpos + row;
      const bool valid = pos < end;
      const uint32_t dst = Traits::ring_chunk(row, copy_chunk) * 16;
      constexpr int kElems = Traits::kElemsPerChunk;
      const DTypeKV* k_src = valid ? kv.k_row(h, pos) + copy_chunk * kElems : kv.k_row(0, begin);
      const DTypeKV* v_src = valid ? kv.v_row(h, pos) + copy_chunk * kElems : kv.v_row(0, begin);
      ptx::cp_async_16(k_dst + dst, k_src, valid ? 16u : 0u);
      ptx::cp_async_16(v_dst + dst, v_src, valid ? 16u : 0u);
    }
  };

  float m[2] = {-math::inf, -math::inf};  // running max of heads 2*pair, 2*pair+1 (base 2)
  float dsum[2] = {0.f, 0.f};             // this lane's share of the softmax denominator
  float acc[Traits::kMTiles][4];          // O^T: dims mt*16 + group (+8), heads 2*pair (+1)
#pragma unroll
  for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[mt][e] = 0.f;
  }

  // ldmatrix rows: K as A (rows = tokens), V as A^T via .trans (rows = tokens); the ring puts
  // 16-byte chunk c of row r at (c ^ (r & 7)), and r & 7 == lane & 7 here.
  const uint32_t mi = lane >> 3;
  const uint32_t r7 = lane & 7;
  const uint32_t k_row = (mi & 1) * 8 + r7, k_chunk0 = mi >> 1;
  const uint32_t v_row = (mi >> 1) * 8 + r7, v_chunk0 = mi & 1;
  const WarpHeads heads{batch_idx, kv_head, head0, num_heads, group, pair};

#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < static_cast<int>(my_tiles)) issue(s, s);
    ptx::cp_async_commit();
  }

  // Query fragments (decode/query.cuh): head `group`, loaded once the first K/V copies are in
  // flight, so the two latencies overlap.
  uint32_t qf[Traits::kKSteps][2];
  uint32_t qf_lo[Traits::kKSteps][2];
  float logit_scale = 1.f;  // an fp8 cache: 2^-shift, the inverse of the query's
  {
    const bool valid = group < num_heads;
    const DTypeQ* qh = q + static_cast<int64_t>(valid ? group : 0) * q_stride_h;
    if constexpr (kWiden) {
      const int shift = f16_query_shift<Traits::kKSteps>(qh, valid, pair, variant, params,
                                                         params.k_scale);
      logit_scale = fp8::pow2(-shift);
      load_query_split<DTypeMma, Traits::kKSteps, DTypeQ, Variant, Params, Times, true>(
          qh, valid, pair, variant, params, qf, qf_lo,
          Times{params.k_scale * fp8::pow2(shift)});
    } else {
      load_query_split<DTypeKV>(qh, valid, pair, variant, params, qf, qf_lo);
    }
  }
  // An fp8 cache: the warp's 16-bit V tile after its ring.
  uint8_t* widened = ring + kS * Traits::kStageBytes;
  const uint32_t widened_addr = ring_addr + kS * Traits::kStageBytes;

  for (uint32_t i = 0; i < my_tiles; ++i) {
    if (i + kS - 1 < my_tiles) issue(i + kS - 1, (i + kS - 1) % kS);
    ptx::cp_async_commit();
    ptx::cp_async_wait<kS - 1>();
    __syncwarp();

    const uint32_t k_base = ring_addr + (i % kS) * Traits::kStageBytes;
    if constexpr (kWiden) {
      const uint8_t* stage = ring + (i % kS) * Traits::kStageBytes;
      widen_tile<Traits, DTypeKV, DTypeMma>(stage + Traits::kTileBytes, widened, lane);
      __syncwarp();
      uint4 raw[2];
      kv_tile_step<Traits, kSoftmax, DTypeMma>(
          [&](int ks, uint32_t (&a)[4]) {
            k_fp8_frag<Traits, DTypeKV, DTypeMma>(stage, group, pair, ks, raw, a);
          },
          [&](int mt) {
            return widened_addr + (v_row * kFragChunks + ((mt * 2 + v_chunk0) ^ r7)) * 16;
          },
          tile_pos(i), end, heads, qf, qf_lo, variant, params, m, dsum, acc,
          Times{logit_scale});
    } else {
      const uint32_t v_base = k_base + Traits::kTileBytes;
      kv_tile_step<Traits, kSoftmax, DTypeMma>(
          [&](int ks) { return k_base + (k_row * kFragChunks + ((ks * 2 + k_chunk0) ^ r7)) * 16; },
          [&](int mt) { return v_base + (v_row * kFragChunks + ((mt * 2 + v_chunk0) ^ r7)) * 16; },
          tile_pos(i), end, heads, qf, qf_lo, variant, params, m, dsum, acc);
    }
    __syncwarp();
  }
  ptx::cp_async_wait<0>();

  // The denominator over all of this warp's tokens (lanes of one column pair share a head).
  reduce_denominator(dsum);

  // Combine the warps in shared memory (the rings are free once every warp is done).
  __syncthreads();
  constexpr int kH = Traits::kHeadsPerBlock;
  float* c_m = reinterpret_cast<float*>(smem + Traits::kVariantSmemBytes);  // [warp][head]
  float* c_d = c_m + Traits::kWarps * kH;                                   // [warp][head]
  float* c_o = c_d + Traits::kWarps * kH;                                   // [warp][head][dim]
  store_warp_state<Traits::kMTiles, kH, kD>(c_m, c_d, c_o, warp, group, pair, m, dsum, acc);
  __syncthreads();

  for (uint32_t idx = threadIdx.x; idx < num_heads * kD; idx += Traits::kThreads) {
    const uint32_t h = idx / kD, d = idx % kD;
    float num = 0.f, den = 0.f, m_ref = 0.f;  // the warps' states, unnormalized
    if constexpr (kSoftmax) {
      float mx = -math::inf;
#pragma unroll
      for (int w = 0; w < Traits::kWarps; ++w) mx = fmaxf(mx, c_m[w * kH + h]);
      m_ref = lse::reference(mx);
#pragma unroll
      for (int w = 0; w < Traits::kWarps; ++w) {
        const float wt = math::ptx_exp2(c_m[w * kH + h] - m_ref);
        num += wt * c_o[(w * kH + h) * kD + d];
        den += wt * c_d[w * kH + h];
      }
    } else {
#pragma unroll
      for (int w = 0; w < Traits::kWarps; ++w) {
        num += c_o[(w * kH + h) * kD + d];
        den += c_d[w * kH + h];
      }
    }
    // The variant's sink joins a whole row's denominator (a split's partial leaves it to the
    // merge).
    if (out.part_o == nullptr) hooks::add_sink(variant, params, m_ref, den, batch_idx, 0, head0 + h);
    float value = lse::normalized<kSoftmax>(num, den);
    if constexpr (kWiden) value *= params.v_scale;
    // Base-2 LSE for softmax; the plain sum of weights otherwise.
    const float weight = lse::weight<kSoftmax>(m_ref, den);
    if (out.part_o != nullptr) {
      out.part_o[h * kD + d] = value;
      if (d == 0) out.part_w[h] = weight;
    } else {
      const float y = hooks::output_transform(variant, params, value, batch_idx, 0, head0 + h);
      out.o[h * out.o_stride_h + d] = from_float<DTypeO>(y);
      if (d == 0 && out.lse != nullptr) out.lse[h] = lse::natural<kSoftmax>(weight);
    }
  }
}

/** Block (split, kv_head * head_slices): one request held densely (NHD or HND by strides). */
template <typename Traits, typename Variant, typename Params>
__global__ void __launch_bounds__(Traits::kThreads)
    single_decode_kernel(const __grid_constant__ Params params, float* part_o, float* part_w,
                         uint32_t chunk, uint32_t num_head_slices) {
  extern __shared__ __align__(128) uint8_t smem[];
  ptx::launch_dependents();  // the merge kernel may be scheduled; it waits for this grid
  using DTypeKV = typename Params::DTypeKV;
  const uint32_t split = blockIdx.x;
  const uint32_t kv_head = blockIdx.y / num_head_slices;
  const uint32_t slice = blockIdx.y % num_head_slices;
  const uint32_t group_size = params.num_qo_heads / params.num_kv_heads;
  const uint32_t first = slice * Traits::kHeadsPerBlock;
  const uint32_t num_heads = min(Traits::kHeadsPerBlock, group_size - first);
  const uint32_t head0 = kv_head * group_size + first;
  const uint32_t begin = split * chunk;
  const uint32_t end = min(params.kv_len, begin + chunk);

  Variant variant(params, 0, smem);
  ContiguousKV<DTypeKV> kv{params.k + kv_head * params.k_stride_h,
                           params.v + kv_head * params.v_stride_h, params.k_stride_n,
                           params.v_stride_n};
  BlockOutput<typename Params::DTypeO> out{params.o + head0 * params.o_stride_h,
                                           params.o_stride_h,
                                           params.lse ? params.lse + head0 : nullptr, nullptr,
                                           nullptr};
  if (part_o != nullptr) {
    const int64_t row0 = static_cast<int64_t>(split) * params.num_qo_heads + head0;
    out.part_o = part_o + row0 * Traits::kHeadDim;
    out.part_w = part_w + row0;
  }
  decode_block<Traits>(params, variant, kv, params.q + head0 * params.q_stride_h,
                       params.q_stride_h, 0, kv_head, head0, num_heads, begin, end, smem, out);
}

/** Block (split, request, kv_head * head_slices) over a paged cache of PAGE_SIZE tokens a page. */
template <typename Traits, int PAGE_SIZE, typename Variant, typename Params>
__global__ void __launch_bounds__(Traits::kThreads)
    batch_decode_kernel(const __grid_constant__ Params params, float* part_o, float* part_w,
                        uint32_t num_splits, uint32_t num_head_slices) {
  extern __shared__ __align__(128) uint8_t smem[];
  ptx::launch_dependents();  // the merge kernel may be scheduled; it waits for this grid
  using DTypeKV = typename Params::DTypeKV;
  // Block order: the grid is (split, request, kv head x slice) as the host launches it; the
  // launch order is re-read so that the kv heads of one request run side by side (then its
  // splits, then the next request). The kv heads of a token share its cache rows
  // ([page][2][page_size][kv_heads][head_dim]): blocks that run together then read whole rows
  // instead of one head's 2 * head_dim bytes out of each.
  const uint64_t lin =
      blockIdx.x + uint64_t(gridDim.x) * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);
  const uint32_t hz = static_cast<uint32_t>(lin % gridDim.z);
  const uint64_t rest = lin / gridDim.z;
  const uint32_t split = static_cast<uint32_t>(rest % gridDim.x);
  const uint32_t batch_idx = static_cast<uint32_t>(rest / gridDim.x);
  const uint32_t kv_head = hz / num_head_slices;
  const uint32_t slice = hz % num_head_slices;
  const uint32_t group_size = params.num_qo_heads / params.num_kv_heads;
  const uint32_t first = slice * Traits::kHeadsPerBlock;
  const uint32_t num_heads = min(Traits::kHeadsPerBlock, group_size - first);
  const uint32_t head0 = kv_head * group_size + first;

  const int32_t page_begin = params.kv_indptr[batch_idx];
  const int32_t num_pages = params.kv_indptr[batch_idx + 1] - page_begin;
  const uint32_t kv_len =
      num_pages <= 0 ? 0u
                     : uint32_t(num_pages - 1) * PAGE_SIZE +
                           uint32_t(params.kv_last_page_len[batch_idx]);
  const uint32_t chunk = ((kv_len + num_splits - 1) / num_splits + 15) / 16 * 16;
  const uint32_t begin = min(kv_len, split * chunk);
  const uint32_t end = min(kv_len, begin + chunk);

  Variant variant(params, batch_idx, smem);
  PagedKV<DTypeKV, PAGE_SIZE> kv{params.paged_kv + kv_head * params.kv_stride_h,
                                 params.kv_indices + page_begin, params.kv_stride_page,
                                 params.kv_stride_kv, params.kv_stride_n};
  const int64_t row0 = static_cast<int64_t>(batch_idx) * params.num_qo_heads + head0;
  BlockOutput<typename Params::DTypeO> out{
      params.o + batch_idx * params.o_stride_b + head0 * params.o_stride_h, params.o_stride_h,
      params.lse ? params.lse + row0 : nullptr, nullptr, nullptr};
  if (part_o != nullptr) {
    const int64_t row = static_cast<int64_t>(split) * params.batch_size * params.num_qo_heads + row0;
    out.part_o = part_o + row * Traits::kHeadDim;
    out.part_w = part_w + row;
  }
  decode_block<Traits>(params, variant, kv,
                       params.q + batch_idx * params.q_stride_b + head0 * params.q_stride_h,
                       params.q_stride_h, batch_idx, kv_head, head0, num_heads, begin, end, smem,
                       out);
}

}  // namespace decode
}  // namespace flashgen
