/**
 * @brief Where the roles of the sm90 prefill kernel meet: the CTA's dynamic shared memory (Q,
 * kStages K and V buffers, their mbarriers, the block scheduler's ring, the variant's bytes; the
 * offsets are HopperTraits', traits.cuh) and the 128-byte swizzle every tile in it uses. Each
 * stage s has four barriers: full_k / full_v (the producer's copies landed) and empty_k /
 * empty_v (every consumer warp is done with the buffer).
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
  /** The block scheduler's ring: two full and two empty barriers, then two slots. */
  __device__ __forceinline__ uint32_t sched_full(uint32_t k) const {
    return base + Traits::kSchedOffset + 8 * k;
  }
  __device__ __forceinline__ uint32_t sched_empty(uint32_t k) const {
    return base + Traits::kSchedOffset + 8 * (2 + k);
  }
  __device__ __forceinline__ uint8_t* ring() const { return smem + Traits::kSchedOffset + 32; }
  __device__ __forceinline__ uint8_t* variant_smem() const { return smem + Traits::kVariantOffset; }

  /** One thread: every barrier. full_count: arrivals that publish a stage (1, the thread that
   *  issues its copies and expects their bytes; 128 for the gather, one per producer thread). */
  __device__ __forceinline__ void init_barriers(uint32_t full_count) const {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_k(s), full_count);
      mbar_init(full_v(s), full_count);
      mbar_init(empty_k(s), Traits::kConsumerWarps);
      mbar_init(empty_v(s), Traits::kConsumerWarps);
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
