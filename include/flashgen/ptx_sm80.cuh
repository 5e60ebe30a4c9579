/**
 * @brief The sm_80+ PTX the decode kernels use: cp.async, ldmatrix, movmatrix, mma.m16n8k16.
 *
 * Fragment layouts follow the PTX ISA for mma.m16n8k16 (group = lane / 4, pair = lane % 4):
 * A (16x16, row): a0 (group, 2*pair..+1), a1 (group+8, ..), a2 (group, 8+2*pair..), a3 (group+8, ..)
 * B (16x8, col):  b0 (k = 2*pair..+1, n = group), b1 (k = 8+2*pair..+1, n = group)
 * C (16x8, f32):  c0,c1 (group, 2*pair..+1), c2,c3 (group+8, 2*pair..+1)
 */
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "flashgen kernels need sm_80 or newer (cp.async, bf16 mma)"
#endif

namespace flashgen {
namespace ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/** Brings the line holding p into L1 (a hint: no register, no wait). */
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}

/** 16-byte global->shared copy; reads `src_bytes` (0 or 16) and zero-fills the rest. */
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

/** sm_90: let the dependent grid (launched with PDL) start being scheduled. */
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/** sm_90: wait until the grid this one depends on (PDL) has finished and its writes are seen. */
__device__ __forceinline__ void wait_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/** Four 8x8 b16 matrices; lane l gives the row address of matrix l/8, row l%8. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/** As ldmatrix_x4, each matrix transposed. */
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/** Transpose one 8x8 b16 matrix held in fragment layout across the warp. */
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

template <typename T>
struct MmaOp;

// One specialization: CTYPE the C++ dtype of A and B, PTYPE its PTX name.
#define FLASHGEN_MMA_16816(CTYPE, PTYPE)                                              \
  template <>                                                                         \
  struct MmaOp<CTYPE> {                                                               \
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], \
                                               uint32_t b0, uint32_t b1) {            \
      asm("mma.sync.aligned.m16n8k16.row.col.f32." PTYPE "." PTYPE                    \
          ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"              \
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                            \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));            \
    }                                                                                 \
  };
FLASHGEN_MMA_16816(__nv_bfloat16, "bf16")
FLASHGEN_MMA_16816(half, "f16")
#undef FLASHGEN_MMA_16816

/** c += A(16x16) * B(16x8), fp32 accumulation. */
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  MmaOp<T>::run(c, a, b0, b1);
}

/** Two floats packed as one b32 of T (low half = x). */
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<half>(float x, float y) {
  half2 v = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace ptx
}  // namespace flashgen
