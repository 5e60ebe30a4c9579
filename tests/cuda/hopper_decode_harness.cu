/**
 * Standalone harness for the Hopper single decode (include/flashgen/hopper/decode.cuh) against
 * the portable decode (decode/kernel.cuh + merge.cuh, launched as csrc/single_decode.cu does).
 *
 * Checks: every (head_dim, variant, layout, group, kv_len, plan) case runs both kernels on the
 * same fresh random inputs into NaN-poisoned outputs (workspace poisoned with 0xAB); the sm90
 * output must be written everywhere, agree with the portable one (max |o - o_p| / max |o_p| <=
 * 1e-2, bf16 rounding of a different sum order, LSE within 1e-3) and with an fp32 reference for
 * softmax variants (rel. L2 <= 1e-2), and a second run must be bitwise identical (race check).
 * Bench: bf16, 32 qo / 8 kv heads, d128, NHD; one call of each kernel per repetition,
 * alternating, L2 flushed (256 MB memset) before every call, cudaEvents, median.
 *   hopper_decode_harness [--no-tests] [--no-bench] [--reps N]
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <functional>
#include <vector>

#include "harness_base.cuh"
#include "flashgen/params.cuh"
#include "flashgen/decode/kernel.cuh"
#include "flashgen/decode/merge.cuh"
#include "flashgen/hopper/decode.cuh"

using P = SingleDecodeParams<bf16, bf16, bf16>;

static int g_fail = 0;
#define ST(...)                                                         \
  do {                                                                  \
    int s_ = (__VA_ARGS__);                                                       \
    if (s_ != 0) {                                                      \
      std::fprintf(stderr, "flashgen status %d at line %d\n", s_, __LINE__); \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)


// ---------------------------------------------------------------- portable launch (as csrc)
template <int D, typename Variant>
int portable_call(const P& p, void* ws, int64_t ws_bytes, const DeviceInfo& dev, cudaStream_t s,
                  int64_t* need = nullptr) {
  using Traits = decode::DecodeTraits<D>;
  const int64_t slices = decode::head_slices<Traits>(p.num_qo_heads / p.num_kv_heads);
  const int64_t units = p.num_kv_heads * slices;
  const int64_t splits0 = decode::plan_splits<Traits>(units, p.kv_len, dev.sm_count, dev.smem_per_sm);
  const int64_t chunk = decode::chunk_tokens(p.kv_len, splits0);
  const int64_t splits = decode::ceil_div(p.kv_len, chunk);
  const int64_t wsb = decode::workspace_bytes(splits, p.num_qo_heads, D);
  if (need) {
    *need = wsb;
    return 0;
  }
  float* part_o = nullptr;
  float* part_w = nullptr;
  if (wsb > 0) {
    if (ws_bytes < wsb) return 99;
    part_o = static_cast<float*>(ws);
    part_w = part_o + splits * p.num_qo_heads * D;
  }
  auto kernel = decode::single_decode_kernel<Traits, Variant, P>;
  static std::atomic<uint64_t> done{0};
  if (int st = allow_smem(kernel, dev, Traits::kSmemBytes, done)) return st;
  const dim3 grid(uint32_t(splits), uint32_t(p.num_kv_heads * slices));
  if (int st = launch("portable", kernel, grid, Traits::kThreads, Traits::kSmemBytes, s, false, p,
                      part_o, part_w, uint32_t(chunk), uint32_t(slices)))
    return st;
  if (splits > 1) {
    decode::MergeOutput<bf16> out{p.o, p.lse, 0, p.o_stride_h, p.num_qo_heads, p.num_qo_heads};
    return launch("merge", decode::merge_kernel<D, Variant, P>, dim3(p.num_qo_heads),
                  decode::kMergeThreads, 0, s, dev.major >= 9, p, (const float*)part_o,
                  (const float*)part_w, uint32_t(splits), out);
  }
  return 0;
}

// ---------------------------------------------------------------- fp32 reference (softmax)
template <int D, typename Variant>
__global__ void ref_decode(const P p, float* o, float* lse) {
  // one block per qo head; scores in global scratch would be simpler, but kv_len <= 32768
  // fits a dynamic shared array of floats.
  extern __shared__ float sc[];
  const int h = blockIdx.x;
  const int hk = h / (p.num_qo_heads / p.num_kv_heads);
  uint8_t vs[256];
  Variant variant(p, 0, vs);
  const bf16* q = p.q + h * p.q_stride_h;
  float qt[D];
  for (int d = 0; d < D; ++d) qt[d] = hooks::query_transform(variant, p, __bfloat162float(q[d]));
  for (int j = threadIdx.x; j < int(p.kv_len); j += blockDim.x) {
    const bf16* k = p.k + j * p.k_stride_n + hk * p.k_stride_h;
    float s = 0.f;
    for (int d = 0; d < D; ++d) s += qt[d] * __bfloat162float(k[d]);
    float x = -INFINITY;
    if (hooks::logits_mask(variant, p, 0, 0, j, h, hk))
      x = hooks::logits_transform(variant, p, s, 0, 0, j, h, hk);
    sc[j] = x;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = 0; j < int(p.kv_len); ++j) mx = fmaxf(mx, sc[j]);
  float den = 0.f;
  for (int j = 0; j < int(p.kv_len); ++j) den += exp2f(sc[j] - mx);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.f;
    for (int j = 0; j < int(p.kv_len); ++j)
      num += exp2f(sc[j] - mx) * __bfloat162float(p.v[j * p.v_stride_n + hk * p.v_stride_h + d]);
    o[h * D + d] = hooks::output_transform(variant, p, num / den, 0, 0, h);
  }
  if (threadIdx.x == 0) lse[h] = (mx + log2f(den)) * 0.69314718f;
}

__global__ void to_f32(const bf16* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __bfloat162float(x[i]);
}

// ---------------------------------------------------------------- one correctness case
enum VariantId { kDefault, kSoftCap, kSigmoid, kSliding, kAlibi };
static const char* vname[] = {"default", "soft_cap", "sigmoid", "sliding_window", "alibi"};

struct Bufs {
  bf16 *q, *k, *v, *o;
  float *lse, *ws, *slopes;
  int64_t ws_bytes;
};

/** The params of one request whose K/V are held densely, NHD ([tokens][heads][D]) or HND
 *  ([heads][tokens][D]); the correctness cases and the bench both start from these. */
