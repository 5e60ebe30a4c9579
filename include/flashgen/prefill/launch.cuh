/**
 * @brief Host side of the prefill kernels: workspace sizing and launches (the C entry points of
 * csrc/ call these). All sizes derive from shapes the host knows; nothing reads device memory.
 *
 *   template <int HEAD_DIM, int POS, typename Variant, typename Params>
 *   int64_t single_prefill_workspace_bytes(qo_len, kv_len, num_qo_heads, num_kv_heads, sm_count)
 *   template <int HEAD_DIM, int MASK, int POS, typename Variant, typename Params>
 *   int launch_single_prefill(const Params& p, void* ws, int64_t ws_bytes, const DeviceInfo& dev,
 *                             cudaStream_t stream)
 *
 *   template <int HEAD_DIM, int POS, typename Variant, typename Params>
 *   int64_t batch_prefill_workspace_bytes(total_q, kv_rows, batch_size, num_qo_heads,
 *                                         num_kv_heads, sm_count)
 *       total_q = q.shape[0]; kv_rows = k.shape[0] (ragged) or kv_indices.shape[0] * PAGE_SIZE
 *       (paged); only the RoPE pre-pass uses kv_rows.
 *   template <int HEAD_DIM, int MASK, int POS, typename Variant, typename Params>
 *   int launch_batch_prefill_ragged(const Params& p, int64_t total_q, int64_t kv_rows, ws, bytes,
 *                                   dev, stream)
 *   template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename Params>
 *   int launch_batch_prefill_paged(const Params& p, int64_t total_q, int64_t kv_rows, ws, bytes,
 *                                  dev, stream)
 *
 * MASK: kMaskNone / kMaskCausal; POS: kPosNone / kPosRopeLlama (traits.cuh). Params are the
 * structs of params.cuh with every field filled (lse may be null; rope fields read only with
 * RoPE; for paged, page_size == PAGE_SIZE). Returns FLASHGEN_OK or a status with a message for
 * flashgen_last_error(). The workspace (16-byte aligned, contents need no initialization) holds:
 * the unit table (batch), the rotated keys (RoPE) and the split-KV partials.
 *
 * Kernels of one call: [prep (batch)] -> [rope_k (RoPE)] -> prefill -> [merge (split; always
 * for batch)], the later ones programmatic dependent launches on sm_90 (each waits for the
 * one before inside the kernel). The first is a plain launch, so a call never overlaps the
 * previous call's use of the workspace. The grid depends on shapes only: a captured graph can
 * be replayed with new lengths of the same batch size and tensor shapes.
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>

#include "flashgen/launch.cuh"
#include "flashgen/params.cuh"
#include "flashgen/status.cuh"
#include "flashgen/prefill/kernel.cuh"
#include "flashgen/prefill/merge.cuh"
#include "flashgen/prefill/rope_k.cuh"
#include "flashgen/prefill/scheduler.cuh"
#include "flashgen/prefill/traits.cuh"

namespace flashgen {
namespace prefill {

inline int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }

/** Workspace layout, from shapes. */
struct WorkspaceLayout {
  int64_t unit_start_off, table_off, rope_off, part_o_off, part_lse_off, total;
  int64_t grid_units, split_units;
  int64_t counter_off;  // the Hopper kernel's block counter (hopper/launch.cuh)
};

template <typename Traits>
inline WorkspaceLayout make_layout(int64_t batch, int64_t grid_units, int64_t rope_rows,
                                   int64_t num_kv_heads, int64_t part_units) {
  WorkspaceLayout w{};
  int64_t off = 0;
  w.unit_start_off = off;
  off += align256((batch + 1) * 4);
  w.table_off = off;
  off += align256(grid_units * 16);
  w.rope_off = off;
  off += align256(rope_rows * num_kv_heads * Traits::kHeadDim * 2);
  w.part_o_off = off;
  off += align256(part_units * num_kv_heads * Traits::kTileQ * Traits::kHeadDim * 4);
  w.part_lse_off = off;
  off += align256(part_units * num_kv_heads * Traits::kTileQ * 4);
  w.total = off;
  return w;
}

struct SinglePlan {
  int64_t num_tiles, splits;
  WorkspaceLayout ws;
};

