/**
 * @brief single_decode: the C entry points of one request's decode (split-KV over kv_len).
 *
 * With pos_encoding=rope_llama the call is a one-query prefill (include/flashgen/prefill/): the
 * same kernels, positions and RoPE as single_prefill, so a decode step and a prefill of a RoPE
 * model agree by construction (on both backends: the sm90 backend takes the portable path there).
 *
 * Backend axis (variants.json): portable = decode/kernel.cuh + merge.cuh; sm90 (built for 9.0a
 * only) = hopper/decode.cuh (bulk tensor copies into an mbarrier ring, split-KV merged inside a
 * thread-block cluster).
 */
#include <flashgen_instance.cuh>

#include "flashgen/decode/kernel.cuh"
#include "flashgen/decode/merge.cuh"
#include "flashgen/decode/traits.cuh"
#include "flashgen/entry.cuh"
#include "flashgen/params.cuh"
#include "flashgen/prefill/args.cuh"
#include "flashgen/prefill/launch.cuh"
#if FLASHGEN_BACKEND_sm90
#include "flashgen/hopper/decode.cuh"
#endif

namespace {

using namespace flashgen;

using Args = FLASHGEN_ARGS;  // generated from variants.json modules.single_decode.args

struct Plan {
  int64_t splits, chunk, head_slices, workspace;
};

// Integer arithmetic over the cached properties of the current device (no CUDA calls).
template <int HEAD_DIM>
void make_plan(int64_t num_qo_heads, int64_t num_kv_heads, int64_t kv_len, const DeviceInfo& dev,
               Plan* plan) {
  using Traits = decode::DecodeTraits<HEAD_DIM>;
  plan->head_slices = decode::head_slices<Traits>(num_qo_heads / num_kv_heads);
  const int64_t units = num_kv_heads * plan->head_slices;
  const int64_t splits = decode::plan_splits<Traits>(units, kv_len, dev.sm_count, dev.smem_per_sm);
  plan->chunk = decode::chunk_tokens(kv_len, splits);
  plan->splits = decode::ceil_div(kv_len, plan->chunk);
  plan->workspace = decode::workspace_bytes(plan->splits, num_qo_heads, HEAD_DIM);
}

/** The fields the decode params and the rope path's prefill params share, from the call: the
 *  variant's parameters first. */
template <typename Params>
int start_params(Params& p, const Args& a) {
  if (int st = prefill::start_common(p, a, "single_decode")) return st;
  prefill::fill_contiguous_kv(p, a);
  p.kv_len = static_cast<uint32_t>(a.kv_len);
  return FLASHGEN_OK;
}

/** The rope_llama path's workspace: the single prefill's, for run_rope's Params and Variant. */
template <typename DType, int HEAD_DIM, typename Tag>
int64_t rope_workspace(int64_t kv_len, int64_t num_qo_heads, int64_t num_kv_heads,
                       const DeviceInfo& dev) {
  using Params = SinglePrefillParams<DType, DType, DType>;
  using Variant = typename Tag::template type<Params>;
  return prefill::single_prefill_workspace_bytes<HEAD_DIM, prefill::kPosRopeLlama, Variant, Params>(
      1, kv_len, num_qo_heads, num_kv_heads, dev.sm_count);
}

/** The rope_llama path: one query at position kv_len - 1, through the prefill kernels. */
template <typename DType, int HEAD_DIM, typename Tag>
int run_rope(const Args& a, const DeviceInfo& dev) {
  using Params = SinglePrefillParams<DType, DType, DType>;
  using Variant = typename Tag::template type<Params>;
  Params p;
  if (int st = start_params(p, a)) return st;
  p.q_stride_n = a.num_qo_heads * a.q_stride_h;  // one token: any multiple of 8 will do
  p.o_stride_n = a.num_qo_heads * a.o_stride_h;
  p.qo_len = 1;
  p.rope_scale = a.rope_scale;
  p.rope_theta = a.rope_theta;
  return prefill::launch_single_prefill<HEAD_DIM, prefill::kMaskNone, prefill::kPosRopeLlama,
                                        Variant>(p, a.workspace, a.workspace_bytes, dev,
                                                 static_cast<cudaStream_t>(a.stream));
}

/**
 * The implementation behind each value of the backend axis (as PrefillBackend for the prefill
 * modules): the Hopper one exists only in binaries built for sm_90a alone.
 */
template <int BACKEND>
struct Impl;

template <>
struct Impl<FLASHGEN_CODE_backend_portable> {
  template <int HEAD_DIM>
  static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
    Plan plan;
    make_plan<HEAD_DIM>(a.num_qo_heads, a.num_kv_heads, a.kv_len, dev, &plan);
    return plan.workspace;
  }
  template <int HEAD_DIM, typename Variant, typename Params>
  static int launch(const Params& p, const Args& a, const DeviceInfo& dev) {
    using Traits = decode::DecodeTraits<HEAD_DIM>;
    using DType = typename Params::DTypeO;
    Plan plan;
    make_plan<HEAD_DIM>(a.num_qo_heads, a.num_kv_heads, a.kv_len, dev, &plan);
    float *part_o, *part_w;
    if (int st = decode::carve_workspace("single_decode", a.workspace, a.workspace_bytes,
                                         plan.splits, a.num_qo_heads, HEAD_DIM, &part_o,
                                         &part_w)) {
      return st;
    }

    auto kernel = decode::single_decode_kernel<Traits, Variant, Params>;
    static std::atomic<uint64_t> smem_done{0};
    if (int st = allow_smem(kernel, dev, Traits::kSmemBytes, smem_done)) return st;
    const dim3 grid(static_cast<uint32_t>(plan.splits),
                    static_cast<uint32_t>(a.num_kv_heads * plan.head_slices));
    const auto stream = static_cast<cudaStream_t>(a.stream);
    if (int st = ::flashgen::launch("single_decode kernel", kernel, grid, Traits::kThreads,
                        Traits::kSmemBytes, stream, false, p, part_o, part_w,
                        static_cast<uint32_t>(plan.chunk),
                        static_cast<uint32_t>(plan.head_slices))) {
      return st;
    }
    if (plan.splits > 1) {
      decode::MergeOutput<DType> out{p.o, p.lse, 0, p.o_stride_h, p.num_qo_heads, p.num_qo_heads};
      return ::flashgen::launch(
          "single_decode merge kernel", decode::merge_kernel<HEAD_DIM, Variant, Params>,
          dim3(p.num_qo_heads), decode::kMergeThreads, 0, stream, dev.major >= 9, p,
          static_cast<const float*>(part_o), static_cast<const float*>(part_w),
          static_cast<uint32_t>(plan.splits), out);
    }
    return FLASHGEN_OK;
  }
};

