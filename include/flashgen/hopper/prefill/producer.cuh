/**
 * @brief The producer of the sm90 prefill kernel: warpgroup 0's K/V copies into the stage
 * buffers (storage.cuh), each stage published on its full barrier and taken back on its empty
 * one. Three ways, by how K/V are laid out:
 *  - contiguous K/V (single, ragged; PAGE_SIZE 0): one thread issues 3-D TMA boxes (one per
 *    64-column block) through the tensor maps; with RoPE the keys come from the rotated copy the
 *    pre-pass wrote into the workspace (the launch points maps.k at it);
 *  - paged, page sizes that are multiples of 8 dividing the kv tile (hopper_paged_tma): warp 0
 *    issues one 5-D box per page and column block, a box per lane, and zeroes the rows of the
 *    last page past kv_len;
 *  - other page sizes (1): the 128 threads gather rows with 16-byte cp.async into the same
 *    swizzled layout, each arriving on the stage's full barrier when its copies land.
 *
 * With an fp8 cache the same copies fill the staging ring instead (one-byte tiles, rows of 64
 * bytes per column block; the gather with warps 0 and 1), and the last two or three warps widen
 * them into the stages (widen.cuh): `sl` names what the copies fill, the Traits' kLoad*
 * constants its shape.
 *
 * run_producer dispatches the warpgroup's threads to one of them (and the dynamic order's
 * scheduler thread to run_scheduler, the widening warps to run_widener). The loops take the
 * scheduler's closures (block_of, plan, next_block) and the stages' (StageRefs) from the kernel
 * (kernel.cuh), which keeps the SASS of the single-body kernel.
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "flashgen/ptx_sm80.cuh"
#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/tma.cuh"
#include "flashgen/hopper/tuning.cuh"
#include "flashgen/hopper/wgmma.cuh"
#include "flashgen/hopper/prefill/scheduler.cuh"
#include "flashgen/hopper/prefill/storage.cuh"
#include "flashgen/hopper/prefill/widen.cuh"

namespace flashgen {
namespace hopper {

/** Where a request's K/V rows start in the tensor maps (single: 0; ragged: kv_indptr[b]). */
template <typename Params, typename = void>
struct has_kv_indptr : std::false_type {};
template <typename Params>
struct has_kv_indptr<Params, std::void_t<decltype(std::declval<Params>().kv_indptr)>>
    : std::true_type {};

template <typename Params>
__device__ __forceinline__ int32_t request_kv_row0(const Params& p, uint32_t batch) {
  if constexpr (has_kv_indptr<Params>::value) {
    return p.kv_indptr[batch];
  } else {
    return 0;
  }
}

/** The stage buffers and barriers as the kernel's closures name them (storage.cuh's addresses):
 *  the producer calls the same closures the consumers do. */
template <typename KAddr, typename VAddr, typename FullK, typename FullV, typename EmptyK,
          typename EmptyV>
struct StageRefs {
  KAddr& k_addr;
  VAddr& v_addr;
  FullK& full_k;
  FullV& full_v;
  EmptyK& empty_k;
  EmptyV& empty_v;
};

/** Contiguous K/V (single, ragged), one thread: per tile, wait for the stage's buffers to be
 *  free and issue one 3-D box per 64-column block of K, then of V. next_block: the scheduler's
 *  (the kernel's closure). Returns the tiles loaded. */
