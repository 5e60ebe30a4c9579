/**
 * @brief Every tuning constant of the sm90 backend (prefill and decode), each with the one-line
 * reason it has the value it has. The measurements behind them (which run, which figures) are in
 * benches/NOTES-hopper.md; the headers that read them are listed in include/flashgen/README.md.
 */
#pragma once

namespace flashgen {
namespace hopper {

/** Tile shape of the prefill kernel per head_dim (read through HopperTraits, traits.cuh):
 *  kv tile rows, K/V stages, consumer warpgroups (64 query rows each) and whether the consumer
 *  warpgroups ping-pong their GEMMs (FA3's warp scheduler barriers). */
template <int HEAD_DIM>
struct HopperConfig;
// S 64 + O 32 floats per thread; three warpgroups: at head_dim 64 the softmax takes as long as
// the GEMMs, so two other warpgroups' GEMMs hide each one's softmax. Ping-pong: faster with.
// kFp8Stages: an fp8 cache's staging ring of one-byte K/V tiles ahead of the 16-bit stages
// (prefill/storage.cuh): two where they fit in shared memory beside the 16-bit stages.
template <>
struct HopperConfig<64> {
  static constexpr int kTileKV = 128, kStages = 2, kConsumerWGs = 3, kFp8Stages = 2;
  static constexpr bool kPingPong = true;
};
// S 64 + O 64 floats, P 32 registers; 32 KB Q + 2 x 64 KB K/V (FA3's hdim-128 shape); fp8:
// + 2 x 32 KB of staging (226 KB in all).
template <>
struct HopperConfig<128> {
  static constexpr int kTileKV = 128, kStages = 2, kConsumerWGs = 2, kFp8Stages = 2;
  static constexpr bool kPingPong = true;
};
// S 32 + O 128 floats; 64 KB Q + 2 x 64 KB K/V. No ping-pong: the GEMMs dominate and the
// softmax is short. fp8: one 32 KB staging stage (a second would pass the 227 KB limit).
template <>
struct HopperConfig<256> {
  static constexpr int kTileKV = 64, kStages = 2, kConsumerWGs = 2, kFp8Stages = 1;
  static constexpr bool kPingPong = false;
};

/** Softmax rescale threshold (log2 units): O and l are rescaled only when a tile's row max
 *  exceeds the running reference by more than this (exact either way). */
constexpr float kRescaleThreshold = 8.0f;

/** Rows in flight per thread of the page-size-1 gather: each needs its page index and source
 *  address in the producer's 24 registers, and 4 spilled. */
constexpr int kGatherUnroll = 2;

/** Persistent grid (one CTA per SM looping over blocks) for every launch except causal single
 *  prefill over more than this many rounds of blocks (blocks / SMs): there the hardware's
 *  dispatch balances causal tiles of unequal length better than a static assignment. */
constexpr int kSnakeRounds = 16;

/** Shared memory of the sm90 single decode's K/V ring (KB), and its consumer groups of 4 warps
 *  (stage i going to group i % groups). */
constexpr int kDecodeRingKB = 128;
constexpr int kDecodeConsumerGroups = 1;

}  // namespace hopper
}  // namespace flashgen
