/**
 * @brief The consumer warpgroups of the sm90 prefill kernel: warpgroup cw (0-based among the
 * consumers) owns packed query rows [64 cw, 64 cw + 64) of each block, and each thread two of
 * them (64 cw + 16 warp4 + lane / 4 + 8 h, h = 0, 1) in every accumulator.
 *
 *   run_consumer    the role: per block from the scheduler, the variant's per-block state,
 *                   stage_query, the per-row state, consume_tiles, then the epilogue
 *                   (epilogue.cuh: the row sums, a split unit's partials or the unit's output)
 *   stage_query     Q with RoPE and the QueryTransform, swizzled into shared memory
 *   consume_tiles   the mainloop over the block's kv tiles:
 *     iteration j (tile kt_j, buffers s_j): issue S_j = Q K_j^T; issue O += P_{j-1} V_{j-1};
 *     wait for S_j (K_j buffer freed); mask / LogitsTransform / online softmax of S_j (row max,
 *     exp2, row sums) while the P V runs; wait for the P V (V_{j-1} buffer freed); rescale O if
 *     the max rose past the threshold; P_j = S_j in the input dtype.
 *
 * The functions are __forceinline__ and keep the single-body kernel's code order, lambdas and
 * `#pragma unroll`s, so the SASS is that of the kernel written inline (benches/sass_identity.sh).
 * Two rules follow from how the compiler lays the inlined code out. A function's local arrays
 * are placed ahead of its caller's, which renumbers the registers and changes the SASS; so the
 * caller (run_consumer) declares every register array the mainloop works on and passes it by
 * reference. And a kernel local whose address was never taken stays a value (smem): taking its
 * address changed how the scheduler ring's address was folded.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashgen/lse.cuh"
#include "flashgen/math.cuh"
#include "flashgen/prefill_io.cuh"
#include "flashgen/ptx_sm80.cuh"
#include "flashgen/variant_hooks.cuh"
#include "flashgen/decode/query.cuh"
#include "flashgen/prefill/hooks.cuh"
#include "flashgen/prefill/kv_source.cuh"
#include "flashgen/prefill/mask.cuh"
#include "flashgen/prefill/rope.cuh"
#include "flashgen/prefill/scheduler.cuh"
#include "flashgen/hopper/mbarrier.cuh"
#include "flashgen/hopper/tuning.cuh"
#include "flashgen/hopper/wgmma.cuh"
#include "flashgen/hopper/prefill/epilogue.cuh"
#include "flashgen/hopper/prefill/scheduler.cuh"
#include "flashgen/hopper/prefill/storage.cuh"

namespace flashgen {
namespace hopper {

/** The products' type of an instance: the cache's, or f16 for a widened fp8 cache whatever q's
 *  type, as in the decode kernels: e4m3 widens to f16 in one instruction a pair and e5m2 in one
 *  byte permutation, where bf16 takes four (dtype.cuh), and P is finer in f16. The query is
 *  brought into f16's range by a power of two (stage_query) and the logits back by its inverse
 *  (consume_tiles). */
template <typename Params>
using MmaType = std::conditional_t<is_fp8<typename Params::DTypeKV>, half,
                                   typename Params::DTypeKV>;

/** Q: the warpgroup's 64 rows of the block (packed row p: token p / G, query head
 *  kv_head * G + p % G), RoPE + QueryTransform in fp32, stored 128-byte-swizzled in the Q
 *  buffer (smem); ctid: the thread within the warpgroup. Ends on the warpgroup's barrier.
 *  An fp8 cache: times its k_scale, so that the logits are those of K = k_scale * stored K, as
 *  the decode kernels define it, and times 2^shift, the power of two that puts the warpgroup's
 *  largest query element in [2^14, 2^15) (a first pass over the rows finds it), stored as f16;
 *  returns 2^-shift, which brings S back to the logits (1 for a 16-bit cache). */