template <typename Traits, bool kDynamic, typename Params, typename NextBlock, typename Stages>
__device__ __forceinline__ uint32_t load_dense(const Params& params, const KVTensorMaps& maps,
                                               const KVMapOrder& order_k,
                                               const KVMapOrder& order_v, uint32_t num_blocks,
                                               NextBlock& next_block, const Stages& sg) {
  constexpr int kTileKV = Traits::kTileKV;
  constexpr int kStages = Traits::kLoadStages;
  constexpr int kRowBytes = Traits::kLoadRowBytes;
  uint32_t g = 0;  // tiles loaded so far by this CTA: stage g % kStages, use g / kStages
  for (uint32_t round = 0; kDynamic || round * gridDim.x < num_blocks; ++round) {
    HopperBlock b;
    if (!next_block(round, 1u, b)) {
      if constexpr (kDynamic) break; else continue;
    }
    const uint32_t kv_head = b.kv_head;
    const int32_t row0 = request_kv_row0(params, b.w.batch);
    for (int32_t j = 0; j < b.n_tiles; ++j, ++g) {
      const uint32_t s = g % kStages;
      const uint32_t ph = (g / kStages) & 1u;
      const int32_t row = row0 + (b.kt_begin + j) * kTileKV;
      const int32_t k1 = order_k.rows_first ? row : int32_t(kv_head);
      const int32_t k2 = order_k.rows_first ? int32_t(kv_head) : row;
      const int32_t v1 = order_v.rows_first ? row : int32_t(kv_head);
      const int32_t v2 = order_v.rows_first ? int32_t(kv_head) : row;
      mbar_wait(sg.empty_k(s), ph ^ 1u);
      mbar_arrive_expect_tx(sg.full_k(s), Traits::kLoadTileBytes);
#pragma unroll
      for (int cb = 0; cb < Traits::kBlocks; ++cb) {
        tma_load_3d(sg.k_addr(s) + cb * kTileKV * kRowBytes, &maps.k, sg.full_k(s), cb * 64, k1,
                    k2);
      }
      mbar_wait(sg.empty_v(s), ph ^ 1u);
      mbar_arrive_expect_tx(sg.full_v(s), Traits::kLoadTileBytes);
#pragma unroll
      for (int cb = 0; cb < Traits::kBlocks; ++cb) {
        tma_load_3d(sg.v_addr(s) + cb * kTileKV * kRowBytes, &maps.v, sg.full_v(s), cb * 64, v1,
                    v2);
      }
    }
  }
  return g;
}

/** Paged K/V by TMA, warp 0 (`lane`): lane l owns box l of a tile (page l / kBlocks of the tile,
 *  column block l % kBlocks), loads that page's id a tile ahead (one register, no shuffles) and
 *  issues its own TMA, so a tile's 8-16 boxes leave in one warp instruction instead of one
 *  thread's loop, and the page-table load is off the copy path. maps.k: the page pool's 5-D map
 *  (`porder`); maps.v (RoPE): the rotated keys. Rows of the last page past kv_len are zeroed.
 *  block_of, plan: the scheduler's (the kernel's closures). Returns the tiles loaded. */
template <typename Traits, int PAGE_SIZE, bool kRope, typename Params, typename BlockOf,
          typename Plan, typename Stages>
