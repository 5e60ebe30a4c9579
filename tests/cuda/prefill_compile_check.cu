// Compile-only check: the prefill headers with an empty ADDITIONAL_PARAMS_DECL (no variant
// parameters), one instance of each kind (the run script builds it for sm_80 and sm_90a).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define ADDITIONAL_PARAMS_DECL
#include "flashgen/variant.cuh"
#include "flashgen/variants/default.cuh"
#include "flashgen/prefill/launch.cuh"

using namespace flashgen;
using S = SinglePrefillParams<half, half, half>;
using R = BatchPrefillRaggedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>;
using P = BatchPrefillPagedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>;

int check_single(const S& p, void* ws, const DeviceInfo& d) {
  return prefill::launch_single_prefill<128, prefill::kMaskCausal, prefill::kPosRopeLlama,
                                        DefaultAttention<S>>(p, ws, 0, d, nullptr);
}
int check_ragged(const R& p, void* ws, const DeviceInfo& d) {
  return prefill::launch_batch_prefill_ragged<64, prefill::kMaskNone, prefill::kPosNone,
                                              DefaultAttention<R>>(p, 1, 1, ws, 0, d, nullptr);
}
int check_paged(const P& p, void* ws, const DeviceInfo& d) {
  return prefill::launch_batch_prefill_paged<256, 16, prefill::kMaskCausal, prefill::kPosNone,
                                             DefaultAttention<P>>(p, 1, 1, ws, 0, d, nullptr);
}