template <typename Traits, bool kRope, typename Variant, typename Params>
__device__ __forceinline__ float stage_query(const Params& params, Variant& variant,
                                             uint8_t* smem, const prefill::RequestInfo& rq,
                                             int32_t qo_len, int32_t kv_len, uint32_t kv_head,
                                             uint32_t p0, uint32_t G, uint32_t cw,
                                             uint32_t ctid) {
  using DTypeMma = MmaType<Params>;  // the stored Q's type (q's, or f16 with an fp8 cache)
  constexpr int kD = Traits::kHeadDim;
  constexpr int kTileQ = Traits::kTileQ;
  constexpr int kHalf = kD / 16;  // 16-byte chunks per half row
  constexpr int kUnits = 64 * kHalf;
  rope::LlamaRope rp;
  if constexpr (kRope) rp = rope::LlamaRope::make(params.rope_theta, params.rope_scale);
  float q_scale = 1.f, unscale = 1.f;  // an fp8 cache: k_scale * 2^shift, 2^-shift
  if constexpr (Traits::kFp8) {
    float mx = 0.f;
#pragma unroll 1
    for (int it = 0; it < kUnits / 128; ++it) {
      const uint32_t idx = it * 128 + ctid;
      const uint32_t p = p0 + cw * 64 + idx / kHalf;
      const int32_t token = int32_t(p / G);
      float lo[8], hi[8];
      prefill::load_query_chunks<kD, kRope>(params, variant, rq, qo_len, kv_len, token,
                                            kv_head * G + p % G, idx % kHalf, rp, lo, hi);
#pragma unroll
      for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(fabsf(lo[j]), fabsf(hi[j])));
    }
    mx = math::warp_max(mx);
    float* const warp_maxes = reinterpret_cast<float*>(smem + Traits::kFp8ScratchOffset) + 4 * cw;
    if (ctid % 32 == 0) warp_maxes[ctid / 32] = mx;
    named_barrier(1 + cw, 128);
    mx = fmaxf(fmaxf(warp_maxes[0], warp_maxes[1]), fmaxf(warp_maxes[2], warp_maxes[3]));
    const fp8::F16Scales f = fp8::f16_scales(mx, params.k_scale);
    q_scale = f.query;
    unscale = f.logits;
  }
#pragma unroll
  for (int it = 0; it < kUnits / 128; ++it) {
    const uint32_t idx = it * 128 + ctid;
    const uint32_t r = cw * 64 + idx / kHalf;
    const uint32_t c = idx % kHalf;
    const uint32_t p = p0 + r;
    const int32_t token = int32_t(p / G);
    const uint32_t head = kv_head * G + p % G;
    float lo[8], hi[8];
    prefill::load_query_chunks<kD, kRope>(params, variant, rq, qo_len, kv_len, token, head, c,
                                          rp, lo, hi);
    if constexpr (Traits::kFp8) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        lo[j] *= q_scale;
        hi[j] *= q_scale;
      }
    }
    *reinterpret_cast<uint4*>(smem + sw128<kTileQ>(r, c)) = pack8<DTypeMma>(lo);
    *reinterpret_cast<uint4*>(smem + sw128<kTileQ>(r, c + kHalf)) = pack8<DTypeMma>(hi);
  }
  fence_proxy_async();
  named_barrier(1 + cw, 128);
  return unscale;
}

/** The mainloop of one block over its n_tiles kv tiles (from kt_begin; tiles in [free_a, free_b)
 *  need no mask): the wgmma issue of Q K^T and P V on the stages (sg), the ping-pong between
 *  consumer warpgroups, and the masks, logits hooks and online softmax of each S tile. g: the
 *  tiles this CTA consumed before the block (stage g % kStages, phase (g / kStages) & 1). In and
 *  out: o (zeroed by the caller), m, l; s, pr: the S tile and its packed P; scale0: tile 0's
 *  rescale factors. The caller owns these arrays (the file comment says why). The per-row inputs
 *  (tok, qo_head, slope, origin) and the variant's (tanh_on, logit_scale, fixed_max) come from
 *  run_consumer; unscale: an fp8 cache's 2^-shift (stage_query), by which S becomes the logits
 *  (folded into the exp2's FFMA and the row max, or applied first where a hook reads the
 *  logits). */
template <typename Traits, int MASK, int PAGE_SIZE, typename Variant, typename Params,
          typename Stages>
