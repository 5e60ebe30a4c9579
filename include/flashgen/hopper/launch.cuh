/**
 * @brief Host side of the Hopper prefill kernel: the same entry-point shapes as
 * prefill/launch.cuh, so a per-architecture backend can call either.
 *
 *   template <int HEAD_DIM, int POS, typename Variant, typename Params>
 *   int64_t hopper::single_prefill_workspace_bytes(qo_len, kv_len, num_qo_heads, num_kv_heads,
 *                                                  sm_count)
 *   template <int HEAD_DIM, int MASK, int POS, typename Variant, typename Params>
 *   int hopper::launch_single_prefill(const Params& p, void* ws, int64_t ws_bytes,
 *                                     const DeviceInfo& dev, cudaStream_t stream)
 *
 *   template <int HEAD_DIM, int POS, typename Variant, typename Params>
 *   int64_t hopper::batch_prefill_workspace_bytes(total_q, kv_rows, batch_size, num_qo_heads,
 *                                                 num_kv_heads, sm_count)
 *   template <int HEAD_DIM, int MASK, int POS, typename Variant, typename Params>
 *   int hopper::launch_batch_prefill_ragged(const Params& p, int64_t total_q, int64_t kv_rows,
 *                                           void* ws, int64_t ws_bytes, const DeviceInfo& dev,
 *                                           cudaStream_t stream)
 *       total_q = q.shape[0], kv_rows = k.shape[0] (the tensor maps span all k/v rows; a
 *       request's tiles start at kv_indptr[b]).
 *   template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename Params>
 *   int hopper::launch_batch_prefill_paged(const Params& p, int64_t total_q, int64_t kv_rows,
 *                                          void* ws, int64_t ws_bytes, const DeviceInfo& dev,
 *                                          cudaStream_t stream)
 *       The portable signature (prefill/launch.cuh): kv_rows = kv_indices.shape[0] * PAGE_SIZE,
 *       read by the RoPE pre-pass only; the workspace is batch_prefill_workspace_bytes's. K/V
 *       tiles come by TMA, one 5-D box per page and 64-column block, when the page size is
 *       a multiple of 8 dividing the kv tile (16); else (page size 1) the producer warpgroup
 *       gathers rows with cp.async. NHD or HND pages, any page order.
 *
 * Batch: the portable prep kernel writes the unit table (with this kernel's tile shapes), then
 * [rope_k] -> hopper prefill -> merge, as prefill/launch.cuh does.
 *
 * Every entry takes Params whose DTypeKV is an fp8 type (__nv_fp8_e4m3, __nv_fp8_e5m2; the
 * params carry k_scale and v_scale, params.cuh's KVScales) as well as 16-bit ones: the kernel
 * widens the cache in shared memory (hopper/prefill/widen.cuh). An fp8 cache needs K/V strides
 * that are multiples of 16 elements (16-byte rows of the copies) and has no RoPE pre-pass
 * (pos_encoding none: keys are rotated before they are quantized).
 *
 * Kernels of a call: [rope_k (RoPE): the portable pre-pass] -> hopper prefill -> [merge (split
 * KV)], the later ones programmatic dependent launches. The workspace holds the rotated keys
 * and the split partials (the portable layout, with this kernel's tile shapes). Tensor maps are
 * encoded on the host on every call (a few microseconds) and passed by value: a captured graph
 * keeps the pointers it was captured with, as it does for the portable kernels.
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <cuda_runtime.h>

#include "flashgen/launch.cuh"
#include "flashgen/params.cuh"
#include "flashgen/status.cuh"
#include "flashgen/prefill/launch.cuh"
#include "flashgen/prefill/merge.cuh"
#include "flashgen/prefill/rope_k.cuh"
#include "flashgen/prefill/scheduler.cuh"
#include "flashgen/hopper/prefill/kernel.cuh"
#include "flashgen/hopper/tma.cuh"
#include "flashgen/hopper/traits.cuh"
#include "flashgen/hopper/tuning.cuh"

namespace flashgen {
namespace hopper {

/** The dynamic block order's counter (hopper/prefill/scheduler.cuh), 256 bytes at the end of a
 *  batch workspace; the prep kernel zeroes it on every call (so a replayed graph starts from zero
 *  too). */
