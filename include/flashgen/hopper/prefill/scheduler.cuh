/**
 * @brief The block scheduler of the sm90 prefill kernel: which work blocks (unit x kv head) a
 * CTA runs, in which order, and each block's plan (its request, its query rows, the kv tiles it
 * visits and which of them need a mask), as every role sees it.
 *
 * A persistent CTA takes one block per round of gridDim.x blocks:
 *  - static orders: round-robin (CTA c takes block c + r * grid) in the batch kernels; snake in
 *    single prefill (odd rounds reversed, so the CTA that took the heaviest block of a round
 *    takes the lightest of the next: blocks come heavy-first);
 *  - the dynamic order (hopper_dynamic_order): a CTA's first block is blockIdx.x and each next
 *    one comes from an atomic counter in the workspace (zeroed by the prep kernel), so CTAs take
 *    the heavy-first blocks in order as they free up. The scheduler thread (warp 1 of the
 *    producer warpgroup, which issues no copies) fetches, plans and publishes each block in a
 *    two-slot ring in shared memory, so the request lookups are off the other roles' path.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashgen/prefill/hooks.cuh"
#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/prefill/mask.cuh"
#include "flashgen/prefill/rope.cuh"
#include "flashgen/prefill/scheduler.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/prefill/storage.cuh"

namespace flashgen {
namespace hopper {

/** One work block (unit x kv head) as every role sees it. */
struct HopperBlock {
  prefill::WorkUnit w;
  prefill::RequestInfo rq;
  uint32_t kv_head, unit, p0;
  int32_t qo_len, kv_len, kt_begin, n_tiles, free_a, free_b;
};

/** A slot of the dynamic order's ring: a block's plan as the scheduler thread computed it. */
struct BlockSlot {
  HopperBlock b;
  uint32_t ok;  // 0: no block (the CTA's work is done)
};

/** Whether a kernel takes its blocks in the dynamic order (host and device: the launch sizes
 *  the grid and has the prep kernel zero the counter accordingly). Batch kernels over
 *  contiguous K/V only: single prefill has no prep kernel to zero the counter (a memset node
 *  costs short calls more than the order gains), and in paged kernels reading the ring spills
 *  the 24-register copy warp. */
template <bool BATCH, int PAGE_SIZE>
__host__ __device__ constexpr bool hopper_dynamic_order() {
  return BATCH && PAGE_SIZE == 0;
}

template <typename Traits, int MASK, int POS, typename Variant, typename Params, typename Sched,
          int PAGE_SIZE>
struct BlockScheduler {
  static constexpr bool kDynamic =
      hopper_dynamic_order<std::is_same<Sched, prefill::BatchSched>::value, PAGE_SIZE>();
  static constexpr bool kSnake = std::is_same_v<Sched, prefill::SingleSched>;
  static constexpr bool kRope = POS == prefill::kPosRopeLlama;
  static_assert(sizeof(BlockSlot) <= Traits::kBlockSlotBytes, "ring slot");

  // References, as a closure holds them: the kernel's own values.
  const Params& params;
  const Sched& sched;
  const PrefillStorage<Traits>& st;
  const uint32_t& num_blocks;
  const uint32_t& num_kv_heads;
  const uint32_t& G;
  uint8_t* const& variant_smem;
  BlockSlot* const& ring;  // the dynamic order's two slots (PrefillStorage::ring)
  uint32_t* const& block_counter;

  /** Whether the block loops go on to round `round`: `for (round = 0; more(round); ++round)`.
   *  A block that is not a real unit is skipped in the static order and ends the loop in the
   *  dynamic one (the unit tables list every real unit before the empty slots, so the first
   *  empty one is the end, on every role alike). */
  __device__ bool more(uint32_t round) const {
    return kDynamic || round * gridDim.x < num_blocks;
  }

  /** The block of round `round` in the static order (round-robin or snake). */
  static __device__ uint32_t block_of(uint32_t round) {
    const uint32_t c = (kSnake && (round & 1u))
                           ? gridDim.x - 1u - blockIdx.x
                           : blockIdx.x;
    return round * gridDim.x + c;
  }

  /** Block blk of the (possibly persistent) grid: unit blk / Hkv, kv head blk % Hkv; the kv
   *  tiles it visits (prefill/mask.cuh's unit_tiles, as in the portable kernel). False: an
   *  empty unit-table slot. */
  __device__ bool plan(uint32_t blk, HopperBlock& b) const {
    constexpr int kTileQ = Traits::kTileQ;
    constexpr int kTileKV = Traits::kTileKV;
    b.kv_head = blk % num_kv_heads;
    b.unit = blk / num_kv_heads;
    if (!sched.get(b.unit, b.w)) return false;
    b.rq = prefill::request_info(params, b.w.batch);
    // Without RoPE nothing reads the offsets; zeroed, their loads are dropped (the plan goes to
    // shared memory, so they would stay, and the scheduler thread's 24 registers spilled).
    if constexpr (!kRope) b.rq.q_rope_offset = b.rq.kv_rope_offset = 0;
    const int32_t qo_len = int32_t(b.rq.qo_len), kv_len = int32_t(b.rq.kv_len);
    b.qo_len = qo_len;
    b.kv_len = kv_len;
    b.p0 = b.w.tile * uint32_t(kTileQ);
    const int32_t first_token = int32_t(b.p0 / G);
    const int32_t last_token =
        int32_t(min(uint32_t(qo_len) * G - 1u, b.p0 + uint32_t(kTileQ) - 1u) / G);
    const prefill::UnitTiles tiles = prefill::unit_tiles<MASK, kTileKV>(
        params, b.w.batch, qo_len, kv_len, first_token, last_token, b.w.splits, b.w.chunk,
        [&p = params, &vs = variant_smem, &b]() { return Variant(p, b.w.batch, vs); });
    b.kt_begin = tiles.begin;
    b.n_tiles = tiles.end - tiles.begin;
    b.free_a = tiles.free_a();
    b.free_b = tiles.free_b();
    return true;
  }

  /** The block of round `round`, planned into b: true to run it; false, skip it (static order)
   *  or stop (dynamic). Dynamic: copied from the ring, each warp releasing the slot once its
   *  lanes have read it. `mask`: the lanes of the calling warp that run this code (the dense
   *  producer issues from one thread). */
  __device__ bool next(uint32_t round, uint32_t mask, HopperBlock& b) const {
    if constexpr (kDynamic) {
      const uint32_t k = round & 1u;
      mbar_wait(st.sched_full(k), (round >> 1) & 1u);
      b = ring[k].b;
      const bool ok = ring[k].ok != 0;
      __syncwarp(mask);
      if ((threadIdx.x & 31u) == 0) mbar_arrive(st.sched_empty(k));
      return ok;
    } else {
      const uint32_t blk = block_of(round);
      return blk < num_blocks && plan(blk, b);
    }
  }

  /** The scheduler thread (dynamic order): plans and publishes every round's block, a block
   *  ahead of the consumers, up to the first that is not a real unit (the end). */
  __device__ __forceinline__ void run() const {
    for (uint32_t round = 0;; ++round) {
      const uint32_t blk = round == 0 ? blockIdx.x : gridDim.x + atomicAdd(block_counter, 1u);
      const uint32_t k = round & 1u;
      mbar_wait(st.sched_empty(k), ((round >> 1) & 1u) ^ 1u);
      const bool ok = blk < num_blocks && plan(blk, ring[k].b);
      ring[k].ok = ok ? 1u : 0u;
      mbar_arrive(st.sched_full(k));
      if (!ok) break;
    }
  }
};

}  // namespace hopper
}  // namespace flashgen
