/**
 * The pieces the prefill harnesses share (prefill_harness.cu, the portable kernels;
 * hopper_paged_harness.cu, the Hopper paged kernels and graph replay) beyond harness_base.cuh
 * (the instance macros and the CUDA check macro): the prefill includes, the random inputs and
 * poisoning, the independent fp32 reference on the GPU, the checks with their tolerances, and
 * the Problem builder (single, ragged and paged inputs, shuffled pages, NHD or HND, empty
 * requests, RoPE offsets). Each harness adds its own kernel calls, cases and benchmarks.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness_base.cuh"
#include "flashgen/prefill/launch.cuh"

static int g_failures = 0;

enum Kind { kSingle = 0, kRagged = 1, kPaged = 2 };

// ---------------------------------------------------------------- host helpers

template <typename T>
T to_t(float x);
template <>
bf16 to_t<bf16>(float x) { return __float2bfloat16(x); }
template <>
half to_t<half>(float x) { return __float2half(x); }
static float to_fl(bf16 x) { return __bfloat162float(x); }
static float to_fl(half x) { return __half2float(x); }

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) { alloc(count); }
  void alloc(size_t count) {
    n = count;
    CK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  }
  void up(const std::vector<T>& h) {
    if (h.size() > n) { std::fprintf(stderr, "upload too large\n"); std::exit(1); }
    if (!h.empty()) CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> down() const {
    std::vector<T> h(n);
    if (n) CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// ---------------------------------------------------------------- reference (fp32, naive)
struct RefArgs {
  const void* q;         // logical [total_q][Hq][D]
  const float* k_rot;    // [total_kv][Hkv][D], already rotated when rope
  const void* v;         // logical [total_kv][Hkv][D]
  const int* qo_indptr;  // [B+1]
  const int* kv_indptr;  // [B+1] (logical rows)
  const int* req_of_token;
  const int* q_off;      // [B] (zeros when none)
  int Hq, Hkv, total_q, causal, rope;
  float rope_theta, rope_scale;
  float* o;
  float* lse;
  float* n_eff;  // (sum w)^2 / sum w^2 per (query, head): the effective number of keys
};

__device__ double ref_freq(int i, int D, double theta, double scale) {
  return 1.0 / (pow(theta, 2.0 * i / D) * scale);
}

template <int D, typename T>
__global__ void ref_rope_k(const T* k, const int* req_of_row, const int* kv_indptr,
                           const int* kv_off, int rows, int Hkv, int rope, float theta,
                           float scale, float* out) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= rows * Hkv) return;
  const int row = idx / Hkv;
  const T* src = k + int64_t(idx) * D;
  float* dst = out + int64_t(idx) * D;
  if (!rope) {
    for (int d = 0; d < D; ++d) dst[d] = float(src[d]);
    return;
  }
  const int b = req_of_row[row];
  const double pos = double(row - kv_indptr[b] + kv_off[b]);
  for (int i = 0; i < D / 2; ++i) {
    const double a = pos * ref_freq(i, D, theta, scale);
    const double c = cos(a), s = sin(a);
    const double x = float(src[i]), y = float(src[i + D / 2]);
    dst[i] = float(x * c - y * s);
    dst[i + D / 2] = float(y * c + x * s);
  }
}

template <int D, typename T, typename Variant, typename Params>
__global__ void ref_attention(const Params params, RefArgs a) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= a.total_q * a.Hq) return;
  const int t = idx / a.Hq, hq = idx % a.Hq;
  const int hk = hq / (a.Hq / a.Hkv);
  const int b = a.req_of_token[t];
  const int i = t - a.qo_indptr[b];
  const int qo_len = a.qo_indptr[b + 1] - a.qo_indptr[b];
  const int kv_len = a.kv_indptr[b + 1] - a.kv_indptr[b];
  __shared__ uint8_t vsmem[256];
  Variant var(params, uint32_t(b), vsmem);
  float qf[D];
  const T* q = static_cast<const T*>(a.q) + int64_t(idx) * D;
  for (int d = 0; d < D; ++d) qf[d] = float(q[d]);
  if (a.rope) {
    const double pos = double(kv_len - qo_len + i + a.q_off[b]);
    for (int p = 0; p < D / 2; ++p) {
      const double ang = pos * ref_freq(p, D, a.rope_theta, a.rope_scale);
      const double c = cos(ang), s = sin(ang);
      const double x = qf[p], y = qf[p + D / 2];
      qf[p] = float(x * c - y * s);
      qf[p + D / 2] = float(y * c + x * s);
    }
  }
  for (int d = 0; d < D; ++d) qf[d] = hooks::query_transform(var, params, qf[d]);
  float acc[D];
  for (int d = 0; d < D; ++d) acc[d] = 0.f;
  float m = -INFINITY, l = 0.f, l2 = 0.f;  // l2: sum of squared weights (same reference as l)
  const T* v = static_cast<const T*>(a.v);
  for (int j = 0; j < kv_len; ++j) {
    const int64_t row = int64_t(a.kv_indptr[b] + j) * a.Hkv + hk;
    if (a.causal && j > kv_len - qo_len + i) continue;
    if (!hooks::logits_mask(var, params, uint32_t(b), uint32_t(i), uint32_t(j), uint32_t(hq),
                            uint32_t(hk))) {
      continue;
    }
    const float* kr = a.k_rot + row * D;
    float s = 0.f;
    for (int d = 0; d < D; ++d) s += qf[d] * kr[d];
    s = hooks::logits_transform(var, params, s, uint32_t(b), uint32_t(i), uint32_t(j),
                                uint32_t(hq), uint32_t(hk));
    const T* vr = v + row * D;
    if (Variant::use_softmax) {
      const float mn = fmaxf(m, s);
      const float sc = exp2f(m - mn);
      const float p = exp2f(s - mn);
      l = l * sc + p;
      l2 = l2 * sc * sc + p * p;
      for (int d = 0; d < D; ++d) acc[d] = acc[d] * sc + p * float(vr[d]);
      m = mn;
    } else {
      l += s;
      l2 += s * s;
      for (int d = 0; d < D; ++d) acc[d] += s * float(vr[d]);
    }
  }
  float* o = a.o + int64_t(idx) * D;
  for (int d = 0; d < D; ++d) {
    float x = Variant::use_softmax ? (l > 0.f ? acc[d] / l : 0.f) : acc[d];
    o[d] = hooks::output_transform(var, params, x, uint32_t(b), uint32_t(i), uint32_t(hq));
  }
  a.lse[idx] = Variant::use_softmax ? (l > 0.f ? (m + log2f(l)) * 0.69314718055994531f : -INFINITY)
                                    : logf(l);
  a.n_eff[idx] = l2 > 0.f ? l * l / l2 : 0.f;
}

// ---------------------------------------------------------------- a test case
struct Spec {
  std::string name;
  int Hq, Hkv;
  std::vector<int> qo, kv;  // per request (single: one)
  bool hnd = false;         // single: k/v HND; paged: [pages][2][Hkv][P][D]
  std::vector<int> qo2, kv2;  // graph: replay lengths (same batch, same sum of qo, kv <= cap)
  bool offsets = false;       // rope offsets per request
  float rope_theta = 1e4f, rope_scale = 1.f;
  uint64_t seed = 1;
  float soft_cap = 5.f, sigmoid_bias = -1.f;  // the variants' parameters
};

struct Lengths {
  std::vector<int> qo_indptr, kv_indptr, req_of_token, req_of_kvrow;
  int total_q = 0, total_kv = 0;
};

static Lengths make_lengths(const std::vector<int>& qo, const std::vector<int>& kv) {
  Lengths L;
  const int B = int(qo.size());
  L.qo_indptr.assign(B + 1, 0);
  L.kv_indptr.assign(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    L.qo_indptr[b + 1] = L.qo_indptr[b] + qo[b];
    L.kv_indptr[b + 1] = L.kv_indptr[b] + kv[b];
    for (int i = 0; i < qo[b]; ++i) L.req_of_token.push_back(b);
    for (int j = 0; j < kv[b]; ++j) L.req_of_kvrow.push_back(b);
  }
  L.total_q = L.qo_indptr[B];
  L.total_kv = L.kv_indptr[B];
  return L;
}

template <typename T>
static std::vector<T> rand_vec(size_t n, Rng& r, float amp) {
  std::vector<T> h(n);
  for (auto& x : h) {
    float f = r.uni() * amp;
    if (f == 0.f) f = 0.01f;
    x = to_t<T>(f);
  }
  return h;
}

struct Errors {
  double rel, max_abs, lse_err;
  bool nan, inf_mismatch;
  double row_u = 0, lse_ratio = 0;  // per-row bounds of test_prefill_gpu.py (see the top)
  bool dead_row_bad = false;        // a row that sees no key has o != 0
};

template <typename T>
static Errors compare(const std::vector<T>& o, const std::vector<float>& oref,
                      const std::vector<float>& lse, const std::vector<float>& lref,
                      const std::vector<float>& n_eff, int D, double u) {
  Errors e{0, 0, 0, false, false};
  for (size_t row = 0; row < lref.size(); ++row) {
    double num = 0, den = 0, amax = 0;
    for (int d = 0; d < D; ++d) {
      const double x = to_fl(o[row * D + d]), y = oref[row * D + d];
      num += (x - y) * (x - y);
      den += y * y;
      amax = std::max(amax, std::fabs(x));
    }
    if (std::isinf(lref[row]) && lref[row] < 0) {
      if (amax != 0.0) e.dead_row_bad = true;
      continue;
    }
    e.row_u = std::max(e.row_u, std::sqrt(num / std::max(den, 1e-60)) / u);
    if (!std::isinf(lse[row]) && !std::isnan(lse[row])) {
      const double bound = 0.5 * u + 4.0 * u / std::sqrt(std::max<double>(n_eff[row], 1.0));
      e.lse_ratio = std::max(e.lse_ratio, std::fabs(double(lse[row]) - lref[row]) / bound);
    }
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < oref.size(); ++i) {
    const double x = to_fl(o[i]);
    if (std::isnan(x) || std::isinf(x)) e.nan = true;
    const double d = x - oref[i];
    num += d * d;
    den += double(oref[i]) * oref[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  e.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  for (size_t i = 0; i < lref.size(); ++i) {
    if (std::isnan(lse[i])) { e.nan = true; continue; }
    if (std::isinf(lref[i]) || std::isinf(lse[i])) {
      if (lref[i] != lse[i]) e.inf_mismatch = true;
      continue;
    }
    e.lse_err = std::max(e.lse_err, double(std::fabs(lse[i] - lref[i])));
  }
  return e;
}

template <Kind K, typename T, int PAGE>
struct ParamsOf;
template <typename T, int P>
struct ParamsOf<kSingle, T, P> { using type = SinglePrefillParams<T, T, T>; };
template <typename T, int P>
struct ParamsOf<kRagged, T, P> { using type = BatchPrefillRaggedParams<T, T, T>; };
template <typename T, int P>
struct ParamsOf<kPaged, T, P> { using type = BatchPrefillPagedParams<T, T, T>; };

/** Everything one case needs on the device; rebuilt for new lengths (graph replay). */
template <Kind K, typename T, int D, int PAGE>
struct Problem {
  using Params = typename ParamsOf<K, T, PAGE>::type;
  Spec spec;
  int B;
  Lengths L;
  int q_cap, kv_cap;  // rows allocated for q and k/v (graph: the max over both length sets)
  // logical data (reference)
  std::vector<T> q_h, k_h, v_h;
  DevBuf<T> q, k_log, v_log;     // logical [rows][H][D]
  DevBuf<T> k_in, v_in;          // kernel layout (single HND) or the page cache
  DevBuf<T> o;
  DevBuf<float> lse, o_ref, lse_ref, k_rot, n_eff;
  DevBuf<int> qo_indptr, kv_indptr, kv_indices, kv_last, q_off, kv_off, req_tok, req_kv;
  DevBuf<int> ref_kv_indptr, ref_q_off;
  DevBuf<float> slopes;
  int num_pages = 0, num_page_entries = 0;
  std::vector<int> page_perm;
  Params p{};