template <typename Traits, int POS>
inline SinglePlan plan_single(int64_t qo_len, int64_t kv_len, int64_t num_qo_heads,
                              int64_t num_kv_heads, int64_t sm_count) {
  SinglePlan p;
  const int64_t G = num_qo_heads / num_kv_heads;
  p.num_tiles = ceil_div64(qo_len * G, Traits::kTileQ);
  const int64_t su = split_units_per_head<Traits>(sm_count, num_kv_heads);
  p.splits = single_splits<Traits>(p.num_tiles, kv_len, su);
  p.ws = make_layout<Traits>(0, 0, POS == kPosRopeLlama ? kv_len : 0, num_kv_heads,
                             p.splits > 1 ? p.num_tiles * p.splits : 0);
  p.ws.unit_start_off = p.ws.table_off = 0;
  p.ws.grid_units = p.num_tiles * p.splits;
  p.ws.split_units = su;
  if (p.splits <= 1 && POS != kPosRopeLlama) p.ws.total = 0;
  return p;
}

template <typename Traits, int POS>
inline WorkspaceLayout plan_batch(int64_t total_q, int64_t kv_rows, int64_t batch,
                                  int64_t num_qo_heads, int64_t num_kv_heads, int64_t sm_count) {
  const int64_t G = num_qo_heads / num_kv_heads;
  const int64_t su = split_units_per_head<Traits>(sm_count, num_kv_heads);
  const int64_t tile_bound = ceil_div64(total_q * G, Traits::kTileQ) + batch;
  const int64_t grid_units = std::max(tile_bound, su);
  WorkspaceLayout w = make_layout<Traits>(batch, grid_units, POS == kPosRopeLlama ? kv_rows : 0,
                                          num_kv_heads, su);
  w.grid_units = grid_units;
  w.split_units = su;
  return w;
}

template <int HEAD_DIM, int POS, typename Variant, typename Params>
inline int64_t single_prefill_workspace_bytes(int64_t qo_len, int64_t kv_len,
                                              int64_t num_qo_heads, int64_t num_kv_heads,
                                              int64_t sm_count) {
  using Traits = PrefillTraitsFor<HEAD_DIM, Variant, Params>;
  return plan_single<Traits, POS>(qo_len, kv_len, num_qo_heads, num_kv_heads, sm_count).ws.total;
}

template <int HEAD_DIM, int POS, typename Variant, typename Params>
inline int64_t batch_prefill_workspace_bytes(int64_t total_q, int64_t kv_rows, int64_t batch,
                                             int64_t num_qo_heads, int64_t num_kv_heads,
                                             int64_t sm_count) {
  using Traits = PrefillTraitsFor<HEAD_DIM, Variant, Params>;
  return plan_batch<Traits, POS>(total_q, kv_rows, batch, num_qo_heads, num_kv_heads, sm_count)
      .total;
}

inline int check_heads(const char* what, int64_t num_qo_heads, int64_t num_kv_heads) {
  if (num_qo_heads <= 0 || num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0 ||
      num_qo_heads > (1 << 20)) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "%s: num_qo_heads (%lld) must be a positive multiple of num_kv_heads (%lld)", what,
                static_cast<long long>(num_qo_heads), static_cast<long long>(num_kv_heads));
  }
  return FLASHGEN_OK;
}

inline int check_ws(const char* what, const void* ws, int64_t have, int64_t need) {
  if (need > 0 && (ws == nullptr || have < need || !aligned16(ws))) {
    return fail(FLASHGEN_WORKSPACE_TOO_SMALL,
                "%s: needs a 16-byte aligned workspace of %lld bytes, got %lld at %p", what,
                static_cast<long long>(need), static_cast<long long>(have), ws);
  }
  return FLASHGEN_OK;
}

/** Rows are read and written as 16-byte vectors. */
inline bool vec_ok(const void* p, int64_t a, int64_t b) {
  return aligned16(p) && vec_stride(a) && vec_stride(b);
}

/** q, k, v and o (single and ragged) are read and written as 16-byte rows. */
template <typename Params>
int check_dense_rows(const char* what, const Params& p) {
  if (!vec_ok(p.q, p.q_stride_n, p.q_stride_h) || !vec_ok(p.k, p.k_stride_n, p.k_stride_h) ||
      !vec_ok(p.v, p.v_stride_n, p.v_stride_h) || !vec_ok(p.o, p.o_stride_n, p.o_stride_h)) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "%s: q, k, v, o must be 16-byte aligned with strides that are multiples of 8", what);
  }
  return FLASHGEN_OK;
}

