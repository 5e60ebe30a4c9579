/**
 * @brief Tile shapes of the prefill kernels (mma.sync m16n8k16, sm_80+).
 *
 * A CTA owns kTileQ "packed" query rows of one kv head: packed row p of a request is token p / G,
 * query head kv_head * G + p % G (G = num_qo_heads / num_kv_heads), so the GQA group shares every
 * K/V tile it loads. Each warp owns kMmaQ * 16 consecutive rows (Q fragments from shared memory,
 * S and O in registers, P kept in registers for the PV mma). K/V stream through kStages buffers
 * of kTileKV rows each (kStages 2: the next tile's copy is issued a whole tile ahead; 1: FA2's
 * K/V ping-pong with an extra barrier before each refill, used where shared memory is short).
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "flashgen/dtype.cuh"
#include "flashgen/portable_tuning.cuh"
#include "flashgen/prefill/hooks.cuh"

namespace flashgen {
namespace prefill {

enum MaskMode : int { kMaskNone = 0, kMaskCausal = 1 };
enum PosEncoding : int { kPosNone = 0, kPosRopeLlama = 1 };

/** MIN_CTAS: the CTAs an SM the kernel is built for (its __launch_bounds__ and the split plan);
 *  PrefillTraitsFor picks it per kernel. */
template <int HEAD_DIM_, int MIN_CTAS = PrefillConfig<HEAD_DIM_>::kMinCtas>
struct PrefillTraits {
  using Cfg = PrefillConfig<HEAD_DIM_>;
  static constexpr int kHeadDim = HEAD_DIM_;
  static constexpr int kWarps = Cfg::kWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMmaQ = Cfg::kMmaQ;        // 16-row m tiles per warp
  static constexpr int kWarpRows = 16 * kMmaQ;
  static constexpr int kTileQ = kWarps * kWarpRows;  // packed query rows per CTA
  static constexpr int kTileKV = Cfg::kTileKV;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kMinCtas = MIN_CTAS;          // __launch_bounds__ and the split plan
  static constexpr int kChunks = kHeadDim / 8;       // 16-byte chunks per row
  static constexpr int kNT = kTileKV / 8;            // n tiles of S per m tile
  static constexpr int kDT = kHeadDim / 8;           // n tiles of O per m tile
  static constexpr int kKSteps = kHeadDim / 16;      // k steps of Q K^T
  static constexpr int kPVSteps = kTileKV / 16;      // k steps of P V
  static constexpr int kCopyChunks = kChunks;          // 16-byte copies per row
  static constexpr int kCopyRows = kThreads / kChunks;  // rows one CTA-wide copy covers
  static constexpr int kCopiesPerThread = kTileKV / kCopyRows;
  static constexpr int kVariantSmemBytes = 256;
  static constexpr int kQSmemBytes = kTileQ * kHeadDim * 2;
  static constexpr int kKVTileBytes = kTileKV * kHeadDim * 2;  // a 16-bit tile, as the mma reads it
  // The K/V ring: 16-bit tiles, read in place (an fp8 cache: Fp8PrefillTraits).
  static constexpr bool kWiden = false;
  static constexpr int kStageTileBytes = kKVTileBytes;
  static constexpr int kWidenedBytes = 0;
  // token of each packed row, then its linear bias (slope, origin) where the variant has one
  static constexpr int kRowInfoBytes = kTileQ * 12;
  static constexpr int kSmemBytes =
      kVariantSmemBytes + kQSmemBytes + 2 * kStages * kKVTileBytes + kRowInfoBytes;
  static_assert(kThreads % kChunks == 0 && kTileKV % kCopyRows == 0, "copy layout");
  static_assert(kNT % 2 == 0 && kDT % 2 == 0, "fragments come in pairs");
  static_assert(kStages == 1 || kStages == 2, "1 or 2 K/V stages");
};

/**
 * The same kernel over an fp8 cache: the ring's stages hold the one-byte tiles as they are
 * stored (a 16-byte copy is 16 elements, so a CTA-wide copy covers twice the rows), and each
 * thread widens the copies it issued into one 16-bit K tile and one 16-bit V tile (Base's
 * swizzled layout), which the mma path reads as it reads a 16-bit stage. A stage is only ever
 * read by the thread that filled it, so it is laid out by thread: copy i of thread t at
 * (i * kThreads + t) * 16 (conflict-free for the copies and the reads).
 */
template <typename Base>
struct Fp8PrefillTraits : Base {
  static constexpr bool kWiden = true;
  static constexpr int kCopyChunks = Base::kHeadDim / 16;           // 16-byte copies per row
  static constexpr int kCopyRows = Base::kThreads / kCopyChunks;    // rows one CTA-wide copy covers
  static constexpr int kCopiesPerThread = Base::kTileKV / kCopyRows;
  static constexpr int kStageTileBytes = Base::kTileKV * Base::kHeadDim;
  static constexpr int kWidenedBytes = 2 * Base::kKVTileBytes;      // the 16-bit K and V tiles
  static constexpr int kSmemBytes = Base::kVariantSmemBytes + Base::kQSmemBytes +
                                    2 * Base::kStages * kStageTileBytes + kWidenedBytes +
                                    Base::kRowInfoBytes;
  static_assert(Base::kThreads % kCopyChunks == 0 && Base::kTileKV % kCopyRows == 0,
                "fp8 copy layout");
};

/** Whether Params holds a page table (the paged kinds). */
template <typename Params>
using page_table_field = decltype(std::declval<Params&>().kv_indices);
template <typename Params>
using has_page_table = hooks::is_detected<page_table_field, Params>;

/**
 * The traits of one kernel: kMinCtasLean CTAs an SM for the lean kernels (a softmax variant
 * over dense K/V; MaskBounds forms its row keys per masked tile and adds no state), kMinCtas
 * for the others, whose extra state did not fit the lean count's registers. The kernel, its launch and the workspace query (launch.cuh) name
 * this one alias, so they agree on the plan.
 */
template <int HEAD_DIM, typename Variant, typename Params>
constexpr int min_ctas() {
  constexpr bool kLean = Variant::use_softmax && !has_page_table<Params>::value;
  return kLean ? PrefillConfig<HEAD_DIM>::kMinCtasLean : PrefillConfig<HEAD_DIM>::kMinCtas;
}

template <int HEAD_DIM, typename Variant, typename Params>
using PrefillTraitsFor = std::conditional_t<
    is_fp8<typename Params::DTypeKV>,
    Fp8PrefillTraits<PrefillTraits<HEAD_DIM, min_ctas<HEAD_DIM, Variant, Params>()>>,
    PrefillTraits<HEAD_DIM, min_ctas<HEAD_DIM, Variant, Params>()>>;

__host__ __device__ __forceinline__ constexpr int64_t ceil_div64(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace prefill
}  // namespace flashgen
