/**
 * @brief Mask modes and the tile-range hook: which kv tiles a CTA visits and which need masks.
 *
 * Causal is bottom-right aligned: query i of a request sees key j when j <= kv_len - qo_len + i.
 * For a CTA whose queries are tokens [first, last], kv tiles at or past the diagonal of `last`
 * are skipped whole; tiles entirely left of the diagonal of `first` (and inside kv_len) run the
 * mask-free loop body; the rest (the diagonal band and a partial last tile) apply the mask per
 * element. A variant with its own LogitsMask makes every tile masked.
 */
#pragma once

#include <cstdint>

#include "flashgen/prefill/traits.cuh"

namespace flashgen {
namespace prefill {

struct KVTileRange {
  int32_t num_tiles;       // visit tiles [0, num_tiles)
  int32_t unmasked_tiles;  // tiles [0, unmasked_tiles) need no per-element mask
};

template <int MASK, int TILE_KV>
__device__ __forceinline__ KVTileRange kv_tile_range(int32_t qo_len, int32_t kv_len,
                                                     int32_t first_token, int32_t last_token) {
  int32_t end = kv_len, free_end = kv_len;
  if constexpr (MASK == kMaskCausal) {
    end = min(kv_len, kv_len - qo_len + last_token + 1);
    free_end = min(kv_len, kv_len - qo_len + first_token + 1);
  }
  end = max(end, 0);
  free_end = max(free_end, 0);
  return {(end + TILE_KV - 1) / TILE_KV, free_end / TILE_KV};
}

/** The per-element test of the mask mode itself (the variant's LogitsMask is applied beside). */
template <int MASK>
__device__ __forceinline__ bool mask_keep(int32_t kv_idx, int32_t kv_len, int32_t diag_limit) {
  if constexpr (MASK == kMaskCausal) {
    return kv_idx < kv_len && kv_idx <= diag_limit;
  } else {
    return kv_idx < kv_len;
  }
}

}  // namespace prefill
}  // namespace flashgen
