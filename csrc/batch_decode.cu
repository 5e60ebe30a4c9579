/**
 * @brief batch_decode: the C entry points of decode over a paged KV cache (int32 CSR pages).
 *
 * With pos_encoding=rope_llama the call is a prefill of one query per request through the
 * prefill kernels (qo_indptr = 0..batch, written into the workspace by a small kernel), so decode
 * and prefill of a RoPE model agree by construction.
 *
 * The kv_dtype axis names the cache's element type: `same` (the dtype axis's, q's and o's) or an
 * fp8 type, which the decode kernel widens a tile at a time (decode/kernel.cuh) and scales by
 * the call's k_scale and v_scale. rope_llama's path rotates 16-bit keys (the prefill's RoPE
 * pre-pass), so an fp8 cache with rope_llama is refused (fp8_cache.cuh).
 */
#include <flashgen_instance.cuh>

#include "flashgen/decode/kernel.cuh"
#include "flashgen/decode/merge.cuh"
#include "flashgen/decode/traits.cuh"
#include "flashgen/entry.cuh"
#include "flashgen/fp8_cache.cuh"
#include "flashgen/params.cuh"
#include "flashgen/prefill/args.cuh"
#include "flashgen/prefill/launch.cuh"

// Kernels stay out of the anonymous namespace below: nvcc names an anonymous namespace after a
// hash of the source file's real path, and a kernel's name is in the .so (its cubin and its
// registration), so the bytes would depend on where the sources are, and a JIT build from the
// installed wheel's sources would differ from the wheel's own instance.
namespace flashgen {
namespace decode {

/** qo_indptr of one query per request: 0, 1, ..., batch. */
__global__ void one_query_each(int32_t* qo_indptr, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    qo_indptr[i] = static_cast<int32_t>(i);
  }
}

}  // namespace decode
}  // namespace flashgen

