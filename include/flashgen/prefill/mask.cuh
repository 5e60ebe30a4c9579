/**
 * @brief Mask modes and the tile-range hook: which kv tiles a CTA visits and which need masks.
 *
 * Causal is bottom-right aligned: query i of a request sees key j when j <= kv_len - qo_len + i.
 * For a CTA whose queries are tokens [first, last], kv tiles at or past the diagonal of `last`
 * are skipped whole; tiles entirely left of the diagonal of `first` (and inside kv_len) run the
 * mask-free loop body; the rest (the diagonal band and a partial last tile) apply the mask per
 * element. A variant with its own LogitsMask makes every tile masked, unless it states its
 * MaskBounds (hooks.cuh), which narrow both ranges and stand in for LogitsMask on the masked
 * tiles (row_keys; the sliding window).
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashgen/prefill/hooks.cuh"
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

/** The kv tiles one work unit visits, in three runs: [begin, free_a()) masked,
 *  [free_a(), free_b()) mask-free, [free_b(), end) masked. */
struct UnitTiles {
  int32_t begin, end;
  int32_t free_lo, free_hi;  // the mask-free tiles before the unit's own range clamps them
  bool bounds;               // the variant's MaskBounds set free_lo (else tiles start mask-free)

  __device__ __forceinline__ int32_t free_a() const {
    return bounds ? min(end, max(begin, free_lo)) : begin;
  }
  __device__ __forceinline__ int32_t free_b() const { return min(end, max(free_a(), free_hi)); }
};

/**
 * The one rule of both prefill kernels (portable and sm90) for a unit whose queries are tokens
 * [first_token, last_token] of a request, split `chunk` of `splits` along kv: the mask mode's
 * range (kv_tile_range), narrowed by the variant's MaskBounds when it has them, divided evenly
 * between the splits. `variant()` gives the variant (a reference or a new one); it is called only
 * for a variant with MaskBounds, so a kernel need not construct one otherwise.
 */
/** Whether a variant's mask comes with MaskBounds (hooks.cuh), which unit_tiles then applies
 *  and after which a kernel runs a leading masked run of tiles. */
template <typename Variant, typename Params>
constexpr bool uses_mask_bounds() {
  return has_own_logits_mask<Variant, Params>() && has_mask_bounds<Variant, Params>::value;
}

template <int MASK, int kTileKV, typename Params, typename GetVariant>
__device__ __forceinline__ UnitTiles unit_tiles(const Params& params, uint32_t batch,
                                                int32_t qo_len, int32_t kv_len,
                                                int32_t first_token, int32_t last_token,
                                                uint32_t splits, uint32_t chunk,
                                                GetVariant&& variant) {
  using Variant = std::decay_t<decltype(variant())>;
  constexpr bool kVarMask = has_own_logits_mask<Variant, Params>();
  constexpr bool kBounds = uses_mask_bounds<Variant, Params>();
  const KVTileRange range = kv_tile_range<MASK, kTileKV>(qo_len, kv_len, first_token, last_token);
  int32_t t_lo = 0, t_hi = range.num_tiles, free_lo = 0, free_hi = range.unmasked_tiles;
  if constexpr (kBounds) {
    auto&& v = variant();
    int32_t lo_f, hi_f, lo_l, hi_l;
    v.MaskBounds(params, batch, qo_len, kv_len, uint32_t(first_token), lo_f, hi_f);
    v.MaskBounds(params, batch, qo_len, kv_len, uint32_t(last_token), lo_l, hi_l);
    t_lo = max(lo_f, 0) / kTileKV;
    t_hi = min(t_hi, (min(hi_l, kv_len - 1) + kTileKV) / kTileKV);
    t_hi = max(t_hi, t_lo);
    free_lo = (max(lo_l, 0) + kTileKV - 1) / kTileKV;
    free_hi = min(free_hi, (min(hi_f, kv_len - 1) + 1) / kTileKV);
  } else if constexpr (kVarMask) {
    free_hi = 0;
  }
  UnitTiles t{t_lo, t_hi, free_lo, free_hi, kBounds};
  if (splits > 1) {
    const int32_t per = (t_hi - t_lo + int32_t(splits) - 1) / int32_t(splits);
    t.begin = min(t_hi, t_lo + int32_t(chunk) * per);
    t.end = min(t_hi, t.begin + per);
  }
  return t;
}

/** The keys a masked tile keeps for query `token` of a variant with MaskBounds: first <= kv <=
 *  last, last being the bounds' hi narrowed by the mask mode (kv_len - 1; causal: the diagonal).
 *  Both kernels test these on masked tiles in place of the mode's test and LogitsMask: kv <= last
 *  on each, kv >= first only on the leading run's (LeadMaskTag), because the tiles after that run
 *  lie at or past every row's first key (unit_tiles' free_lo). So a window-capable variant
 *  without a window (first 0) does a plain causal mask's per-element work. */
struct RowKeys {
  int32_t first, last;
};

template <int MASK, typename Variant, typename Params>
__device__ __forceinline__ RowKeys row_keys(Variant& v, const Params& params, uint32_t batch,
                                            int32_t qo_len, int32_t kv_len, int32_t token) {
  int32_t lo, hi;
  v.MaskBounds(params, batch, qo_len, kv_len, uint32_t(token), lo, hi);
  int32_t last = min(hi, kv_len - 1);
  if constexpr (MASK == kMaskCausal) last = min(last, kv_len - qo_len + token);
  return {lo, last};
}

/** The mask tag of the leading run's tiles (a masked tile, true like the trailing run's): the
 *  only ones whose rows test their first key. */
struct LeadMaskTag : std::true_type {};

/** kv_idx and keys in one frame: absolute, or both relative to the tile's first column (then
 *  kv_idx is a constant of the unrolled loop and the test one compare with an immediate). */
template <bool kLead>
__device__ __forceinline__ bool row_keys_keep(int32_t kv_idx, const RowKeys& keys) {
  return kv_idx <= keys.last && (!kLead || kv_idx >= keys.first);
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