  void build(const Spec& s, Rng& r, bool first) {
    spec = s;
    B = int(s.qo.size());
    L = make_lengths(s.qo, s.kv);
    const int Hq = s.Hq, Hkv = s.Hkv;
    if (first) {
      q_cap = L.total_q;
      kv_cap = L.total_kv;
      if (!s.qo2.empty()) {
        Lengths L2 = make_lengths(s.qo2, s.kv2);
        q_cap = std::max(q_cap, L2.total_q);
        kv_cap = std::max(kv_cap, L2.total_kv);
      }
      q_h = rand_vec<T>(size_t(q_cap) * Hq * D, r, 2.f);
      k_h = rand_vec<T>(size_t(kv_cap) * Hkv * D, r, 2.f);
      v_h = rand_vec<T>(size_t(kv_cap) * Hkv * D, r, 1.f);
      q.alloc(q_h.size());
      q.up(q_h);
      k_log.alloc(k_h.size());
      v_log.alloc(v_h.size());
      o.alloc(q_h.size());
      lse.alloc(size_t(q_cap) * Hq);
      o_ref.alloc(q_h.size());
      lse_ref.alloc(size_t(q_cap) * Hq);
      n_eff.alloc(size_t(q_cap) * Hq);
      k_rot.alloc(k_h.size());
      qo_indptr.alloc(B + 1);
      kv_indptr.alloc(B + 1);
      ref_kv_indptr.alloc(B + 1);
      q_off.alloc(B);
      kv_off.alloc(B);
      ref_q_off.alloc(B);
      kv_last.alloc(B);
      req_tok.alloc(std::max(q_cap, 1));
      req_kv.alloc(std::max(kv_cap, 1));
      std::vector<float> sl(Hq);
      for (int h = 0; h < Hq; ++h) sl[h] = std::pow(2.f, -8.f * (h + 1) / Hq);
      slopes.alloc(Hq);
      slopes.up(sl);
      if (K == kPaged) {
        // page table capacity: every page of both length sets plus a few unused pages
        int pages_needed = 0, pages2 = 0;
        for (int x : s.kv) pages_needed += (x + PAGE - 1) / PAGE;
        for (int x : s.kv2) pages2 += (x + PAGE - 1) / PAGE;
        num_page_entries = std::max(pages_needed, pages2);
        num_pages = num_page_entries + 3;
        const size_t page_elems = size_t(2) * PAGE * Hkv * D;
        std::vector<T> cache = rand_vec<T>(page_elems * num_pages, r, 2.f);
        k_in.alloc(cache.size());
        k_in.up(cache);
        kv_indices.alloc(std::max(num_page_entries, 1));
        // the cache is the truth for paged: the logical k/v are gathered from it below
        cache_h = std::move(cache);
      } else {
        k_log.up(k_h);
        v_log.up(v_h);
        if (K == kSingle && s.hnd) {
          const int n = kv_cap;
          std::vector<T> kh(k_h.size()), vh(v_h.size());
          for (int j = 0; j < n; ++j)
            for (int h = 0; h < Hkv; ++h)
              for (int d = 0; d < D; ++d) {
                kh[(size_t(h) * n + j) * D + d] = k_h[(size_t(j) * Hkv + h) * D + d];
                vh[(size_t(h) * n + j) * D + d] = v_h[(size_t(j) * Hkv + h) * D + d];
              }
          k_in.alloc(kh.size());
          v_in.alloc(vh.size());
          k_in.up(kh);
          v_in.up(vh);
        }
      }
    }
    // lengths and offsets
    qo_indptr.up(L.qo_indptr);
    kv_indptr.up(L.kv_indptr);
    ref_kv_indptr.up(L.kv_indptr);
    std::vector<int> qoff(B, 0), kvoff(B, 0);
    if (s.offsets) {
      for (int b = 0; b < B; ++b) {
        qoff[b] = r.below(300);
        kvoff[b] = r.below(300);
      }
    }
    q_off.up(qoff);
    kv_off.up(kvoff);
    req_tok.up(L.req_of_token);
    req_kv.up(L.req_of_kvrow);
    if (K == kPaged) {
      const int Hkv_ = Hkv;
      std::vector<int> perm(num_pages);
      for (int i = 0; i < num_pages; ++i) perm[i] = i;
      for (int i = num_pages - 1; i > 0; --i) std::swap(perm[i], perm[r.below(i + 1)]);
      std::vector<int> indptr(B + 1, 0), indices, last(B, 0);
      for (int b = 0; b < B; ++b) {
        const int np = (s.kv[b] + PAGE - 1) / PAGE;
        for (int i = 0; i < np; ++i) indices.push_back(perm[indices.size()]);
        indptr[b + 1] = int(indices.size());
        last[b] = np > 0 ? s.kv[b] - (np - 1) * PAGE : 0;
      }
      indices.resize(std::max<size_t>(indices.size(), size_t(num_page_entries)), 0);
      kv_indptr.up(indptr);
      kv_indices.up(indices);
      kv_last.up(last);
      // gather the logical k/v of these lengths from the cache
      std::vector<T> kl(size_t(kv_cap) * Hkv_ * D, to_t<T>(0.5f)), vl = kl;
      for (int b = 0; b < B; ++b) {
        for (int j = 0; j < s.kv[b]; ++j) {
          const int page = indices[indptr[b] + j / PAGE], off = j % PAGE;
          for (int h = 0; h < Hkv_; ++h) {
            const size_t lrow = (size_t(L.kv_indptr[b] + j) * Hkv_ + h) * D;
            for (int d = 0; d < D; ++d) {
              kl[lrow + d] = cache_h[cache_index(page, 0, off, h, d)];
              vl[lrow + d] = cache_h[cache_index(page, 1, off, h, d)];
            }
          }
        }
      }
      k_log.up(kl);
      v_log.up(vl);
    }
    fill_params();
  }

