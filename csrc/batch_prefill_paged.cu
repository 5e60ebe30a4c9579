/**
 * @brief batch_prefill_paged: the C entry points of a batch prefill with q packed along tokens
 * (int32 qo_indptr on the device) and K/V in batch_decode's paged cache, over the kernels of
 * include/flashgen/prefill/. Lengths are read on the device only, so a captured call replays
 * with new lengths.
 */
#include <flashgen_instance.cuh>

#include "flashgen/entry.cuh"
#include "flashgen/params.cuh"
#include "flashgen/prefill/args.cuh"
#include "flashgen/prefill/launch.cuh"
#if FLASHGEN_BACKEND_sm90
#include "flashgen/hopper/launch.cuh"
#endif

namespace {

using namespace flashgen;

using Args = FLASHGEN_ARGS;  // generated from variants.json modules.batch_prefill_paged.args

/** Rows of keys the RoPE pre-pass may rotate: k's rows, or every slot of the listed pages. */
int64_t kv_rows(const Args& a, int64_t page_size) {
  return a.num_page_ids * page_size;
}

/**
 * The implementation behind each value of the backend axis (variants.json): the Hopper one
 * exists only in binaries the generated header says hold it (built for sm_90a alone), so a
 * portable instance never names Hopper code.
 */
template <int BACKEND>
struct Impl;

template <>
struct Impl<FLASHGEN_CODE_backend_portable> {
  template <int HEAD_DIM, int PAGE_SIZE, int POS, typename Variant, typename Params>
  static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
    return prefill::batch_prefill_workspace_bytes<HEAD_DIM, POS, Variant, Params>(
        a.total_q, kv_rows(a, PAGE_SIZE), a.batch_size, a.num_qo_heads, a.num_kv_heads,
        dev.sm_count);
  }
  template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename Params>
  static int launch(const Params& p, const Args& a, const DeviceInfo& dev) {
    return prefill::launch_batch_prefill_paged<HEAD_DIM, PAGE_SIZE, MASK, POS, Variant>(
        p, a.total_q, kv_rows(a, PAGE_SIZE), a.workspace, a.workspace_bytes, dev,
        static_cast<cudaStream_t>(a.stream));
  }
};

#if FLASHGEN_BACKEND_sm90
template <>
struct Impl<FLASHGEN_CODE_backend_sm90> {
  template <int HEAD_DIM, int PAGE_SIZE, int POS, typename Variant, typename Params>
  static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
    return hopper::batch_prefill_workspace_bytes<HEAD_DIM, POS, Variant, Params>(
        a.total_q, kv_rows(a, PAGE_SIZE), a.batch_size, a.num_qo_heads, a.num_kv_heads,
        dev.sm_count);
  }
  template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename Params>
  static int launch(const Params& p, const Args& a, const DeviceInfo& dev) {
    return hopper::launch_batch_prefill_paged<HEAD_DIM, PAGE_SIZE, MASK, POS, Variant>(
        p, a.total_q, kv_rows(a, PAGE_SIZE), a.workspace, a.workspace_bytes, dev,
        static_cast<cudaStream_t>(a.stream));
  }
};
#endif

struct BatchPrefillPaged {
  static int check_shape(const Args& a) {
    if (int st = prefill::check_shape_batch(a, "batch_prefill_paged")) return st;
    return prefill::check_shape_heads(a, "batch_prefill_paged");
  }

  static int check_call(const Args& a) {
    if (a.q == nullptr || a.paged_kv == nullptr || a.o == nullptr) {
      return fail(FLASHGEN_INVALID_ARGUMENT, "batch_prefill_paged: q, paged_kv and o must not be NULL");
    }
    return check_shape(a);
  }

  /** The workspace a call of this instance needs (the same Params and Variant as run's). */
  template <typename DType, int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Tag, int BACKEND>
  static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
    using Params = BatchPrefillPagedParams<DType, DType, DType>;
    using Variant = typename Tag::template type<Params>;
    return Impl<BACKEND>::template workspace_bytes<HEAD_DIM, PAGE_SIZE, POS, Variant, Params>(a, dev);
  }

  template <typename DType, int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Tag, int BACKEND>
  static int run(const Args& a, const DeviceInfo& dev) {
    using Params = BatchPrefillPagedParams<DType, DType, DType>;
    using Variant = typename Tag::template type<Params>;
    Params p;
    if (int st = copy_additional_params(&p, a.additional_params, "batch_prefill_paged")) return st;
    prefill::fill_q_o(p, a);
    p.paged_kv = static_cast<const DType*>(a.paged_kv);
    p.qo_indptr = a.qo_indptr;
    p.kv_indptr = a.kv_indptr;
    p.kv_indices = a.kv_indices;
    p.kv_last_page_len = a.kv_last_page_len;
    p.q_rope_offset = a.q_rope_offset;
    p.kv_rope_offset = a.kv_rope_offset;
    p.kv_stride_page = a.kv_stride_page;
    p.kv_stride_kv = a.kv_stride_kv;
    p.kv_stride_n = a.kv_stride_n;
    p.kv_stride_h = a.kv_stride_h;
    p.batch_size = static_cast<uint32_t>(a.batch_size);
    p.page_size = static_cast<uint32_t>(a.page_size);
    return Impl<BACKEND>::template launch<HEAD_DIM, PAGE_SIZE, MASK, POS, Variant>(p, a, dev);
  }
};

}  // namespace

FLASHGEN_DEFINE_ENTRY_POINTS(batch_prefill_paged, BatchPrefillPaged, FG_dtype, FG_head_dim, FG_page_size,
                             FG_mask, FG_pos_encoding, FG_variant, FG_backend)