inline void add_block_counter(prefill::WorkspaceLayout* w) {
  w->counter_off = w->total;
  w->total += 256;
}

template <typename Traits, int POS>
inline prefill::SinglePlan plan_single(int64_t qo_len, int64_t kv_len, int64_t num_qo_heads,
                                       int64_t num_kv_heads, int64_t sm_count) {
  prefill::SinglePlan p;
  const int64_t G = num_qo_heads / num_kv_heads;
  p.num_tiles = prefill::ceil_div64(qo_len * G, Traits::kTileQ);
  const int64_t su = prefill::split_units_per_head<Traits>(sm_count, num_kv_heads);
  p.splits = prefill::single_splits<Traits>(p.num_tiles, kv_len, su);
  p.ws = prefill::make_layout<Traits>(0, 0, POS == prefill::kPosRopeLlama ? kv_len : 0,
                                      num_kv_heads, p.splits > 1 ? p.num_tiles * p.splits : 0);
  p.ws.unit_start_off = p.ws.table_off = 0;
  p.ws.grid_units = p.num_tiles * p.splits;
  p.ws.split_units = su;
  if (p.splits <= 1 && POS != prefill::kPosRopeLlama) p.ws.total = 0;
  return p;
}

/** With RoPE (POS), the pre-pass (prefill/rope_k.cuh's kernel for the params kind) over `rows`
 *  key rows into `region`, the rotated copy in the workspace, which *rope_k then points at
 *  (nullptr without RoPE); `dependent`: a programmatic dependent launch (it follows the prep
 *  kernel). Nothing is launched for no rows. */
template <int HEAD_DIM, int POS, int PAGE_SIZE, typename Params, typename DType>
inline int rotate_keys(const char* what, const Params& p, uint8_t* region, int64_t rows,
                       bool dependent, const DeviceInfo& dev, cudaStream_t stream,
                       const DType** rope_k) {
  *rope_k = nullptr;
  if constexpr (POS == prefill::kPosRopeLlama) {
    DType* out = reinterpret_cast<DType*>(region);
    *rope_k = out;
    if (rows <= 0) return FLASHGEN_OK;
    const int64_t items = rows * p.num_kv_heads * (HEAD_DIM / 16);
    return launch(what, prefill::rope_k_kernel<HEAD_DIM, PAGE_SIZE>(p),
                  dim3(prefill::rope_blocks(items, dev)), prefill::kRopeThreads, 0, stream,
                  dependent, p, out, rows);
  }
  return FLASHGEN_OK;
}

template <int HEAD_DIM, int POS, typename Variant, typename Params>
inline int64_t single_prefill_workspace_bytes(int64_t qo_len, int64_t kv_len, int64_t num_qo_heads,
                                              int64_t num_kv_heads, int64_t sm_count) {
  using Traits = HopperTraitsFor<HEAD_DIM, POS, Variant, Params>;
  return plan_single<Traits, POS>(qo_len, kv_len, num_qo_heads, num_kv_heads, sm_count).ws.total;
}

template <typename Traits, int MASK, int POS, typename Variant, typename Params, typename Sched,
          int PAGE_SIZE = 0>
struct HopperKernelTag {};

/** Persistent grid: at most one CTA per SM, each looping over blocks (single prefill: snake,
 *  scheduler.cuh), so the producer loads the next block's first K/V tiles during the current
 *  block's epilogue and the CTA start is paid once per SM; one CTA per block for causal single
 *  prefill over more than kSnakeRounds rounds (tuning.cuh). */
inline uint32_t grid_ctas(int64_t blocks, const DeviceInfo& dev, bool causal_single) {
  const int64_t persistent_ctas = std::min<int64_t>(blocks, dev.sm_count);
  const bool few_rounds = blocks <= int64_t(kSnakeRounds) * dev.sm_count;
  const bool persistent = !causal_single || few_rounds;
  return uint32_t(persistent ? persistent_ctas : blocks);
}

/** An fp8 cache's K/V strides (elements): multiples of 16, so that every copy moves 16-byte
 *  rows (the tensor maps' and the gather's). */
