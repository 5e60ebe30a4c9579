/**
 * @brief The prefill attention kernel (FA2-style, mma.sync m16n8k16, sm_80+).
 *
 * Per CTA: kTileQ packed query rows of one kv head (traits.cuh) against a range of kv tiles.
 *  - Q: each warp loads its own rows once (16-byte loads), applies RoPE and the variant's
 *    QueryTransform in fp32, stores them swizzled (smem.cuh) in the input dtype.
 *  - K/V: cp.async tiles of kTileKV rows; the copy of tile t+1 is issued while tile t is computed.
 *  - S = Q K^T on fp32 accumulators (Q and K fragments by ldmatrix), the variant's
 *    LogitsTransform, masks only on tiles that need them (mask.cuh), an online base-2 softmax,
 *    P repacked in registers as the A operand of O += P V (V fragments by ldmatrix.trans).
 *  - Epilogue: O / l, OutputTransform, staged through the warp's own Q rows in shared memory and
 *    written with 16-byte stores; LSE in natural log. Split units write fp32 partials instead.
 *  - An fp8 cache (Fp8PrefillTraits): the ring streams the one-byte tiles as they are stored, and
 *    once its own copies of a tile have landed each thread widens them, exactly (dtype.cuh), into
 *    the f16 K or V tile the mma path reads, while the other copies stay in flight. The products
 *    run in f16 whatever q's type (fp8::f16_shift, dtype.cuh): each warp stages its query
 *    times k_scale and a power of two that brings it into f16's range, and multiplies the logits
 *    by the inverse power. v_scale multiplies the output before OutputTransform (and so every
 *    split's partial, which the merge combines as it is).
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashgen/dtype.cuh"
#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"
#include "flashgen/params.cuh"
#include "flashgen/portable_tuning.cuh"
#include "flashgen/prefill_io.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"
#include "flashgen/prefill/hooks.cuh"
#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/prefill/mask.cuh"
#include "flashgen/prefill/rope.cuh"
#include "flashgen/prefill/scheduler.cuh"
#include "flashgen/prefill/smem.cuh"
#include "flashgen/prefill/traits.cuh"

namespace flashgen {
namespace prefill {

template <typename Variant, typename Params>
constexpr bool has_variant_mask() {
  return has_own_logits_mask<Variant, Params>();
}

/** Slope and origin of a row's linear logits bias (prefill/hooks.cuh LinearBias). */
struct RowBias {
  float slope;
  int32_t origin;
};

/**
 * The copies of one fp8 stage that this thread issued (Fp8PrefillTraits' layout), widened into a
 * 16-bit tile of kChunks chunks a row: 16 bytes into chunks 2c and 2c + 1 of the row. Threads
 * whose chunk has bit 2 set store chunk 2c + 1 first, so the eight threads of a store phase hit
 * eight distinct 16-byte bank groups.
 */
template <typename Traits, typename To, typename Fp8>
__device__ __forceinline__ void widen_own_copies(const uint8_t* stage, uint8_t* tile,
                                                 uint32_t tid) {
  constexpr int kChunks = Traits::kChunks;
  const uint32_t c = tid % Traits::kCopyChunks;
  const uint32_t row0 = tid / Traits::kCopyChunks;
  const uint32_t first = (c >> 2) & 1;
  // One copy at a time: unrolled, the loads hoisted ahead of the widening need registers the
  // kernel (at its 255) does not have, and ptxas spilled more (benches/ptxas_spills.py).
#pragma unroll 1
  for (int i = 0; i < Traits::kCopiesPerThread; ++i) {
    uint4 x = *reinterpret_cast<const uint4*>(stage + (i * Traits::kThreads + tid) * 16);
    if (first) x = make_uint4(x.z, x.w, x.x, x.y);  // the chunk's high half first
    uint4 a, b;
    fp8::widen4<To, Fp8>(x.x, a.x, a.y);
    fp8::widen4<To, Fp8>(x.y, a.z, a.w);
    fp8::widen4<To, Fp8>(x.z, b.x, b.y);
    fp8::widen4<To, Fp8>(x.w, b.z, b.w);
    const uint32_t row = row0 + i * Traits::kCopyRows;
    *reinterpret_cast<uint4*>(tile + swz<kChunks>(row, 2 * c + first)) = a;
    *reinterpret_cast<uint4*>(tile + swz<kChunks>(row, 2 * c + 1 - first)) = b;
  }
}

/**
 * The kernel. Params is one of the three prefill params structs; Sched maps block -> unit;
 * rope_k is the rotated-K workspace (POS == kPosRopeLlama), part the split partials.
 */