namespace {

using namespace flashgen;

using Args = FLASHGEN_ARGS;  // generated from variants.json modules.batch_decode.args

struct Plan {
  int64_t splits, head_slices, workspace;
};

template <int HEAD_DIM, typename DTypeKV>
using TraitsFor = decode::DecodeTraits<HEAD_DIM, static_cast<int>(sizeof(DTypeKV))>;

// Request lengths live on the device, so the plan depends on the batch shape alone; each block
// cuts its own request into `splits` chunks.
template <int HEAD_DIM, typename DTypeKV>
void make_plan(int64_t batch_size, int64_t num_qo_heads, int64_t num_kv_heads,
               const DeviceInfo& dev, Plan* plan) {
  using Traits = TraitsFor<HEAD_DIM, DTypeKV>;
  plan->head_slices = decode::head_slices<Traits>(num_qo_heads / num_kv_heads);
  const int64_t units = batch_size * num_kv_heads * plan->head_slices;
  plan->splits = decode::plan_splits<Traits>(units, 0, dev.sm_count, dev.smem_per_sm);
  plan->workspace =
      decode::workspace_bytes(plan->splits, batch_size * num_qo_heads, HEAD_DIM);
}

/** The fields the decode params and the rope path's prefill params share, from the call: the
 *  variant's parameters first. */
template <typename Params>
int start_params(Params& p, const Args& a) {
  if (int st = prefill::start_common(p, a, "batch_decode")) return st;
  prefill::fill_paged_kv(p, a);
  p.batch_size = static_cast<uint32_t>(a.batch_size);
  return FLASHGEN_OK;
}

/** Bytes of the rope path's workspace: the qo_indptr, then the prefill's own (run_rope's Params
 *  and Variant). */
template <typename DType, int HEAD_DIM, int PAGE_SIZE, typename Tag>
int64_t rope_workspace(const Args& a, const DeviceInfo& dev, int64_t* indptr_bytes) {
  using Params = BatchPrefillPagedParams<DType, DType, DType>;
  using Variant = typename Tag::template type<Params>;
  *indptr_bytes = prefill::align256((a.batch_size + 1) * 4);
  return *indptr_bytes + prefill::batch_prefill_workspace_bytes<HEAD_DIM, prefill::kPosRopeLlama,
                                                                Variant, Params>(
                             a.batch_size, a.num_page_ids * PAGE_SIZE, a.batch_size,
                             a.num_qo_heads, a.num_kv_heads, dev.sm_count);
}

/** The rope_llama path: one query per request at position kv_len - 1, as a paged prefill. */
template <typename DType, int HEAD_DIM, int PAGE_SIZE, typename Tag>
int run_rope(const Args& a, const DeviceInfo& dev) {
  using Params = BatchPrefillPagedParams<DType, DType, DType>;
  using Variant = typename Tag::template type<Params>;
  int64_t indptr_bytes = 0;
  const int64_t need = rope_workspace<DType, HEAD_DIM, PAGE_SIZE, Tag>(a, dev, &indptr_bytes);
  if (a.workspace == nullptr || a.workspace_bytes < need || !aligned16(a.workspace)) {
    return fail(FLASHGEN_WORKSPACE_TOO_SMALL,
                "batch_decode: needs a 16-byte aligned workspace of %lld bytes, got %lld at %p",
                static_cast<long long>(need), static_cast<long long>(a.workspace_bytes),
                a.workspace);
  }
  Params p;
  if (int st = start_params(p, a)) return st;
  auto* indptr = static_cast<int32_t*>(a.workspace);
  p.qo_indptr = indptr;
  p.q_rope_offset = nullptr;
  p.kv_rope_offset = nullptr;
  p.q_stride_n = a.q_stride_b;
  p.o_stride_n = a.o_stride_b;
  p.page_size = static_cast<uint32_t>(a.page_size);
  p.rope_scale = a.rope_scale;
  p.rope_theta = a.rope_theta;
  const auto stream = static_cast<cudaStream_t>(a.stream);
  const uint32_t n = static_cast<uint32_t>(a.batch_size + 1);
  if (int st = launch("batch_decode qo_indptr kernel", decode::one_query_each,
                      dim3((n + 255) / 256), 256, 0, stream, false, indptr, n)) {
    return st;
  }
  return prefill::launch_batch_prefill_paged<HEAD_DIM, PAGE_SIZE, prefill::kMaskNone,
                                             prefill::kPosRopeLlama, Variant>(
      p, a.batch_size, a.num_page_ids * PAGE_SIZE,
      static_cast<uint8_t*>(a.workspace) + indptr_bytes,
      a.workspace_bytes - indptr_bytes, dev, stream);
}

template <typename DType, typename DTypeKV, int HEAD_DIM, int PAGE_SIZE, typename Tag>
int run_standard(const Args& a, const DeviceInfo& dev) {
  using Params = BatchDecodeParams<DType, DTypeKV, DType>;
  using Variant = typename Tag::template type<Params>;
  using Traits = TraitsFor<HEAD_DIM, DTypeKV>;

  Params p;
  if (int st = start_params(p, a)) return st;
  if (int st = fill_fp8_kv(p, a, "batch_decode")) return st;
  p.q_stride_b = a.q_stride_b;
  p.o_stride_b = a.o_stride_b;
  p.page_size = PAGE_SIZE;

  Plan plan;
  make_plan<HEAD_DIM, DTypeKV>(a.batch_size, a.num_qo_heads, a.num_kv_heads, dev, &plan);
  const int64_t rows = a.batch_size * a.num_qo_heads;
  float *part_o, *part_w;
  if (int st = decode::carve_workspace("batch_decode", a.workspace, a.workspace_bytes,
                                       plan.splits, rows, HEAD_DIM, &part_o, &part_w)) {
    return st;
  }

  auto kernel = decode::batch_decode_kernel<Traits, PAGE_SIZE, Variant, Params>;
  static std::atomic<uint64_t> smem_done{0};
  if (int st = allow_smem(kernel, dev, Traits::kSmemBytes, smem_done)) return st;
  const dim3 grid(static_cast<uint32_t>(plan.splits), static_cast<uint32_t>(a.batch_size),
                  static_cast<uint32_t>(a.num_kv_heads * plan.head_slices));
  const auto stream = static_cast<cudaStream_t>(a.stream);
  if (int st = launch("batch_decode kernel", kernel, grid, Traits::kThreads, Traits::kSmemBytes,
                      stream, false, p, part_o, part_w, static_cast<uint32_t>(plan.splits),
                      static_cast<uint32_t>(plan.head_slices))) {
    return st;
  }
  if (plan.splits > 1) {
    decode::MergeOutput<DType> out{p.o,          p.lse,          p.o_stride_b,
                                   p.o_stride_h, p.num_qo_heads, static_cast<uint32_t>(rows)};
    return launch("batch_decode merge kernel", decode::merge_kernel<HEAD_DIM, Variant, Params>,
                  dim3(static_cast<uint32_t>(rows)), decode::kMergeThreads, 0, stream,
                  dev.major >= 9, p, static_cast<const float*>(part_o),
                  static_cast<const float*>(part_w), static_cast<uint32_t>(plan.splits), out);
  }
  return FLASHGEN_OK;
}

struct BatchDecode {
  static int check_shape(const Args& a) {
    const int64_t batch_size = a.batch_size, num_qo_heads = a.num_qo_heads;
    const int64_t num_kv_heads = a.num_kv_heads;
    if (num_qo_heads <= 0 || num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "batch_decode: num_qo_heads (%lld) must be a positive multiple of "
                  "num_kv_heads (%lld)",
                  static_cast<long long>(num_qo_heads), static_cast<long long>(num_kv_heads));
    }
    if (batch_size <= 0 || batch_size > 65535) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "batch_decode: batch_size %lld out of range [1, 65535]",
                  static_cast<long long>(batch_size));
    }
    if (num_kv_heads > 65535 || num_qo_heads > (int64_t{1} << 24)) {
      return fail(FLASHGEN_INVALID_ARGUMENT, "batch_decode: too many heads (%lld kv, %lld qo)",
                  static_cast<long long>(num_kv_heads), static_cast<long long>(num_qo_heads));
    }
    return FLASHGEN_OK;
  }

  static int check_call(const Args& a) {
    if (a.q == nullptr || a.paged_kv == nullptr || a.o == nullptr || a.kv_indptr == nullptr ||
        a.kv_indices == nullptr || a.kv_last_page_len == nullptr) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "batch_decode: q, paged_kv, o, kv_indptr, kv_indices and kv_last_page_len must "
                  "not be NULL");
    }
    if (int st = check_shape(a)) return st;
    if (!aligned16(a.paged_kv) || !vec_stride(a.kv_stride_page) || !vec_stride(a.kv_stride_kv) ||
        !vec_stride(a.kv_stride_n) || !vec_stride(a.kv_stride_h)) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "batch_decode: paged_kv must be 16-byte aligned with strides that are multiples "
                  "of 8 elements (%p; strides page %lld, kv %lld, n %lld, h %lld)",
                  a.paged_kv, static_cast<long long>(a.kv_stride_page),
                  static_cast<long long>(a.kv_stride_kv), static_cast<long long>(a.kv_stride_n),
                  static_cast<long long>(a.kv_stride_h));
    }
    return FLASHGEN_OK;
  }

  /** One instance: rope_llama through the prefill kernels, the decode kernels otherwise. */
  template <typename DType, int HEAD_DIM, int PAGE_SIZE, int POS, typename Tag, int KV>
  struct Instance {
    using DTypeKV = CacheType<DType, KV>;
    static int64_t workspace_bytes(const Args& a, const DeviceInfo& dev) {
      if constexpr (POS == prefill::kPosRopeLlama) {
        int64_t indptr_bytes = 0;
        return rope_workspace<DType, HEAD_DIM, PAGE_SIZE, Tag>(a, dev, &indptr_bytes);
      } else {
        Plan plan;
        make_plan<HEAD_DIM, DTypeKV>(a.batch_size, a.num_qo_heads, a.num_kv_heads, dev, &plan);
        return plan.workspace;
      }
    }

    static int run(const Args& a, const DeviceInfo& dev) {
      if constexpr (POS == prefill::kPosRopeLlama) {
        static_assert(!is_fp8<DTypeKV>,  // fp8_cache.cuh
                      "rope_llama with an fp8 KV cache: unsupported (variants.json)");
        return run_rope<DType, HEAD_DIM, PAGE_SIZE, Tag>(a, dev);
      } else {
        return run_standard<DType, DTypeKV, HEAD_DIM, PAGE_SIZE, Tag>(a, dev);
      }
    }
  };
};

}  // namespace

FLASHGEN_DEFINE_ENTRY_POINTS(batch_decode, BatchDecode, FG_dtype, FG_head_dim, FG_page_size,
                             FG_pos_encoding, FG_variant, FG_kv_dtype)