__device__ __forceinline__ uint32_t load_paged_tma(const Params& params, uint8_t* smem,
                                                   uint32_t base, uint32_t tail_bar,
                                                   const KVTensorMaps& maps,
                                                   const KVMapOrder& order_v,
                                                   const PagedMapOrder& porder,
                                                   uint32_t num_blocks, BlockOf& block_of,
                                                   Plan& plan, const Stages& sg, uint32_t tid) {
  constexpr int kTileKV = Traits::kTileKV;
  constexpr int kStages = Traits::kLoadStages;
  constexpr int kRowBytes = Traits::kLoadRowBytes;
  constexpr int kRowChunks = kRowBytes / 16;  // 16-byte chunks of a row of a column block
  constexpr int kPages = kTileKV / PAGE_SIZE;  // pages per kv tile
  constexpr int kBoxes = kPages * Traits::kBlocks;
  static_assert(kBoxes <= 32, "one box per lane of the issuing warp");
  const uint32_t lane = tid;
  const bool issuer = lane < uint32_t(kBoxes);
  const int32_t box_page = int32_t(lane) / Traits::kBlocks;
  const int32_t box_cb = int32_t(lane) % Traits::kBlocks;
  const uint32_t box_off =
      uint32_t(box_cb) * kTileKV * kRowBytes + uint32_t(box_page) * PAGE_SIZE * kRowBytes;
  uint32_t g = 0, tail_ph = 0;
  // coordinate of map dimension k + 1 from the logical (row in page, head, kv, page)
  auto coord = [&](int k, int32_t head, int32_t kv, int32_t pg) -> int32_t {
    const uint8_t a = porder.at[k];
    return a == 0 ? 0 : (a == 1 ? head : (a == 2 ? kv : pg));
  };
  for (uint32_t round = 0; round * gridDim.x < num_blocks; ++round) {
    const uint32_t blk = block_of(round);
    HopperBlock b;
    if (blk >= num_blocks || !plan(blk, b)) continue;
    const int32_t head = int32_t(b.kv_head);
    const int32_t n_pages = (b.kv_len + PAGE_SIZE - 1) / PAGE_SIZE;
    const int32_t* pages = params.kv_indices + b.rq.page0;
    // this lane's page id for tile j (-1: past the request's pages, zero fill)
    auto page_of = [&](int32_t j) -> int32_t {
      const int32_t pi = (b.kt_begin + j) * (kTileKV / PAGE_SIZE) + box_page;
      return issuer && j < b.n_tiles && pi < n_pages ? __ldg(pages + pi) : -1;
    };
    int32_t pid_next = page_of(0);
    for (int32_t j = 0; j < b.n_tiles; ++j, ++g) {
      const uint32_t s = g % kStages;
      const uint32_t ph = (g / kStages) & 1u;
      const int32_t t0 = (b.kt_begin + j) * kTileKV;
      const int32_t pid = pid_next;
      pid_next = page_of(j + 1);  // in flight while the buffers drain
      auto load = [&](uint32_t dst, uint32_t done, int32_t kv) {
        if (issuer) {
          tma_load_5d(dst + box_off, &maps.k, done, box_cb * 64, coord(0, head, kv, pid),
                      coord(1, head, kv, pid), coord(2, head, kv, pid),
                      coord(3, head, kv, pid));
        }
      };
      mbar_wait(sg.empty_k(s), ph ^ 1u);
      if (lane == 0) mbar_arrive_expect_tx(sg.full_k(s), Traits::kLoadTileBytes);
      __syncwarp();
      if constexpr (kRope) {
        // rotated keys: the dense workspace rows, as ragged
        const int32_t row = int32_t(b.rq.kv_row0) + t0;
        const int32_t k1 = order_v.rows_first ? row : head;
        const int32_t k2 = order_v.rows_first ? head : row;
        if (lane < uint32_t(Traits::kBlocks)) {
          tma_load_3d(sg.k_addr(s) + lane * kTileKV * kRowBytes, &maps.v, sg.full_k(s),
                      int32_t(lane) * 64, k1, k2);
        }
      } else {
        load(sg.k_addr(s), sg.full_k(s), 0);
      }
      mbar_wait(sg.empty_v(s), ph ^ 1u);
      // Rows past kv_len in the request's last page hold whatever the cache slot holds:
      // zeroed here before the consumers see the tile (P is 0 there, but 0 * NaN is not).
      const int32_t z_lo = b.kv_len - t0;
      const int32_t z_hi = min(kTileKV, n_pages * PAGE_SIZE - t0);
      if (z_lo < z_hi) {
        if (lane == 0) mbar_arrive_expect_tx(tail_bar, Traits::kLoadTileBytes);
        __syncwarp();
        load(sg.v_addr(s), tail_bar, 1);
        mbar_wait(tail_bar, tail_ph);
        tail_ph ^= 1u;
        uint8_t* vs = smem + (sg.v_addr(s) - base);
        const int32_t n = (z_hi - z_lo) * Traits::kBlocks * kRowChunks;  // 16-byte chunks
        for (int32_t i = int32_t(lane); i < n; i += 32) {
          const int32_t cb = i / ((z_hi - z_lo) * kRowChunks);
          const int32_t rem = i % ((z_hi - z_lo) * kRowChunks);
          *reinterpret_cast<uint4*>(vs + cb * kTileKV * kRowBytes +
                                    (z_lo + rem / kRowChunks) * kRowBytes +
                                    (rem % kRowChunks) * 16) = make_uint4(0u, 0u, 0u, 0u);
        }
        fence_proxy_async();
        __syncwarp();
        if (lane == 0) mbar_arrive(sg.full_v(s));
      } else {
        if (lane == 0) mbar_arrive_expect_tx(sg.full_v(s), Traits::kLoadTileBytes);
        __syncwarp();
        load(sg.v_addr(s), sg.full_v(s), 1);
      }
    }
  }
  return g;
}