template <typename Params, typename... Strides>
inline int check_fp8_strides(const char* what, const Params&, Strides... strides) {
  if constexpr (is_fp8<typename Params::DTypeKV>) {
    const int64_t all[] = {int64_t(strides)...};
    for (int64_t x : all) {
      if (x % 16 != 0) {
        return fail(FLASHGEN_INVALID_ARGUMENT,
                    "%s: an fp8 K/V cache needs strides that are multiples of 16 elements "
                    "(got %lld): pass K/V whose rows start 16 bytes apart",
                    what, static_cast<long long>(x));
      }
    }
  }
  return FLASHGEN_OK;
}

inline int check_hopper(const char* what, const DeviceInfo& dev) {
  if (dev.major != 9) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "%s: the sm90 backend runs on Hopper GPUs (compute capability 9.0) only; device %d "
                "has compute capability %d.x: use the portable backend",
                what, dev.device, dev.major);
  }
  return FLASHGEN_OK;
}

/**
 * The K and V tensor maps of a call over contiguous K/V (single, ragged): K from the keys the
 * RoPE pre-pass rotated into the workspace (`rope_k`, [rows][heads][head_dim]) when RoPE is on,
 * else from k with its strides; V from v. `rows` is at least 1: a map needs a non-empty tensor.
 */
template <typename Traits, int HEAD_DIM, int POS, typename DType, typename Params>
inline int make_contiguous_kv_maps(const Params& p, const DType* rope_k, int64_t rows,
                                   KVTensorMaps* maps, KVMapOrder* order_k, KVMapOrder* order_v) {
  constexpr int kBoxRows = Traits::kTileKV;  // one box per kv tile and 64-column block
  if constexpr (POS == prefill::kPosRopeLlama) {
    if (int st = make_kv_map(&maps->k, order_k, rope_k, rows, p.num_kv_heads, HEAD_DIM,
                             int64_t(p.num_kv_heads) * HEAD_DIM, int64_t(HEAD_DIM),
                             kBoxRows)) {
      return st;
    }
  } else {
    if (int st = make_kv_map(&maps->k, order_k, p.k, rows, p.num_kv_heads, HEAD_DIM, p.k_stride_n,
                             p.k_stride_h, kBoxRows)) {
      return st;
    }
  }
  return make_kv_map(&maps->v, order_v, p.v, rows, p.num_kv_heads, HEAD_DIM, p.v_stride_n,
                     p.v_stride_h, kBoxRows);
}

template <int HEAD_DIM, int MASK, int POS, typename Variant, typename Params>
int launch_single_prefill(const Params& p, void* ws, int64_t ws_bytes, const DeviceInfo& dev,
                          cudaStream_t stream) {
  using Traits = HopperTraitsFor<HEAD_DIM, POS, Variant, Params>;
  using DType = typename Params::DTypeKV;
  const char* what = "single_prefill (sm90)";
  if (int st = check_hopper(what, dev)) return st;
  if (int st = prefill::check_single_inputs(what, p)) return st;
  if (int st = check_fp8_strides(what, p, p.k_stride_n, p.k_stride_h, p.v_stride_n,
                                 p.v_stride_h)) {
    return st;
  }
  if (p.kv_len >= (uint32_t{1} << 31)) {  // TMA coordinates are int32
    return fail(FLASHGEN_INVALID_ARGUMENT, "%s: kv_len must be below 2^31", what);
  }
  if (p.qo_len == 0) return FLASHGEN_OK;
  const prefill::SinglePlan plan =
      plan_single<Traits, POS>(p.qo_len, p.kv_len, p.num_qo_heads, p.num_kv_heads, dev.sm_count);
  if (int st = prefill::check_ws(what, ws, ws_bytes, plan.ws.total)) return st;
  uint8_t* base = static_cast<uint8_t*>(ws);
  bool first = true;
  const int64_t rows = p.kv_len > 0 ? int64_t(p.kv_len) : 1;  // a map needs a non-empty tensor
  KVTensorMaps maps;
  KVMapOrder order_k, order_v;
  const DType* rope_k;
  if (int st = rotate_keys<HEAD_DIM, POS, 0>("single_prefill rope_k kernel", p,
                                             base + plan.ws.rope_off, int64_t(p.kv_len), false,
                                             dev, stream, &rope_k)) {
    return st;
  }
  if (POS == prefill::kPosRopeLlama && p.kv_len > 0) first = false;
  if (int st = make_contiguous_kv_maps<Traits, HEAD_DIM, POS>(p, rope_k, rows, &maps, &order_k,
                                                              &order_v)) {
    return st;
  }
  prefill::Partials part{nullptr, nullptr};
  if (plan.splits > 1) {
    part.o = reinterpret_cast<float*>(base + plan.ws.part_o_off);
    part.lse = reinterpret_cast<float*>(base + plan.ws.part_lse_off);
  }
  const prefill::SingleSched sched{uint32_t(plan.num_tiles), uint32_t(plan.splits)};
  auto kernel = hopper_prefill_kernel<Traits, MASK, POS, Variant, Params, prefill::SingleSched>;
  using Tag = HopperKernelTag<Traits, MASK, POS, Variant, Params, prefill::SingleSched>;
  if (int st = prefill::smem_optin<Tag>(kernel, dev, Traits::kSmemBytes)) return st;
  const int64_t blocks = plan.num_tiles * plan.splits * p.num_kv_heads;
  const dim3 grid(grid_ctas(blocks, dev, MASK == prefill::kMaskCausal));
  if (int st = launch("single_prefill (sm90) kernel", kernel, grid, Traits::kThreads,
                      Traits::kSmemBytes, stream, !first, p, maps, sched, order_k, order_v, part,
                      uint32_t(blocks), static_cast<const DType*>(nullptr), PagedMapOrder{},
                      static_cast<uint32_t*>(nullptr))) {
    return st;
  }
  if (plan.splits > 1) {
    auto merge = prefill::prefill_merge_kernel<Traits, Variant, Params, prefill::SingleSched>;
    return launch("single_prefill (sm90) merge kernel", merge, dim3(uint32_t(blocks)),
                  prefill::kMergeThreads, 0, stream, true, p, sched, part);
  }
  return FLASHGEN_OK;
}