template <int D>
P dense_params(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int hq, int hkv,
               int kv_len, bool hnd) {
  P p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  p.q_stride_h = D;
  p.k_stride_h = p.v_stride_h = hnd ? int64_t(kv_len) * D : D;
  p.k_stride_n = p.v_stride_n = hnd ? D : int64_t(hkv) * D;
  p.o_stride_h = D;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.kv_len = kv_len;
  p.sm_scale = 1.f / std::sqrt(float(D));
  return p;
}

template <int D, typename Variant, typename Traits = hopper::DecodeTraits90<D>>
void run_case(const DeviceInfo& dev, Bufs& b, VariantId vid, bool hnd, int hkv, int group,
              int kv_len, const hopper::DecodeKnobs90& knobs, uint64_t seed) {
  const int hq = hkv * group;
  Rng rng(seed);
  std::vector<bf16> hq_(size_t(hq) * D), hk(size_t(kv_len) * hkv * D), hv(hk.size());
  for (auto& x : hq_) x = __float2bfloat16(rng.uni() * 2.f);
  for (auto& x : hk) x = __float2bfloat16(rng.uni() * 2.f);
  for (auto& x : hv) x = __float2bfloat16(rng.uni());
  CK(cudaMemcpy(b.q, hq_.data(), hq_.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b.k, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b.v, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
  std::vector<float> sl(hq);
  for (int h = 0; h < hq; ++h) sl[h] = std::pow(2.f, -8.f * (h + 1) / hq);
  CK(cudaMemcpy(b.slopes, sl.data(), hq * 4, cudaMemcpyHostToDevice));
  P p = dense_params<D>(b.q, b.k, b.v, b.o, b.lse, hq, hkv, kv_len, hnd);
  p.logits_soft_cap = 30.f;
  p.window_left = 100;
  p.alibi_slopes = b.slopes;
  p.sigmoid_bias = -1.f;

  const int n = hq * D;
  std::vector<bf16> o_port(n), o_h(n), o_h2(n);
  std::vector<float> l_port(hq), l_h(hq), l_h2(hq);
  // portable
  CK(cudaMemset(b.o, 0xff, n * 2));
  CK(cudaMemset(b.lse, 0xff, hq * 4));
  CK(cudaMemset(b.ws, 0xab, b.ws_bytes));
  ST(portable_call<D, Variant>(p, b.ws, b.ws_bytes, dev, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(o_port.data(), b.o, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(l_port.data(), b.lse, hq * 4, cudaMemcpyDeviceToHost));
  const auto plan = hopper::plan_single_decode90<Traits>(hq, hkv, kv_len, dev, knobs);
  for (int rep = 0; rep < 2; ++rep) {
    CK(cudaMemset(b.o, 0xff, n * 2));
    CK(cudaMemset(b.lse, 0xff, hq * 4));
    CK(cudaMemset(b.ws, 0xab, b.ws_bytes));
    ST((hopper::launch_single_decode_planned<D, Variant, P, Traits>(p, plan, b.ws, b.ws_bytes, dev, 0)));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy((rep ? o_h2 : o_h).data(), b.o, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy((rep ? l_h2 : l_h).data(), b.lse, hq * 4, cudaMemcpyDeviceToHost));
  }
  double mx_ref = 0, mx_diff = 0, lse_diff = 0;
  bool nan = false, same = std::memcmp(o_h.data(), o_h2.data(), n * 2) == 0 &&
                           std::memcmp(l_h.data(), l_h2.data(), hq * 4) == 0;
  for (int i = 0; i < n; ++i) {
    const float a = __bfloat162float(o_h[i]), r = __bfloat162float(o_port[i]);
    if (!std::isfinite(a)) nan = true;
    mx_ref = std::max(mx_ref, double(std::fabs(r)));
    mx_diff = std::max(mx_diff, double(std::fabs(a - r)));
  }
  for (int h = 0; h < hq; ++h) {
    if (std::isnan(l_h[h])) nan = true;
    if (std::isinf(l_h[h]) && l_h[h] == l_port[h]) continue;
    lse_diff = std::max(lse_diff, double(std::fabs(l_h[h] - l_port[h])));
  }
  // fp32 reference (softmax variants; kv_len fits the shared score array)
  double ref_rel = 0;
  const bool softmax = Variant::use_softmax;
  if (softmax && kv_len <= 12288) {
    float *ro, *rl, *of;
    CK(cudaMalloc(&ro, n * 4));
    CK(cudaMalloc(&rl, hq * 4));
    CK(cudaMalloc(&of, n * 4));
    CK(cudaFuncSetAttribute(ref_decode<D, Variant>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            kv_len * 4));
    ref_decode<D, Variant><<<hq, 128, kv_len * 4>>>(p, ro, rl);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> hr(n);
    CK(cudaMemcpy(hr.data(), ro, n * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
      const double d = __bfloat162float(o_h[i]) - hr[i];
      num += d * d;
      den += double(hr[i]) * hr[i];
    }
    ref_rel = std::sqrt(num / std::max(den, 1e-30));
    cudaFree(ro);
    cudaFree(rl);
    cudaFree(of);
  }
  const double rel = mx_diff / std::max(mx_ref, 1e-30);
  const bool ok = !nan && same && rel <= 1e-2 && lse_diff <= 1e-3 && ref_rel <= 1e-2;
  if (!ok) ++g_fail;
  std::printf("%s d%d r%d w%d %-14s %s hkv%d g%-2d kv%-6d plan c%lld g%lld chunk %lld: vs portable %.2e, "
              "lse %.2e, vs fp32 %.2e%s%s\n",
              ok ? "ok  " : "FAIL", D, Traits::kRingBytes / 1024, Traits::kConsumerWarps, vname[vid], hnd ? "HND" : "NHD", hkv, group, kv_len,
              (long long)plan.cluster, (long long)plan.groups, (long long)plan.chunk, rel, lse_diff,
              ref_rel, nan ? " NaN/unwritten" : "", same ? "" : " NOT-REPRODUCIBLE");
}

template <int D>
void run_variant(const DeviceInfo& dev, Bufs& b, VariantId v, bool hnd, int hkv, int g, int kv,
                 const hopper::DecodeKnobs90& k, uint64_t seed) {
  switch (v) {
    case kDefault: run_case<D, DefaultAttention<P>>(dev, b, v, hnd, hkv, g, kv, k, seed); break;
    case kSoftCap: run_case<D, LogitsSoftCap<P>>(dev, b, v, hnd, hkv, g, kv, k, seed); break;
    case kSigmoid: run_case<D, Sigmoid<P>>(dev, b, v, hnd, hkv, g, kv, k, seed); break;
    case kSliding: run_case<D, SlidingWindow<P>>(dev, b, v, hnd, hkv, g, kv, k, seed); break;
    case kAlibi: run_case<D, ALiBi<P>>(dev, b, v, hnd, hkv, g, kv, k, seed); break;
  }
}

// ---------------------------------------------------------------- bench
struct Timer {
  void* flush;
  cudaEvent_t e0, e1;
  Timer() {
    CK(cudaMalloc(&flush, 256 << 20));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
  }
  template <typename F>
  float once(F f) {
    CK(cudaMemsetAsync(flush, 0, 256 << 20));
    CK(cudaEventRecord(e0));
    f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e3f;
  }
};

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Traits>
int occupancy_clusters(int cluster) {
  auto kernel = hopper::single_decode_kernel90<Traits, DefaultAttention<P>, P>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster * 8, 8);
  cfg.blockDim = dim3(Traits::kThreads);
  cfg.dynamicSmemBytes = Traits::kSmemBytes;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = -1;
  cudaError_t e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return n;
}

/** The bench's and the trace's call: random bf16 q/k/v of hq / hkv heads at head_dim D, kv_len
 *  tokens of NHD or HND K/V, an output and a 64 MB workspace (freed with the object). */
template <int D>
struct DecodeBuffers {
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* ws = nullptr;
  const int64_t ws_bytes = 64 << 20;
  P p{};
  DecodeBuffers(int hq, int hkv, int kv_len, bool hnd) {
    CK(cudaMalloc(&q, hq * D * 2));
    CK(cudaMalloc(&o, hq * D * 2));
    CK(cudaMalloc(&k, size_t(kv_len) * hkv * D * 2));
    CK(cudaMalloc(&v, size_t(kv_len) * hkv * D * 2));
    CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaMemset(ws, 0, ws_bytes));
    std::vector<bf16> h(size_t(kv_len) * hkv * D);
    Rng rng(kv_len);
    for (auto& x : h) x = __float2bfloat16(rng.uni());
    CK(cudaMemcpy(k, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(q, h.data(), hq * D * 2, cudaMemcpyHostToDevice));
    p = dense_params<D>(q, k, v, o, nullptr, hq, hkv, kv_len, hnd);
  }
  DecodeBuffers(const DecodeBuffers&) = delete;
  DecodeBuffers& operator=(const DecodeBuffers&) = delete;
  ~DecodeBuffers() {
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
    cudaFree(ws);
  }
};

/** The launch floor: an empty kernel with the decode kernel's block size, 64 CTAs in clusters
 *  of 8, with `smem` bytes of dynamic shared memory. With the decode kernel's 137 KB it took
 *  2.85-2.98 us against 2.75-2.82 with none, but as a row of the bench it made row A read
 *  ~0.8 us slower at 1024 tokens (same kernel, NOTES-hopper run 11), so the bench runs it with
 *  none. */
template <typename Tr>
void launch_probe(int smem) {
  static const bool allowed = [] {
    CK(cudaFuncSetAttribute(hopper::cluster_probe_kernel90<Tr>,
                            cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
    return true;
  }();
  (void)allowed;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(64);
  cfg.blockDim = dim3(Tr::kThreads);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 8;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, hopper::cluster_probe_kernel90<Tr>));
}

void bench(const DeviceInfo& dev, int reps) {
  constexpr int D = 128;
  using V = DefaultAttention<P>;
  using T96 = hopper::DecodeTraits90<D, 96>;
  const int hq = 32, hkv = 8;
  std::printf("\nresident clusters of size 1..16 (d128): ring128 w4:");
  for (int c = 1; c <= 16; ++c) std::printf(" %lld", (long long)hopper::resident_clusters90<hopper::DecodeTraits90<D>>(dev, c));
  std::printf("\n  ring96 w4:");
  for (int c = 1; c <= 16; ++c) std::printf(" %lld", (long long)hopper::resident_clusters90<T96>(dev, c));
  std::printf("\n");
  Timer t;
  // layout 1: HND K/V ([heads][tokens][dim]: each head's rows contiguous), the NHD rows' DRAM
  // access question (a head's 256-byte rows at a 2 KB stride in NHD)
  for (auto [kv_len, hnd] : {std::pair<int, bool>{32768, false}, {32768, true}, {1024, false}}) {
    DecodeBuffers<D> buf(hq, hkv, kv_len, hnd);
    const P& p = buf.p;
    void* ws = buf.ws;
    const int64_t ws_bytes = buf.ws_bytes;
    const double bytes = 2.0 * hq * D * 2 + 2.0 * kv_len * hkv * D * 2;
    struct Cfg {
      const char* name;
      std::function<void(hopper::DecodePlan90*)> run;
    };
    auto mk = [&](auto traits, int64_t fc, int64_t fg) {
      using Tr = decltype(traits);
      return [&, fc, fg](hopper::DecodePlan90* out) {
        hopper::DecodeKnobs90 kn;
        kn.force_cluster = fc;
        kn.force_groups = fg;
        auto plan = hopper::plan_single_decode90<Tr>(hq, hkv, kv_len, dev, kn);
        if (out) {
          *out = plan;
          return;
        }
        ST((hopper::launch_single_decode_planned<D, V, P, Tr>(p, plan, ws, ws_bytes, dev, 0)));
      };
    };
    using T128 = hopper::DecodeTraits90<D, 128, 1>;
    using T128w8 = hopper::DecodeTraits90<D, 128, 2>;
    using T192 = hopper::DecodeTraits90<D, 192, 1>;
    using T96w8 = hopper::DecodeTraits90<D, 96, 2>;
    using T192w12 = hopper::DecodeTraits90<D, 192, 3>;
    std::vector<Cfg> cfgs = {
        {"A ring128 w4 auto", mk(T128(), 0, 0)},
        {"B ring128 w8 auto", mk(T128w8(), 0, 0)},
        {"C ring192 w4 auto", mk(T192(), 0, 0)},
        {"D ring96 w4 auto", mk(T96(), 0, 0)},
        {"E ring96 w4 c16g1", mk(T96(), 16, 1)},
        {"F ring96 w8 c16g1", mk(T96w8(), 16, 1)},
        {"G ring96 w4 c8g2", mk(T96(), 8, 2)},
        {"H ring128 w4 c15g1", mk(T128(), 15, 1)},
        {"L ring128 w4 c14g1", mk(T128(), 14, 1)},
        {"I ring128 w4 c12g1", mk(T128(), 12, 1)},
        {"J ring128 w4 c4g1", mk(T128(), 4, 1)},
        {"K ring128 w4 c2g1", mk(T128(), 2, 1)},
        {"M ring192 w12 auto", mk(T192w12(), 0, 0)},
        // Past 64 CTAs: a plain read of these bytes reaches ~2.95 TB/s on 64 CTAs and ~3.44 on
        // 128 (benches/read_ceiling.cu), and clusters of 8 with a 128 KB ring fit 15 at a time;
        // these 96-128 CTA plans measured 1-3 us slower than A at 32768 (NOTES-hopper run 11).
        {"N ring128 w4 c4g3", mk(T128(), 4, 3)},
        {"O ring128 w4 c2g8", mk(T128(), 2, 8)},
        {"P ring128 w4 c2g7", mk(T128(), 2, 7)},
        {"Q ring128 w4 c1g16", mk(T128(), 1, 16)},
        {"R ring192 w4 c2g8", mk(T192(), 2, 8)},
    };
    std::vector<std::vector<float>> times(cfgs.size() + 2);
    auto call = [&](int i) {
      if (i == 0) {
        ST(portable_call<D, V>(p, ws, ws_bytes, dev, 0));
      } else if (i == int(cfgs.size()) + 1) {  // floor: an empty kernel, cluster launch of 8
        launch_probe<T128>(0);
      } else {
        cfgs[i - 1].run(nullptr);
      }
    };
    const int n = int(cfgs.size()) + 2;
    for (int i = 0; i < n; ++i)
      for (int w = 0; w < 3; ++w) call(i);
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < reps; ++r)
      for (int i = 0; i < n; ++i) {
        const int j = (r & 1) ? n - 1 - i : i;  // alternate the order
        times[j].push_back(t.once([&] { call(j); }));
      }
    std::printf("\nsingle_decode bf16 32/8 heads d128 %s kv_len %d (%.1f MB), median of %d, L2 flushed\n",
                hnd ? "HND" : "NHD", kv_len, bytes / 1e6, reps);
    for (int i = 0; i < n; ++i) {
      const float us = median(times[i]);
      std::string plan = "";
      const char* name = i == 0 ? "portable" : (i == n - 1 ? "empty cluster kernel" : cfgs[i - 1].name);
      if (i > 0 && i < n - 1) {
        hopper::DecodePlan90 pl;
        cfgs[i - 1].run(&pl);
        char buf[96];
        std::snprintf(buf, sizeof buf, "cluster %lld x groups %lld, chunk %lld", (long long)pl.cluster,
                      (long long)pl.groups, (long long)pl.chunk);
        plan = buf;
      }
      std::printf("  %-24s %8.2f us %6.3f TB/s  %s\n", name, us, bytes / us / 1e6, plan.c_str());
    }
  }
}

#ifdef FLASHGEN_HDECODE_TRACE
// ---------------------------------------------------------------- trace (build with -DFLASHGEN_HDECODE_TRACE)
// Where a call's time goes inside the sm90 kernel: per CTA, the clock64 marks of decode.cuh
// converted to ns by that CTA's own clock rate (clock64 over globaltimer between entry and
// exit), the mean and the max over the CTAs of each run, median over runs; plus the spread of
// the CTAs' entries and exits and the kernel's span (first entry to last exit, globaltimer).
void trace(const DeviceInfo& dev, int reps) {
  constexpr int D = 128;
  using V = DefaultAttention<P>;
  using Tr = hopper::DecodeTraits90<D>;
  const int hq = 32, hkv = 8;
  void* flush;
  CK(cudaMalloc(&flush, 256 << 20));
  static const char* names[12] = {"entry", "barriers initialised", "producer: stage 0 issued",
                                  "producer: last stage issued", "warp 0: query loaded",
                                  "warp 0: stage 0 landed", "warp 0: kv loop done",
                                  "partial computed (push: pushed)", "cluster barrier passed",
                                  "cluster merge written", "warps combined", "exit"};
  for (int kv_len : {1024, 8192, 32768}) {
    DecodeBuffers<D> buf(hq, hkv, kv_len, false);
    const P& p = buf.p;
    void* ws = buf.ws;
    const int64_t ws_bytes = buf.ws_bytes;
    const auto plan = hopper::plan_single_decode90<Tr>(hq, hkv, kv_len, dev);
    const int ctas = int(plan.splits * hkv * plan.head_slices);
    std::vector<long long> h(size_t(ctas) * 14);
    std::vector<std::vector<double>> mean(12), mx(12);
    std::vector<double> span, entry_skew, exit_skew, ghz;
    for (int r = 0; r < reps + 3; ++r) {
      CK(cudaMemsetAsync(flush, 0, 256 << 20));
      ST((hopper::launch_single_decode_planned<D, V, P, Tr>(p, plan, ws, ws_bytes, dev, 0)));
      CK(cudaDeviceSynchronize());
      if (r < 3) continue;
      CK(cudaMemcpyFromSymbol(h.data(), hopper::hdecode_trace, h.size() * 8));
      long long g_in0 = LLONG_MAX, g_in1 = 0, g_out0 = LLONG_MAX, g_out1 = 0;
      std::vector<double> sum(12, 0.0), top(12, 0.0);
      double rate_sum = 0;
      for (int c = 0; c < ctas; ++c) {
        const long long* t = &h[size_t(c) * 14];
        const double rate = double(t[11] - t[0]) / double(std::max<long long>(1, t[13] - t[12]));
        rate_sum += rate;
        for (int i = 1; i < 12; ++i) {
          const double ns = double(t[i] - t[0]) / rate;
          sum[i] += ns;
          top[i] = std::max(top[i], ns);
        }
        g_in0 = std::min(g_in0, t[12]);
        g_in1 = std::max(g_in1, t[12]);
        g_out0 = std::min(g_out0, t[13]);
        g_out1 = std::max(g_out1, t[13]);
      }
      for (int i = 1; i < 12; ++i) {
        mean[i].push_back(sum[i] / ctas);
        mx[i].push_back(top[i]);
      }
      span.push_back(double(g_out1 - g_in0));
      entry_skew.push_back(double(g_in1 - g_in0));
      exit_skew.push_back(double(g_out1 - g_out0));
      ghz.push_back(rate_sum / ctas);
    }
    std::printf("\ntrace: single_decode sm90 bf16 32/8 heads d128 NHD kv_len %d, plan cluster %lld x "
                "groups %lld, chunk %lld, %d CTAs; median of %d runs, L2 flushed; ns from the "
                "CTA's entry (mean / max over CTAs)\n",
                kv_len, (long long)plan.cluster, (long long)plan.groups, (long long)plan.chunk,
                ctas, reps);
    const int order[11] = {1, 2, 4, 5, 3, 6, 10, 7, 8, 9, 11};
    for (int i : order) {
      std::printf("  %-30s %8.0f %8.0f\n", names[i], median(std::vector<float>(mean[i].begin(), mean[i].end())),
                  median(std::vector<float>(mx[i].begin(), mx[i].end())));
    }
    std::printf("  kernel span (first entry to last exit) %.0f ns; entries spread over %.0f ns, "
                "exits over %.0f ns; SM clock %.2f GHz\n",
                median(std::vector<float>(span.begin(), span.end())),
                median(std::vector<float>(entry_skew.begin(), entry_skew.end())),
                median(std::vector<float>(exit_skew.begin(), exit_skew.end())),
                median(std::vector<float>(ghz.begin(), ghz.end())));
  }
  cudaFree(flush);
}
#endif

int main(int argc, char** argv) {
  bool tests = true, do_bench = true;
  [[maybe_unused]] bool do_trace = false;
  int reps = 50;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-tests")) tests = false;
    if (!std::strcmp(argv[i], "--no-bench")) do_bench = false;
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
#ifdef FLASHGEN_HDECODE_TRACE
    if (!std::strcmp(argv[i], "--trace")) tests = do_bench = false, do_trace = true;
#endif
  }
  DeviceInfo dev;
  ST(current_device(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev.device));
  std::printf("%s, %d SMs, smem/SM %d, smem/block %d, sm90 smem d64/128/256: %d/%d/%d\n", prop.name,
              dev.sm_count, dev.smem_per_sm, dev.smem_per_block,
              hopper::DecodeTraits90<64>::kSmemBytes, hopper::DecodeTraits90<128>::kSmemBytes,
              hopper::DecodeTraits90<256>::kSmemBytes);
  if (tests) {
    const int max_kv = 40000, max_hq = 64;
    Bufs b;
    CK(cudaMalloc(&b.q, max_hq * 256 * 2));
    CK(cudaMalloc(&b.o, max_hq * 256 * 2));
    CK(cudaMalloc(&b.k, size_t(max_kv) * 8 * 256 * 2));
    CK(cudaMalloc(&b.v, size_t(max_kv) * 8 * 256 * 2));
    CK(cudaMalloc(&b.lse, max_hq * 4));
    CK(cudaMalloc(&b.slopes, max_hq * 4));
    b.ws_bytes = 64 << 20;
    CK(cudaMalloc(&b.ws, b.ws_bytes));
    hopper::DecodeKnobs90 def, small;
    small.max_cluster = 2;  // forces groups > 1: the workspace + merge-kernel path
    uint64_t seed = 1;
    for (int kv : {1, 17, 64, 100, 1000, 4097, 32768}) {
      for (int v = 0; v < 5; ++v) {
        run_variant<128>(dev, b, VariantId(v), false, 8, 4, kv, def, seed++);
      }
      run_variant<128>(dev, b, kDefault, true, 8, 4, kv, def, seed++);
      run_variant<128>(dev, b, kDefault, false, 8, 4, kv, small, seed++);
      run_variant<128>(dev, b, kSigmoid, true, 8, 4, kv, small, seed++);
      run_variant<64>(dev, b, kDefault, false, 8, 4, kv, def, seed++);
      run_variant<64>(dev, b, kSoftCap, true, 2, 8, kv, def, seed++);
      run_variant<256>(dev, b, kDefault, false, 8, 4, kv, def, seed++);
      run_variant<256>(dev, b, kAlibi, true, 4, 2, kv, small, seed++);
      run_variant<128>(dev, b, kDefault, false, 1, 32, kv, def, seed++);  // 4 head slices
      run_variant<128>(dev, b, kSliding, true, 4, 1, kv, def, seed++);
      run_variant<128>(dev, b, kDefault, false, 2, 5, kv, def, seed++);  // odd group
    }
    using W8 = hopper::DecodeTraits90<128, 128, 2>;
    using W8r96 = hopper::DecodeTraits90<128, 96, 2>;
    using W8r192 = hopper::DecodeTraits90<128, 192, 2>;
    hopper::DecodeKnobs90 c16, c13;
    c16.force_cluster = 16;
    c13.force_cluster = 13;
    c13.force_groups = 2;
    for (int kv : {1, 100, 1000, 4097, 32768}) {
      run_case<128, DefaultAttention<P>, W8>(dev, b, kDefault, false, 8, 4, kv, def, seed++);
      run_case<128, Sigmoid<P>, W8>(dev, b, kSigmoid, true, 8, 4, kv, small, seed++);
      run_case<128, LogitsSoftCap<P>, W8r96>(dev, b, kSoftCap, false, 8, 4, kv, c16, seed++);
      run_case<128, DefaultAttention<P>, W8r192>(dev, b, kDefault, true, 2, 8, kv, def, seed++);
      run_case<128, DefaultAttention<P>>(dev, b, kDefault, false, 8, 4, kv, c13, seed++);
      run_case<128, Sigmoid<P>>(dev, b, kSigmoid, false, 8, 4, kv, c16, seed++);
      run_case<64, DefaultAttention<P>, hopper::DecodeTraits90<64, 128, 2>>(dev, b, kDefault, false, 8, 4, kv, def, seed++);
      // d256 with two consumer groups would need four 64 KB stages (more than an SM holds):
      // the 192 KB ring (three stages) instead.
      run_case<256, ALiBi<P>, hopper::DecodeTraits90<256, 192, 1>>(dev, b, kAlibi, false, 8, 4, kv, def, seed++);
    }
    std::printf("%d failures\n", g_fail);
  }
  if (do_bench) bench(dev, reps);
#ifdef FLASHGEN_HDECODE_TRACE
  if (do_trace) trace(dev, reps);
#endif
  return g_fail ? 1 : 0;
}
