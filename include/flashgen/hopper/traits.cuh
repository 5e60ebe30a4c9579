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
 * shape (HopperConfig), with head_dim 64 dropping to two consumer warpgroups where the
 * instance carries per-row state (consumer_warpgroups). The kernel, its launch and the
 * workspace query all name that one alias, so they agree on the tile shapes.
 */
#pragma once

#include <cstdint>

#include "flashgen/prefill/hooks.cuh"
#include "flashgen/prefill/traits.cuh"

namespace flashgen {
namespace hopper {

template <int HEAD_DIM>
struct HopperConfig;
// S 64 + O 32 floats per thread. Three consumer warpgroups (192 query rows, 160 registers
// each): at head_dim 64 the softmax takes as long as the GEMMs, so two other warpgroups' GEMMs
// hide each one's softmax (FLASHGEN_HOPPER_D64_WGS=2: run 1's 128-row shape).
#ifndef FLASHGEN_HOPPER_D64_WGS
#define FLASHGEN_HOPPER_D64_WGS 3
#endif
#ifndef FLASHGEN_HOPPER_D64_STAGES
#define FLASHGEN_HOPPER_D64_STAGES 2
#endif
template <>
struct HopperConfig<64> {
  static constexpr int kTileKV = 128, kStages = FLASHGEN_HOPPER_D64_STAGES,
                       kConsumerWGs = FLASHGEN_HOPPER_D64_WGS;
  static constexpr bool kPingPong = true;  // run 1: 382 TFLOP/s with, 308 without
};
// S 64 + O 64 floats, P 32 registers; 32 KB Q + 2 x 64 KB K/V (FA3's hdim-128 shape).
// (Overridable for experiments: FLASHGEN_HOPPER_D128_{TILE_KV,STAGES,WGS}.)
#ifndef FLASHGEN_HOPPER_D128_TILE_KV
#define FLASHGEN_HOPPER_D128_TILE_KV 128
#endif
#ifndef FLASHGEN_HOPPER_D128_STAGES
#define FLASHGEN_HOPPER_D128_STAGES 2
#endif
#ifndef FLASHGEN_HOPPER_D128_WGS
#define FLASHGEN_HOPPER_D128_WGS 2
#endif
template <>
struct HopperConfig<128> {
  static constexpr int kTileKV = FLASHGEN_HOPPER_D128_TILE_KV,
                       kStages = FLASHGEN_HOPPER_D128_STAGES,
                       kConsumerWGs = FLASHGEN_HOPPER_D128_WGS;
  static constexpr bool kPingPong = true;  // run 1: 630 TFLOP/s with, 567 without
};
// S 32 + O 128 floats; 64 KB Q + 2 x 64 KB K/V. No ping-pong: run 1 measured 709 TFLOP/s
// without and 688 with (causal 8192): the GEMMs dominate and the softmax is short.
template <>
struct HopperConfig<256> {
  static constexpr int kTileKV = 64, kStages = 2, kConsumerWGs = 2;
  static constexpr bool kPingPong = false;
};

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
#ifdef FLASHGEN_HOPPER_PINGPONG
  static constexpr bool kPingPong = FLASHGEN_HOPPER_PINGPONG != 0;  // forced (experiments)
#else
  static constexpr bool kPingPong = HopperConfig<HEAD_DIM_>::kPingPong;
#endif
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
 * kv loop does not: RoPE, a LinearBias hook (ALiBi) or a MaskBounds hook (sliding window)
 * made ptxas spill (4 to 180 bytes stored) in 87 of the 160 head_dim-64 kernels of the matrix
 * (benches/runs/spills-session10.txt). Those instances take two warpgroups (240 registers),
 * the shape head_dim 64 had before; the others keep the head_dim's shape.
 */
template <int HEAD_DIM, int POS, typename Variant, typename Params>
constexpr int consumer_warpgroups() {
  constexpr bool kRowState = POS == prefill::kPosRopeLlama ||
                             prefill::has_linear_bias<Variant, Params>::value ||
                             prefill::has_mask_bounds<Variant, Params>::value;
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