template <typename Traits, int POS>
inline prefill::WorkspaceLayout plan_batch(int64_t total_q, int64_t kv_rows, int64_t batch,
                                           int64_t num_qo_heads, int64_t num_kv_heads,
                                           int64_t sm_count) {
  prefill::WorkspaceLayout w = prefill::plan_batch<Traits, POS>(total_q, kv_rows, batch,
                                                               num_qo_heads, num_kv_heads, sm_count);
  add_block_counter(&w);
  return w;
}

template <int HEAD_DIM, int POS, typename Variant, typename Params>
inline int64_t batch_prefill_workspace_bytes(int64_t total_q, int64_t kv_rows, int64_t batch,
                                             int64_t num_qo_heads, int64_t num_kv_heads,
                                             int64_t sm_count) {
  using Traits = HopperTraitsFor<HEAD_DIM, POS, Variant, Params>;
  return plan_batch<Traits, POS>(total_q, kv_rows, batch, num_qo_heads, num_kv_heads, sm_count)
      .total;
}

/** A batch call's workspace: its plan (L), where it lies (base) and the unit table the prep
 *  kernel wrote. */
struct BatchWorkspace {
  prefill::WorkspaceLayout L;
  uint8_t* base;
  int4* table;
  prefill::Partials partials() const {
    return {reinterpret_cast<float*>(base + L.part_o_off),
            reinterpret_cast<float*>(base + L.part_lse_off)};
  }
  /** The dynamic block order's counter. */
  uint32_t* counter() const { return reinterpret_cast<uint32_t*>(base + L.counter_off); }
};

/** A batch call's workspace plan, checked against `ws`, and its prep kernel (the unit table;
 *  the dynamic order's counter zeroed). */
template <typename Traits, int MASK, int POS, typename Params>
inline int prepare_batch(const char* what, const char* prep_what, const Params& p,
                         int64_t total_q, int64_t kv_rows, void* ws, int64_t ws_bytes,
                         const DeviceInfo& dev, cudaStream_t stream, BatchWorkspace* w) {
  w->L = plan_batch<Traits, POS>(total_q, kv_rows, p.batch_size, p.num_qo_heads,
                                 p.num_kv_heads, dev.sm_count);
  if (int st = prefill::check_ws(what, ws, ws_bytes, w->L.total)) return st;
  w->base = static_cast<uint8_t*>(ws);
  w->table = nullptr;
  return prefill::launch_batch_prep<Traits, MASK>(prep_what, p, w->L, w->base, stream,
                                                  w->counter(), &w->table);
}

