/**
 * @brief Where the roles of the sm90 prefill kernel meet: the CTA's dynamic shared memory (Q,
 * kStages K and V buffers, their mbarriers, the block scheduler's ring, the variant's bytes; the
 * offsets are HopperTraits', traits.cuh) and the 128-byte swizzle every tile in it uses. Each
 * stage s has four barriers: full_k / full_v (the producer's copies landed) and empty_k /
 * empty_v (every consumer warp is done with the buffer).
 *
 * An fp8 cache adds the staging ring (traits.cuh): stage s of it has full8_k / full8_v (the
 * copies landed) and empty8_k / empty8_v (the widening warps have read it); the 16-bit stage is
 * then "full" once the widening warps have written it (an arrive per widening warp), and the
 * copies' end word tells the widening warps how many tiles there were (widen.cuh).
 */
#pragma once

#include <cstdint>

#include "flashgen/ptx_sm80.cuh"
#include "flashgen/hopper/mbarrier.cuh"

namespace flashgen {
namespace hopper {

/** Byte offset of 16-byte chunk `ch` of row r in a 128-byte-swizzled tile of ROWS rows. */
template <int ROWS>
__device__ __forceinline__ uint32_t sw128(uint32_t r, uint32_t ch) {
  return (ch / 8) * (ROWS * 128) + r * 128 + (((ch % 8) ^ (r % 8)) << 4);
}

/** How the stages are filled (producer.cuh), which the consumers must know too (a gathered stage
 *  needs a proxy fence before wgmma reads it): paged K/V by TMA when pages tile the kv tile in
 *  whole 1024-byte swizzle atoms (page sizes that are multiples of 8 dividing it; a gather of
 *  such pages is slower than the boxes), else (page size 1) a gather. */
template <int TILE_KV, int PAGE_SIZE>
__host__ __device__ constexpr bool hopper_paged_tma() {
  return PAGE_SIZE > 0 && PAGE_SIZE % 8 == 0 && TILE_KV % (PAGE_SIZE > 0 ? PAGE_SIZE : 1) == 0;
}

/** fp8: the threads that gather page-size-1 K/V into the staging ring (warps 0 and 1). */
constexpr int kFp8GatherThreads = 64;

/** fp8: the producer warps that widen the staged tiles, the last ones of warpgroup 0: those that
 *  issue no copies. The gather takes warps 0 and 1, which leaves warps 2 and 3; paged TMA boxes
 *  (warp 0) and dense copies (thread 0) leave warps 1 to 3. An fp8 kernel takes a static block
 *  order (scheduler.cuh's hopper_dynamic_order), so no scheduler thread holds warp 1. */
template <int TILE_KV, int PAGE_SIZE>
__host__ __device__ constexpr int hopper_widen_warps() {
  return PAGE_SIZE > 0 && !hopper_paged_tma<TILE_KV, PAGE_SIZE>() ? 2 : 3;
}

template <typename Traits>
struct PrefillStorage {
  static constexpr int kStages = Traits::kStages;
  uint8_t* smem;  // the window aligned up to 1024 bytes (the swizzle's period)
  uint32_t base;  // its shared-space address