template <typename Traits, int MASK, int POS, int PAGE_SIZE, typename Variant, typename Params,
          typename Sched>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtas)
    prefill_kernel(const __grid_constant__ Params params, const Sched sched,
                   const typename Params::DTypeKV* __restrict__ rope_k, const Partials part) {
  using DTypeQ = typename Params::DTypeQ;
  using DTypeKV = typename Params::DTypeKV;
  using DTypeO = typename Params::DTypeO;
  constexpr bool kWiden = Traits::kWiden;
  static_assert(std::is_same<DTypeQ, DTypeKV>::value || (kWiden && is_fp8<DTypeKV>),
                "q and kv share one 16-bit dtype, or kv is an fp8 cache widened to f16");
  // The type of the tensor-core products (and of the staged query): the cache's, or f16 for a
  // widened fp8 cache.
  using DTypeMma = std::conditional_t<kWiden, half, DTypeKV>;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kChunks = Traits::kChunks;
  constexpr int kMmaQ = Traits::kMmaQ;
  constexpr int kNT = Traits::kNT;
  constexpr int kDT = Traits::kDT;
  constexpr int kTileKV = Traits::kTileKV;
  constexpr bool kSoftmax = Variant::use_softmax;
  constexpr bool kRope = POS == kPosRopeLlama;
  constexpr bool kVarMask = has_variant_mask<Variant, Params>();
  constexpr bool kLinearBias = has_linear_bias<Variant, Params>::value;
  constexpr bool kTanhCap = kSoftmax && has_tanh_cap<Variant, Params>::value;
  constexpr bool kVarLogits =
      has_own_logits_transform<Variant, Params>() && !kLinearBias && !kTanhCap;
  constexpr bool kBounds = uses_mask_bounds<Variant, Params>();
  constexpr bool kFixedMaxAble = kSoftmax && fixed_reference_able<Variant, Params, DTypeMma>();
  constexpr bool kWholeTiles = tuning::whole_tile_copies(kLinearBias, kTanhCap);

  extern __shared__ __align__(128) uint8_t smem[];
  ptx::wait_prerequisite_grid();  // prep / rope pre-pass (PDL on sm_90; no-op otherwise)
  ptx::launch_dependents();

  const uint32_t num_kv_heads = params.num_kv_heads;
  const uint32_t kv_head = blockIdx.x % num_kv_heads;
  const uint32_t unit = blockIdx.x / num_kv_heads;
  WorkUnit w;
  if (!sched.get(unit, w)) return;
  const RequestInfo rq = request_info(params, w.batch);
  const uint32_t G = params.num_qo_heads / num_kv_heads;
  const int32_t qo_len = int32_t(rq.qo_len), kv_len = int32_t(rq.kv_len);

  const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t group = lane >> 2, pair = lane & 3;
  const uint32_t mi = lane >> 3, r7 = lane & 7;

  uint8_t* variant_smem = smem;
  uint8_t* q_smem = smem + Traits::kVariantSmemBytes;
  uint8_t* kv_smem = q_smem + Traits::kQSmemBytes;
  const uint32_t q_addr = ptx::smem_addr(q_smem);
  const uint32_t k_addr = ptx::smem_addr(kv_smem);
  const uint32_t v_addr = k_addr + Traits::kStages * Traits::kStageTileBytes;
  // An fp8 cache: the 16-bit K and V tiles each thread widens its copies into, after the ring.
  uint8_t* widened = kv_smem + 2 * Traits::kStages * Traits::kStageTileBytes;
  const uint32_t widened_k = ptx::smem_addr(widened);
  const uint32_t widened_v = widened_k + Traits::kKVTileBytes;
  // Token of each packed row, written at the Q load (a warp reads only its own rows): the
  // masked tiles, the hooks and the epilogue read it instead of dividing by G (the head is
  // kv_head * G + p - token * G).
  int32_t* row_token = reinterpret_cast<int32_t*>(widened + Traits::kWidenedBytes);
  RowBias* row_bias = reinterpret_cast<RowBias*>(row_token + Traits::kTileQ);
  (void)row_bias;

  Variant variant(params, w.batch, variant_smem);

  // Packed rows of this CTA: p in [p0, p0 + kTileQ); token p / G, head kv_head * G + p % G.
  // (qo_len * G < 2^32: 32-bit packed indices and divisions.)
  const uint32_t p0 = w.tile * uint32_t(Traits::kTileQ);
  const int32_t first_token = int32_t(p0 / G);
  const int32_t last_token =
      int32_t(min(uint32_t(qo_len) * G - 1u, p0 + uint32_t(Traits::kTileQ) - 1u) / G);
  const uint32_t warp_row0 = warp * Traits::kWarpRows;

  // ---- kv tiles of this unit (mask.cuh; the variant by pointer: nvcc's front end takes a lambda
  // returning a reference capture for a reference to a local, warning #836)
  const UnitTiles tiles =
      unit_tiles<MASK, kTileKV>(params, w.batch, qo_len, kv_len, first_token, last_token, w.splits,
                                w.chunk, [v = &variant]() -> Variant& { return *v; });
  const int32_t kt_begin = tiles.begin, kt_end = tiles.end;
  const bool write_partial = w.splits > 1;

  const auto kv = make_kv<kD, PAGE_SIZE, kRope>(params, rq, kv_head, rope_k);

  // ---- K/V copies: thread copies chunk tid % kCopyChunks of rows tid / kCopyChunks + i *
  // kCopyRows (a chunk: 16 bytes, kCopyElems elements)
  constexpr int kCopyChunks = Traits::kCopyChunks;
  constexpr int kCopyElems = 16 / int(sizeof(DTypeKV));
  const uint32_t copy_chunk = tid % kCopyChunks;
  const uint32_t copy_row0 = tid / kCopyChunks;
  // Paged, tiles made of whole pages and pages of whole copy strides: a thread's rows
  // copy_row0 + i * kCopyRows fall in page i / kRowsPerPage of the tile at the same in-page row
  // for each i % kRowsPerPage, so it looks up kTileKV / PAGE_SIZE pages per tile (not one per
  // row) and forms addresses from loop-invariant row offsets.
  constexpr bool kPageFast = decltype(kv)::kPaged && kTileKV % PAGE_SIZE == 0 &&
                             PAGE_SIZE % Traits::kCopyRows == 0;
  constexpr int kRowsPerPage = kPageFast ? PAGE_SIZE / Traits::kCopyRows : 1;
  constexpr int kPagesPT = kPageFast ? kTileKV / PAGE_SIZE : Traits::kCopiesPerThread;
  int32_t pages[kPagesPT];
  // kPagesAtIssue: no page indices held in registers across the loop; the copies read them
  // when issued (L1 hits: a request's kv_indices are small and the K/V copies bypass L1), after
  // an L1 prefetch a tile ahead.
  constexpr bool kPagesAtIssue =
      kPageFast && tuning::page_index_at_issue(MASK == kMaskCausal, kVarLogits, kTanhCap);
  auto load_pages = [&](int32_t kt) {
    if constexpr (kPagesAtIssue) {
      if (kt < kt_end && kt * kTileKV < kv_len) {
        ptx::prefetch_l1(kv.pages + kt * (kTileKV / PAGE_SIZE));
      }
    } else if constexpr (kPageFast) {
#pragma unroll
      for (int j = 0; j < kPagesPT; ++j) {
        const int32_t pos = kt * kTileKV + j * PAGE_SIZE;
        pages[j] = (kt < kt_end && pos < kv_len) ? kv.page(uint32_t(pos)) : 0;
      }
    } else if constexpr (decltype(kv)::kPaged) {
      // Held in registers: reading each row's index at issue is slower.
#pragma unroll
      for (int i = 0; i < Traits::kCopiesPerThread; ++i) {
        const int32_t pos = kt * kTileKV + int32_t(copy_row0 + i * Traits::kCopyRows);
        pages[i] = (kt < kt_end && pos < kv_len) ? kv.page(uint32_t(pos)) : 0;
      }
    }
  };
  // Row i of a thread's copies is copy_row0 + i * kCopyRows (kCopyRows is a multiple of 8, so
  // every row has the XOR key copy_row0 & 7): destinations are constant offsets, and dense
  // sources advance by one 64-bit step (no per-row pointers held across the loop).
  // An fp8 stage: copy i of thread tid at (i * kThreads + tid) * 16 (Fp8PrefillTraits).
  const uint32_t copy_dst = kWiden ? tid * 16 : swz<kChunks>(copy_row0, copy_chunk);
  constexpr uint32_t kCopyStep = kWiden ? Traits::kThreads * 16 : Traits::kCopyRows * kChunks * 16;
  auto issue = [&](int32_t kt, bool is_v) {
    if (kt < kt_end) {
      const uint32_t stage = Traits::kStages == 1 ? 0u : uint32_t(kt & 1);
      const uint32_t dst0 = (is_v ? v_addr : k_addr) + stage * Traits::kStageTileBytes + copy_dst;
      const int32_t pos0 = kt * kTileKV + int32_t(copy_row0);
      // A tile wholly inside kv_len (all but the last) copies with no per-row checks: a
      // warp-uniform branch instead of a compare and two selects per 16-byte copy.
      const bool whole = kWholeTiles && kt * kTileKV + kTileKV <= kv_len;
      // Rows held densely at base + pos * stride: one 64-bit step per row.
      auto dense_copies = [&](const DTypeKV* rows, int64_t stride) {
        const DTypeKV* base = rows + copy_chunk * kCopyElems;
        const DTypeKV* src = base + int64_t(pos0) * stride;
        const int64_t step = int64_t(Traits::kCopyRows) * stride;
        if (whole) {
#pragma unroll
          for (int i = 0; i < Traits::kCopiesPerThread; ++i) {
            ptx::cp_async_16(dst0 + i * kCopyStep, src, 16u);
            src += step;
          }
        } else {
#pragma unroll
          for (int i = 0; i < Traits::kCopiesPerThread; ++i) {
            const bool valid = pos0 + i * Traits::kCopyRows < kv_len;
            ptx::cp_async_16(dst0 + i * kCopyStep, valid ? src : base,
                             valid ? 16u : 0u);
            src += step;
          }
        }
      };
      if constexpr (kPageFast) {
        if constexpr (decltype(kv)::kKDense) {
          // Rotated keys (RoPE) come from the dense workspace copy: the dense path's copies.
          if (!is_v) {
            dense_copies(kv.k_dense, kv.k_dense_stride);
            ptx::cp_async_commit();
            return;
          }
        }
        if constexpr (kPagesAtIssue) {
#pragma unroll
          for (int j = 0; j < kPagesPT; ++j) {
            const int32_t pos = kt * kTileKV + j * PAGE_SIZE;
            pages[j] = pos < kv_len ? kv.page(uint32_t(pos)) : 0;
          }
        }
        auto copies = [&](auto whole_tag) {
#pragma unroll
          for (int i = 0; i < Traits::kCopiesPerThread; ++i) {
            const int32_t pos = pos0 + i * Traits::kCopyRows;
            const bool valid = decltype(whole_tag)::value || pos < kv_len;
            const DTypeKV* src = kv.base + int64_t(pages[i / kRowsPerPage]) * kv.stride_page +
                                 (is_v ? kv.stride_kv : 0) +
                                 int64_t(copy_row0 + (i % kRowsPerPage) * Traits::kCopyRows) *
                                     kv.stride_n;
            ptx::cp_async_16(dst0 + i * kCopyStep, src + copy_chunk * kCopyElems,
                             valid ? 16u : 0u);
          }
        };
        if (whole) {
          copies(std::true_type{});
        } else {
          copies(std::false_type{});
        }
      } else if constexpr (decltype(kv)::kPaged) {
#pragma unroll
        for (int i = 0; i < Traits::kCopiesPerThread; ++i) {
          const int32_t pos = pos0 + i * Traits::kCopyRows;
          const bool valid = pos < kv_len;
          const uint32_t upos = valid ? uint32_t(pos) : 0u;
          const DTypeKV* src = is_v ? kv.v_row(pages[i], upos) : kv.k_row(pages[i], upos);
          ptx::cp_async_16(dst0 + i * kCopyStep, src + copy_chunk * kCopyElems,
                           valid ? 16u : 0u);
        }
      } else {
        dense_copies(is_v ? kv.v : kv.k, is_v ? kv.v_stride_n : kv.k_stride_n);
      }
    }
    ptx::cp_async_commit();
  };

  // Issue the first K/V copies before the Q load so the two latencies overlap.
  load_pages(kt_begin);
  issue(kt_begin, false);
  issue(kt_begin, true);
  load_pages(kt_begin + 1);

  // ---- Q: the warp's own rows, RoPE + QueryTransform in fp32, stored in the input dtype (an
  // fp8 cache: times k_scale * 2^shift, in f16; the logits are multiplied by logits_unshift).
  float q_scale = 1.f, logits_unshift = 1.f;
  (void)q_scale;
  (void)logits_unshift;
  {
    constexpr int kHalf = kChunks / 2;
    constexpr int kUnits = Traits::kWarpRows * kHalf;
    rope::LlamaRope rp;
    if constexpr (kRope) rp = rope::LlamaRope::make(params.rope_theta, params.rope_scale);
    if constexpr (kWiden) {
      // The warp's largest transformed query element (a first pass over its rows), for the
      // power of two that brings the query times k_scale into f16's range.
      float mx = 0.f;
#pragma unroll
      for (int it = 0; it < kUnits / 32; ++it) {
        const uint32_t idx = it * 32 + lane;
        const uint32_t p = p0 + warp_row0 + idx / kHalf;
        float lo[8], hi[8];
        load_query_chunks<kD, kRope>(params, variant, rq, qo_len, kv_len, int32_t(p / G),
                                     kv_head * G + p % G, idx % kHalf, rp, lo, hi);
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(fabsf(lo[j]), fabsf(hi[j])));
      }
      const fp8::F16Scales f = fp8::f16_scales(math::warp_max(mx), params.k_scale);
      q_scale = f.query;
      logits_unshift = f.logits;
    }
    // Fully unrolled: all of a lane's 16-byte loads are in flight at once.
#pragma unroll
    for (int it = 0; it < kUnits / 32; ++it) {
      const uint32_t idx = it * 32 + lane;
      const uint32_t r = warp_row0 + idx / kHalf;
      const uint32_t c = idx % kHalf;
      const uint32_t p = p0 + r;
      const int32_t token = int32_t(p / G);
      const uint32_t head = kv_head * G + p % G;
      if (c == 0) {
        row_token[r] = token;
        if constexpr (kLinearBias) {
          RowBias rb{0.f, 0};
          if (token < qo_len) {
            variant.LinearBias(params, w.batch, uint32_t(token), head, kv_head, rb.slope,
                               rb.origin);
          }
          row_bias[r] = rb;
        }
      }
      float lo[8], hi[8];
      load_query_chunks<kD, kRope>(params, variant, rq, qo_len, kv_len, token, head, c, rp, lo, hi);
      if constexpr (kWiden) {  // the logits of K = k_scale * stored, times 2^shift
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          lo[j] *= q_scale;
          hi[j] *= q_scale;
        }
      }
      *reinterpret_cast<uint4*>(q_smem + swz<kChunks>(r, c)) = pack8<DTypeMma>(lo);
      *reinterpret_cast<uint4*>(q_smem + swz<kChunks>(r, c + kHalf)) = pack8<DTypeMma>(hi);
    }
    __syncwarp();
  }

  // Packed row of this thread's fragment row (mq, h): p0 + warp_row0 + mq*16 + group + 8h.
  // Tokens (row_token) and heads are read where needed (masked tiles, hooks, epilogue) rather
  // than held in registers across the loop.

  float o[kMmaQ][kDT][4];
  float m[kMmaQ][2], l[kMmaQ][2];
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mq][dt][e] = 0.f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mq][h] = -math::inf;
      l[mq][h] = 0.f;
    }
  }

  // ldmatrix lane addresses. Logical chunk 2s + c0 of a lane's row r sits at physical chunk
  // 8 (s / 4) + ((2 (s % 4)) ^ (c0 ^ (r & 7))): one per-lane offset `rel` (row bytes + the
  // lane's XOR part), then `(rel ^ imm) + imm` per fragment. No per-k-step offsets are held in
  // registers (8 per operand make the loop spill).
  constexpr uint32_t kRowBytes = kChunks * 16;
  const uint32_t q_rel = (warp_row0 + (mi & 1) * 8 + r7) * kRowBytes + (((mi >> 1) ^ r7) << 4);
  const uint32_t k_rel = ((mi >> 1) * 8 + r7) * kRowBytes + (((mi & 1) ^ r7) << 4);
  const uint32_t v_rel = ((mi & 1) * 8 + r7) * kRowBytes + (((mi >> 1) ^ r7) << 4);
  auto frag = [](uint32_t base, uint32_t rel, int s) -> uint32_t {
    return base + (rel ^ uint32_t((2 * (s % 4)) << 4)) + uint32_t((s / 4) * 128);
  };

  // A fixed softmax reference (hooks.cuh): the tiles skip the running max and the rescale (a
  // warp-uniform branch: two copies of the loops spill).
  bool fixed_max = false;
  if constexpr (kFixedMaxAble) {
    float ref;
    fixed_max = fixed_reference(variant, params, ref);
    if (fixed_max) {
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) m[mq][0] = m[mq][1] = ref;
    }
  }

  // TanhCap: the logits transform is logit_scale * tanh.approx(s) when tanh_on (else the
  // identity, logit_scale 1); the kernel applies tanh itself and folds logit_scale into the
  // softmax FFMA and the row max.
  bool tanh_on = false;
  float logit_scale = 1.f;
  (void)tanh_on;
  (void)logit_scale;
  if constexpr (kTanhCap) tanh_on = tanh_cap(variant, params, logit_scale);

  auto step = [&](int32_t kt, auto mask_tag) {
    constexpr bool kMask = decltype(mask_tag)::value;
    constexpr bool kLead = std::is_same<decltype(mask_tag), LeadMaskTag>::value;
    const uint32_t stage = Traits::kStages == 1 ? 0u : uint32_t(kt & 1);
    // K_kt has landed (V_kt may still be in flight); with 2 stages this barrier also frees the
    // buffers of tile kt-1 for tile kt+1. An fp8 cache: this thread's copies of K_kt widened
    // first (every warp is done with the 16-bit K tile: it passed the V barrier of tile kt-1).
    ptx::cp_async_wait<1>();
    if constexpr (kWiden) {
      widen_own_copies<Traits, DTypeMma, DTypeKV>(kv_smem + stage * Traits::kStageTileBytes,
                                                  widened, tid);
    }
    __syncthreads();
    if constexpr (Traits::kStages == 2) issue(kt + 1, false);

    float s[kMmaQ][kNT][4];
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mq][nt][e] = 0.f;
      }
    }
    const uint32_t kb = kWiden ? widened_k : k_addr + stage * Traits::kKVTileBytes;