/** Where 16-byte chunk c of row r of a tile goes in what the copies fill: the 128-byte swizzle
 *  of the stages, or the staging ring's rows of 64 bytes per column block (fp8). */
template <typename Traits>
__device__ __forceinline__ uint32_t load_chunk_offset(uint32_t r, uint32_t c) {
  if constexpr (Traits::kFp8) {
    return (c / 4) * (Traits::kTileKV * 64) + r * 64 + (c % 4) * 16;
  } else {
    return sw128<Traits::kTileKV>(r, c);
  }
}

/** Paged K/V gathered by the 128 producer threads (fp8: the 64 of warps 0 and 1) with 16-byte
 *  cp.async into the swizzled layout (fp8: the staging ring's), each thread arriving on the
 *  stage's full barrier when its copies land; with RoPE, K from the rotated copy `rope_k`.
 *  block_of, plan: the scheduler's (the kernel's closures). Returns the tiles loaded. */
template <typename Traits, int PAGE_SIZE, bool kRope, typename Params, typename BlockOf,
          typename Plan, typename Stages>
__device__ __forceinline__ uint32_t load_gather(const Params& params,
                                                const typename Params::DTypeKV* rope_k,
                                                uint32_t num_blocks, BlockOf& block_of,
                                                Plan& plan, const Stages& sg, uint32_t tid) {
  using DTypeKV = typename Params::DTypeKV;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kTileKV = Traits::kTileKV;
  constexpr int kStages = Traits::kLoadStages;
  // Thread t copies 16-byte chunk t % kChunks of rows t / kChunks + kRowStep * i.
  constexpr uint32_t kElems = 16 / sizeof(DTypeKV);  // elements of a 16-byte chunk
  constexpr uint32_t kChunks = kD / kElems;
  constexpr uint32_t kThreads = Traits::kFp8 ? kFp8GatherThreads : 128;
  constexpr uint32_t kRowStep = kThreads / kChunks;
  constexpr int kPasses = kTileKV / int(kRowStep);
  static_assert(kTileKV % kRowStep == 0, "kv tile rows per pass");
  const uint32_t c = tid % kChunks, r0 = tid / kChunks;
  uint32_t g = 0;
  for (uint32_t round = 0; round * gridDim.x < num_blocks; ++round) {
    const uint32_t blk = block_of(round);
    HopperBlock b;
    if (blk >= num_blocks || !plan(blk, b)) continue;
    const auto src = prefill::make_kv<kD, PAGE_SIZE, kRope>(params, b.rq, b.kv_head, rope_k);
    for (int32_t j = 0; j < b.n_tiles; ++j, ++g) {
      const uint32_t s = g % kStages;
      const uint32_t ph = (g / kStages) & 1u;
      const int32_t pos0 = (b.kt_begin + j) * kTileKV + int32_t(r0);
      mbar_wait(sg.empty_k(s), ph ^ 1u);
#pragma unroll kGatherUnroll
      for (int i = 0; i < kPasses; ++i) {
        const int32_t pos = pos0 + i * int32_t(kRowStep);
        const bool ok = pos < b.kv_len;
        const DTypeKV* row = src.k_row(ok && !kRope ? src.page(uint32_t(pos)) : 0,
                                       ok ? uint32_t(pos) : 0u);
        ptx::cp_async_16(sg.k_addr(s) + load_chunk_offset<Traits>(r0 + i * kRowStep, c),
                         row + c * kElems, ok ? 16u : 0u);
      }
      mbar_cp_async_arrive(sg.full_k(s));
      mbar_wait(sg.empty_v(s), ph ^ 1u);
#pragma unroll kGatherUnroll
      for (int i = 0; i < kPasses; ++i) {
        const int32_t pos = pos0 + i * int32_t(kRowStep);
        const bool ok = pos < b.kv_len;
        const DTypeKV* row = src.v_row(ok ? src.page(uint32_t(pos)) : 0,
                                       ok ? uint32_t(pos) : 0u);
        ptx::cp_async_16(sg.v_addr(s) + load_chunk_offset<Traits>(r0 + i * kRowStep, c),
                         row + c * kElems, ok ? 16u : 0u);
      }
      mbar_cp_async_arrive(sg.full_v(s));
    }
  }
  return g;
}

