/**
 * @brief mbarrier wrappers (sm_90): init, arrive, arrive with an expected transaction count
 * (the bulk tensor copy completes the bytes), and the parity wait.
 *
 * Phase convention: a barrier starts in phase 0; wait(parity) returns once the phase with that
 * parity has completed. A consumer of use n of a stage waits on parity n & 1; a producer that
 * must see the stage freed waits on (n & 1) ^ 1, which a fresh barrier passes at once.
 */
#pragma once

#include <cstdint>

namespace flashgen {
namespace hopper {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/** Makes the inits visible to the other threads and to the async proxy. */
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

/** Arrive once all cp.async copies this thread issued so far have landed (.noinc: the arrive is
 *  one of the barrier's expected arrivals, so the init count includes the copying threads). */
__device__ __forceinline__ void mbar_cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

/** One try of the parity wait. kCluster: acquire at cluster scope, for a barrier that peers
 *  complete (st.async bytes from other CTAs of the cluster); else the default (CTA scope). */
template <bool kCluster = false>
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  if constexpr (kCluster) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  }
  return ok != 0;
}

template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait<kCluster>(bar, parity)) {
  }
}

}  // namespace hopper
}  // namespace flashgen