#pragma unroll
    for (int ks = 0; ks < Traits::kKSteps; ++ks) {
      uint32_t qa[kMmaQ][4];
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
        ptx::ldmatrix_x4(qa[mq], frag(q_addr + mq * 16 * kRowBytes, q_rel, ks));
      }
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, frag(kb + np * 16 * kRowBytes, k_rel, ks));
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
          ptx::mma_16816<DTypeMma>(s[mq][2 * np], qa[mq], b[0], b[1]);
          ptx::mma_16816<DTypeMma>(s[mq][2 * np + 1], qa[mq], b[2], b[3]);
        }
      }
    }
    if constexpr (kWiden) {  // the logits of the query before its power of two
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mq][nt][e] *= logits_unshift;
        }
      }
    }
    if constexpr (Traits::kStages == 1) {
      __syncthreads();  // every warp is done with the K buffer
      issue(kt + 1, false);
    }

    // ---- linear bias (LinearBias): s += slope * (kv - origin) as one FFMA per logit with the
    // column's constant offset; the row's part, slope * (kv0 - origin), is kept apart and folded
    // into the max and the exp2's reference (or added here without softmax).
    float row_base[kMmaQ][2];
    (void)row_base;
    if constexpr (kLinearBias) {
      const int32_t kv0 = kt * kTileKV + int32_t(2 * pair);
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const RowBias rb = row_bias[warp_row0 + mq * 16 + group + 8 * h];
          const float base = rb.slope * float(kv0 - rb.origin);
          row_base[mq][h] = base;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1) {
              float& x = s[mq][nt][2 * h + e1];
              x = fmaf(rb.slope, float(nt * 8 + e1), x);
              if constexpr (!kSoftmax) x += base;
            }
          }
        }
      }
    }

    // ---- tanh of TanhCap (its scale is applied in the softmax)
    if constexpr (kTanhCap) {
      if (tanh_on) {
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mq][nt][e] = math::ptx_tanh(s[mq][nt][e]);
          }
        }
      }
    }

    // ---- logits transform and masks
    if constexpr (kVarLogits || kMask) {
      const int32_t kv0 = kt * kTileKV + int32_t(2 * pair);
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t r = warp_row0 + mq * 16 + group + 8 * h;
          const int32_t token = row_token[r];
          const uint32_t qo_head = kv_head * G + (p0 + r) - uint32_t(token) * G;
          (void)qo_head;
          const int32_t diag = kv_len - qo_len + token;
          RowKeys keys{0, 0};
          (void)keys;
          if constexpr (kMask && kBounds) {
            keys = row_keys<MASK>(variant, params, w.batch, qo_len, kv_len, token);
          }
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1) {
              const int32_t kv_idx = kv0 + nt * 8 + e1;
              float x = s[mq][nt][2 * h + e1];
              bool keep = true;
              if constexpr (kMask && kBounds) {
                keep = row_keys_keep<kLead>(kv_idx, keys);
              } else if constexpr (kMask) {
                keep = mask_keep<MASK>(kv_idx, kv_len, diag);
                if constexpr (kVarMask) {
                  keep = keep && hooks::logits_mask(variant, params, w.batch, uint32_t(token),
                                                    uint32_t(kv_idx), qo_head, kv_head);
                }
              }
              if constexpr (kVarLogits) {
                if (keep) {
                  x = prefill::logits_transform(variant, params, x, w.batch, uint32_t(token),
                                              uint32_t(kv_idx), qo_head, kv_head);
                }
              }
              if constexpr (kMask) {
                x = keep ? x : (kSoftmax ? -math::inf : 0.f);
              }
              s[mq][nt][2 * h + e1] = x;
            }
          }
        }
      }
    }

    // ---- online softmax (base 2). m is the reference of O and l: raised lazily (threshold);
    // fixed (no max, no rescale) with a LogitsRange reference.
    if (kSoftmax && !fixed_max) {
      float tile_max[kMmaQ][2];
      bool need_rescale = false;
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = (kLinearBias || kTanhCap) ? -math::inf : m[mq][h];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            mx = fmaxf(mx, fmaxf(s[mq][nt][2 * h], s[mq][nt][2 * h + 1]));
          }
          if constexpr (kLinearBias) mx = fmaxf(mx + row_base[mq][h], m[mq][h]);
          if constexpr (kTanhCap) mx = fmaxf(mx * logit_scale, m[mq][h]);  // logit_scale > 0
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          tile_max[mq][h] = mx;
          need_rescale |= mx > m[mq][h] + tuning::kRescaleThreshold;
        }
      }
      // Warp-uniform: rescale O only when some row's max rose past the threshold.
      if (__any_sync(0xffffffffu, need_rescale)) {
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float mx = tile_max[mq][h];
            const float m_ref = lse::reference(mx);
            const float scale = math::ptx_exp2(m[mq][h] - m_ref);
            m[mq][h] = mx;
            l[mq][h] *= scale;
#pragma unroll
            for (int dt = 0; dt < kDT; ++dt) {
              o[mq][dt][2 * h] *= scale;
              o[mq][dt][2 * h + 1] *= scale;
            }
          }
        }
      }
    }
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kSoftmax) {
          float m_ref = lse::reference(m[mq][h]);
          if constexpr (kLinearBias) m_ref -= row_base[mq][h];
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1) {
              const float x = kTanhCap ? fmaf(s[mq][nt][2 * h + e1], logit_scale, -m_ref)
                                       : s[mq][nt][2 * h + e1] - m_ref;
              s[mq][nt][2 * h + e1] = math::ptx_exp2(x);
            }
            sum += s[mq][nt][2 * h] + s[mq][nt][2 * h + 1];
          }
          l[mq][h] += sum;
        } else {
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) sum += s[mq][nt][2 * h] + s[mq][nt][2 * h + 1];
          l[mq][h] += sum;
        }
      }
    }

    // P in the input dtype, packed now so the fp32 scores are dead before the PV loop.
    uint32_t pf[kMmaQ][kNT][2];
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        pf[mq][nt][0] = ptx::pack2<DTypeMma>(s[mq][nt][0], s[mq][nt][1]);
        pf[mq][nt][1] = ptx::pack2<DTypeMma>(s[mq][nt][2], s[mq][nt][3]);
      }
    }

    // ---- V_kt has landed (K_{kt+1} may be in flight); an fp8 cache: widened as K was (every
    // warp is done with the 16-bit V tile: it passed the K barrier of this tile)
    ptx::cp_async_wait<1>();
    if constexpr (kWiden) {
      widen_own_copies<Traits, DTypeMma, DTypeKV>(
          kv_smem + (Traits::kStages + stage) * Traits::kStageTileBytes,
          widened + Traits::kKVTileBytes, tid);
    }
    __syncthreads();
    if constexpr (Traits::kStages == 2) {
      issue(kt + 1, true);
      load_pages(kt + 2);
    }
    const uint32_t vb = kWiden ? widened_v : v_addr + stage * Traits::kKVTileBytes;
    // Warps with an all-zero P (causal) too: skipping them is slower.
