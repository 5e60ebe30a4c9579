/**
 * @brief The widening warps of the sm90 prefill kernel over an fp8 KV cache: the last two or
 * three warps of the producer warpgroup (storage.cuh's hopper_widen_warps) turn each staged
 * one-byte K or V tile (storage.cuh's staging ring, as the copies wrote it) into the 16-bit,
 * 128-byte-swizzled tile the consumers' wgmma reads, in the order the copies filled the ring.
 *
 * Who widens, and why these warps: wgmma reads K and V from shared memory as 16-bit values
 * only, so every element is widened once per CTA before its first wgmma. The consumer
 * warpgroups are the critical path (their GEMMs and softmax already fill the tensor cores and
 * the issue slots of their warps), so widening there would lengthen every tile; the
 * copy-issuing threads must stay free to issue the next tile's copies (one thread, or one warp,
 * or the gather's page lookups). The producer warps that issue nothing (warps 1 to 3; 2 and 3
 * beside the page-size-1 gather) widen tile g while the copies of
 * tile g + 1 fly and the consumers run tile g - 1, each on its own SM sub-partition, so the
 * ring stays as full as with a 16-bit cache as long as a tile's widening is shorter than a
 * tile's GEMMs. The conversion is dtype.cuh's fp8::widen4, exact: on sm_90 e4m3 -> f16 is the
 * hardware's, e5m2 -> f16 a byte permutation, and -> bf16 four instructions a pair (the counts
 * per 16 bytes are in benches/NOTES-hopper.md).
 *
 * The warps follow the tiles, not the blocks: tile g sits in staging stage g % kFp8Stages and
 * goes to 16-bit stage g % kStages, exactly the consumers' count, so they need no block plan.
 * After the copies' last tile, the copies write their tile count (load_end) and arrive on the
 * next staging stage's full8_k barrier instead of loading it: a widening warp that finds that
 * stage full and g equal to the count stops.
 *
 * Barriers of tile g: wait full8 (the bytes landed) and the 16-bit stage's empty (the
 * consumers' wgmma of its previous use are done); widen; a proxy fence (generic stores, read
 * by wgmma, the async proxy); each warp arrives on the 16-bit full barrier and on the staging
 * empty barrier (init counts: the widening warps), which frees the staging stage for the
 * copies.
 */
#pragma once

#include <cstdint>

#include "flashgen/dtype.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/wgmma.cuh"
#include "flashgen/hopper/prefill/storage.cuh"

