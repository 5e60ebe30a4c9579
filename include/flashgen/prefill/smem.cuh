/**
 * @brief Shared-memory layout of the prefill tiles: rows of head_dim 16-bit elements stored as
 * 16-byte chunks, chunk c of row r at position c ^ (r & 7) within the row (XOR swizzle).
 *
 * Eight consecutive rows of one logical chunk land in eight different 16-byte bank groups, so
 * ldmatrix (8 row addresses per matrix), the cp.async fills and the epilogue's 4-byte fragment
 * stores are all conflict-free; rows are at least 128 bytes (head_dim >= 64).
 */
#pragma once

#include <cstdint>

namespace flashgen {
namespace prefill {

/** Byte offset of (row, 16-byte chunk) in a tile of kChunks chunks per row. */
template <int kChunks>
__device__ __forceinline__ uint32_t swz(uint32_t row, uint32_t chunk) {
  return (row * kChunks + (chunk ^ (row & 7))) * 16;
}

}  // namespace prefill
}  // namespace flashgen