/**
 * The checks of a launch that hold for every backend (this file's and hopper/launch.cuh's, which
 * add their own limits): heads, the tensors the kind reads, 16-byte rows. Written once so that the
 * two backends refuse the same inputs with the same words.
 */
template <typename Params>
int check_single_inputs(const char* what, const Params& p) {
  if (int st = check_heads(what, p.num_qo_heads, p.num_kv_heads)) return st;
  if (int st = check_dense_rows(what, p)) return st;
  if (uint64_t(p.qo_len) * (p.num_qo_heads / p.num_kv_heads) >= (uint64_t{1} << 31)) {
    return fail(FLASHGEN_INVALID_ARGUMENT, "%s: qo_len * group size must be below 2^31", what);
  }
  return FLASHGEN_OK;
}

template <typename Params>
int check_ragged_inputs(const char* what, const Params& p) {
  if (int st = check_heads(what, p.num_qo_heads, p.num_kv_heads)) return st;
  if (p.batch_size == 0 || p.qo_indptr == nullptr || p.kv_indptr == nullptr) {
    return fail(FLASHGEN_INVALID_ARGUMENT, "%s: batch_size >= 1 and indptrs are required", what);
  }
  return check_dense_rows(what, p);
}

template <int PAGE_SIZE, typename Params>
int check_paged_inputs(const char* what, const Params& p) {
  if (int st = check_heads(what, p.num_qo_heads, p.num_kv_heads)) return st;
  if (p.batch_size == 0 || p.qo_indptr == nullptr || p.kv_indptr == nullptr ||
      p.kv_indices == nullptr || p.kv_last_page_len == nullptr) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "%s: batch_size >= 1, indptrs, kv_indices and kv_last_page_len are required", what);
  }
  if (p.page_size != PAGE_SIZE) {
    return fail(FLASHGEN_INVALID_ARGUMENT, "%s: page_size %u but the kernel is built for %d", what,
                p.page_size, PAGE_SIZE);
  }
  if (!vec_ok(p.q, p.q_stride_n, p.q_stride_h) || !vec_ok(p.o, p.o_stride_n, p.o_stride_h) ||
      !vec_ok(p.paged_kv, p.kv_stride_page, p.kv_stride_kv) ||
      !vec_ok(p.paged_kv, p.kv_stride_n, p.kv_stride_h)) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "%s: q, paged_kv, o must be 16-byte aligned with strides that are multiples of 8",
                what);
  }
  return FLASHGEN_OK;
}

/**
 * The first kernel of a batch call, for both backends: the prep kernel fills the unit table
 * (scheduler.cuh) at `table` from the indptrs on the device. `counter`: the Hopper kernel's block
 * counter, reset here (null for the portable kernel).
 */
template <typename Traits, int MASK, typename Params>
int launch_batch_prep(const char* what, const Params& p, const WorkspaceLayout& L, uint8_t* base,
                      cudaStream_t stream, uint32_t* counter, int4** table) {
  int32_t* unit_start = reinterpret_cast<int32_t*>(base + L.unit_start_off);
  *table = reinterpret_cast<int4*>(base + L.table_off);
  const uint32_t G = p.num_qo_heads / p.num_kv_heads;
  return launch(what, prefill_prep_kernel<Traits, MASK, Params>, dim3(1), kPrepThreads, 0, stream,
                false, p, G, uint32_t(L.grid_units), uint32_t(L.split_units), unit_start, *table,
                counter);
}

/** One flag word per kernel instantiation (KernelTag makes the static distinct per kernel). */
template <typename KernelTag, typename Kernel>
inline int smem_optin(Kernel kernel, const DeviceInfo& dev, int bytes) {
  static std::atomic<uint64_t> done{0};
  return allow_smem(kernel, dev, bytes, done);
}

template <typename Traits, int MASK, int POS, int PAGE_SIZE, typename Variant, typename Params,
          typename Sched>
struct MainKernelTag {};

inline int rope_blocks(int64_t items, const DeviceInfo& dev) {
  const int64_t want = ceil_div64(items, kRopeThreads);
  return int(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(dev.sm_count) * 8)));
}

