/**
 * @brief A consumer warpgroup of the sm90 prefill kernel: where its threads sit in the block's
 * query rows. Warpgroup cw owns packed rows [64 cw, 64 cw + 64); a thread's two rows of every
 * wgmma accumulator are 64 cw + 16 warp4 + lane / 4 + 8 h (h = 0, 1).
 *
 * The consumer's work itself (Q staged with RoPE and the QueryTransform, the mainloop of wgmma
 * and the online softmax, the output store) is still written in the kernel body
 * (hopper/prefill/kernel.cuh): it is a set of lambdas over the warpgroup's registers, and every
 * form of them as functions tried so far compiled to different SASS (include/flashgen/README.md).
 */
#pragma once

#include <cstdint>

namespace flashgen {
namespace hopper {

struct ConsumerThread {
  uint32_t cw;     // consumer warpgroup (warpgroup cw + 1 of the CTA)
  uint32_t ctid;   // thread within the warpgroup
  uint32_t lane;   // lane within the warp
  uint32_t warp4;  // warp within the warpgroup
};

}  // namespace hopper
}  // namespace flashgen