__device__ __forceinline__ void consume_tiles(
    const Params& params, Variant& variant, const prefill::WorkUnit& w, const Stages& sg,
    const uint32_t& q_addr, const uint32_t& cw, const uint32_t& lane, const uint32_t& quad,
    const int32_t (&tok)[2], const uint32_t (&qo_head)[2], const float (&slope)[2],
    const int32_t (&origin)[2], const bool& tanh_on, const float& logit_scale,
    const float& unscale, const bool& fixed_max, const int32_t& qo_len, const int32_t& kv_len,
    const uint32_t& kv_head, const int32_t& kt_begin, const int32_t& n_tiles,
    const int32_t& free_a, const int32_t& free_b, const uint32_t& g,
    float (&o)[Traits::kHeadDim / 2], float (&m)[2], float (&l)[2],
    float (&s)[Traits::kTileKV / 2], uint32_t (&pr)[Traits::kTileKV / 4], float (&scale0)[2]) {
  using DTypeMma = MmaType<Params>;
  using Mma = Wgmma<DTypeMma, Traits::kTileKV>;   // S = Q K^T: n = kv tile
  using MmaPV = Wgmma<DTypeMma, Traits::kHeadDim>;  // O += P V: n = head_dim
  constexpr int kD = Traits::kHeadDim;
  constexpr int kTileQ = Traits::kTileQ;
  constexpr int kTileKV = Traits::kTileKV;
  constexpr int kStages = Traits::kStages;
  constexpr int kS = kTileKV / 2;  // S floats per thread
  constexpr int kO = kD / 2;       // O floats per thread
  constexpr bool kSoftmax = Variant::use_softmax;
  // cp.async writes the stages (not with an fp8 cache: the widening warps fence their stores)
  constexpr bool kGather =
      PAGE_SIZE > 0 && !hopper_paged_tma<kTileKV, PAGE_SIZE>() && !Traits::kFp8;
  constexpr bool kVarMask = prefill::has_own_logits_mask<Variant, Params>();
  constexpr bool kBounds = prefill::uses_mask_bounds<Variant, Params>();
  constexpr bool kTanhCap = kSoftmax && prefill::has_tanh_cap<Variant, Params>::value;
  constexpr bool kLinearBias = prefill::has_linear_bias<Variant, Params>::value;
  constexpr bool kVarLogits =
      prefill::has_own_logits_transform<Variant, Params>() && !kTanhCap && !kLinearBias;
  // An fp8 cache's S is 2^shift times the logits: multiplied back first where a hook reads
  // them (tanh, the linear bias, a variant's transform, the sums without softmax); else folded
  // into the row max and the exp2's FFMA, as TanhCap's scale is.
  constexpr bool kUnscaleFirst =
      Traits::kFp8 && (kTanhCap || kLinearBias || kVarLogits || !kSoftmax);
  constexpr bool kUnscaleFolded = Traits::kFp8 && !kUnscaleFirst;
  // The leading run's tiles (before free_a; only with MaskBounds) also test each row's first key.
  using LeadTag = std::conditional_t<kBounds, prefill::LeadMaskTag, std::true_type>;
  auto& k_addr = sg.k_addr;
  auto& v_addr = sg.v_addr;
  auto& full_k = sg.full_k;
  auto& full_v = sg.full_v;
  auto& empty_k = sg.empty_k;
  auto& empty_v = sg.empty_v;
  // Q's descriptors (their low words: the high word is one constant). With MaskBounds, the
  // window's keys leave ptxas a few registers short and it rebuilt the eight descriptors on
  // every tile (32 instructions of the paged kernel's mask-free loop, 580 against default's
  // 548); an empty asm makes each word opaque, so it is computed once and held (540, no spills).
  uint32_t q_desc_lo[kD / 16];
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    q_desc_lo[ks] = uint32_t(desc_kmajor<kTileQ>(q_addr, ks, cw * 64));
    if constexpr (kBounds) asm volatile("" : "+r"(q_desc_lo[ks]));
  }
  const uint64_t q_desc_hi = desc_kmajor<kTileQ>(q_addr, 0, cw * 64) >> 32 << 32;
  auto issue_qk = [&](uint32_t st) {
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      Mma::ss(s, q_desc_hi | q_desc_lo[ks], desc_kmajor<kTileKV>(k_addr(st), ks, 0),
              ks > 0 ? 1u : 0u);
    }
    wg_commit();
  };
  auto issue_pv = [&](uint32_t st) {
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < kTileKV / 16; ++ks) {
      const uint32_t a[4] = {pr[4 * ks], pr[4 * ks + 1], pr[4 * ks + 2], pr[4 * ks + 3]};
      MmaPV::rs(o, a, desc_mnmajor<kTileKV>(v_addr(st), ks), 1u);
    }
    wg_commit();
  };
  // Ping-pong among the consumer warpgroups (FA3's warp scheduler barriers; traits say per
  // head_dim): a warpgroup issues its GEMMs of a step only after the previous one (cw - 1, in a
  // ring) has issued its own, so each warpgroup's softmax runs while the others' GEMMs occupy
  // the tensor cores. Named barrier kPingPongBarrier + cw is "warpgroup cw may issue"; each
  // issue step waits on its own and then arrives on the next warpgroup's. The last warpgroup
  // skips its last arrive and lets warpgroup 0 in first, so arrivals and waits pair up exactly
  // (all run the same number of steps).
  constexpr uint32_t kWGs = Traits::kConsumerWGs;
  auto pp_wait = [&]() {
    if constexpr (Traits::kPingPong) named_barrier(Traits::kPingPongBarrier + cw, 256);
  };
  auto pp_signal = [&](bool last) {
    if constexpr (Traits::kPingPong) {
      if (!(last && cw == kWGs - 1)) {
        named_barrier_arrive(Traits::kPingPongBarrier + (cw + 1) % kWGs, 256);
      }
    }
  };
  // Paged: the stage was written by cp.async (generic proxy) and is read by wgmma (async
  // proxy): a proxy fence after the barrier wait, before the reading wgmma is issued.
  auto wait_full = [&](uint32_t bar_addr, uint32_t parity) {
    mbar_wait(bar_addr, parity);
    if constexpr (kGather) fence_proxy_async();
  };
  auto release = [&](uint32_t b) {
    __syncwarp();
    if (lane == 0) mbar_arrive(b);
  };

  // Masks, LogitsTransform and the online softmax of S for tile kt; scale[h] is the factor O
  // must be multiplied by before P is added (applied by the caller once the P V in flight
  // completes).
  auto softmax_tile = [&](int32_t kt, auto mask_tag, float (&scale)[2]) {
    constexpr bool kMask = decltype(mask_tag)::value;
    constexpr bool kLead = std::is_same<decltype(mask_tag), prefill::LeadMaskTag>::value;
    const int32_t kv0 = kt * kTileKV + int32_t(2 * quad);  // this thread's first column
    (void)kv0;
    float row_base[2] = {0.f, 0.f};
    (void)row_base;
    if constexpr (kUnscaleFirst) {
#pragma unroll
      for (int i = 0; i < kS; ++i) s[i] *= unscale;
    }
    if constexpr (kLinearBias) {
#pragma unroll
      for (int h = 0; h < 2; ++h) row_base[h] = slope[h] * float(kv0 - origin[h]);
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        const int h = (i / 2) % 2;
        s[i] = fmaf(slope[h], float(8 * (i / 4) + (i % 2)), s[i]);
        if constexpr (!kSoftmax) s[i] += row_base[h];
      }
    }
    if constexpr (kTanhCap) {
      if (tanh_on) {
#pragma unroll
        for (int i = 0; i < kS; ++i) s[i] = math::ptx_tanh(s[i]);
      }
    }
    if constexpr (kVarLogits || kMask) {
      // MaskBounds: each row's keys (prefill/mask.cuh), per tile from tok rather than held
      // across the loop (two more registers there make ptxas rebuild Q's descriptors per tile),
      // relative to this thread's first column kv0.
      prefill::RowKeys keys[2] = {{0, 0}, {0, 0}};
      (void)keys;
      if constexpr (kMask && kBounds) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const prefill::RowKeys k =
              prefill::row_keys<MASK>(variant, params, w.batch, qo_len, kv_len, tok[h]);
          keys[h] = {k.first - kv0, k.last - kv0};
        }
      }
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        const int h = (i / 2) % 2;
        const int32_t kv_idx = kv0 + 8 * (i / 4) + (i % 2);
        float x = s[i];
        bool keep = true;
        if constexpr (kMask && kBounds) {
          keep = prefill::row_keys_keep<kLead>(8 * (i / 4) + (i % 2), keys[h]);
        } else if constexpr (kMask) {
          keep = prefill::mask_keep<MASK>(kv_idx, kv_len, kv_len - qo_len + tok[h]);
          if constexpr (kVarMask) {
            keep = keep && hooks::logits_mask(variant, params, w.batch, uint32_t(tok[h]),
                                              uint32_t(kv_idx), qo_head[h], kv_head);
          }
        }
        if constexpr (kVarLogits) {
          if (keep) {
            x = prefill::logits_transform(variant, params, x, w.batch, uint32_t(tok[h]),
                                          uint32_t(kv_idx), qo_head[h], kv_head);
          }
        }
        if constexpr (kMask) x = keep ? x : (kSoftmax ? -math::inf : 0.f);
        s[i] = x;
      }
    }
    if constexpr (kSoftmax) {
      // Row max and row sum, one dependent chain per row. With a fixed reference (LogitsRange)
      // there is no max and no rescale.
      scale[0] = scale[1] = 1.f;
      if (!fixed_max) {
        float mx[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mx[h] = (kTanhCap || kLinearBias || kUnscaleFolded) ? -math::inf : m[h];
        }
#pragma unroll
        for (int i = 0; i < kS; ++i) mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], s[i]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (kTanhCap) mx[h] = fmaxf(mx[h] * logit_scale, m[h]);  // logit_scale > 0
          if constexpr (kUnscaleFolded) mx[h] = fmaxf(mx[h] * unscale, m[h]);   // unscale > 0
          if constexpr (kLinearBias) mx[h] = fmaxf(mx[h] + row_base[h], m[h]);
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
          mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
          if (mx[h] > m[h] + kRescaleThreshold) {
            scale[h] = math::ptx_exp2(m[h] - mx[h]);  // 0 when m was -inf
            m[h] = mx[h];
          }
        }
      }
      float m_ref[2] = {lse::reference(m[0]), lse::reference(m[1])};
      if constexpr (kLinearBias) {
        m_ref[0] -= row_base[0];
        m_ref[1] -= row_base[1];
      }
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        const int h = (i / 2) % 2;
        const float x = kTanhCap         ? fmaf(s[i], logit_scale, -m_ref[h])
                        : kUnscaleFolded ? fmaf(s[i], unscale, -m_ref[h])
                                         : s[i] - m_ref[h];
        s[i] = math::ptx_exp2(x);
        sum[h] += s[i];
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) l[h] = l[h] * scale[h] + sum[h];
    } else {
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < kS; ++i) sum[(i / 2) % 2] += s[i];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[h] += sum[h];
        scale[h] = 1.f;
      }
    }
  };
  auto rescale_o = [&](const float (&scale)[2]) {
    if constexpr (kSoftmax) {
      if (scale[0] != 1.f || scale[1] != 1.f) {
#pragma unroll
        for (int i = 0; i < kO; ++i) o[i] *= scale[(i / 2) % 2];
      }
    }
  };
  auto pack_p = [&]() {
#pragma unroll
    for (int j = 0; j < kS / 4; ++j) {
      pr[2 * j] = ptx::pack2<DTypeMma>(s[4 * j], s[4 * j + 1]);
      pr[2 * j + 1] = ptx::pack2<DTypeMma>(s[4 * j + 2], s[4 * j + 3]);
    }
  };

  if (n_tiles > 0) {
    if constexpr (Traits::kPingPong) {
      if (cw == kWGs - 1) named_barrier_arrive(Traits::kPingPongBarrier, 256);
    }
    // ---- tile 0: S_0 only
    {
      pp_wait();
      wait_full(full_k(g % kStages), (g / kStages) & 1u);
      issue_qk(g % kStages);
      pp_signal(false);
      wg_wait<0>();
      fence_regs(s);
      release(empty_k(g % kStages));
      float (&scale)[2] = scale0;
      if (kt_begin >= free_a && kt_begin < free_b) {
        softmax_tile(kt_begin, std::false_type{}, scale);
      } else {
        softmax_tile(kt_begin, LeadTag{}, scale);
      }
      rescale_o(scale);
      pack_p();
    }
    // ---- tiles 1..n-1: S_j overlapped with P_{j-1} V_{j-1}
    auto step = [&](int32_t j, auto mask_tag) {
      const uint32_t gj = g + uint32_t(j);
      const uint32_t st = gj % kStages, ph = (gj / kStages) & 1u;
      const uint32_t sp = (gj - 1) % kStages, php = ((gj - 1) / kStages) & 1u;
      pp_wait();
      wait_full(full_k(st), ph);
      issue_qk(st);
      wait_full(full_v(sp), php);
      issue_pv(sp);
      pp_signal(false);
      wg_wait<1>();
      fence_regs(s);
      release(empty_k(st));
      float scale[2];
      softmax_tile(kt_begin + j, mask_tag, scale);
      wg_wait<0>();
      fence_regs(o);
      fence_regs(pr);
      release(empty_v(sp));
      rescale_o(scale);
      pack_p();
    };
    int32_t j = 1;
    for (; j < min(n_tiles, free_a - kt_begin); ++j) step(j, LeadTag{});
    for (; j < min(n_tiles, free_b - kt_begin); ++j) step(j, std::false_type{});
    for (; j < n_tiles; ++j) step(j, std::true_type{});
    // ---- last P V
    {
      const uint32_t gl = g + uint32_t(n_tiles) - 1u;
      const uint32_t sp = gl % kStages, php = (gl / kStages) & 1u;
      pp_wait();
      wait_full(full_v(sp), php);
      issue_pv(sp);
      pp_signal(true);
      wg_wait<0>();
      fence_regs(o);
      fence_regs(pr);
      release(empty_v(sp));
    }
  }
}

