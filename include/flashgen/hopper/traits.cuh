/**
 * @brief Tile shapes of the Hopper prefill kernel (wgmma + TMA, sm_90a).
 *
 * A CTA is 1 + kConsumerWGs warpgroups: warpgroup 0 loads K/V tiles with the bulk tensor copy
 * engine (registers cut to kProducerRegs), each consumer warpgroup owns 64 of the kTileQ =
 * 64 * kConsumerWGs packed query rows (registers raised to kConsumerRegs) and runs S = Q K^T
 * (both operands in shared memory), the softmax, and O += P V (P from registers). K/V stream
 * through kStages buffers of kTileKV rows. Packed rows as in the portable kernel: packed row p
 * is token p / G, query head kv_head * G + p % G.
 *
 * An instance's traits come from HopperTraitsFor<HEAD_DIM, POS, Variant, Params>: the head_dim's
 * shape (HopperConfig, tuning.cuh), with head_dim 64 dropping to two consumer warpgroups where the
 * instance carries per-row state (consumer_warpgroups). The kernel, its launch and the
 * workspace query all name that one alias, so they agree on the tile shapes.
 *
 * An fp8 cache (KV_BYTES 1): the copies land in a ring of kFp8Stages one-byte tiles ("staging",
 * laid out as the copies write them: per 64-column block, rows of 64 bytes, no swizzle), and
 * the producer warpgroup's widening warps (warps 1 to 3, or 2 and 3 beside the page-size-1
 * gather: hopper_widen_warps) widen each into the 16-bit stages the consumers' wgmma reads
 * (wgmma has no 16-bit x fp8 form). The copies keep warp 0 and, with the gather (64 threads),
 * warp 1; the producer's registers rise from 24 to 32, the rest of the CTA's 64K that the
 * consumers leave.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashgen/dtype.cuh"

#include "flashgen/prefill/hooks.cuh"
#include "flashgen/prefill/traits.cuh"
#include "flashgen/hopper/tuning.cuh"

namespace flashgen {
namespace hopper {

/** The shapes of HopperTraits (16-bit K/V) and HopperFp8Traits (KV_BYTES 1: an fp8 cache). */
template <int HEAD_DIM_, int CONSUMER_WGS, int KV_BYTES>
struct HopperShape {
  static_assert(KV_BYTES == 2 || KV_BYTES == 1, "16-bit or fp8 K/V");
  static constexpr int kHeadDim = HEAD_DIM_;
  static constexpr bool kFp8 = KV_BYTES == 1;  // an fp8 cache, staged and widened
  static constexpr int kConsumerWGs = CONSUMER_WGS;
  static_assert(kConsumerWGs == 2 || kConsumerWGs == 3, "2 or 3 consumer warpgroups");
  static constexpr int kTileQ = 64 * kConsumerWGs;  // 64 packed query rows per warpgroup
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  // The CTA's registers, what its launch gave it (kLaunchRegs a thread: 168 with two consumer
  // warpgroups, 128 with three) split by setmaxnreg: 24 for the producer, the rest to the
  // consumers (multiples of 8). With an fp8 cache the widening warps take 32 (at 24 they spill)
  // where the consumers can spare it: 8 of two warpgroups' 240 at head_dim 64 and 128, the 1024
  // that three warpgroups leave free; at head_dim 256 the consumers spill at 232, so the
  // producer keeps 24.
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  static constexpr int kProducerRegs = kFp8 && (kConsumerWGs == 3 || kHeadDim < 256) ? 32 : 24;
  static constexpr int kConsumerRegs =
      kConsumerWGs == 2 ? (kProducerRegs == 32 ? 232 : 240) : 160;
  // Named barriers: 1 + cw, warpgroup cw's own; kPingPongBarrier + cw, "cw may issue".
  static constexpr int kPingPongBarrier = 1 + kConsumerWGs;
  static constexpr int kMinCtas = 1;  // one CTA per SM (the split plan reads this)
  static constexpr int kTileKV = HopperConfig<HEAD_DIM_>::kTileKV;
  static constexpr int kStages = HopperConfig<HEAD_DIM_>::kStages;
  static constexpr bool kPingPong = HopperConfig<HEAD_DIM_>::kPingPong;
  static constexpr int kBlocks = kHeadDim / 64;  // 128-byte column blocks per row
  static constexpr int kQBytes = kTileQ * kHeadDim * 2;
  static constexpr int kKVBytes = kTileKV * kHeadDim * 2;
  // fp8: the staging ring (kFp8Stages K and V tiles of one byte an element) after the stages.
  static constexpr int kFp8Stages = kFp8 ? HopperConfig<HEAD_DIM_>::kFp8Stages : 0;
  static constexpr int kFp8TileBytes = kTileKV * kHeadDim;
  static constexpr int kFp8Offset = kQBytes + 2 * kStages * kKVBytes;
  static constexpr int kBarOffset = kFp8Offset + 2 * kFp8Stages * kFp8TileBytes;
  // What the copies fill (producer.cuh): the stages, or the fp8 staging ring; the bytes of one
  // tile and of one row of a 64-column block there.
  static constexpr int kLoadStages = kFp8 ? kFp8Stages : kStages;
  static constexpr int kLoadTileBytes = kFp8 ? kFp8TileBytes : kKVBytes;
  static constexpr int kLoadRowBytes = 64 * KV_BYTES;
  // 4 barriers per stage + 1 (paged TMA: the tail tile's V, zeroed past kv_len by the
  // producer); fp8: + 4 per staging stage and a word (the copies' tile count at their end), then
  // a float per consumer warp (the query's largest magnitude, stage_query).
  static constexpr int kFp8ScratchOffset = kBarOffset + 8 * (4 * kStages + 1) +
                                           8 * (4 * kFp8Stages + 1);
  static constexpr int kSchedOffset =
      kFp8 ? kFp8ScratchOffset + 64 : kBarOffset + 8 * (4 * kStages + 1);
  // dynamic block order: 2 full + 2 empty barriers, then two slots of a block's plan
  static constexpr int kBlockSlotBytes = 128;
  static constexpr int kVariantOffset = kSchedOffset + 8 * 4 + 2 * kBlockSlotBytes;
  static constexpr int kVariantSmemBytes = 256;
  // + 1024: the dynamic shared memory base is aligned up to 1024 bytes (128-byte swizzle atoms).
  static constexpr int kSmemBytes = 1024 + kVariantOffset + kVariantSmemBytes;
  static_assert(kHeadDim % 64 == 0, "head_dim is a multiple of 64");
  static_assert(kTileKV % 16 == 0 && kTileKV <= 256, "kv tile: wgmma n and k steps");
  static_assert(kConsumerWGs * 128 * kConsumerRegs + 128 * kProducerRegs <= kLaunchRegs * kThreads,
                "setmaxnreg: the split must fit the registers of the launch (an increase that does "
                "not waits forever)");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA (sm_90: 227 KB)");
};

