/**
 * @brief batch_prefill_paged: the C entry points of a batch prefill with q packed along tokens
 * (int32 qo_indptr on the device) and K/V in batch_decode's paged cache, over the kernels of
 * include/flashgen/prefill/. Lengths are read on the device only, so a captured call replays
 * with new lengths.
 *
 * Compile-time values come only through the generated DISPATCH_* macros, so this file builds
 * in the one-instance form and in the dispatching form of <flashgen_instance.cuh>.
 */
#include <flashgen_instance.cuh>

#include <cstdio>

#include "flashgen/abi.h"
#include "flashgen/launch.cuh"
#include "flashgen/params.cuh"
#include "flashgen/prefill/args.cuh"
#include "flashgen/prefill/launch.cuh"
#include "flashgen/status.cuh"
#if FLASHGEN_BACKEND_sm90
#include "flashgen/hopper/launch.cuh"
#endif

FLASHGEN_DEFINE_COMMON_ENTRY_POINTS()

namespace {

using namespace flashgen;

using Args = FLASHGEN_ARGS;  // generated from variants.json modules.batch_prefill_paged.args

int check_shape(const Args& a) {
  if (a.batch_size < 1 || a.batch_size > 65535 || a.total_q < 0 || a.total_q > (int64_t{1} << 30)) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "batch_prefill_paged: batch_size %lld must be in [1, 65535] and total_q %lld in [0, 2^30]",
                static_cast<long long>(a.batch_size), static_cast<long long>(a.total_q));
  }
  if (a.num_qo_heads <= 0 || a.num_kv_heads <= 0 || a.num_kv_heads > 65535 ||
      a.num_qo_heads % a.num_kv_heads != 0) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "batch_prefill_paged: num_qo_heads (%lld) must be a positive multiple of num_kv_heads "
                "(%lld, at most 65535)",
                static_cast<long long>(a.num_qo_heads), static_cast<long long>(a.num_kv_heads));
  }
  return FLASHGEN_OK;
}

/** Rows of keys the RoPE pre-pass may rotate: k's rows, or every slot of the listed pages. */
int64_t kv_rows(const Args& a, int64_t page_size) {
  return a.num_page_ids * page_size;
}

/**
 * The implementation behind each value of the backend axis (variants.json): the Hopper one
 * exists only in binaries the generated header says hold it (built for sm_90a alone), so a
 * portable instance never names Hopper code. A specialization, not `if constexpr` in the
 * dispatch body: that body is no template, and a discarded branch there is still compiled.
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

/** The workspace a call of this instance needs (the same Params and Variant as run's). */
template <typename DType, int HEAD_DIM, int PAGE_SIZE, int POS, typename Tag, int BACKEND>
int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
  using Params = BatchPrefillPagedParams<DType, DType, DType>;
  using Variant = typename Tag::template type<Params>;
  return Impl<BACKEND>::template workspace_bytes<HEAD_DIM, PAGE_SIZE, POS, Variant, Params>(a, dev);
}

template <typename DType, int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Tag, int BACKEND>
int run(const Args& a, const DeviceInfo& dev) {
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

}  // namespace

extern "C" FLASHGEN_API int flashgen_batch_prefill_paged_workspace_size(const Args* args,
                                                                   int64_t* bytes) {
  if (args == nullptr || bytes == nullptr) {
    return fail(FLASHGEN_INVALID_ARGUMENT, "batch_prefill_paged_workspace_size: args or bytes is NULL");
  }
  const Args& a = *args;
  if (int st = check_shape(a)) return st;
  DeviceInfo dev;
  if (int st = current_device(&dev)) return st;
  const bool hit = FLASHGEN_DISPATCH_ARGS(a, {
    *bytes = workspace_bytes<FG_dtype, FG_head_dim, FG_page_size, FG_pos_encoding, FG_variant,
                             FG_backend>(a, dev);
  });
  return hit ? FLASHGEN_OK : FLASHGEN_FAIL_NO_INSTANCE(a);
}

extern "C" FLASHGEN_API int flashgen_batch_prefill_paged(const Args* args) {
  if (args == nullptr) return fail(FLASHGEN_INVALID_ARGUMENT, "batch_prefill_paged: args is NULL");
  const Args& a = *args;
  if (a.q == nullptr || a.paged_kv == nullptr || a.o == nullptr) {
    return fail(FLASHGEN_INVALID_ARGUMENT, "batch_prefill_paged: q, paged_kv and o must not be NULL");
  }
  if (int st = check_shape(a)) return st;
  DeviceInfo dev;
  if (int st = current_device(&dev)) return st;
  int status = FLASHGEN_OK;
  const bool hit = FLASHGEN_DISPATCH_ARGS(a, { status = run<FG_dtype, FG_head_dim, FG_page_size, FG_mask, FG_pos_encoding, FG_variant, FG_backend>(a, dev); });
  return hit ? status : FLASHGEN_FAIL_NO_INSTANCE(a);
}

FLASHGEN_DEFINE_QUERY_ENTRY_POINT()
