/**
 * @brief The measured choices of the portable backend (the mma.sync prefill and decode kernels,
 * sm_80+), in one place: tile shapes, occupancy, split-KV plans and the rules that pick a code
 * path per kernel. Each is the winner of the GPU runs in benches/NOTES-prefill.md and
 * benches/NOTES-decode.md; the line above it says why. Only constants and constexpr rules live
 * here, so a retune is one edit of this file and no kernel source changes.
 */
#pragma once

#include <cstdint>

namespace flashgen {
namespace prefill {

/** Tile shape and occupancy of the prefill kernel for one head_dim (see PrefillTraits). */
template <int HEAD_DIM>
struct PrefillConfig;

// 64-row kv tiles: 128-row ones spilled; 3 CTAs an SM spilled in all but the lean kernels.
template <>
struct PrefillConfig<64> {
  static constexpr int kWarps = 4, kMmaQ = 2, kTileKV = 64, kStages = 2, kMinCtas = 2,
                       kMinCtasLean = 3;
};
// 4 warps x 32 rows, 64-row kv tiles, 2 stages: 96 KB, 2 CTAs an SM.
template <>
struct PrefillConfig<128> {
  static constexpr int kWarps = 4, kMmaQ = 2, kTileKV = 64, kStages = 2, kMinCtas = 2,
                       kMinCtasLean = 2;
};
// 8 warps x 16 rows, single K/V buffers: 128 KB, which sm_80's 163 KB holds once.
template <>
struct PrefillConfig<256> {
  static constexpr int kWarps = 8, kMmaQ = 1, kTileKV = 64, kStages = 1, kMinCtas = 1,
                       kMinCtasLean = 1;
};

namespace tuning {

// Shortest kv chunk, in kv tiles, that a split-KV unit gets: shorter ones cost more to merge.
constexpr int kMinChunkTiles = 4;

// Online softmax: the exp2 reference is raised only when a tile's max passes it by this much
// (log2 units; exact either way), which skips most O rescales.
constexpr float kRescaleThreshold = 8.0f;

// K/V tiles wholly inside kv_len copy without per-row checks only for LinearBias or TanhCap
// variants: faster there, a spill in the ragged default kernel otherwise.
constexpr bool whole_tile_copies(bool linear_bias, bool tanh_cap) {
  return linear_bias || tanh_cap;
}

// Paged kernels over whole pages read the page indices when a tile's copies issue (not held in
// registers across the loop) only where that spills less: non-causal, no per-logit transform.
constexpr bool page_index_at_issue(bool causal, bool var_logits, bool tanh_cap) {
  return !causal && !var_logits && !tanh_cap;
}

}  // namespace tuning
}  // namespace prefill

namespace decode {
namespace tuning {

// Four warps a block, each streaming its own tiles.
constexpr int kWarps = 4;

// Ring depth per warp: at least 2 tiles in flight to cover DRAM latency, deeper for small rows,
// at most ~128 KB a block so sm_80 still fits one.
constexpr int stages(int head_dim) { return head_dim == 64 ? 4 : (head_dim == 128 ? 3 : 2); }

// The same for an fp8 cache: two stages. Its widening makes the kernel issue-bound, not
// memory-bound, so warps beat depth: at head_dim 128 (128 x 8192, page 16, H200) 2 stages ran
// 520 us, 3 ran 551 and 4 ran 564 (3 blocks an SM by registers, 4 to 2 by shared memory); at
// head_dim 64 and 256 the three depths ran within 0.3 %.
constexpr int fp8_stages(int /*head_dim*/) { return 2; }

// Independent score accumulators a tile: 4 halve the dependent mma chain at head_dim <= 128;
// head_dim 256 keeps 2 (registers).
constexpr int score_chains(int head_dim) { return head_dim <= 128 ? 4 : 2; }

// Split-KV plan: blocks per resident-block slot aimed for, and the shortest chunk worth a block.
constexpr int64_t kTargetWaves = 1;
constexpr int64_t kMinChunkTokens = 64;

}  // namespace tuning
}  // namespace decode
}  // namespace flashgen