template <int HEAD_DIM, int MASK, int POS, typename Variant, typename Params>
int launch_single_prefill(const Params& p, void* ws, int64_t ws_bytes, const DeviceInfo& dev,
                          cudaStream_t stream) {
  using Traits = PrefillTraitsFor<HEAD_DIM, Variant, Params>;
  using DType = typename Params::DTypeKV;
  const char* what = "single_prefill";
  if (int st = check_single_inputs(what, p)) return st;
  if (p.qo_len == 0) return FLASHGEN_OK;
  const SinglePlan plan =
      plan_single<Traits, POS>(p.qo_len, p.kv_len, p.num_qo_heads, p.num_kv_heads, dev.sm_count);
  if (int st = check_ws(what, ws, ws_bytes, plan.ws.total)) return st;
  uint8_t* base = static_cast<uint8_t*>(ws);
  const bool pdl = dev.major >= 9;
  bool first = true;
  DType* rope_k = nullptr;
  if constexpr (POS == kPosRopeLlama) {
    if (p.kv_len > 0) {
      rope_k = reinterpret_cast<DType*>(base + plan.ws.rope_off);
      const int64_t items = int64_t(p.kv_len) * p.num_kv_heads * (HEAD_DIM / 16);
      auto k = rope_k_single_kernel<HEAD_DIM, typename Params::DTypeQ, DType, typename Params::DTypeO>;
      if (int st = launch("single_prefill rope_k kernel", k, dim3(rope_blocks(items, dev)),
                          kRopeThreads, 0, stream, false, p, rope_k, int64_t(p.kv_len))) {
        return st;
      }
      first = false;
    }
  }
  Partials part{nullptr, nullptr};
  if (plan.splits > 1) {
    part.o = reinterpret_cast<float*>(base + plan.ws.part_o_off);
    part.lse = reinterpret_cast<float*>(base + plan.ws.part_lse_off);
  }
  const SingleSched sched{uint32_t(plan.num_tiles), uint32_t(plan.splits)};
  auto kernel = prefill_kernel<Traits, MASK, POS, 1, Variant, Params, SingleSched>;
  using Tag = MainKernelTag<Traits, MASK, POS, 1, Variant, Params, SingleSched>;
  if (int st = smem_optin<Tag>(kernel, dev, Traits::kSmemBytes)) return st;
  const int64_t blocks = plan.num_tiles * plan.splits * p.num_kv_heads;
  if (int st = launch("single_prefill kernel", kernel, dim3(uint32_t(blocks)), Traits::kThreads,
                      Traits::kSmemBytes, stream, pdl && !first, p, sched,
                      static_cast<const DType*>(rope_k), part)) {
    return st;
  }
  if (plan.splits > 1) {
    auto merge = prefill_merge_kernel<Traits, Variant, Params, SingleSched>;
    return launch("single_prefill merge kernel", merge, dim3(uint32_t(blocks)), kMergeThreads, 0,
                  stream, pdl, p, sched, part);
  }
  return FLASHGEN_OK;
}

template <typename Params>
struct RopeFn {
  using type = void (*)(Params, typename Params::DTypeKV*, int64_t);
};

/** Shared by the ragged and paged launches once the kind-specific kernels are chosen. */
template <typename Traits, int MASK, typename Tag, typename Params, typename Main, typename Merge>
int launch_batch_common(const char* what, const Params& p, const WorkspaceLayout& L, void* ws,
                        const DeviceInfo& dev, cudaStream_t stream, Main main, Merge merge,
                        typename RopeFn<Params>::type rope_kernel,
                        int64_t rope_rows) {
  using DType = typename Params::DTypeKV;
  uint8_t* base = static_cast<uint8_t*>(ws);
  const bool pdl = dev.major >= 9;
  int4* table = nullptr;
  if (int st = launch_batch_prep<Traits, MASK>("batch_prefill prep kernel", p, L, base, stream,
                                               nullptr, &table)) {
    return st;
  }
  DType* rope_k = nullptr;
  if (rope_kernel != nullptr && rope_rows > 0) {
    rope_k = reinterpret_cast<DType*>(base + L.rope_off);
    const int64_t items = rope_rows * p.num_kv_heads * (Traits::kHeadDim / 16);
    if (int st = launch("batch_prefill rope_k kernel", rope_kernel, dim3(rope_blocks(items, dev)),
                        kRopeThreads, 0, stream, pdl, p, rope_k, rope_rows)) {
      return st;
    }
  }
  const Partials part{reinterpret_cast<float*>(base + L.part_o_off),
                      reinterpret_cast<float*>(base + L.part_lse_off)};
  const BatchSched sched{table};
  if (int st = smem_optin<Tag>(main, dev, Traits::kSmemBytes)) return st;
  const int64_t blocks = L.grid_units * p.num_kv_heads;
  if (int st = launch("batch_prefill kernel", main, dim3(uint32_t(blocks)), Traits::kThreads,
                      Traits::kSmemBytes, stream, pdl, p, sched, static_cast<const DType*>(rope_k),
                      part)) {
    return st;
  }
  return launch("batch_prefill merge kernel", merge, dim3(uint32_t(L.split_units * p.num_kv_heads)),
                kMergeThreads, 0, stream, pdl, p, sched, part);
}