namespace flashgen {
namespace hopper {

/**
 * One staged tile (src) widened into a 16-bit stage (dst) by the 32 WARPS widening threads
 * (wtid: the thread among them). 16-byte unit i of the staging tile is row R = i / 4 of its
 * column-block-major rows (column block R / kTileKV, row R % kTileKV) and 16-column chunk
 * q = i % 4 of it; it becomes chunks 2q and 2q + 1 of row R of the 16-bit tile, which sw128
 * puts at R * 128 + (((2q or 2q + 1) ^ (R % 8)) << 4). A thread's units are kThreads apart, its
 * rows kThreads / 4 apart, a multiple of 8: q and R % 8, so the two chunk offsets, are the same
 * for all of them, and the source and destination advance by constants (no index math in the
 * loop). Consecutive threads read consecutive 16 bytes, and a store phase's 8 threads (rows R,
 * R + 1, q = 0..3) hit 8 distinct 16-byte bank groups of the swizzle.
 */
template <typename Traits, int WARPS, typename To, typename Fp8>
__device__ __forceinline__ void widen_tile(const uint8_t* src, uint8_t* dst, uint32_t wtid) {
  constexpr uint32_t kUnits = Traits::kFp8TileBytes / 16;
  constexpr uint32_t kThreads = 32 * WARPS;
  static_assert((kThreads / 4) % 8 == 0, "a thread's rows keep one phase of the swizzle");
  const uint32_t q = wtid % 4, phase = (wtid / 4) % 8;
  const uint32_t lo_off = ((2 * q) ^ phase) << 4, hi_off = ((2 * q + 1) ^ phase) << 4;
  src += wtid * 16;
  dst += (wtid / 4) * 128;
  // Unrolled whole: every unit's addresses are the thread's base plus constants, so a unit
  // costs its load, eight conversions and two stores (the issue slots these warps take are
  // their SM sub-partitions' consumers' too).
  constexpr uint32_t kIters = (kUnits + kThreads - 1) / kThreads;
#pragma unroll
  for (uint32_t j = 0; j < kIters; ++j) {
    if (kUnits % kThreads == 0 || j + 1 < kIters || wtid + j * kThreads < kUnits) {
      const uint4 x = *reinterpret_cast<const uint4*>(src + j * kThreads * 16);
      uint4 y0, y1;
      fp8::widen4<To, Fp8>(x.x, y0.x, y0.y);
      fp8::widen4<To, Fp8>(x.y, y0.z, y0.w);
      fp8::widen4<To, Fp8>(x.z, y1.x, y1.y);
      fp8::widen4<To, Fp8>(x.w, y1.z, y1.w);
      *reinterpret_cast<uint4*>(dst + j * (kThreads / 4) * 128 + lo_off) = y0;
      *reinterpret_cast<uint4*>(dst + j * (kThreads / 4) * 128 + hi_off) = y1;
    }
  }
}

/** The widening warps' role (the last WARPS warps of the producer warpgroup; wtid: the thread
 *  among them): every tile the copies stage, K then V, until the copies' end (the file
 *  comment). st: the CTA's storage; sg: the 16-bit stages' closures (the kernel's); To: the
 *  query's 16-bit type. */
template <typename Traits, int WARPS, typename To, typename Fp8, typename Storage,
          typename Stages>
__device__ __forceinline__ void run_widener(const Storage& st, const Stages& sg, uint32_t wtid) {
  constexpr int kStages = Traits::kStages;
  constexpr int kFp8Stages = Traits::kFp8Stages;
  const uint32_t lane = wtid % 32;
  // staging tile src (freed: its empty barrier) into 16-bit stage dst (full: its full barrier)
  auto widen = [&](uint32_t src, uint32_t freed, uint32_t dst, uint32_t full) {
    widen_tile<Traits, WARPS, To, Fp8>(st.smem + (src - st.base), st.smem + (dst - st.base),
                                       wtid);
    fence_proxy_async();  // generic stores, read by wgmma (the async proxy)
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(full);
      mbar_arrive(freed);
    }
  };
  for (uint32_t g = 0;; ++g) {
    const uint32_t s8 = g % kFp8Stages, ph8 = (g / kFp8Stages) & 1u;
    const uint32_t s = g % kStages, ph = (g / kStages) & 1u;
    mbar_wait(st.full8_k(s8), ph8);
    if (*st.load_end() == g) break;  // the copies' end, not a tile
    mbar_wait(sg.empty_k(s), ph ^ 1u);
    widen(st.k8_addr(s8), st.empty8_k(s8), sg.k_addr(s), sg.full_k(s));
    mbar_wait(st.full8_v(s8), ph8);
    mbar_wait(sg.empty_v(s), ph ^ 1u);
    widen(st.v8_addr(s8), st.empty8_v(s8), sg.v_addr(s), sg.full_v(s));
  }
}

/** The copies' end (fp8), called by each thread that counts as an arrival of a full8 barrier
 *  (its init count): `tiles` loaded in all; once the next staging stage is free (as for a load:
 *  a phase of full8_k may not complete twice before the widening warps wait on it), its full8_k
 *  completes without bytes, and the widening warps read the count. */
template <typename Traits, typename Storage>
__device__ __forceinline__ void end_loads(const Storage& st, uint32_t tiles) {
  constexpr uint32_t kFp8Stages = Traits::kFp8Stages;
  const uint32_t s8 = tiles % kFp8Stages;
  mbar_wait(st.empty8_k(s8), ((tiles / kFp8Stages) & 1u) ^ 1u);
  *st.load_end() = tiles;
  mbar_arrive(st.full8_k(s8));
}

}  // namespace hopper
}  // namespace flashgen