/** The traits of a 16-bit K/V instance and of an fp8 one (separate names, not a parameter of
 *  one template, so that the 16-bit kernels keep their symbols). */
template <int HEAD_DIM_, int CONSUMER_WGS = HopperConfig<HEAD_DIM_>::kConsumerWGs>
struct HopperTraits : HopperShape<HEAD_DIM_, CONSUMER_WGS, 2> {};
template <int HEAD_DIM_, int CONSUMER_WGS = HopperConfig<HEAD_DIM_>::kConsumerWGs>
struct HopperFp8Traits : HopperShape<HEAD_DIM_, CONSUMER_WGS, 1> {};

/**
 * Consumer warpgroups of one instance. Three warpgroups leave each consumer thread 160
 * registers; head_dim 64's S, O and P fit in them, but state held per query row across the
 * kv loop does not: RoPE or a LinearBias hook (ALiBi) make ptxas spill there. Those instances
 * take two warpgroups (240 registers); the others keep the head_dim's shape. A MaskBounds hook
 * (sliding window) holds nothing across the loop (prefill/mask.cuh's row_keys are formed per
 * masked tile from the row's token) and keeps it too.
 */
template <int HEAD_DIM, int POS, typename Variant, typename Params>
constexpr int consumer_warpgroups() {
  constexpr bool kRowState = POS == prefill::kPosRopeLlama ||
                             prefill::has_linear_bias<Variant, Params>::value;
  return HopperConfig<HEAD_DIM>::kConsumerWGs == 3 && kRowState
             ? 2
             : HopperConfig<HEAD_DIM>::kConsumerWGs;
}

/** The traits of one instance (kernel, launch and workspace query). */
template <int HEAD_DIM, int POS, typename Variant, typename Params,
          int CWGS = consumer_warpgroups<HEAD_DIM, POS, Variant, Params>()>
using HopperTraitsFor = std::conditional_t<is_fp8<typename Params::DTypeKV>,
                                           HopperFp8Traits<HEAD_DIM, CWGS>,
                                           HopperTraits<HEAD_DIM, CWGS>>;

}  // namespace hopper
}  // namespace flashgen
