/**
 * @brief Tile shapes, shared-memory layout and the split-KV plan of the decode kernels.
 *
 * A block serves one (request, kv head, split) and up to kHeadsPerBlock query heads of that kv
 * head (the n = 8 of mma.m16n8k16: S^T = K Q^T and O^T = V^T P^T, so the GQA group rides in the
 * small dimension and K/V are read once for the whole group). Its four warps stream interleaved
 * 16-token tiles through private cp.async rings, then combine in shared memory.
 *
 * An fp8 cache (ELEM_BYTES_ 1) streams its one-byte tiles through the ring (half the bytes of a
 * 16-bit tile). A lane reads its K fragments from the fp8 stage and widens them to f16 in registers
 * (16 bytes of one row serve four k steps: ring_chunk's swizzle keeps those reads conflict-free);
 * the warp widens the V tile it is at into an f16 tile of its own (`kWidenBytes`, laid out as a
 * 16-bit ring stage), which the mma path reads transposed as it reads the 16-bit ring.
 */
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashgen/portable_tuning.cuh"
#include "flashgen/status.cuh"

namespace flashgen {
namespace decode {

template <int HEAD_DIM_, int ELEM_BYTES_ = 2>
struct DecodeTraits {
  static constexpr int kHeadDim = HEAD_DIM_;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim 64, 128 or 256");
  static_assert(ELEM_BYTES_ == 2 || ELEM_BYTES_ == 1, "16-bit or fp8 K/V");
  static constexpr bool kWiden = ELEM_BYTES_ == 1;  // an fp8 cache, widened per tile

  static constexpr int kWarps = tuning::kWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTileTokens = 16;    // mma m (scores) and k (P V)
  static constexpr int kHeadsPerBlock = 8;  // mma n: query heads sharing one kv head
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kMTiles = kHeadDim / 16;
  static constexpr int kChunks = kHeadDim * ELEM_BYTES_ / 16;  // 16-byte chunks per K/V row
  static constexpr int kElemsPerChunk = 16 / ELEM_BYTES_;
  static constexpr int kFragChunks = kHeadDim * 2 / 16;  // the same of the 16-bit tile mma reads
  static constexpr int kRowsPerCopy = 32 / kChunks;            // rows one warp-wide copy covers
  static constexpr int kCopiesPerTile = kTileTokens / kRowsPerCopy;

  static constexpr int kStages =  // ring depth per warp
      kWiden ? tuning::fp8_stages(kHeadDim) : tuning::stages(kHeadDim);
  // Independent score accumulators per tile (a multiple of 2: hi and lo query parts).
  static constexpr int kScoreChains = tuning::score_chains(kHeadDim);
  static_assert(kScoreChains == 1 || kScoreChains == 2 || kScoreChains == 4, "1, 2 or 4 chains");
  static constexpr int kTileBytes = kTileTokens * kHeadDim * ELEM_BYTES_;  // K (or V) of a tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  // The 16-bit V tile a warp widens an fp8 stage's V into (none for a 16-bit cache).
  static constexpr int kWidenBytes = kWiden ? kTileTokens * kHeadDim * 2 : 0;
  static constexpr int kWarpRingBytes = kStages * kStageBytes + kWidenBytes;
  static constexpr int kPipeBytes = kWarps * kWarpRingBytes;
  static constexpr int kCombineBytes =
      kWarps * kHeadsPerBlock * (kHeadDim + 2) * static_cast<int>(sizeof(float));
  static constexpr int kVariantSmemBytes = 256;  // scratch a variant may use (smem_ptr)
  static constexpr int kSmemBytes =
      kVariantSmemBytes + (kPipeBytes > kCombineBytes ? kPipeBytes : kCombineBytes);
  static_assert(kCopiesPerTile * kRowsPerCopy == kTileTokens, "tile rows must split evenly");
  static_assert(!kWiden || (kTileTokens * kChunks) % 32 == 0, "a warp widens whole chunks");

