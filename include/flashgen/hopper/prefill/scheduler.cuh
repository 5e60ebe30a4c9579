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

#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/prefill/scheduler.cuh"
#include "flashgen/hopper/mbarrier.cuh"

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
 *  the 24-register copy warp. Not over an fp8 cache: the scheduler thread would keep warp 1
 *  from widening (storage.cuh's hopper_widen_warps), and a third widening warp gains more
 *  than the order does (benches/NOTES-hopper.md). */
template <bool BATCH, int PAGE_SIZE, bool FP8>
__host__ __device__ constexpr bool hopper_dynamic_order() {
  return BATCH && PAGE_SIZE == 0 && !FP8;
}

/** The scheduler thread of the dynamic order: plans and publishes every round's block in the
 *  two-slot ring, a block ahead of the consumers (the plan's loads are off their path), up to
 *  the first that is not a real unit (the end: the unit tables list every real unit before the
 *  empty slots). Its first block is blockIdx.x, each next one from the counter. plan,
 *  sched_full, sched_empty: the kernel's closures. */
template <typename Plan, typename SchedFull, typename SchedEmpty>
__device__ __forceinline__ void run_scheduler(uint32_t num_blocks, uint32_t* block_counter,
                                              BlockSlot* ring, Plan& plan, SchedFull& sched_full,
                                              SchedEmpty& sched_empty) {
  for (uint32_t round = 0;; ++round) {
    const uint32_t blk = round == 0 ? blockIdx.x : gridDim.x + atomicAdd(block_counter, 1u);
    const uint32_t k = round & 1u;
    mbar_wait(sched_empty(k), ((round >> 1) & 1u) ^ 1u);
    const bool ok = blk < num_blocks && plan(blk, ring[k].b);
    ring[k].ok = ok ? 1u : 0u;
    mbar_arrive(sched_full(k));
    if (!ok) break;
  }
}

/** Blocks of this CTA in a static order: one per round of gridDim.x blocks; round-robin (CTA c
 *  takes c + r * grid) in the batch kernels, snake in single prefill (odd rounds reversed, so
 *  the CTA that took the heaviest block of a round takes the lightest of the next: blocks come
 *  heavy-first; it lets causal single prefill run persistent over few rounds, launch.cuh's
 *  grid_ctas). */
template <bool kSnake>
__device__ __forceinline__ auto make_block_of() {
  return [](uint32_t round) -> uint32_t {
    const uint32_t c = (kSnake && (round & 1u))
                           ? gridDim.x - 1u - blockIdx.x
                           : blockIdx.x;
    return round * gridDim.x + c;
  };
}

}  // namespace hopper
}  // namespace flashgen