  std::vector<T> cache_h;
  size_t cache_index(int page, int kv, int off, int h, int d) const {
    const int Hkv = spec.Hkv;
    if (spec.hnd) return ((((size_t(page) * 2 + kv) * Hkv + h) * PAGE + off) * D + d);
    return ((((size_t(page) * 2 + kv) * PAGE + off) * Hkv + h) * D + d);
  }

  void fill_params() {
    const int Hq = spec.Hq, Hkv = spec.Hkv;
    Params P{};
    P.logits_soft_cap = spec.soft_cap;
    P.window_left = 37;
    P.alibi_slopes = slopes.p;
    P.sigmoid_bias = spec.sigmoid_bias;
    P.sm_scale = 1.f / std::sqrt(float(D));
    P.rope_theta = spec.rope_theta;
    P.rope_scale = spec.rope_scale;
    P.q = q.p;
    P.o = o.p;
    P.lse = lse.p;
    P.q_stride_n = int64_t(Hq) * D;
    P.q_stride_h = D;
    P.o_stride_n = int64_t(Hq) * D;
    P.o_stride_h = D;
    P.num_qo_heads = Hq;
    P.num_kv_heads = Hkv;
    if constexpr (K == kSingle) {
      P.qo_len = L.total_q;
      P.kv_len = L.total_kv;
      if (spec.hnd) {
        P.k = k_in.p;
        P.v = v_in.p;
        P.k_stride_h = int64_t(kv_cap) * D;
        P.k_stride_n = D;
        P.v_stride_h = int64_t(kv_cap) * D;
        P.v_stride_n = D;
      } else {
        P.k = k_log.p;
        P.v = v_log.p;
        P.k_stride_n = P.v_stride_n = int64_t(Hkv) * D;
        P.k_stride_h = P.v_stride_h = D;
      }
    } else if constexpr (K == kRagged) {
      P.k = k_log.p;
      P.v = v_log.p;
      P.k_stride_n = P.v_stride_n = int64_t(Hkv) * D;
      P.k_stride_h = P.v_stride_h = D;
      P.qo_indptr = qo_indptr.p;
      P.kv_indptr = kv_indptr.p;
      P.q_rope_offset = spec.offsets ? q_off.p : nullptr;
      P.kv_rope_offset = spec.offsets ? kv_off.p : nullptr;
      P.batch_size = B;
    } else {
      P.paged_kv = k_in.p;
      P.qo_indptr = qo_indptr.p;
      P.kv_indptr = kv_indptr.p;
      P.kv_indices = kv_indices.p;
      P.kv_last_page_len = kv_last.p;
      P.q_rope_offset = spec.offsets ? q_off.p : nullptr;
      P.kv_rope_offset = spec.offsets ? kv_off.p : nullptr;
      P.batch_size = B;
      P.page_size = PAGE;
      P.kv_stride_page = int64_t(2) * PAGE * Hkv * D;
      P.kv_stride_kv = int64_t(PAGE) * Hkv * D;
      if (spec.hnd) {
        P.kv_stride_h = int64_t(PAGE) * D;
        P.kv_stride_n = D;
      } else {
        P.kv_stride_n = int64_t(Hkv) * D;
        P.kv_stride_h = D;
      }
    }
    p = P;
  }

