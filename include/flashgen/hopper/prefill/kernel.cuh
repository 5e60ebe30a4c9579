/**
 * @brief The sm90 prefill kernel (sm_90a): TMA K/V loads on mbarriers, a producer warpgroup
 * and two or three consumer warpgroups, wgmma for Q K^T (shared x shared) and P V (registers x
 * shared), and the softmax of tile j overlapped with the P V of tile j-1 (FA3's intra-warpgroup
 * pipelining).
 *
 * This body only composes the roles: it sets up the shared memory (storage.cuh), names the
 * stages and the block scheduler as closures, and dispatches warpgroup 0 to the producer
 * (producer.cuh: the K/V copies, and the scheduler thread of scheduler.cuh) and the others to
 * the consumer loop (consumer.cuh: Q staging, the mainloop; epilogue.cuh: the output). The
 * closures stay here and the roles take them by reference: written as member functions of a
 * scheduler object, as __forceinline__ functions or built by factory functions elsewhere, the
 * ones that capture anything compiled to different code (include/flashgen/README.md).
 *
 * An fp8 cache (Params::DTypeKV __nv_fp8_e4m3 / __nv_fp8_e5m2, with the params' k_scale and
 * v_scale): the copies fill a staging ring of one-byte tiles that the producer's idle warps
 * widen, exactly, into f16 stages (widen.cuh says why there); the products run in f16 whatever
 * q's type, as in the decode kernels (consumer.cuh's MmaType): k_scale and a power of two that
 * puts the warpgroup's query in f16's range multiply the transformed query, the inverse power
 * brings S back to the logits (K = k_scale * stored K); v_scale multiplies the output
 * accumulators before the epilogue (V = v_scale * stored V, split partials included); the LSE
 * keeps its meaning.
 *
 * The hooks, masks, causal alignment (bottom-right), GQA packing, RoPE and LSE convention are
 * those of the portable kernel (prefill/kernel.cuh): the same KVTileRange, the same variant hook
 * views (prefill/hooks.cuh), base-2 softmax with lazy rescale, natural-log LSE output.
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashgen/dtype.cuh"
#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"
#include "flashgen/params.cuh"
#include "flashgen/prefill_io.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"
#include "flashgen/prefill/hooks.cuh"
#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/prefill/mask.cuh"
#include "flashgen/prefill/rope.cuh"
#include "flashgen/prefill/scheduler.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/tma.cuh"
#include "flashgen/hopper/traits.cuh"
#include "flashgen/hopper/tuning.cuh"
#include "flashgen/hopper/wgmma.cuh"
#include "flashgen/hopper/prefill/consumer.cuh"
#include "flashgen/hopper/prefill/epilogue.cuh"
#include "flashgen/hopper/prefill/producer.cuh"
#include "flashgen/hopper/prefill/scheduler.cuh"
#include "flashgen/hopper/prefill/storage.cuh"

namespace flashgen {
namespace hopper {

/**
 * PAGE_SIZE 0: K/V by TMA through `maps` (single, ragged). Paged with page sizes that are
 * multiples of 8 dividing the kv tile (16): TMA too, one 5-D box per page and 64-column block of
 * the map over the page pool (`maps.k`), issued by warp 0, a box per lane. Other page sizes (1):
 * the 128 producer threads gather K/V rows with 16-byte cp.async (page table lookups per row,
 * rows past kv_len zero-filled) into the same 128-byte-swizzled layout the TMA writes, each
 * thread arriving on the stage's full barrier when its copies land (init count 128). With RoPE
 * the keys come from the rotated copy in the workspace (`rope_k`, the portable layout).
 */
template <typename Traits, int MASK, int POS, typename Variant, typename Params, typename Sched,
          int PAGE_SIZE = 0>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    hopper_prefill_kernel(const __grid_constant__ Params params,
                          const __grid_constant__ KVTensorMaps maps, const Sched sched,
                          const KVMapOrder order_k, const KVMapOrder order_v,
                          const prefill::Partials part, const uint32_t num_blocks,
                          const typename Params::DTypeKV* rope_k, const PagedMapOrder porder,
                          uint32_t* const block_counter) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // built for another architecture: the launcher refuses non-Hopper devices