/** The consumer warpgroups' role (warpgroups 1.. of the CTA): for each block the scheduler hands
 *  out (next_block, the kernel's closure: the ring in the dynamic order, else the static order's
 *  plan), stage Q, run the mainloop over the block's kv tiles and write the block's output.
 *  sg: the stage buffers and barriers (the kernel's closures); q_addr: the Q buffer; smem: the
 *  CTA's aligned window (Q, then the stages); tid, wg: the thread and its warpgroup in the CTA.
 *  The kernel's other locals come by reference, smem by value (the file comment says why). */
template <typename Traits, int MASK, int POS, int PAGE_SIZE, bool kDynamic, typename Variant,
          typename Params, typename Stages, typename NextBlock>
__device__ __forceinline__ void run_consumer(const Params& params, const prefill::Partials& part,
                                             const uint32_t& num_blocks, uint8_t* smem,
                                             const uint32_t& q_addr, const Stages& sg,
                                             NextBlock& next_block, uint8_t* const& variant_smem,
                                             const uint32_t& G, const uint32_t& num_kv_heads,
                                             const uint32_t& tid, const uint32_t& wg) {
  using DTypeKV = typename Params::DTypeKV;
  using DTypeP = MmaType<Params>;  // P's type, the products'
  constexpr int kD = Traits::kHeadDim;
  constexpr int kS = Traits::kTileKV / 2;  // S floats per thread
  constexpr int kO = kD / 2;               // O floats per thread
  constexpr bool kSoftmax = Variant::use_softmax;
  constexpr bool kRope = POS == prefill::kPosRopeLlama;
  // TanhCap (prefill/hooks.cuh): the transform is scale * tanh.approx(s) when the variant says
  // so; the mainloop applies tanh itself and folds the scale into the exp2's FFMA and the row
  // max, as the portable kernel does (no FMUL and no select per logit).
  constexpr bool kTanhCap = kSoftmax && prefill::has_tanh_cap<Variant, Params>::value;
  // LinearBias (prefill/hooks.cuh, ALiBi): s + slope * (kv - origin) as one FFMA per logit
  // with the column's constant offset; the row's part of a tile, slope * (kv0 - origin), is kept
  // apart and folded into the row max and the exp2's reference, as the portable kernel does.
  constexpr bool kLinearBias = prefill::has_linear_bias<Variant, Params>::value;
  constexpr bool kFixedMaxAble =
      kSoftmax && prefill::fixed_reference_able<Variant, Params, DTypeP>();
  setmaxnreg_inc<Traits::kConsumerRegs>();
  const uint32_t cw = wg - 1;            // consumer warpgroup: rows [64 cw, 64 cw + 64)
  const uint32_t ctid = tid - 128 * wg;  // thread within the warpgroup
  const uint32_t lane = tid & 31, warp4 = ctid / 32;
  uint32_t g = 0;  // tiles consumed so far by this CTA (the producer's counter)

  for (uint32_t round = 0; kDynamic || round * gridDim.x < num_blocks; ++round) {
    HopperBlock b;
    if (!next_block(round, 0xffffffffu, b)) {
      if constexpr (kDynamic) break; else continue;
    }
    const prefill::WorkUnit w = b.w;
    const prefill::RequestInfo rq = b.rq;
    const uint32_t kv_head = b.kv_head, unit = b.unit, p0 = b.p0;
    const int32_t qo_len = b.qo_len, kv_len = b.kv_len, kt_begin = b.kt_begin;
    const int32_t n_tiles = b.n_tiles, free_a = b.free_a, free_b = b.free_b;
    Variant variant(params, w.batch, variant_smem);
    bool tanh_on = false;  // TanhCap: apply tanh, then logit_scale inside the softmax
    float logit_scale = 1.f;
    (void)tanh_on;
    (void)logit_scale;
    if constexpr (kTanhCap) tanh_on = prefill::tanh_cap(variant, params, logit_scale);
    // A fixed softmax reference (prefill/hooks.cuh): the tiles skip the row max and the rescale.
    bool fixed_max = false;
    float fixed_ref = 0.f;
    if constexpr (kFixedMaxAble) fixed_max = prefill::fixed_reference(variant, params, fixed_ref);
    named_barrier(1 + cw, 128);  // the previous block's epilogue has read its O from shared memory

    const float unscale = stage_query<Traits, kRope>(params, variant, smem, rq, qo_len, kv_len,
                                                     kv_head, p0, G, cw, ctid);

    // This thread's two rows (h = 0, 1) of every accumulator: r = 64 cw + 16 warp4 + lane/4 + 8h.
    int32_t tok[2];
    uint32_t qo_head[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t p = p0 + cw * 64 + warp4 * 16 + lane / 4 + 8 * h;
      tok[h] = int32_t(p / G);
      qo_head[h] = kv_head * G + p - uint32_t(tok[h]) * G;
    }
    const uint32_t quad = lane % 4;
    float slope[2] = {0.f, 0.f};  // LinearBias, per row (0 for rows past qo_len)
    int32_t origin[2] = {0, 0};
    (void)slope;
    (void)origin;
    if constexpr (kLinearBias) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (tok[h] < qo_len) {
          variant.LinearBias(params, w.batch, uint32_t(tok[h]), qo_head[h], kv_head, slope[h],
                             origin[h]);
        }
      }
    }

    // The mainloop's registers: O, the row max and sum, the S tile, its packed P, tile 0's
    // rescale factors. Declared here, not in consume_tiles (the file comment says why).
    float o[kO];
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
    float m[2] = {-math::inf, -math::inf}, l[2] = {0.f, 0.f};
    if (fixed_max) m[0] = m[1] = fixed_ref;
    float s[kS];
    uint32_t pr[kS / 2];
    float scale0[2];
    consume_tiles<Traits, MASK, PAGE_SIZE>(params, variant, w, sg, q_addr, cw, lane, quad, tok,
                                           qo_head, slope, origin, tanh_on, logit_scale,
                                           unscale, fixed_max, qo_len, kv_len, kv_head,
                                           kt_begin, n_tiles, free_a, free_b, g, o, m, l, s, pr,
                                           scale0);

    g += uint32_t(n_tiles);
    if constexpr (is_fp8<DTypeKV>) {  // V = v_scale * stored V: the output and the partials
#pragma unroll
      for (int i = 0; i < kO; ++i) o[i] *= params.v_scale;
    }

    // ---- epilogue: the row sums; a split unit's partials (epilogue.cuh); else the variant's
    // sink, O / l, OutputTransform, staged in this warpgroup's Q rows, 16-byte stores.
    reduce_row_sums(l);
    if (w.splits > 1) {
      store_partials<Traits, kSoftmax>(part, unit, kv_head, num_kv_heads, cw, warp4, lane, quad, o,
                                       m, l);
      continue;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // a whole row: the variant's sink joins its denominator
      hooks::add_sink(variant, params, m[h], l[h], w.batch, uint32_t(tok[h]), qo_head[h]);
    }
    store_output<Traits, kSoftmax>(params, variant, smem, w, rq, o, m, l, tok, qo_head, qo_len, p0,
                                   G, kv_head, cw, warp4, lane, quad, ctid);
  }  // blocks
}

}  // namespace hopper
}  // namespace flashgen
