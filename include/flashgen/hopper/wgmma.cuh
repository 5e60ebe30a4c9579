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
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashgen/hopper/wgmma_ops.cuh"

namespace flashgen {
namespace hopper {

/**
 * wgmma.mma_async wrappers, m64nNk16, fp32 accumulators, bf16/f16 operands:
 *  - Wgmma<T, N>::ss(d, desc_a, desc_b, accumulate): A and B from shared memory, both K-major.
 *  - Wgmma<T, N>::rs(d, a, desc_b, accumulate): A from registers (4 x b32 per thread, the
 *    mma.m16n8k16 A fragment of the warp's 16 rows), B from shared memory MN-major
 *    (imm-trans-b = 1).
 * Both accumulate when `accumulate` != 0 (D = A B otherwise). d holds N/2 floats per thread:
 * d[i] is row 16*warp + lane/4 + 8*((i/2)%2), column 8*(i/4) + 2*(lane%4) + i%2 of the 64 x N
 * tile.
 */
template <typename T, int N>
struct Wgmma;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHGEN_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define FLASHGEN_WGMMA_ASM(...)
#endif

// One specialization: CTYPE the C++ dtype, PTYPE its PTX name, N the shape (N / 2
// accumulators); the operand lists are wgmma_ops.cuh's FLASHGEN_WGMMA_{ACC,D,SS,SSP,RS,RSP}<N>.
#define FLASHGEN_WGMMA(CTYPE, PTYPE, N)                                                          \
  template <>                                                                                  \
  struct Wgmma<CTYPE, N> {                                                                     \
    __device__ __forceinline__ static void ss(float (&d)[N / 2], uint64_t da, uint64_t db,     \
                                              uint32_t accumulate) {                           \
      FLASHGEN_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, " FLASHGEN_WGMMA_SSP##N ", 0;\n"    \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTYPE "." PTYPE " " \
                         FLASHGEN_WGMMA_ACC##N ", " FLASHGEN_WGMMA_SS##N                       \
                         ", p, 1, 1, 0, 0;\n}\n"                                               \
                         : FLASHGEN_WGMMA_D##N                                                 \
                         : "l"(da), "l"(db), "r"(accumulate));                                 \
    }                                                                                          \
    __device__ __forceinline__ static void rs(float (&d)[N / 2], const uint32_t (&a)[4],       \
                                              uint64_t db, uint32_t accumulate) {              \
      FLASHGEN_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, " FLASHGEN_WGMMA_RSP##N ", 0;\n"    \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTYPE "." PTYPE " " \
                         FLASHGEN_WGMMA_ACC##N ", " FLASHGEN_WGMMA_RS##N                       \
                         ", p, 1, 1, 1;\n}\n"                                                  \
                         : FLASHGEN_WGMMA_D##N                                                 \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db),                \
                           "r"(accumulate));                                                   \
    }                                                                                          \
  };

#define FLASHGEN_WGMMA_BF16(N) FLASHGEN_WGMMA(__nv_bfloat16, "bf16", N)
#define FLASHGEN_WGMMA_F16(N) FLASHGEN_WGMMA(half, "f16", N)
FLASHGEN_WGMMA_SHAPES(FLASHGEN_WGMMA_BF16)
FLASHGEN_WGMMA_SHAPES(FLASHGEN_WGMMA_F16)


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
