/**
 * @brief single_prefill: the C entry points of one request's prefill (qo_len queries over kv_len
 * keys), over the kernels of include/flashgen/prefill/. The kv_dtype axis: k and v in q's dtype,
 * or fp8 (fp8_cache.cuh) scaled by k_scale and v_scale, as in batch_prefill_ragged.
 */
#include <flashgen_instance.cuh>

#include "flashgen/entry.cuh"
#include "flashgen/fp8_cache.cuh"
#include "flashgen/params.cuh"
#include "flashgen/prefill/args.cuh"
#include "flashgen/prefill/backends.cuh"

namespace {

using namespace flashgen;

using Args = FLASHGEN_ARGS;  // generated from variants.json modules.single_prefill.args

struct SinglePrefill {
  static int check_shape(const Args& a) {
    if (a.qo_len < 0 || a.qo_len > (int64_t{1} << 30) || a.kv_len < 0 ||
        a.kv_len > (int64_t{1} << 30)) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "single_prefill: qo_len %lld and kv_len %lld must be in [0, 2^30]",
                  static_cast<long long>(a.qo_len), static_cast<long long>(a.kv_len));
    }
    return prefill::check_shape_heads(a, "single_prefill");
  }

  static int check_call(const Args& a) {
    if (int st = prefill::check_qkvo(a, "single_prefill")) return st;
    return check_shape(a);
  }

  /** One instance: its params struct and its backend's kernels for its variant. */
  template <typename DType, int HEAD_DIM, int MASK, int POS, typename Tag, int BACKEND, int KV>
  struct Instance {
    using DTypeKV = CacheType<DType, KV>;
    using Params = SinglePrefillParams<DType, DTypeKV, DType>;
    using Backend = PrefillBackend<BACKEND, Tag>;

    static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
      return Backend::template single_workspace_bytes<HEAD_DIM, POS, Params>(
          a.qo_len, a.kv_len, a.num_qo_heads, a.num_kv_heads, dev.sm_count);
    }

    static int run(const Args& a, const DeviceInfo& dev) {
      static_assert(POS != prefill::kPosRopeLlama || !is_fp8<DTypeKV>,  // fp8_cache.cuh
                    "rope_llama with an fp8 KV cache: unsupported (variants.json)");
      Params p;
      if (int st = prefill::start_params(p, a, "single_prefill")) return st;
      prefill::fill_contiguous_kv(p, a);
      if (int st = fill_fp8_kv(p, a, "single_prefill")) return st;
      p.qo_len = static_cast<uint32_t>(a.qo_len);
      p.kv_len = static_cast<uint32_t>(a.kv_len);
      return Backend::template launch_single<HEAD_DIM, MASK, POS>(
          p, a.workspace, a.workspace_bytes, dev, static_cast<cudaStream_t>(a.stream));
    }
  };
};

}  // namespace

FLASHGEN_DEFINE_ENTRY_POINTS(single_prefill, SinglePrefill, FG_dtype, FG_head_dim, FG_mask,
                             FG_pos_encoding, FG_variant, FG_backend, FG_kv_dtype)