/** The producer warpgroup's role (warpgroup 0, its registers cut to kProducerRegs): in the
 *  dynamic order thread 32 is the scheduler thread (scheduler.cuh); the copies are issued by
 *  warp 0 (paged TMA), the 128 threads (gather; fp8: warps 0 and 1) or thread 0 (dense TMA),
 *  and the other threads return at once, except with an fp8 cache the last two or three warps,
 *  which widen the staged tiles (widen.cuh, storage.cuh's hopper_widen_warps). st: the CTA's
 *  storage (the paged tail barrier, the staging ring); ring, block_of, plan, next_block,
 *  sched_full, sched_empty: the scheduler's (the kernel's closures); sg: the stages'; sl: what
 *  the copies fill (sg, or the staging ring's closures with an fp8 cache). */
template <typename Traits, int PAGE_SIZE, bool kRope, bool kDynamic, typename Params,
          typename Storage, typename BlockOf, typename Plan, typename NextBlock,
          typename SchedFull, typename SchedEmpty, typename Stages, typename LoadStages>
__device__ __forceinline__ void run_producer(
    const Params& params, const KVTensorMaps& maps, const KVMapOrder& order_k,
    const KVMapOrder& order_v, const PagedMapOrder& porder,
    const typename Params::DTypeKV* rope_k, uint8_t* smem, uint32_t base, const Storage& st,
    uint32_t num_blocks, uint32_t* block_counter, BlockSlot* ring, BlockOf& block_of, Plan& plan,
    NextBlock& next_block, SchedFull& sched_full, SchedEmpty& sched_empty, const Stages& sg,
    const LoadStages& sl, uint32_t tid) {
  constexpr bool kPagedTma = hopper_paged_tma<Traits::kTileKV, PAGE_SIZE>();
  constexpr bool kGather = PAGE_SIZE > 0 && !kPagedTma;
  setmaxnreg_dec<Traits::kProducerRegs>();
  if constexpr (kDynamic) {
    if (tid == 32) {
      run_scheduler(num_blocks, block_counter, ring, plan, sched_full, sched_empty);
      return;
    }
  }
  if constexpr (Traits::kFp8) {
    static_assert(!kRope, "an fp8 cache has no RoPE pre-pass: keys are rotated before caching");
    static_assert(!kDynamic, "an fp8 cache takes a static order: warp 1 may widen");
    constexpr int kWidenWarps = hopper_widen_warps<Traits::kTileKV, PAGE_SIZE>();
    if (tid >= 32 * (4 - kWidenWarps)) {
      run_widener<Traits, kWidenWarps, half, typename Params::DTypeKV>(
          st, sg, tid - 32 * (4 - kWidenWarps));
      return;
    }
  }
  if constexpr (kPagedTma) {
    if (tid < 32) {
      const uint32_t tiles = load_paged_tma<Traits, PAGE_SIZE, kRope>(
          params, smem, base, st.tail_v(), maps, order_v, porder, num_blocks, block_of, plan, sl,
          tid);
      if constexpr (Traits::kFp8) {
        if (tid == 0) end_loads<Traits>(st, tiles);
      }
    }
    return;
  } else if constexpr (kGather) {
    if (!Traits::kFp8 || tid < kFp8GatherThreads) {
      const uint32_t tiles = load_gather<Traits, PAGE_SIZE, kRope>(params, rope_k, num_blocks,
                                                                   block_of, plan, sl, tid);
      if constexpr (Traits::kFp8) end_loads<Traits>(st, tiles);
    }
    return;
  }
  if (tid == 0) {
    const uint32_t tiles =
        load_dense<Traits, kDynamic>(params, maps, order_k, order_v, num_blocks, next_block, sl);
    if constexpr (Traits::kFp8) end_loads<Traits>(st, tiles);
  }
}

}  // namespace hopper
}  // namespace flashgen