  /** Where 16-byte chunk `chunk` of tile row `row` lies in a ring stage: 16-bit rows swizzled
   *  (chunk ^ row) for conflict-free ldmatrix; fp8 rows of 8 or more chunks have their halves of
   *  64 bytes swapped in odd rows, so that a quarter warp's 16-byte K reads (rows 2i and 2i + 1,
   *  chunks 4c..4c + 3) fall on eight distinct bank groups. */
  __host__ __device__ static constexpr uint32_t ring_chunk(uint32_t row, uint32_t chunk) {
    if constexpr (kWiden) {
      return row * kChunks + (kChunks >= 8 ? chunk ^ ((row & 1) << 2) : chunk);
    } else {
      return row * kChunks + (chunk ^ (row & 7));
    }
  }
  static_assert(kStages >= 2, "a ring needs two stages");
};

constexpr int64_t kMaxSplits = 256;
constexpr int64_t kMergeMaxSplits = kMaxSplits;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/** Resident blocks per SM, from shared memory alone (the same on every call for one device). */
template <typename Traits>
inline int64_t blocks_per_sm(int64_t smem_per_sm) {
  const int64_t per_block = Traits::kSmemBytes + 1024;  // 1 KB reserved per block
  return std::max<int64_t>(1, std::min<int64_t>(8, smem_per_sm / per_block));
}

/** Head slices: query heads per kv head beyond kHeadsPerBlock go to further blocks. */
template <typename Traits>
inline int64_t head_slices(int64_t group_size) {
  return ceil_div(group_size, Traits::kHeadsPerBlock);
}

/** Splits of one request so that units * splits fills the GPU; never chunks under 64 tokens. */
template <typename Traits>
inline int64_t plan_splits(int64_t units, int64_t max_kv_len, int64_t sm_count,
                           int64_t smem_per_sm) {
  const int64_t slots = sm_count * blocks_per_sm<Traits>(smem_per_sm);
  int64_t splits = ceil_div(tuning::kTargetWaves * slots, std::max<int64_t>(units, 1));
  if (max_kv_len > 0) splits = std::min(splits, ceil_div(max_kv_len, tuning::kMinChunkTokens));
  return std::max<int64_t>(1, std::min(splits, kMaxSplits));
}

/** Tokens per split, a multiple of the tile (and so of page size 16). */
inline int64_t chunk_tokens(int64_t kv_len, int64_t splits) {
  return ceil_div(ceil_div(kv_len, splits), 16) * 16;
}

/** Workspace: partial outputs [splits][rows][head_dim] then weights [splits][rows], fp32. */
inline int64_t workspace_bytes(int64_t splits, int64_t rows, int64_t head_dim) {
  if (splits <= 1) return 0;
  return splits * rows * (head_dim + 1) * static_cast<int64_t>(sizeof(float));
}

/** The call's workspace as workspace_bytes lays it out: part_o and part_w, both null with one
 *  split. Fails, pointing at `module`'s workspace query, when it is too small or misaligned. */
inline int carve_workspace(const char* module, void* ws, int64_t ws_bytes, int64_t splits,
                           int64_t rows, int64_t head_dim, float** part_o, float** part_w) {
  const int64_t need = workspace_bytes(splits, rows, head_dim);
  *part_o = *part_w = nullptr;
  if (need == 0) return FLASHGEN_OK;
  if (ws == nullptr || ws_bytes < need || (reinterpret_cast<uintptr_t>(ws) & 15) != 0) {
    return fail(FLASHGEN_WORKSPACE_TOO_SMALL,
                "%s: needs a 16-byte aligned workspace of %lld bytes, got %lld at %p (ask "
                "flashgen_%s_workspace_size on the same device)",
                module, static_cast<long long>(need), static_cast<long long>(ws_bytes), ws,
                module);
  }
  *part_o = static_cast<float*>(ws);
  *part_w = *part_o + splits * rows * head_dim;
  return FLASHGEN_OK;
}

}  // namespace decode
}  // namespace flashgen