/** The merge kernel after a batch call's prefill kernel (split units' partials). */
template <typename Traits, typename Variant, typename Params>
inline int launch_batch_merge(const char* what, const Params& p,
                              const prefill::WorkspaceLayout& L, const prefill::BatchSched& sched,
                              const prefill::Partials& part, cudaStream_t stream) {
  auto merge = prefill::prefill_merge_kernel<Traits, Variant, Params, prefill::BatchSched>;
  return launch(what, merge, dim3(uint32_t(L.split_units * p.num_kv_heads)),
                prefill::kMergeThreads, 0, stream, true, p, sched, part);
}

/** What a batch kernel takes of K and V: the tensor maps and their dimension orders and, paged,
 *  the rotated keys its producer reads (RoPE) and the page pool map's order. */
template <typename DType>
struct BatchKVMaps {
  KVTensorMaps maps{};
  KVMapOrder order_k{true}, order_v{true};
  const DType* paged_rope_k = nullptr;
  PagedMapOrder paged_order{};
};

/** Ragged: maps over k (or the rotated keys) and v, as single prefill's. */
template <typename Traits, int HEAD_DIM, int POS, int PAGE_SIZE, typename DType, typename Q,
          typename K, typename O>
inline int make_batch_kv_maps(const BatchPrefillRaggedParams<Q, K, O>& p, const DType* rope_k,
                              int64_t kv_rows, BatchKVMaps<DType>* kv) {
  return make_contiguous_kv_maps<Traits, HEAD_DIM, POS>(
      p, rope_k, kv_rows > 0 ? kv_rows : 1, &kv->maps, &kv->order_k, &kv->order_v);
}

/** Paged, TMA (hopper_paged_tma): maps.k is the 5-D map of the page pool (K and V by the k/v
 *  coordinate), maps.v the dense map of the rotated keys (RoPE). Other page sizes: the producer
 *  gathers rows, no maps. */
template <typename Traits, int HEAD_DIM, int POS, int PAGE_SIZE, typename DType, typename Q,
          typename K, typename O>
inline int make_batch_kv_maps(const BatchPrefillPagedParams<Q, K, O>& p, const DType* rope_k,
                              int64_t kv_rows, BatchKVMaps<DType>* kv) {
  kv->paged_rope_k = rope_k;
  if constexpr (hopper_paged_tma<Traits::kTileKV, PAGE_SIZE>()) {
    if (int st = make_paged_map(&kv->maps.k, &kv->paged_order, p.paged_kv, p.num_kv_heads,
                                HEAD_DIM, PAGE_SIZE, p.kv_stride_page, p.kv_stride_kv,
                                p.kv_stride_n, p.kv_stride_h)) {
      return st;
    }
    if constexpr (POS == prefill::kPosRopeLlama) {
      if (int st = make_kv_map(&kv->maps.v, &kv->order_v, rope_k, kv_rows > 0 ? kv_rows : 1,
                               p.num_kv_heads, HEAD_DIM, int64_t(p.num_kv_heads) * HEAD_DIM,
                               int64_t(HEAD_DIM), Traits::kTileKV)) {
        return st;
      }
      kv->order_k = kv->order_v;  // the kernel reads both the same here
    }
  }
  return FLASHGEN_OK;
}

/** The names a batch call gives its kernels in its errors. */
struct BatchKernelNames {
  const char *prep, *rope_k, *prefill, *merge;
};

/** A batch call `what` whose inputs were checked (ragged: PAGE_SIZE 0): prep kernel, [rope_k],
 *  the prefill kernel over the unit table, merge. */