  int64_t kv_rows() const {
    if (K == kPaged) return int64_t(num_page_entries) * PAGE;
    return kv_cap;
  }
};

/** The inputs of a batch bench (qo = kv per request, random data): device buffers and the
 *  params over them for kind K (single, ragged, or paged with pages of PAGE rows, shuffled in
 *  the pool unless shuffle_pages is false); kv_rows: the rows the RoPE pre-pass reads. */
template <Kind K, typename T, int D, int PAGE>
struct BenchInputs {
  using Params = typename ParamsOf<K, T, PAGE>::type;
  int B;
  Lengths L;
  DevBuf<T> q, o, k, v, cache;
  DevBuf<float> lse, slopes;
  DevBuf<int> qo_indptr, kv_indptr, kv_indices, kv_last;
  Params P{};
  int64_t kv_rows = 0;

  BenchInputs(int Hq, int Hkv, const std::vector<int>& lens, bool shuffle_pages)
      : B(int(lens.size())), L(make_lengths(lens, lens)) {
    const int64_t nq = int64_t(L.total_q) * Hq * D, nkv = int64_t(L.total_kv) * Hkv * D;
    q.alloc(nq);
    o.alloc(nq);
    k.alloc(nkv);
    v.alloc(nkv);
    lse.alloc(size_t(L.total_q) * Hq);
    fill_random<T><<<1024, 256>>>(q.p, nq, 1, 2.f);
    fill_random<T><<<1024, 256>>>(k.p, nkv, 2, 2.f);
    fill_random<T><<<1024, 256>>>(v.p, nkv, 3, 1.f);
    slopes.alloc(Hq);
    std::vector<float> sl(Hq);
    for (int h = 0; h < Hq; ++h) sl[h] = std::pow(2.f, -8.f * (h + 1) / Hq);
    slopes.up(sl);
    P.logits_soft_cap = 30.f;  // as benches/bench_prefill.py
    P.window_left = 1024;
    P.alibi_slopes = slopes.p;
    P.sigmoid_bias = 0.f;
    P.sm_scale = 1.f / std::sqrt(float(D));
    P.rope_theta = 1e4f;
    P.rope_scale = 1.f;
    P.q = q.p;
    P.o = o.p;
    P.lse = lse.p;
    P.q_stride_n = P.o_stride_n = int64_t(Hq) * D;
    P.q_stride_h = P.o_stride_h = D;
    P.num_qo_heads = Hq;
    P.num_kv_heads = Hkv;
    qo_indptr.alloc(B + 1);
    kv_indptr.alloc(B + 1);
    kv_last.alloc(B);
    qo_indptr.up(L.qo_indptr);
    kv_rows = L.total_kv;
    if constexpr (K == kSingle) {
      P.qo_len = L.total_q;
      P.kv_len = L.total_kv;
      P.k = k.p;
      P.v = v.p;
      P.k_stride_n = P.v_stride_n = int64_t(Hkv) * D;
      P.k_stride_h = P.v_stride_h = D;
    } else if constexpr (K == kRagged) {
      kv_indptr.up(L.kv_indptr);
      P.k = k.p;
      P.v = v.p;
      P.k_stride_n = P.v_stride_n = int64_t(Hkv) * D;
      P.k_stride_h = P.v_stride_h = D;
      P.qo_indptr = qo_indptr.p;
      P.kv_indptr = kv_indptr.p;
      P.q_rope_offset = P.kv_rope_offset = nullptr;
      P.batch_size = B;
    } else {
      int pages = 0;
      std::vector<int> indptr(B + 1, 0), last(B);
      for (int b = 0; b < B; ++b) {
        const int np = (lens[b] + PAGE - 1) / PAGE;
        pages += np;
        indptr[b + 1] = pages;
        last[b] = lens[b] - (np - 1) * PAGE;
      }
      std::vector<int> idx(pages);
      Rng r(5);
      for (int i = 0; i < pages; ++i) idx[i] = i;
      if (shuffle_pages) {
        for (int i = pages - 1; i > 0; --i) std::swap(idx[i], idx[r.below(i + 1)]);
      }
      kv_indices.alloc(pages);
      kv_indices.up(idx);
      kv_indptr.up(indptr);
      kv_last.up(last);
      const size_t ce = size_t(pages) * 2 * PAGE * Hkv * D;
      cache.alloc(ce);
      fill_random<T><<<1024, 256>>>(cache.p, ce, 4, 2.f);
      P.paged_kv = cache.p;
      P.qo_indptr = qo_indptr.p;
      P.kv_indptr = kv_indptr.p;
      P.kv_indices = kv_indices.p;
      P.kv_last_page_len = kv_last.p;
      P.q_rope_offset = P.kv_rope_offset = nullptr;
      P.batch_size = B;
      P.page_size = PAGE;
      P.kv_stride_page = int64_t(2) * PAGE * Hkv * D;
      P.kv_stride_kv = int64_t(PAGE) * Hkv * D;
      P.kv_stride_n = int64_t(Hkv) * D;
      P.kv_stride_h = D;
      kv_rows = int64_t(pages) * PAGE;
    }
  }
};

/** FLOPs of a batch bench (4 Hq qo kv D per request, half of it under the causal mask). */
template <int MASK>
static double bench_flops(int Hq, int D, const std::vector<int>& lens) {
  double flops = 0;
  for (int x : lens) flops += 4.0 * Hq * double(x) * x * D * (MASK == prefill::kMaskCausal ? 0.5 : 1.0);
  return flops;
}