  __device__ __forceinline__ uint32_t q_addr() const { return base; }
  __device__ __forceinline__ uint32_t k_addr(uint32_t s) const {
    return base + Traits::kQBytes + s * Traits::kKVBytes;
  }
  __device__ __forceinline__ uint32_t v_addr(uint32_t s) const {
    return base + Traits::kQBytes + (kStages + s) * Traits::kKVBytes;
  }
  __device__ __forceinline__ uint32_t bar() const { return base + Traits::kBarOffset; }
  __device__ __forceinline__ uint32_t full_k(uint32_t s) const { return bar() + 8 * s; }
  __device__ __forceinline__ uint32_t full_v(uint32_t s) const { return bar() + 8 * (kStages + s); }
  __device__ __forceinline__ uint32_t empty_k(uint32_t s) const {
    return bar() + 8 * (2 * kStages + s);
  }
  __device__ __forceinline__ uint32_t empty_v(uint32_t s) const {
    return bar() + 8 * (3 * kStages + s);
  }
  /** Paged TMA: the tail tile's V, zeroed past kv_len by the producer before it is published. */
  __device__ __forceinline__ uint32_t tail_v() const { return bar() + 8 * 4 * kStages; }
  /** fp8: staging stage s (one-byte tiles) and its barriers, after the 16-bit stages'. */
  static constexpr int kFp8Stages = Traits::kFp8Stages;
  __device__ __forceinline__ uint32_t k8_addr(uint32_t s) const {
    return base + Traits::kFp8Offset + s * Traits::kFp8TileBytes;
  }
  __device__ __forceinline__ uint32_t v8_addr(uint32_t s) const {
    return base + Traits::kFp8Offset + (kFp8Stages + s) * Traits::kFp8TileBytes;
  }
  __device__ __forceinline__ uint32_t bar8() const { return tail_v() + 8; }
  __device__ __forceinline__ uint32_t full8_k(uint32_t s) const { return bar8() + 8 * s; }
  __device__ __forceinline__ uint32_t full8_v(uint32_t s) const {
    return bar8() + 8 * (kFp8Stages + s);
  }
  __device__ __forceinline__ uint32_t empty8_k(uint32_t s) const {
    return bar8() + 8 * (2 * kFp8Stages + s);
  }
  __device__ __forceinline__ uint32_t empty8_v(uint32_t s) const {
    return bar8() + 8 * (3 * kFp8Stages + s);
  }
  /** fp8: the tiles the copies loaded in all, written once they are done (widen.cuh). */
  __device__ __forceinline__ volatile uint32_t* load_end() const {
    return reinterpret_cast<volatile uint32_t*>(smem + (bar8() + 8 * 4 * kFp8Stages - base));
  }
  /** The block scheduler's ring: two full and two empty barriers, then two slots. */
  __device__ __forceinline__ uint32_t sched_full(uint32_t k) const {
    return base + Traits::kSchedOffset + 8 * k;
  }
  __device__ __forceinline__ uint32_t sched_empty(uint32_t k) const {
    return base + Traits::kSchedOffset + 8 * (2 + k);
  }
  __device__ __forceinline__ uint8_t* ring() const { return smem + Traits::kSchedOffset + 32; }
  __device__ __forceinline__ uint8_t* variant_smem() const { return smem + Traits::kVariantOffset; }

  /** One thread: every barrier. full_count: arrivals that publish what the copies fill (1, the
   *  thread that issues its copies and expects their bytes; one per gathering thread): the
   *  stages, or with an fp8 cache the staging ring, whose 16-bit stages are published by the
   *  widen_warps widening warps (one arrive each). */
  __device__ __forceinline__ void init_barriers(uint32_t full_count, uint32_t widen_warps) const {
    const uint32_t stage_full = Traits::kFp8 ? widen_warps : full_count;
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_k(s), stage_full);
      mbar_init(full_v(s), stage_full);
      mbar_init(empty_k(s), Traits::kConsumerWarps);
      mbar_init(empty_v(s), Traits::kConsumerWarps);
    }
    if constexpr (Traits::kFp8) {
#pragma unroll
      for (int s = 0; s < kFp8Stages; ++s) {
        mbar_init(full8_k(s), full_count);
        mbar_init(full8_v(s), full_count);
        mbar_init(empty8_k(s), widen_warps);
        mbar_init(empty8_v(s), widen_warps);
      }
      *load_end() = ~0u;
    }
    mbar_init(tail_v(), 1);
    mbar_init(sched_full(0), 1);
    mbar_init(sched_full(1), 1);
    mbar_init(sched_empty(0), Traits::kConsumerWarps + 1);  // + the copy-issuing warp
    mbar_init(sched_empty(1), Traits::kConsumerWarps + 1);
    mbar_init_fence();
  }
};

}  // namespace hopper
}  // namespace flashgen