template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename Params>
int launch_batch(const char* what, const BatchKernelNames& names, const Params& p,
                 int64_t total_q, int64_t kv_rows, void* ws, int64_t ws_bytes,
                 const DeviceInfo& dev, cudaStream_t stream) {
  using Traits = HopperTraitsFor<HEAD_DIM, POS, Variant, Params>;
  using DType = typename Params::DTypeKV;
  BatchWorkspace w;
  if (int st = prepare_batch<Traits, MASK, POS>(what, names.prep, p, total_q, kv_rows, ws,
                                                ws_bytes, dev, stream, &w)) {
    return st;
  }
  const DType* rope_k;
  if (int st = rotate_keys<HEAD_DIM, POS, PAGE_SIZE>(names.rope_k, p, w.base + w.L.rope_off,
                                                     kv_rows, true, dev, stream, &rope_k)) {
    return st;
  }
  BatchKVMaps<DType> kv;
  if (int st = make_batch_kv_maps<Traits, HEAD_DIM, POS, PAGE_SIZE>(p, rope_k, kv_rows, &kv)) {
    return st;
  }
  const prefill::Partials part = w.partials();
  const prefill::BatchSched sched{w.table};
  auto kernel =
      hopper_prefill_kernel<Traits, MASK, POS, Variant, Params, prefill::BatchSched, PAGE_SIZE>;
  using Tag = HopperKernelTag<Traits, MASK, POS, Variant, Params, prefill::BatchSched, PAGE_SIZE>;
  if (int st = prefill::smem_optin<Tag>(kernel, dev, Traits::kSmemBytes)) return st;
  const int64_t blocks = w.L.grid_units * p.num_kv_heads;
  const dim3 grid(grid_ctas(blocks, dev, false));
  if (int st = launch(names.prefill, kernel, grid, Traits::kThreads, Traits::kSmemBytes, stream,
                      true, p, kv.maps, sched, kv.order_k, kv.order_v, part, uint32_t(blocks),
                      kv.paged_rope_k, kv.paged_order, w.counter())) {
    return st;
  }
  return launch_batch_merge<Traits, Variant>(names.merge, p, w.L, sched, part, stream);
}

template <int HEAD_DIM, int MASK, int POS, typename Variant, typename Params>
int launch_batch_prefill_ragged(const Params& p, int64_t total_q, int64_t kv_rows, void* ws,
                                int64_t ws_bytes, const DeviceInfo& dev, cudaStream_t stream) {
  const char* what = "batch_prefill_ragged (sm90)";
  if (int st = check_hopper(what, dev)) return st;
  if (int st = prefill::check_ragged_inputs(what, p)) return st;
  if (int st = check_fp8_strides(what, p, p.k_stride_n, p.k_stride_h, p.v_stride_n,
                                 p.v_stride_h)) {
    return st;
  }
  if (kv_rows >= (int64_t{1} << 31)) {  // TMA coordinates are int32
    return fail(FLASHGEN_INVALID_ARGUMENT, "%s: k must have fewer than 2^31 rows", what);
  }
  constexpr BatchKernelNames kNames{
      "batch_prefill_ragged (sm90) prep kernel", "batch_prefill_ragged (sm90) rope_k kernel",
      "batch_prefill_ragged (sm90) kernel", "batch_prefill_ragged (sm90) merge kernel"};
  return launch_batch<HEAD_DIM, 0, MASK, POS, Variant>(what, kNames, p, total_q, kv_rows, ws,
                                                       ws_bytes, dev, stream);
}

template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename Params>
int launch_batch_prefill_paged(const Params& p, int64_t total_q, int64_t kv_rows, void* ws,
                               int64_t ws_bytes, const DeviceInfo& dev, cudaStream_t stream) {
  static_assert(PAGE_SIZE >= 1, "page size");
  const char* what = "batch_prefill_paged (sm90)";
  if (int st = check_hopper(what, dev)) return st;
  if (int st = prefill::check_paged_inputs<PAGE_SIZE>(what, p)) return st;
  if (int st = check_fp8_strides(what, p, p.kv_stride_page, p.kv_stride_kv, p.kv_stride_n,
                                 p.kv_stride_h)) {
    return st;
  }
  constexpr BatchKernelNames kNames{
      "batch_prefill_paged (sm90) prep kernel", "batch_prefill_paged (sm90) rope_k kernel",
      "batch_prefill_paged (sm90) kernel", "batch_prefill_paged (sm90) merge kernel"};
  return launch_batch<HEAD_DIM, PAGE_SIZE, MASK, POS, Variant>(what, kNames, p, total_q, kv_rows,
                                                               ws, ws_bytes, dev, stream);
}

}  // namespace hopper
}  // namespace flashgen
