/**
 * @brief Hopper single decode (sm_90): K/V streamed by the bulk tensor copy engine into a
 * multi-stage mbarrier ring, split-KV over a thread-block cluster merged through distributed
 * shared memory, so that one kernel does the whole call when one cluster per head group fills
 * the GPU.
 *
 * A CTA serves one (kv head, head slice, split) like the portable kernel (decode/kernel.cuh),
 * with the same math per 16-token tile: S^T = K Q^T and O^T += V^T P^T on mma.m16n8k16 (the query
 * heads of one kv head are the n = 8 dimension), the query split in hi + lo parts, a base-2
 * online softmax per head, the same variant hooks. What differs is how K/V arrive and how splits
 * meet:
 * - one producer warp (one thread) issues cp.async.bulk.tensor.3d loads (the tensor maps of
 *   hopper/tma.cuh, 128-byte swizzle, box 64 columns x 64 rows x 1 head) of 64 tokens of K and
 *   V per stage into kStages stages (about 128 KB in flight per SM); four consumer warps take 16
 *   tokens of each stage and free it with one arrive each.
 * - the splits of a head group are the CTAs of one cluster (8 by default): each CTA combines its
 *   warps into its partial (normalized output and base-2 LSE per head) and pushes each slice of
 *   it, with its LSEs, into the shared memory of the CTA that finalizes that slice (st.async,
 *   completing on that CTA's merge mbarrier); each CTA waits for its own slice's bytes, merges
 *   and writes them. Nobody reads a peer's memory, so no cluster barrier holds a CTA at its end
 *   (a pull-style merge needs two cluster barriers, which cost more). No workspace and no
 *   second kernel unless a head group needs more splits than a cluster holds: then each
 *   cluster writes one partial to the workspace and the portable merge kernel
 *   (decode/merge.cuh, PDL) combines the clusters.
 *
 * Variants, GQA (head slices of 8), NHD/HND (by strides, through the tensor map's dimension
 * order), LSE and the non-softmax (sum) convention are the portable kernel's.
 */
#pragma once

#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include "flashgen/decode/merge.cuh"
#include "flashgen/decode/query.cuh"
#include "flashgen/decode/softmax.cuh"
#include "flashgen/decode/tile.cuh"
#include "flashgen/decode/traits.cuh"
#include "flashgen/dtype.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/tma.cuh"
#include "flashgen/hopper/tuning.cuh"
#include "flashgen/launch.cuh"
#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/status.cuh"
#include "flashgen/variant_hooks.cuh"