template <int HEAD_DIM, int MASK, int POS, typename Variant, typename Params>
int launch_batch_prefill_ragged(const Params& p, int64_t total_q, int64_t kv_rows, void* ws,
                                int64_t ws_bytes, const DeviceInfo& dev, cudaStream_t stream) {
  using Traits = PrefillTraitsFor<HEAD_DIM, Variant, Params>;
  using DType = typename Params::DTypeKV;
  const char* what = "batch_prefill_ragged";
  if (int st = check_ragged_inputs(what, p)) return st;
  const WorkspaceLayout L = plan_batch<Traits, POS>(total_q, kv_rows, p.batch_size,
                                                    p.num_qo_heads, p.num_kv_heads, dev.sm_count);
  if (int st = check_ws(what, ws, ws_bytes, L.total)) return st;
  auto main = prefill_kernel<Traits, MASK, POS, 1, Variant, Params, BatchSched>;
  using Tag = MainKernelTag<Traits, MASK, POS, 1, Variant, Params, BatchSched>;
  auto merge = prefill_merge_kernel<Traits, Variant, Params, BatchSched>;
  if constexpr (POS == kPosRopeLlama) {
    auto rk = rope_k_ragged_kernel<HEAD_DIM, typename Params::DTypeQ, DType, typename Params::DTypeO>;
    return launch_batch_common<Traits, MASK, Tag>(what, p, L, ws, dev, stream, main, merge, rk, kv_rows);
  } else {
    return launch_batch_common<Traits, MASK, Tag>(what, p, L, ws, dev, stream, main, merge, nullptr, 0);
  }
}

template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename Params>
int launch_batch_prefill_paged(const Params& p, int64_t total_q, int64_t kv_rows, void* ws,
                               int64_t ws_bytes, const DeviceInfo& dev, cudaStream_t stream) {
  using Traits = PrefillTraitsFor<HEAD_DIM, Variant, Params>;
  using DType = typename Params::DTypeKV;
  const char* what = "batch_prefill_paged";
  if (int st = check_paged_inputs<PAGE_SIZE>(what, p)) return st;
  const WorkspaceLayout L = plan_batch<Traits, POS>(total_q, kv_rows, p.batch_size,
                                                    p.num_qo_heads, p.num_kv_heads, dev.sm_count);
  if (int st = check_ws(what, ws, ws_bytes, L.total)) return st;
  auto main = prefill_kernel<Traits, MASK, POS, PAGE_SIZE, Variant, Params, BatchSched>;
  using Tag = MainKernelTag<Traits, MASK, POS, PAGE_SIZE, Variant, Params, BatchSched>;
  auto merge = prefill_merge_kernel<Traits, Variant, Params, BatchSched>;
  if constexpr (POS == kPosRopeLlama) {
    auto rk = rope_k_paged_kernel<HEAD_DIM, PAGE_SIZE, typename Params::DTypeQ, DType,
                                  typename Params::DTypeO>;
    return launch_batch_common<Traits, MASK, Tag>(what, p, L, ws, dev, stream, main, merge, rk, kv_rows);
  } else {
    return launch_batch_common<Traits, MASK, Tag>(what, p, L, ws, dev, stream, main, merge, nullptr, 0);
  }
}

}  // namespace prefill
}  // namespace flashgen