#pragma unroll
    for (int ks = 0; ks < Traits::kPVSteps; ++ks) {
      uint32_t pa[kMmaQ][4];
#pragma unroll
      for (int mq = 0; mq < kMmaQ; ++mq) {
        pa[mq][0] = pf[mq][2 * ks][0];
        pa[mq][1] = pf[mq][2 * ks][1];
        pa[mq][2] = pf[mq][2 * ks + 1][0];
        pa[mq][3] = pf[mq][2 * ks + 1][1];
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, frag(vb + ks * 16 * kRowBytes, v_rel, dp));
#pragma unroll
        for (int mq = 0; mq < kMmaQ; ++mq) {
          ptx::mma_16816<DTypeMma>(o[mq][2 * dp], pa[mq], b[0], b[1]);
          ptx::mma_16816<DTypeMma>(o[mq][2 * dp + 1], pa[mq], b[2], b[3]);
        }
      }
    }
    if constexpr (Traits::kStages == 1) {
      __syncthreads();  // every warp is done with the V buffer
      issue(kt + 1, true);
      load_pages(kt + 2);
    }
  };

  // Tiles in order: [kt_begin, free_a) masked, each row's first key too (only with MaskBounds),
  // [free_a, free_b) mask-free, [free_b, kt_end) masked. Separate loops rather than one loop with a branch: the branch would
  // keep the masked body's values live across the hot loop (it spills).
  const int32_t free_a = tiles.free_a(), free_b = tiles.free_b();
  int32_t kt = kt_begin;
  if constexpr (kBounds) {
    for (; kt < free_a; ++kt) step(kt, LeadMaskTag{});
  }
  for (; kt < free_b; ++kt) step(kt, std::false_type{});
  for (; kt < kt_end; ++kt) step(kt, std::true_type{});
  ptx::cp_async_wait<0>();

  // ---- epilogue
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[mq][h] += __shfl_xor_sync(0xffffffffu, l[mq][h], 1);
      l[mq][h] += __shfl_xor_sync(0xffffffffu, l[mq][h], 2);
    }
  }
  if (write_partial) {
    // Slot `unit`: rows [kTileQ], fp32 (normalized for softmax), weight = base-2 LSE or sum.
    const int64_t slot_row0 = (int64_t(unit) * num_kv_heads + kv_head) * Traits::kTileQ;
#pragma unroll
    for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t r = warp_row0 + mq * 16 + group + 8 * h;
        const float lv = l[mq][h];
        float inv = lse::inverse<kSoftmax>(lv);
        if constexpr (kWiden) inv *= params.v_scale;  // V = v_scale * stored
        float* dst = part.o + (slot_row0 + r) * kD + 2 * pair;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          *reinterpret_cast<float2*>(dst + dt * 8) =
              make_float2(o[mq][dt][2 * h] * inv, o[mq][dt][2 * h + 1] * inv);
        }
        if (pair == 0) {
          part.lse[slot_row0 + r] =
              lse::weight<kSoftmax>(m[mq][h], lv);
        }
      }
    }
    return;
  }

  // A whole row: the variant's sink joins its denominator (a loop of its own, so that the
  // epilogue of a variant without one stays as it was).
  if constexpr (hooks::has_sink_logit<Variant, Params>::value) {
#pragma unroll
    for (int i = 0; i < 2 * kMmaQ; ++i) {  // the thread's rows (mq, h) = (i / 2, i % 2)
      const uint32_t r = warp_row0 + (i / 2) * 16 + group + 8 * (i % 2);
      const int32_t token = row_token[r];
      hooks::add_sink(variant, params, m[i / 2][i % 2], l[i / 2][i % 2], w.batch, uint32_t(token),
                      kv_head * G + (p0 + r) - uint32_t(token) * G);
    }
  }

  // Final output: normalized, OutputTransform, staged in this warp's Q rows (only this warp
  // reads them), then 16-byte stores.