namespace flashgen {
namespace hopper {

#ifdef FLASHGEN_HDECODE_TRACE
/** Harness only (hopper_decode_harness --trace): per CTA, clock64 at points 0..11 of the kernel
 *  and globaltimer at entry (12) and exit (13), to see where a short call's time goes. */
__device__ long long hdecode_trace[1024][14];
#define FLASHGEN_HDECODE_MARK(i) \
  hdecode_trace[(blockIdx.y * gridDim.x + blockIdx.x) & 1023][i] = clock64()
__device__ __forceinline__ long long hdecode_globaltimer() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#else
#define FLASHGEN_HDECODE_MARK(i)
#endif

/** RING_KB: shared memory of the K/V ring; GROUPS: consumer groups of 4 warps, stage i going to
 *  group i % GROUPS (more tiles in flight in the math per SM). */
template <int HEAD_DIM, int RING_KB = kDecodeRingKB, int GROUPS = kDecodeConsumerGroups>
struct DecodeTraits90 {
  static constexpr int kHeadDim = HEAD_DIM;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim 64, 128 or 256");
  static constexpr int kGroups = GROUPS;
  static constexpr int kConsumerWarps = 4 * GROUPS;
  static constexpr int kThreads = (kConsumerWarps + 1) * 32;
  static constexpr int kStageTokens = 64;  // one 16-token tile per warp of a group
  static constexpr int kHeadsPerBlock = 8;
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kMTiles = kHeadDim / 16;
  static constexpr int kScoreChains = kHeadDim <= 128 ? 4 : 2;
  static constexpr int kBoxes = kHeadDim / 64;         // 64-column boxes per row
  static constexpr int kBoxBytes = kStageTokens * 128;  // one box of a stage (128-byte rows)
  static constexpr int kTileBytes = kBoxes * kBoxBytes;  // K (or V) of a stage
  static constexpr int kStageBytes = 2 * kTileBytes;
  // Stages, a multiple of the consumer groups: group g owns slots g, g + GROUPS, ... (its own
  // ring, so a barrier is never two phases behind the group that waits on it).
  static constexpr int kFit = RING_KB * 1024 / kStageBytes / GROUPS * GROUPS;
  static constexpr int kStages = kFit >= 2 * GROUPS ? kFit : 2 * GROUPS;
  static constexpr int kSlotsPerGroup = kStages / GROUPS;
  static constexpr int kRingBytes = kStages * kStageBytes;
  // The warp combine's m, d, o and scale per (warp, head).
  static constexpr int kCombineBytes =
      kConsumerWarps * kHeadsPerBlock * (kHeadDim + 3) * static_cast<int>(sizeof(float));
  static_assert(kCombineBytes <= kRingBytes, "the warp combine reuses the ring");
  static constexpr int kVariantOffset = kRingBytes;  // 256 bytes a variant may use (smem_ptr)
  static constexpr int kBarOffset = kVariantOffset + 256;
  // The cluster merge's inbox, after the barriers (a ring slot's full and empty ones, and the
  // merge barrier): every peer's weight per head ([16][head] floats), then the peers' pieces of
  // the chunks this CTA finalizes ([peer][per] float4s; cluster * per <= chunks + cluster).
  static constexpr int kInboxOffset = (kBarOffset + (2 * kStages + 1) * 8 + 15) / 16 * 16;
  static constexpr int kInboxWeightBytes = 16 * kHeadsPerBlock * 4;
  static constexpr int kInboxBytes =
      kInboxWeightBytes + (kHeadsPerBlock * kHeadDim / 4 + 16) * 16;
  // + 1 KB: the dynamic window is aligned to 1024 bytes by hand (the 128-byte swizzle's period).
  static constexpr int kSmemBytes = kInboxOffset + kInboxBytes + 1024;
  // sm_90's most dynamic shared memory per block: a shape past it (say four 64 KB stages at
  // head_dim 256) fails here rather than at its launch.
  static_assert(kSmemBytes <= 227 * 1024, "the ring and its inbox exceed an SM's shared memory");
};

constexpr int kMaxClusterPortable = 8;

/** The split plan of one call: `cluster` CTAs a cluster, `groups` clusters per head group. */
struct DecodePlan90 {
  int64_t cluster, groups, splits, chunk, head_slices, workspace;
};

/** Knobs of the plan (the harness sweeps them; the library uses the defaults). */
struct DecodeKnobs90 {
  int64_t force_cluster = 0, force_groups = 0;  // harness only: a fixed shape
  int64_t max_cluster = kMaxClusterPortable;
  int64_t min_chunk = 64;
};

/** A kernel with the decode kernel's block size and shared memory, for occupancy questions. */
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) cluster_probe_kernel90() {}

/**
 * How many clusters of `cluster` CTAs (1..16) of the decode kernel's shape can be resident at
 * once on `dev` (cudaOccupancyMaxActiveClusters), asked once per device and size; 0 when the
 * device cannot run such a cluster. Sizes over 8 are non-portable: how many fit depends on how
 * the GPU's processing clusters (GPCs) are populated, which is why this is asked, not computed.
 */
template <typename Traits>
inline int64_t resident_clusters90(const DeviceInfo& dev, int cluster) {
  static std::atomic<int64_t> cache[kMaxDevices][16];  // 0 = not asked yet, -1 = none
  const bool cacheable = dev.device >= 0 && dev.device < kMaxDevices && cluster >= 1 &&
                         cluster <= 16;
  if (cacheable) {
    const int64_t v = cache[dev.device][cluster - 1].load(std::memory_order_acquire);
    if (v != 0) return v < 0 ? 0 : v;
  }
  auto probe = cluster_probe_kernel90<Traits>;
  int n = 0;
  cudaError_t err =
      cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (err == cudaSuccess && cluster > kMaxClusterPortable) {
    err = cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  if (err == cudaSuccess) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(cluster) * 8);
    cfg.blockDim = dim3(Traits::kThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(Traits::kSmemBytes);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(cluster);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    err = cudaOccupancyMaxActiveClusters(&n, probe, &cfg);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: this size is just not available
    n = 0;
  }
  if (cacheable) {
    cache[dev.device][cluster - 1].store(n > 0 ? n : -1, std::memory_order_release);
  }
  return n;
}

/**
 * The split plan. One CTA of this kernel streams ~50 GB/s, so a call wants as many SMs as it can get, in one kernel where it can. The
 * cluster is the largest power of two (<= max_cluster, 8 by default: the portable cluster size,
 * so no GPC layout question; at most one split per min_chunk tokens) of which one cluster per
 * head group is co-resident: the splits of a group meet in its cluster's shared memory. When the
 * head groups leave room for more clusters (few kv heads), each group gets several clusters
 * (groups > 1) and the portable merge kernel combines them. CUDA calls only through the cached
 * occupancy questions above. knobs.force_cluster (any size up to 16) is for the harness.
 */
template <typename Traits>
inline DecodePlan90 plan_single_decode90(int64_t num_qo_heads, int64_t num_kv_heads,
                                         int64_t kv_len, const DeviceInfo& dev,
                                         const DecodeKnobs90& knobs = DecodeKnobs90()) {
  DecodePlan90 plan;
  plan.head_slices = decode::ceil_div(num_qo_heads / num_kv_heads, Traits::kHeadsPerBlock);
  const int64_t units = std::max<int64_t>(1, num_kv_heads * plan.head_slices);
  const int64_t max_splits = std::max<int64_t>(
      1, std::min<int64_t>(decode::kMaxSplits,
                           decode::ceil_div(std::max<int64_t>(kv_len, 1), knobs.min_chunk)));
  const int64_t limit = std::min<int64_t>({16, knobs.max_cluster, max_splits});
  int64_t top = 1;
  while (top * 2 <= limit) top *= 2;
  int64_t cluster = 1;
  for (int64_t c = top; c >= 1; c /= 2) {
    if (resident_clusters90<Traits>(dev, static_cast<int>(c)) >= units) {
      cluster = c;
      break;
    }
  }
  const int64_t resident = resident_clusters90<Traits>(dev, static_cast<int>(cluster));
  plan.cluster = cluster;
  plan.groups = std::max<int64_t>(1, std::min(resident / units, max_splits / cluster));
  if (knobs.force_cluster > 0) {
    plan.cluster = knobs.force_cluster;
    plan.groups = knobs.force_groups > 0 ? knobs.force_groups : 1;
  }
  plan.splits = plan.cluster * plan.groups;
  plan.chunk = decode::chunk_tokens(kv_len, plan.splits);
  plan.workspace = decode::workspace_bytes(plan.groups, num_qo_heads, Traits::kHeadDim);
  return plan;
}

namespace detail {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

/** The address of `addr` (this CTA's shared window) in cluster CTA `rank`'s window. */
__device__ __forceinline__ uint32_t map_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

/** acc += s * x, element by element. */
__device__ __forceinline__ void fma4(float4& acc, float s, const float4& x) {
  acc.x += s * x.x;
  acc.y += s * x.y;
  acc.z += s * x.z;
  acc.w += s * x.w;
}

/** Arrives on the cluster barrier without ordering memory: the kernel's one use is to say its
 *  mbarriers are initialised, which fence.mbarrier_init.release.cluster already made visible. */
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/** Stores 16 bytes at `addr` of a peer's (or this CTA's) shared window; the bytes complete on
 *  the mbarrier `bar` of the same CTA (both shared::cluster addresses, from map_rank). */
__device__ __forceinline__ void st_async_v4(uint32_t addr, float4 x, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(addr),
      "r"(__float_as_uint(x.x)), "r"(__float_as_uint(x.y)), "r"(__float_as_uint(x.z)),
      "r"(__float_as_uint(x.w)), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void st_async_f32(uint32_t addr, float x, uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
      "r"(__float_as_uint(x)), "r"(bar)
      : "memory");
}

}  // namespace detail

/**
 * Grid (splits = cluster * groups, kv_heads * head_slices), cluster (cluster, 1, 1). Split s
 * covers kv positions [s * chunk, (s + 1) * chunk). part_o / part_w non-null: groups > 1, each
 * cluster writes its merged partial as split blockIdx.x / cluster of decode/merge.cuh's layout.
 */
template <typename Traits, typename Variant, typename Params>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    single_decode_kernel90(const __grid_constant__ Params params,
                           const __grid_constant__ KVTensorMaps maps, uint32_t k_rows_first,
                           uint32_t v_rows_first, float* part_o, float* part_w, uint32_t chunk,
                           uint32_t num_head_slices, uint32_t cluster) {
  using DTypeQ = typename Params::DTypeQ;
  using DTypeKV = typename Params::DTypeKV;
  using DTypeO = typename Params::DTypeO;
  static_assert(sizeof(DTypeQ) == 2 && sizeof(DTypeKV) == 2, "16-bit inputs");
  constexpr bool kSoftmax = Variant::use_softmax;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kS = Traits::kStages;
  constexpr int kH = Traits::kHeadsPerBlock;
  constexpr int kW = Traits::kConsumerWarps;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  ptx::launch_dependents();  // the merge kernel (groups > 1) may be scheduled; it waits
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
#ifdef FLASHGEN_HDECODE_TRACE
  if (threadIdx.x == 0) {
    FLASHGEN_HDECODE_MARK(0);
    hdecode_trace[(blockIdx.y * gridDim.x + blockIdx.x) & 1023][12] = hdecode_globaltimer();
  }
#endif
  const uint32_t ring = ptx::smem_addr(smem);
  const uint32_t full_bar = ring + Traits::kBarOffset;
  const uint32_t empty_bar = full_bar + 8 * kS;

  const uint32_t lane = threadIdx.x & 31;
  const uint32_t warp = threadIdx.x >> 5;
  const uint32_t split = blockIdx.x;
  const uint32_t kv_head = blockIdx.y / num_head_slices;
  const uint32_t slice = blockIdx.y % num_head_slices;
  const uint32_t group_size = params.num_qo_heads / params.num_kv_heads;
  const uint32_t first = slice * kH;
  const uint32_t num_heads = min(uint32_t(kH), group_size - first);
  const uint32_t head0 = kv_head * group_size + first;
  const uint32_t begin = min(params.kv_len, split * chunk);
  const uint32_t end = min(params.kv_len, begin + chunk);
  const uint32_t num_stages = (end - begin + Traits::kStageTokens - 1) / Traits::kStageTokens;

  // The cluster merge: rank r finalizes float4 chunks [r * per, (r + 1) * per) of the head
  // slice's [head][dim] output; every peer pushes it those chunks of its partial and its weight
  // per head (st.async), which complete on r's merge barrier.
  constexpr int kD4 = kD / 4;
  const uint32_t rank = detail::cluster_ctarank();
  const uint32_t chunks = num_heads * kD4;
  const uint32_t per = (chunks + cluster - 1) / cluster;
  const uint32_t owned = min(per, chunks - min(chunks, rank * per));
  const uint32_t merge_bar = empty_bar + 8 * kS;
  const uint32_t inbox_w = ring + Traits::kInboxOffset;  // [peer][head] floats
  const uint32_t inbox_o = inbox_w + Traits::kInboxWeightBytes;  // [peer][per] float4s

  // Stage i: K and V rows [begin + i * kStageTokens, ...) of kv_head into its ring slot, once
  // the slot's previous use is consumed (a fresh slot's wait passes at once).
  auto issue_stage = [&](uint32_t i) {
    const uint32_t use = i / Traits::kGroups;
    const uint32_t slot = i % Traits::kGroups + Traits::kGroups * (use % Traits::kSlotsPerGroup);
    mbar_wait(empty_bar + 8 * slot, ((use / Traits::kSlotsPerGroup) & 1) ^ 1);
    const uint32_t bar = full_bar + 8 * slot;
    mbar_arrive_expect_tx(bar, Traits::kStageBytes);
    const int32_t row = int32_t(begin + i * Traits::kStageTokens);
    const uint32_t k_dst = ring + slot * Traits::kStageBytes;
    const uint32_t v_dst = k_dst + Traits::kTileBytes;
#pragma unroll
    for (int b = 0; b < Traits::kBoxes; ++b) {
      tma_load_3d(k_dst + b * Traits::kBoxBytes, &maps.k, bar, b * 64,
                  k_rows_first ? row : int32_t(kv_head), k_rows_first ? int32_t(kv_head) : row);
      tma_load_3d(v_dst + b * Traits::kBoxBytes, &maps.v, bar, b * 64,
                  v_rows_first ? row : int32_t(kv_head), v_rows_first ? int32_t(kv_head) : row);
    }
    if (i == 0) FLASHGEN_HDECODE_MARK(2);
  };
  // A short call is a chain of latencies (hopper_decode_harness --trace): the query and the
  // first stages are asked for first thing, side by side. The producer thread sets up the
  // barriers and sends the first round of stages before the block-wide barrier; the consumer
  // warps load their query fragments (decode/query.cuh: head `group`) meanwhile. Issued after
  // the stages, the query queued behind their bytes (1.2 us later at 1024 tokens, 2.6 us with a
  // full 128 KB ring).
  Variant variant(params, 0, smem + Traits::kVariantOffset);
  const uint32_t group = lane >> 2;
  const uint32_t pair = lane & 3;
  uint32_t qf[Traits::kKSteps][2];
  uint32_t qf_lo[Traits::kKSteps][2];
  if (warp < kW) {
    const bool valid = group < num_heads;
    decode::load_query_split<DTypeKV>(
        params.q + (head0 + static_cast<int64_t>(valid ? group : 0)) * params.q_stride_h, valid,
        pair, variant, params, qf, qf_lo);
    if (threadIdx.x == 0) FLASHGEN_HDECODE_MARK(4);
  }
  const uint32_t first_round = min(num_stages, uint32_t(kS));
  if (warp == kW && lane == 0) {
    tma_prefetch_map(&maps.k);
    tma_prefetch_map(&maps.v);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, 4);
    }
    mbar_init(merge_bar, 1);
    if (owned > 0) mbar_arrive_expect_tx(merge_bar, cluster * (owned * 16 + num_heads * 4));
    mbar_init_fence();
    for (uint32_t i = 0; i < first_round; ++i) issue_stage(i);
  }
  __syncthreads();
  detail::cluster_arrive_relaxed();  // the merge barriers are set up; waited on before the first push
  if (threadIdx.x == 0) FLASHGEN_HDECODE_MARK(1);

  float m[2] = {-math::inf, -math::inf};  // running max of heads 2*pair, 2*pair+1 (base 2)
  float dsum[2] = {0.f, 0.f};
  float acc[Traits::kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[mt][e] = 0.f;
  }
  if (warp == kW) {
    // Producer: one thread keeps every stage of the ring in flight.
    if (lane == 0) {
      for (uint32_t i = first_round; i < num_stages; ++i) issue_stage(i);
      FLASHGEN_HDECODE_MARK(3);
    }
  } else {
    // ldmatrix rows: K as A (rows = tokens), V as A^T via .trans; the 128-byte swizzle puts
    // 16-byte chunk c of row r at (c ^ (r & 7)), and r & 7 == lane & 7 here.
    const uint32_t mi = lane >> 3;
    const uint32_t r7 = lane & 7;
    const uint32_t wg = warp % 4;  // warp within its consumer group: tokens 16 * wg of a stage
    const uint32_t k_row = wg * 16 + (mi & 1) * 8 + r7, k_chunk0 = mi >> 1;
    const uint32_t v_row = wg * 16 + (mi >> 1) * 8 + r7, v_chunk0 = mi & 1;
    auto chunk_addr = [&](uint32_t base, uint32_t row, uint32_t ch) {
      return base + (ch >> 3) * Traits::kBoxBytes + row * 128 + (((ch & 7) ^ r7) << 4);
    };
    const decode::WarpHeads heads{0, kv_head, head0, num_heads, group, pair};

    for (uint32_t i = warp / 4; i < num_stages; i += Traits::kGroups) {
      const uint32_t use = i / Traits::kGroups;
      const uint32_t slot = i % Traits::kGroups + Traits::kGroups * (use % Traits::kSlotsPerGroup);
      mbar_wait(full_bar + 8 * slot, (use / Traits::kSlotsPerGroup) & 1);
      if (threadIdx.x == 0 && i == 0) FLASHGEN_HDECODE_MARK(5);
      const uint32_t tpos = begin + i * Traits::kStageTokens + wg * 16;
      if (tpos < end) {
        const uint32_t k_base = ring + slot * Traits::kStageBytes;
        const uint32_t v_base = k_base + Traits::kTileBytes;
        decode::kv_tile_step<Traits, kSoftmax, DTypeKV>(
            [&](int ks) { return chunk_addr(k_base, k_row, ks * 2 + k_chunk0); },
            [&](int mt) { return chunk_addr(v_base, v_row, mt * 2 + v_chunk0); }, tpos, end, heads,
            qf, qf_lo, variant, params, m, dsum, acc);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_bar + 8 * slot);
    }
    if (threadIdx.x == 0) FLASHGEN_HDECODE_MARK(6);
    decode::reduce_denominator(dsum);
  }

  // Combine the consumer warps (the ring is free: every stage was waited on).
  __syncthreads();
  float* c_m = reinterpret_cast<float*>(smem);  // [warp][head]
  float* c_d = c_m + kW * kH;                   // [warp][head]
  float* c_o = c_d + kW * kH;                   // [warp][head][dim]
  if (warp < kW) {
    decode::store_warp_state<Traits::kMTiles, kH, kD>(c_m, c_d, c_o, warp, group, pair, m, dsum,
                                                     acc);
  }
  __syncthreads();
  if (threadIdx.x == 0) FLASHGEN_HDECODE_MARK(10);
  // This CTA's partial: normalized output [head][dim] and its base-2 LSE (softmax) or sum of
  // weights per head, pushed to the CTAs that finalize it. Each warp's weight in a head is
  // worked out once (kW x kH values, by one thread per head), then every element is kW FMAs of
  // float4s: done per element (max, exp2s and a division for each of the head's 128 columns), this
  // step took ~1.2 us of a 7 us kernel at 1024 tokens (hopper_decode_harness --trace).
  float* c_s = c_o + kW * kH * kD;  // [warp][head]: the weight of c_o in the partial
  detail::cluster_wait();  // every peer's merge barrier is set up
  if (threadIdx.x == 0) FLASHGEN_HDECODE_MARK(8);
  if (threadIdx.x < num_heads) {
    const uint32_t h = threadIdx.x;
    float weight;
    if constexpr (kSoftmax) {
      float mx = -math::inf;
#pragma unroll
      for (int w = 0; w < kW; ++w) mx = fmaxf(mx, c_m[w * kH + h]);
      const float m_ref = lse::reference(mx);
      float wt[kW];
      float den = 0.f;
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        wt[w] = math::ptx_exp2(c_m[w * kH + h] - m_ref);
        den += wt[w] * c_d[w * kH + h];
      }
      const float inv = lse::inverse<true>(den);
#pragma unroll
      for (int w = 0; w < kW; ++w) c_s[w * kH + h] = wt[w] * inv;
      weight = lse::weight<true>(m_ref, den);
    } else {
      float den = 0.f;
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        den += c_d[w * kH + h];
        c_s[w * kH + h] = 1.f;
      }
      weight = den;
    }
    for (uint32_t r = 0; r < cluster && r * per < chunks; ++r) {
      detail::st_async_f32(detail::map_rank(inbox_w + 4 * (rank * kH + h), r), weight,
                           detail::map_rank(merge_bar, r));
    }
  }
  __syncthreads();
  for (uint32_t idx = threadIdx.x; idx < chunks; idx += Traits::kThreads) {
    const uint32_t h = idx / kD4, d4 = idx % kD4;
    float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      const float sc = c_s[w * kH + h];
      const float4 x = reinterpret_cast<const float4*>(c_o + (w * kH + h) * kD)[d4];
      detail::fma4(x4, sc, x);
    }
    const uint32_t owner = idx / per;
    detail::st_async_v4(detail::map_rank(inbox_o + 16 * (rank * per + idx - owner * per), owner),
                        x4, detail::map_rank(merge_bar, owner));
  }
  if (threadIdx.x == 0) FLASHGEN_HDECODE_MARK(7);

  // This CTA's chunks, once every peer's bytes are in: nothing of this CTA is read by a peer, so
  // no cluster barrier holds it at the end.
  if (threadIdx.x < owned) mbar_wait<true>(merge_bar, 0);  // peers complete it: cluster scope
  const float* w_in = reinterpret_cast<const float*>(smem + Traits::kInboxOffset);
  const float4* o_in =
      reinterpret_cast<const float4*>(smem + Traits::kInboxOffset + Traits::kInboxWeightBytes);
  for (uint32_t i = threadIdx.x; i < owned; i += Traits::kThreads) {
    const uint32_t c = rank * per + i;
    const uint32_t h = c / kD4, d = (c % kD4) * 4;
    float w_max = -math::inf;
    if constexpr (kSoftmax) {
      for (uint32_t r = 0; r < cluster; ++r) w_max = fmaxf(w_max, w_in[r * kH + h]);
    }
    lse::Merge<kSoftmax> mg(w_max);
    float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
    for (uint32_t r = 0; r < cluster; ++r) {
      detail::fma4(num, mg.add(w_in[r * kH + h]), o_in[r * per + i]);
    }
    // A whole row (no portable merge after this kernel): the variant's sink joins it here.
    if (part_o == nullptr) hooks::add_sink(variant, params, mg.ref, mg.den, 0, 0, head0 + h);
    const float inv = mg.inverse();
    const float value[4] = {num.x * inv, num.y * inv, num.z * inv, num.w * inv};
    const float weight = mg.weight();
    if (part_o != nullptr) {
      const int64_t row =
          static_cast<int64_t>(split / cluster) * params.num_qo_heads + head0 + h;
      *reinterpret_cast<float4*>(part_o + row * kD + d) =
          make_float4(value[0], value[1], value[2], value[3]);
      if (d == 0) part_w[row] = weight;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float y = hooks::output_transform(variant, params, value[e], 0, 0, head0 + h);
        params.o[(head0 + h) * params.o_stride_h + d + e] = from_float<DTypeO>(y);
      }
      if (d == 0 && params.lse != nullptr) {
        params.lse[head0 + h] = lse::natural<kSoftmax>(weight);
      }
    }
  }
  if (threadIdx.x == 0) FLASHGEN_HDECODE_MARK(9);