#if FLASHGEN_BACKEND_sm90
template <>
struct Impl<FLASHGEN_CODE_backend_sm90> {
  template <int HEAD_DIM>
  static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
    return hopper::single_decode_plan<HEAD_DIM>(a.num_qo_heads, a.num_kv_heads, a.kv_len, dev)
        .workspace;
  }
  template <int HEAD_DIM, typename Variant, typename Params>
  static int launch(const Params& p, const Args& a, const DeviceInfo& dev) {
    return hopper::launch_single_decode<HEAD_DIM, Variant>(p, a.workspace, a.workspace_bytes, dev,
                                                           static_cast<cudaStream_t>(a.stream));
  }
};
#endif

template <typename DType, int HEAD_DIM, typename Tag, int BACKEND>
int run_standard(const Args& a, const DeviceInfo& dev) {
  using Params = SingleDecodeParams<DType, DType, DType>;
  using Variant = typename Tag::template type<Params>;

  Params p;
  if (int st = start_params(p, a)) return st;
  return Impl<BACKEND>::template launch<HEAD_DIM, Variant>(p, a, dev);
}

struct SingleDecode {
  static int check_shape(const Args& a) {
    const int64_t num_qo_heads = a.num_qo_heads, num_kv_heads = a.num_kv_heads, kv_len = a.kv_len;
    if (num_qo_heads <= 0 || num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "single_decode: num_qo_heads (%lld) must be a positive multiple of "
                  "num_kv_heads (%lld)",
                  static_cast<long long>(num_qo_heads), static_cast<long long>(num_kv_heads));
    }
    if (num_kv_heads > 65535 || num_qo_heads > (int64_t{1} << 24)) {
      return fail(FLASHGEN_INVALID_ARGUMENT, "single_decode: too many heads (%lld kv, %lld qo)",
                  static_cast<long long>(num_kv_heads), static_cast<long long>(num_qo_heads));
    }
    if (kv_len <= 0 || kv_len > (int64_t{1} << 30)) {
      return fail(FLASHGEN_INVALID_ARGUMENT, "single_decode: kv_len %lld out of range [1, 2^30]",
                  static_cast<long long>(kv_len));
    }
    return FLASHGEN_OK;
  }

  static int check_call(const Args& a) {
    if (int st = prefill::check_qkvo(a, "single_decode")) return st;
    if (int st = check_shape(a)) return st;
    if (!aligned16(a.k) || !aligned16(a.v) || !vec_stride(a.k_stride_n) ||
        !vec_stride(a.k_stride_h) || !vec_stride(a.v_stride_n) || !vec_stride(a.v_stride_h)) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "single_decode: k and v must be 16-byte aligned with strides that are "
                  "multiples of 8 elements (k %p strides %lld,%lld; v %p strides %lld,%lld)",
                  a.k, static_cast<long long>(a.k_stride_n), static_cast<long long>(a.k_stride_h),
                  a.v, static_cast<long long>(a.v_stride_n), static_cast<long long>(a.v_stride_h));
    }
    return FLASHGEN_OK;
  }

  /** One instance: rope_llama through the prefill kernels, the decode kernels otherwise. */
  template <typename DType, int HEAD_DIM, int POS, typename Tag, int BACKEND>
  struct Instance {
    static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
      if constexpr (POS == prefill::kPosRopeLlama) {
        return rope_workspace<DType, HEAD_DIM, Tag>(a.kv_len, a.num_qo_heads, a.num_kv_heads, dev);
      } else {
        return Impl<BACKEND>::template workspace_bytes<HEAD_DIM>(a, dev);
      }
    }

    static int run(const Args& a, const DeviceInfo& dev) {
      if constexpr (POS == prefill::kPosRopeLlama) {
        return run_rope<DType, HEAD_DIM, Tag>(a, dev);
      } else {
        return run_standard<DType, HEAD_DIM, Tag, BACKEND>(a, dev);
      }
    }
  };
};

}  // namespace

FLASHGEN_DEFINE_ENTRY_POINTS(single_decode, SingleDecode, FG_dtype, FG_head_dim, FG_pos_encoding,
                             FG_variant, FG_backend)
