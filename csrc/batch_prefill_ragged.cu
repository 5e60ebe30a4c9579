/**
 * @brief batch_prefill_ragged: the C entry points of a batch prefill whose q, k and v are packed
 * along tokens (int32 qo_indptr / kv_indptr on the device), over the kernels of
 * include/flashgen/prefill/. Lengths are read on the device only, so a captured call replays
 * with new lengths. The kv_dtype axis: k and v in q's dtype, or fp8 (fp8_cache.cuh) scaled by
 * k_scale and v_scale, which each backend's kernels widen as they read.
 */
#include <flashgen_instance.cuh>

#include "flashgen/entry.cuh"
#include "flashgen/fp8_cache.cuh"
#include "flashgen/params.cuh"
#include "flashgen/prefill/args.cuh"
#include "flashgen/prefill/backends.cuh"

namespace {

using namespace flashgen;

using Args = FLASHGEN_ARGS;  // generated from variants.json modules.batch_prefill_ragged.args

struct BatchPrefillRagged {
  static int check_shape(const Args& a) {
    if (int st = prefill::check_shape_batch(a, "batch_prefill_ragged")) return st;
    return prefill::check_shape_heads(a, "batch_prefill_ragged");
  }

  static int check_call(const Args& a) {
    if (int st = prefill::check_qkvo(a, "batch_prefill_ragged")) return st;
    return check_shape(a);
  }

  /** One instance: its params struct and its backend's kernels for its variant. */
  template <typename DType, int HEAD_DIM, int MASK, int POS, typename Tag, int BACKEND, int KV>
  struct Instance {
    using DTypeKV = CacheType<DType, KV>;
    using Params = BatchPrefillRaggedParams<DType, DTypeKV, DType>;
    using Backend = PrefillBackend<BACKEND, Tag>;

    static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
      return Backend::template batch_workspace_bytes<HEAD_DIM, POS, Params>(
          a.total_q, a.total_kv, a.batch_size, a.num_qo_heads, a.num_kv_heads, dev.sm_count);
    }

    static int run(const Args& a, const DeviceInfo& dev) {
      static_assert(POS != prefill::kPosRopeLlama || !is_fp8<DTypeKV>,  // fp8_cache.cuh
                    "rope_llama with an fp8 KV cache: unsupported (variants.json)");
      Params p;
      if (int st = prefill::start_params(p, a, "batch_prefill_ragged")) return st;
      prefill::fill_contiguous_kv(p, a);
      if (int st = fill_fp8_kv(p, a, "batch_prefill_ragged")) return st;
      prefill::fill_packed_batch(p, a);
      p.kv_indptr = a.kv_indptr;
      return Backend::template launch_ragged<HEAD_DIM, MASK, POS>(
          p, a.total_q, a.total_kv, a.workspace, a.workspace_bytes, dev,
          static_cast<cudaStream_t>(a.stream));
    }
  };
};

}  // namespace

FLASHGEN_DEFINE_ENTRY_POINTS(batch_prefill_ragged, BatchPrefillRagged, FG_dtype, FG_head_dim,
                             FG_mask, FG_pos_encoding, FG_variant, FG_backend, FG_kv_dtype)