#pragma unroll
  for (int mq = 0; mq < kMmaQ; ++mq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t r = warp_row0 + mq * 16 + group + 8 * h;
      const float lv = l[mq][h];
      float inv = lse::inverse<kSoftmax>(lv);
      if constexpr (kWiden) inv *= params.v_scale;  // V = v_scale * stored
      const int32_t token = row_token[r];
      const uint32_t qo_head = kv_head * G + (p0 + r) - uint32_t(token) * G;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        float y0 = o[mq][dt][2 * h] * inv, y1 = o[mq][dt][2 * h + 1] * inv;
        y0 = hooks::output_transform(variant, params, y0, w.batch, uint32_t(token), qo_head);
        y1 = hooks::output_transform(variant, params, y1, w.batch, uint32_t(token), qo_head);
        *reinterpret_cast<uint32_t*>(q_smem + swz<kChunks>(r, dt) + pair * 4) =
            ptx::pack2<DTypeO>(y0, y1);
      }
      if (pair == 0 && params.lse != nullptr && token < qo_len) {
        params.lse[(rq.q_row0 + token) * params.num_qo_heads + qo_head] =
            lse::natural<kSoftmax>(lse::weight<kSoftmax>(m[mq][h], lv));
      }
    }
  }
  __syncwarp();
#pragma unroll 4
  for (int it = 0; it < Traits::kWarpRows * kChunks / 32; ++it) {
    const uint32_t idx = it * 32 + lane;
    const uint32_t r = warp_row0 + idx / kChunks;
    const uint32_t c = idx % kChunks;
    const uint32_t p = p0 + r;
    const int32_t token = int32_t(p / G);
    if (token < qo_len) {
      const uint32_t head = kv_head * G + p % G;
      DTypeO* dst = params.o + (rq.q_row0 + token) * params.o_stride_n +
                    int64_t(head) * params.o_stride_h + c * 8;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(q_smem + swz<kChunks>(r, c));
    }
  }
}

}  // namespace prefill
}  // namespace flashgen
