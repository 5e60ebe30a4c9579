/**
 * @brief batch_prefill_paged: the C entry points of a batch prefill with q packed along tokens
 * (int32 qo_indptr on the device) and K/V in batch_decode's paged cache, over the kernels of
 * include/flashgen/prefill/. Lengths are read on the device only, so a captured call replays
 * with new lengths. The kv_dtype axis: the cache in q's dtype, or fp8 (fp8_cache.cuh) scaled by
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

using Args = FLASHGEN_ARGS;  // generated from variants.json modules.batch_prefill_paged.args

/** Rows of keys the RoPE pre-pass may rotate: every slot of the listed pages. */
template <int PAGE_SIZE>
int64_t kv_rows(const Args& a) {
  return a.num_page_ids * PAGE_SIZE;
}

struct BatchPrefillPaged {
  static int check_shape(const Args& a) {
    if (int st = prefill::check_shape_batch(a, "batch_prefill_paged")) return st;
    return prefill::check_shape_heads(a, "batch_prefill_paged");
  }

  static int check_call(const Args& a) {
    if (a.q == nullptr || a.paged_kv == nullptr || a.o == nullptr) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "batch_prefill_paged: q, paged_kv and o must not be NULL");
    }
    return check_shape(a);
  }

  /** One instance: its params struct and its backend's kernels for its variant. */
  template <typename DType, int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Tag,
            int BACKEND, int KV>
  struct Instance {
    using DTypeKV = CacheType<DType, KV>;
    using Params = BatchPrefillPagedParams<DType, DTypeKV, DType>;
    using Backend = PrefillBackend<BACKEND, Tag>;

    static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
      return Backend::template batch_workspace_bytes<HEAD_DIM, POS, Params>(
          a.total_q, kv_rows<PAGE_SIZE>(a), a.batch_size, a.num_qo_heads, a.num_kv_heads,
          dev.sm_count);
    }

    static int run(const Args& a, const DeviceInfo& dev) {
      static_assert(POS != prefill::kPosRopeLlama || !is_fp8<DTypeKV>,  // fp8_cache.cuh
                    "rope_llama with an fp8 KV cache: unsupported (variants.json)");
      Params p;
      if (int st = prefill::start_params(p, a, "batch_prefill_paged")) return st;
      prefill::fill_paged_kv(p, a);
      if (int st = fill_fp8_kv(p, a, "batch_prefill_paged")) return st;
      prefill::fill_packed_batch(p, a);
      p.page_size = static_cast<uint32_t>(a.page_size);
      return Backend::template launch_paged<HEAD_DIM, PAGE_SIZE, MASK, POS>(
          p, a.total_q, kv_rows<PAGE_SIZE>(a), a.workspace, a.workspace_bytes, dev,
          static_cast<cudaStream_t>(a.stream));
    }
  };
};

}  // namespace

FLASHGEN_DEFINE_ENTRY_POINTS(batch_prefill_paged, BatchPrefillPaged, FG_dtype, FG_head_dim,
                             FG_page_size, FG_mask, FG_pos_encoding, FG_variant, FG_backend,
                             FG_kv_dtype)