#else
  using DTypeQ = typename Params::DTypeQ;
  using DTypeKV = typename Params::DTypeKV;
  static_assert(std::is_same<DTypeQ, DTypeKV>::value || is_fp8<DTypeKV>,
                "q and kv share one 16-bit dtype, or kv is an fp8 cache");
  static_assert(Traits::kFp8 == is_fp8<DTypeKV>, "traits of the cache's element size");
  constexpr int kTileQ = Traits::kTileQ;
  constexpr int kTileKV = Traits::kTileKV;
  constexpr bool kRope = POS == prefill::kPosRopeLlama;
  constexpr bool kPaged = PAGE_SIZE > 0;
  constexpr bool kPagedTma = hopper_paged_tma<kTileKV, PAGE_SIZE>();
  constexpr bool kGather = kPaged && !kPagedTma;
  // gather: one arrive per gathering thread (every producer thread; fp8: warps 0 and 1)
  constexpr uint32_t kFullCount =
      kGather ? (Traits::kFp8 ? uint32_t(kFp8GatherThreads) : 128u) : 1u;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw_addr = ptx::smem_addr(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw_addr);
  const PrefillStorage<Traits> st{smem, base};
  const uint32_t q_addr = st.q_addr();
  auto k_addr = [&](uint32_t s) { return st.k_addr(s); };
  auto v_addr = [&](uint32_t s) { return st.v_addr(s); };
  const uint32_t bar = st.bar();
  auto full_k = [&](uint32_t s) { return st.full_k(s); };
  auto full_v = [&](uint32_t s) { return st.full_v(s); };
  auto empty_k = [&](uint32_t s) { return st.empty_k(s); };
  auto empty_v = [&](uint32_t s) { return st.empty_v(s); };
  // fp8: the staging ring the copies fill (storage.cuh)
  auto k8_addr = [&](uint32_t s) { return st.k8_addr(s); };
  auto v8_addr = [&](uint32_t s) { return st.v8_addr(s); };
  auto full8_k = [&](uint32_t s) { return st.full8_k(s); };
  auto full8_v = [&](uint32_t s) { return st.full8_v(s); };
  auto empty8_k = [&](uint32_t s) { return st.empty8_k(s); };
  auto empty8_v = [&](uint32_t s) { return st.empty8_v(s); };

  // Dynamic order: the scheduler thread publishes each round's planned block in a two-slot ring.
  const uint32_t sched_bar = base + Traits::kSchedOffset;
  auto sched_full = [&](uint32_t k) { return sched_bar + 8 * k; };
  auto sched_empty = [&](uint32_t k) { return sched_bar + 8 * (2 + k); };
  BlockSlot* const ring = reinterpret_cast<BlockSlot*>(smem + Traits::kSchedOffset + 32);
  static_assert(sizeof(BlockSlot) <= Traits::kBlockSlotBytes, "ring slot");
  constexpr bool kDynamic =
      hopper_dynamic_order<std::is_same<Sched, prefill::BatchSched>::value, PAGE_SIZE,
                           Traits::kFp8>();

  const uint32_t tid = threadIdx.x;
  const uint32_t wg = tid / 128;
  if (tid == 0) st.init_barriers(kFullCount, hopper_widen_warps<kTileKV, PAGE_SIZE>());
  if (!kGather && tid == 32) {
    tma_prefetch_map(&maps.k);
    tma_prefetch_map(&maps.v);
  }
  __syncthreads();
  ptx::wait_prerequisite_grid();  // the RoPE pre-pass (PDL)
  ptx::launch_dependents();

  const uint32_t num_kv_heads = params.num_kv_heads;
  const uint32_t G = params.num_qo_heads / num_kv_heads;
  uint8_t* variant_smem = st.variant_smem();

  // The static orders (scheduler.cuh): round-robin in the batch kernels, snake in single
  // prefill.
  auto block_of = make_block_of<std::is_same_v<Sched, prefill::SingleSched>>();

  // Block blk of the (possibly persistent) grid: unit blk / Hkv, kv head blk % Hkv; the kv
  // tiles it visits (prefill/mask.cuh's unit_tiles, as in the portable kernel). False: an empty
  // unit-table slot.
  auto plan = [&](uint32_t blk, HopperBlock& b) -> bool {
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
        [&]() { return Variant(params, b.w.batch, variant_smem); });
    b.kt_begin = tiles.begin;
    b.n_tiles = tiles.end - tiles.begin;
    b.free_a = tiles.free_a();
    b.free_b = tiles.free_b();
    return true;
  };

  // The block of round `round`, planned into b: true to run it; false, skip it (static order) or
  // stop (dynamic). Dynamic: the scheduler thread (warp 1 of the producer warpgroup, which
  // issues no copies) fetches each block after the first from the counter, plans it and
  // publishes the plan, so the request lookups (unit table, indptrs) are off the other roles'
  // path; the copy-issuing warp and the consumer warps copy it from the ring, each warp
  // releasing the slot once its lanes have read it. `mask`: the lanes of the calling warp that
  // run this code (the dense producer issues from one thread).
  auto next_block = [&](uint32_t round, uint32_t mask, HopperBlock& b) -> bool {
    if constexpr (kDynamic) {
      const uint32_t k = round & 1u;
      mbar_wait(sched_full(k), (round >> 1) & 1u);
      b = ring[k].b;
      const bool ok = ring[k].ok != 0;
      __syncwarp(mask);
      if ((threadIdx.x & 31u) == 0) mbar_arrive(sched_empty(k));
      return ok;
    } else {
      const uint32_t blk = block_of(round);
      return blk < num_blocks && plan(blk, b);
    }
  };
  // The roles' block loops: `for (round = 0; kDynamic || round * gridDim.x < num_blocks; ...)`;
  // a block that is not a real unit is skipped in the static order and ends the loop in the
  // dynamic one (the unit tables list every real unit before the empty slots, so the first
  // empty one is the end, on both sides alike).

  const StageRefs<decltype(k_addr), decltype(v_addr), decltype(full_k), decltype(full_v),
                  decltype(empty_k), decltype(empty_v)>
      sg{k_addr, v_addr, full_k, full_v, empty_k, empty_v};
  const StageRefs<decltype(k8_addr), decltype(v8_addr), decltype(full8_k), decltype(full8_v),
                  decltype(empty8_k), decltype(empty8_v)>
      sg8{k8_addr, v8_addr, full8_k, full8_v, empty8_k, empty8_v};
  if (wg == 0) {
    // Producer warpgroup: the K/V copies (dense: thread 0; paged page 16: warp 0; page size 1:
    // the 128 threads) and, in the dynamic order, the scheduler (thread 32); fp8: the copies
    // fill the staging ring and the idle warps widen it into the stages.
    if constexpr (Traits::kFp8) {
      run_producer<Traits, PAGE_SIZE, kRope, kDynamic>(
          params, maps, order_k, order_v, porder, rope_k, smem, base, st, num_blocks,
          block_counter, ring, block_of, plan, next_block, sched_full, sched_empty, sg, sg8, tid);
    } else {
      run_producer<Traits, PAGE_SIZE, kRope, kDynamic>(
          params, maps, order_k, order_v, porder, rope_k, smem, base, st, num_blocks,
          block_counter, ring, block_of, plan, next_block, sched_full, sched_empty, sg, sg, tid);
    }
    return;
  }

  // Consumer warpgroups: Q, the mainloop and the output of each block.
  run_consumer<Traits, MASK, POS, PAGE_SIZE, kDynamic, Variant>(
      params, part, num_blocks, smem, q_addr, sg, next_block, variant_smem, G, num_kv_heads, tid,
      wg);
#endif
}

}  // namespace hopper
}  // namespace flashgen
