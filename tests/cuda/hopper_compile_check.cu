// Compile check of one Hopper prefill instance (bf16, head_dim 128, causal, default variant):
// nvcc -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c; its cold compile time is the
// figure the issue asks for.
#define ADDITIONAL_PARAMS_DECL
#include "flashgen/variants/default.cuh"
#include "flashgen/hopper/launch.cuh"

using P = flashgen::SinglePrefillParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16>;
template int flashgen::hopper::launch_single_prefill<128, flashgen::prefill::kMaskCausal,
                                                     flashgen::prefill::kPosNone,
                                                     DefaultAttention<P>, P>(
    const P&, void*, int64_t, const flashgen::DeviceInfo&, cudaStream_t);