#ifdef FLASHGEN_HDECODE_TRACE
  if (threadIdx.x == 0) {
    FLASHGEN_HDECODE_MARK(11);
    hdecode_trace[(blockIdx.y * gridDim.x + blockIdx.x) & 1023][13] = hdecode_globaltimer();
  }
#endif
}

/** Launches the decode kernel of `plan` (and the portable merge when plan.groups > 1). */
template <int HEAD_DIM, typename Variant, typename Params, typename Traits = DecodeTraits90<HEAD_DIM>>
inline int launch_single_decode_planned(const Params& p, const DecodePlan90& plan, void* workspace,
                                        int64_t workspace_bytes, const DeviceInfo& dev,
                                        cudaStream_t stream) {
  if (dev.major != 9) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "single_decode: the sm90 backend runs on compute capability 9.x only (device %d "
                "is %d.x); use backend=\"portable\"",
                dev.device, dev.major);
  }
  float* part_o = nullptr;
  float* part_w = nullptr;
  if (plan.workspace > 0) {
    if (workspace == nullptr || workspace_bytes < plan.workspace || !aligned16(workspace)) {
      return fail(FLASHGEN_WORKSPACE_TOO_SMALL,
                  "single_decode: needs a 16-byte aligned workspace of %lld bytes, got %lld at %p "
                  "(ask flashgen_single_decode_workspace_size on the same device)",
                  static_cast<long long>(plan.workspace),
                  static_cast<long long>(workspace_bytes), workspace);
    }
    part_o = static_cast<float*>(workspace);
    part_w = part_o + plan.groups * int64_t(p.num_qo_heads) * HEAD_DIM;
  }
  KVTensorMaps maps;
  KVMapOrder k_order, v_order;
  if (int st = make_kv_map(&maps.k, &k_order, p.k, p.kv_len, p.num_kv_heads, HEAD_DIM,
                           p.k_stride_n, p.k_stride_h, Traits::kStageTokens)) {
    return st;
  }
  if (int st = make_kv_map(&maps.v, &v_order, p.v, p.kv_len, p.num_kv_heads, HEAD_DIM,
                           p.v_stride_n, p.v_stride_h, Traits::kStageTokens)) {
    return st;
  }
  auto kernel = single_decode_kernel90<Traits, Variant, Params>;
  static std::atomic<uint64_t> smem_done{0};
  if (int st = allow_smem(kernel, dev, Traits::kSmemBytes, smem_done)) return st;
  if (plan.cluster > kMaxClusterPortable) {
    static std::atomic<uint64_t> np_done{0};
    const uint64_t bit = dev.device < 64 ? (uint64_t{1} << dev.device) : 0;
    if (bit == 0 || !(np_done.load(std::memory_order_acquire) & bit)) {
      const cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (err != cudaSuccess) {
        return fail(FLASHGEN_CUDA_ERROR, "cudaFuncSetAttribute (cluster size): %s",
                    cudaGetErrorString(err));
      }
      np_done.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<uint32_t>(plan.splits),
                     static_cast<uint32_t>(p.num_kv_heads * plan.head_slices));
  cfg.blockDim = dim3(Traits::kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(Traits::kSmemBytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(plan.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaError_t err = cudaLaunchKernelEx(
      &cfg, kernel, p, maps, uint32_t(k_order.rows_first), uint32_t(v_order.rows_first), part_o,
      part_w, static_cast<uint32_t>(plan.chunk), static_cast<uint32_t>(plan.head_slices),
      static_cast<uint32_t>(plan.cluster));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(FLASHGEN_CUDA_ERROR, "single_decode sm90 kernel: %s (%s)", cudaGetErrorString(err),
                cudaGetErrorName(err));
  }
  if (plan.groups > 1) {
    decode::MergeOutput<typename Params::DTypeO> out{p.o, p.lse, 0, p.o_stride_h, p.num_qo_heads,
                                                     p.num_qo_heads};
    return launch("single_decode merge kernel", decode::merge_kernel<HEAD_DIM, Variant, Params>,
                  dim3(p.num_qo_heads), decode::kMergeThreads, 0, stream, true, p,
                  static_cast<const float*>(part_o), static_cast<const float*>(part_w),
                  static_cast<uint32_t>(plan.groups), out);
  }
  return FLASHGEN_OK;
}

/** The entry points backend sm90 of csrc/single_decode.cu calls (portable signatures). */
template <int HEAD_DIM>
inline DecodePlan90 single_decode_plan(int64_t num_qo_heads, int64_t num_kv_heads, int64_t kv_len,
                                       const DeviceInfo& dev) {
  return plan_single_decode90<DecodeTraits90<HEAD_DIM>>(num_qo_heads, num_kv_heads, kv_len, dev);
}

template <int HEAD_DIM, typename Variant, typename Params>
inline int launch_single_decode(const Params& p, void* workspace, int64_t workspace_bytes,
                                const DeviceInfo& dev, cudaStream_t stream) {
  const DecodePlan90 plan = single_decode_plan<HEAD_DIM>(p.num_qo_heads, p.num_kv_heads,
                                                         p.kv_len, dev);
  return launch_single_decode_planned<HEAD_DIM, Variant>(p, plan, workspace, workspace_bytes, dev,
                                                         stream);
}

}  // namespace hopper
}  // namespace flashgen
