/**
 * @brief Warpgroup MMA (sm_90a): shared-memory matrix descriptors for 128-byte-swizzled tiles,
 * the fence / commit / wait protocol, and the register fences that keep the compiler from
 * touching accumulators (or A fragments) while an asynchronous wgmma owns them.
 *
 * Tiles are stored as the bulk tensor copy engine writes them with CU_TENSOR_MAP_SWIZZLE_128B:
 * column blocks of 64 16-bit elements (128 bytes per row), each block [rows][64], 16-byte chunk
 * c of row r at chunk c ^ (r % 8); every block starts on a 1024-byte boundary.
 *  - K-major operand (Q, K: the reduction runs along the row): start = block of k / 64 +
 *    (k % 64) * 2 bytes + first row * 128; SBO = 1024 (8 rows); LBO unused (1).
 *  - MN-major operand (V in P V: the reduction runs down the rows, N along the row):
 *    start = first row * 128; LBO = bytes between 64-column blocks; SBO = 1024 (8 rows).
 * Descriptor bits (PTX ISA, matrix descriptor): [0,14) start >> 4, [16,30) LBO >> 4,
 * [32,46) SBO >> 4, [49,52) base offset (0: blocks are 1024-aligned), [62,64) swizzle (1 = 128B).
 */
#pragma once

#include <cstdint>

#include "flashgen/hopper/wgmma_ops.cuh"

namespace flashgen {
namespace hopper {

__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo >> 4) & 0x3FFF) << 16;
  d |= uint64_t((sbo >> 4) & 0x3FFF) << 32;
  d |= uint64_t(1) << 62;  // 128-byte swizzle
  return d;
}

/** K-major tile, 16-element k step `ks`, rows starting at `row0` (a multiple of 8). */
template <int ROWS>
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t tile_addr, int ks, uint32_t row0) {
  const uint32_t a = tile_addr + uint32_t(ks / 4) * (ROWS * 128) + uint32_t(ks % 4) * 32 + row0 * 128;
  return smem_desc(a, 16, 1024);
}

/** MN-major tile of ROWS rows (the k dimension), 16-row k step `ks`. */
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t tile_addr, int ks) {
  return smem_desc(tile_addr + uint32_t(ks) * 16 * 128, ROWS * 128, 1024);
}

__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/** Orders reads/writes of these registers after the preceding wait (and keeps them alive). */
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

/** Register budget per thread of a warpgroup (needs a register cap at kernel entry). */
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/** Named barrier among `threads` threads (id 0 is __syncthreads). */
__device__ __forceinline__ void named_barrier(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/** Arrive at a named barrier without waiting (the other side syncs on it). */
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/** Generic-proxy writes to shared memory become visible to wgmma / TMA (the async proxy). */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace hopper
}  // namespace flashgen
