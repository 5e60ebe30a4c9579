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
 */
#pragma once

#include <cstdint>

#include "flashgen/prefill/hooks.cuh"
#include "flashgen/prefill/traits.cuh"
#include "flashgen/hopper/tuning.cuh"

namespace flashgen {
namespace hopper {

template <int HEAD_DIM_, int CONSUMER_WGS = HopperConfig<HEAD_DIM_>::kConsumerWGs>
struct HopperTraits {
  static constexpr int kHeadDim = HEAD_DIM_;
  static constexpr int kConsumerWGs = CONSUMER_WGS;
  static_assert(kConsumerWGs == 2 || kConsumerWGs == 3, "2 or 3 consumer warpgroups");
  static constexpr int kTileQ = 64 * kConsumerWGs;  // 64 packed query rows per warpgroup
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  // The CTA's 64K registers: 24 for the producer, the rest to the consumers (multiples of 8).
  static constexpr int kProducerRegs = 24, kConsumerRegs = kConsumerWGs == 2 ? 240 : 160;
  // Named barriers: 1 + cw, warpgroup cw's own; kPingPongBarrier + cw, "cw may issue".
  static constexpr int kPingPongBarrier = 1 + kConsumerWGs;
  static constexpr int kMinCtas = 1;  // one CTA per SM (the split plan reads this)
  static constexpr int kTileKV = HopperConfig<HEAD_DIM_>::kTileKV;
  static constexpr int kStages = HopperConfig<HEAD_DIM_>::kStages;
  static constexpr bool kPingPong = HopperConfig<HEAD_DIM_>::kPingPong;
  static constexpr int kBlocks = kHeadDim / 64;  // 128-byte column blocks per row
  static constexpr int kQBytes = kTileQ * kHeadDim * 2;
  static constexpr int kKVBytes = kTileKV * kHeadDim * 2;
  static constexpr int kBarOffset = kQBytes + 2 * kStages * kKVBytes;
  // 4 barriers per stage + 1 (paged TMA: the tail tile's V, zeroed past kv_len by the producer)
  static constexpr int kSchedOffset = kBarOffset + 8 * (4 * kStages + 1);
  // dynamic block order: 2 full + 2 empty barriers, then two slots of a block's plan
  static constexpr int kBlockSlotBytes = 128;
  static constexpr int kVariantOffset = kSchedOffset + 8 * 4 + 2 * kBlockSlotBytes;
  static constexpr int kVariantSmemBytes = 256;
  // + 1024: the dynamic shared memory base is aligned up to 1024 bytes (128-byte swizzle atoms).
  static constexpr int kSmemBytes = 1024 + kVariantOffset + kVariantSmemBytes;
  static_assert(kHeadDim % 64 == 0, "head_dim is a multiple of 64");
  static_assert(kTileKV % 16 == 0 && kTileKV <= 256, "kv tile: wgmma n and k steps");
  static_assert(kConsumerWGs * 128 * kConsumerRegs + 128 * kProducerRegs <= 65536, "registers");
};

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
template <int HEAD_DIM, int POS, typename Variant, typename Params>
using HopperTraitsFor =
    HopperTraits<HEAD_DIM, consumer_warpgroups<HEAD_DIM, POS, Variant, Params>()>;

}  // namespace hopper
}  // namespace flashgen
