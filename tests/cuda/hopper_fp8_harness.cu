/**
 * GPU harness of the Hopper batch prefill kernels (hopper::launch_batch_prefill_ragged / _paged)
 * over an fp8 KV cache (e4m3, e5m2), on the Problem builder of prefill_harness_common.cuh: the
 * 16-bit problem's K/V are quantized with per-tensor scales (fp8 = K / k_scale rounded, V
 * likewise), the kernel reads the fp8 cache with those scales, and the independent fp32
 * reference reads the dequantized cache (k_scale * stored K, v_scale * stored V), so the
 * kernel's only differences from it are those of a 16-bit cache (the query and P rounded to
 * 16 bits): the same checks and tolerances as the 16-bit harnesses (rel, max, lse, per-row
 * bounds, dead rows) and the same race check (a second run must give bitwise the same output).
 * Cases: ragged and paged (page sizes 1, 16, 64; NHD and HND pages), causal and not, GQA, split
 * units (partials), bf16 and f16 queries, head_dim 64/128/256, the built-in variants.
 *
 * Build: tests/cuda/run_harness.sh hopper_fp8_harness OUT   (sm_90a, -Xptxas -v report)
 * Run:   OUT/hopper_fp8_harness [--no-bench] [--no-tests] [--reps N]   (exit 1 on any failure)
 * Benchmark: the 16-request paged prefill (page 16, causal, 512..4096 tokens) with a bf16 cache
 * and with an fp8_e4m3 one, cudaEvents around one call, L2 flushed before each, median of N.
 */
#include <cuda_fp8.h>

#include "hopper_harness_common.cuh"

static int g_reps = 25;

using e4m3 = __nv_fp8_e4m3;
using e5m2 = __nv_fp8_e5m2;

template <typename Fp8>
static const char* fp8_name() {
  return std::is_same<Fp8, e4m3>::value ? " e4m3" : " e5m2";
}

/** x as the cache stores it with `scale` (x / scale, rounded to Fp8), and the value the kernel
 *  must read back: scale * stored. */
template <typename Fp8>
static Fp8 quantize(float x, float scale) {
  return Fp8(x / scale);
}
template <typename Fp8>
static float dequantize(float x, float scale) {
  return scale * float(quantize<Fp8>(x, scale));
}

/** The fields every batch kind shares, from the 16-bit params p: the variant's parameters, q, o,
 *  lse, the indptrs and RoPE offsets, the strides of q and o, the sizes and scales. */
template <typename P8, typename P16>
static void copy_batch_fields(P8& d, const P16& p) {
  static_cast<AdditionalParams&>(d) = static_cast<const AdditionalParams&>(p);
  d.q = p.q;
  d.o = p.o;
  d.lse = p.lse;
  d.qo_indptr = p.qo_indptr;
  d.kv_indptr = p.kv_indptr;
  d.q_rope_offset = p.q_rope_offset;
  d.kv_rope_offset = p.kv_rope_offset;
  d.q_stride_n = p.q_stride_n;
  d.q_stride_h = p.q_stride_h;
  d.o_stride_n = p.o_stride_n;
  d.o_stride_h = p.o_stride_h;
  d.batch_size = p.batch_size;
  d.num_qo_heads = p.num_qo_heads;
  d.num_kv_heads = p.num_kv_heads;
  d.sm_scale = p.sm_scale;
  d.rope_scale = p.rope_scale;
  d.rope_theta = p.rope_theta;
}

/** Ragged: k and v (fp8, the 16-bit tensors' layout). */
template <typename T, typename Fp8>
static BatchPrefillRaggedParams<T, Fp8, T> fp8_params(const BatchPrefillRaggedParams<T, T, T>& p,
                                                      const Fp8* k, const Fp8* v) {
  BatchPrefillRaggedParams<T, Fp8, T> d{};
  copy_batch_fields(d, p);
  d.k = k;
  d.v = v;
  d.k_stride_n = p.k_stride_n;
  d.k_stride_h = p.k_stride_h;
  d.v_stride_n = p.v_stride_n;
  d.v_stride_h = p.v_stride_h;
  return d;
}

/** Paged: the page pool (fp8, the 16-bit pool's layout; `v` unused). */
template <typename T, typename Fp8>
static BatchPrefillPagedParams<T, Fp8, T> fp8_params(const BatchPrefillPagedParams<T, T, T>& p,
                                                     const Fp8* pool, const Fp8*) {
  BatchPrefillPagedParams<T, Fp8, T> d{};
  copy_batch_fields(d, p);
  d.paged_kv = pool;
  d.kv_indices = p.kv_indices;
  d.kv_last_page_len = p.kv_last_page_len;
  d.kv_stride_page = p.kv_stride_page;
  d.kv_stride_kv = p.kv_stride_kv;
  d.kv_stride_n = p.kv_stride_n;
  d.kv_stride_h = p.kv_stride_h;
  d.page_size = p.page_size;
  return d;
}

/**
 * One case: the 16-bit Problem of s, its K/V quantized to Fp8 with k_scale and v_scale (ragged:
 * k and v; paged: the pool, K and V halves of each page by their own scale), the Hopper kernel
 * over the fp8 cache (twice: race check), the fp32 reference over the dequantized K/V.
 */
template <Kind K, typename T, typename Fp8, int D, int MASK, template <class> class VariantT,
          int PAGE = 1>
static void run_fp8(const Spec& s, float k_scale, float v_scale) {
  using Prob = Problem<K, T, D, PAGE>;
  using P16 = typename Prob::Params;
  using P8 = typename ParamsOf<K, T, PAGE, Fp8>::type;
  using Variant8 = VariantT<P8>;
  DeviceInfo dev;
  if (current_device(&dev)) { std::fprintf(stderr, "device query failed\n"); std::exit(1); }
  Rng r(s.seed * 7919 + D);
  Prob pr;
  pr.build(s, r, true);
  const int Hkv = s.Hkv;

  // The fp8 cache, and the logical K/V it holds (dequantized, fp32) for the reference.
  auto quantize_all = [](const std::vector<T>& h, auto scale_of) {
    std::vector<Fp8> q(h.size());
    for (size_t i = 0; i < h.size(); ++i) q[i] = quantize<Fp8>(to_fl(h[i]), scale_of(i));
    return q;
  };
  DevBuf<Fp8> k8, v8;
  if constexpr (K == kPaged) {
    const size_t half_page = size_t(PAGE) * Hkv * D;  // K, then V of each page (NHD and HND)
    const std::vector<Fp8> pool = quantize_all(
        pr.cache_h, [&](size_t i) { return (i / half_page) % 2 ? v_scale : k_scale; });
    k8.alloc(pool.size());
    k8.up(pool);
  } else {
    k8.alloc(pr.k_h.size());
    v8.alloc(pr.v_h.size());
    k8.up(quantize_all(pr.k_h, [&](size_t) { return k_scale; }));
    v8.up(quantize_all(pr.v_h, [&](size_t) { return v_scale; }));
  }
  std::vector<T> k_log = pr.k_log.down(), v_log = pr.v_log.down();
  std::vector<float> k_deq(k_log.size()), v_deq(v_log.size());
  for (size_t i = 0; i < k_log.size(); ++i) {
    k_deq[i] = dequantize<Fp8>(to_fl(k_log[i]), k_scale);
    v_deq[i] = dequantize<Fp8>(to_fl(v_log[i]), v_scale);
  }
  pr.k_rot.up(k_deq);  // the reference's K (no RoPE with an fp8 cache)
  DevBuf<float> v_ref(v_deq.size());
  v_ref.up(v_deq);

  P8 p8 = fp8_params(pr.p, k8.p, v8.p);
  p8.k_scale = k_scale;
  p8.v_scale = v_scale;
  const int64_t total_q = pr.q_cap, kv_rows = pr.kv_rows();
  const int64_t bytes = ws_bytes<true, K, D, Z, T, Variant8>(p8, total_q, kv_rows, pr.B, dev);
  DevBuf<uint8_t> ws(size_t(std::max<int64_t>(bytes, 16)));
  CK(cudaMemset(ws.p, 0xAB, ws.n));
  CK(cudaMemset(pr.o.p, 0xFF, pr.o.n * sizeof(T)));
  CK(cudaMemset(pr.lse.p, 0xFF, pr.lse.n * sizeof(float)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto launch = [&]() {
    return call_kernel<true, K, D, MASK, Z, PAGE, Variant8>(p8, total_q, kv_rows, ws.p, bytes, dev,
                                                             st);
  };
  if (const int rc = launch()) {
    std::printf("FAIL %-34s launch returned %d: %s\n", s.name.c_str(), rc, last_error_buffer());
    ++g_failures;
    CK(cudaStreamDestroy(st));
    return;
  }
  CK(cudaStreamSynchronize(st));
  CK(cudaGetLastError());
  const bool stable = same_again(pr.o, ws, st, launch);

  RefArgs a{pr.q.p, pr.k_rot.p, v_ref.p, pr.qo_indptr.p, pr.ref_kv_indptr.p, pr.req_tok.p,
            pr.q_off.p, s.Hq, Hkv, pr.L.total_q, MASK == prefill::kMaskCausal, 0, s.rope_theta,
            s.rope_scale, pr.o_ref.p, pr.lse_ref.p, pr.n_eff.p};
  const int nthreads = pr.L.total_q * s.Hq;
  if (nthreads > 0) {
    ref_attention<D, T, VariantT<P16>, P16, float><<<(nthreads + 63) / 64, 64, 0, st>>>(pr.p, a);
    CK(cudaGetLastError());
  }
  CK(cudaStreamSynchronize(st));
  check_outputs<K, D, Z>(s, s.name, pr, stable, fp8_name<Fp8>());
  CK(cudaStreamDestroy(st));
}

// ---------------------------------------------------------------- benchmark

/** Random fp8 bytes whose exponent's top bit is clear: finite values (no NaN or Inf) of both
 *  formats, below 2 in magnitude for e4m3. */
__global__ void fill_fp8_bytes(uint8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed * 0x9E3779B9u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    p[i] = uint8_t(h & 0xbfu);
  }
}

/** The bench of bench_serving's paged prefill: 16 requests of 512..4096 tokens (qo = kv),
 *  causal, page 16, 32/32 heads, head_dim 128; the bf16 cache, then the same pool as fp8_e4m3
 *  (k_scale 0.5, v_scale 2). */
static void bench_paged_fp8() {
  constexpr int D = 128, PAGE = 16;
  using P8 = ParamsOf<kPaged, bf16, PAGE, e4m3>::type;
  std::vector<int> lens;
  for (int i = 0; i < 16; ++i) lens.push_back(512 + (4096 - 512) * i / 15);
  DeviceInfo dev;
  current_device(&dev);
  BenchInputs<kPaged, bf16, D, PAGE> in(32, 32, lens, true);
  const size_t pool_elems = in.cache.n;
  DevBuf<e4m3> pool8(pool_elems);
  fill_fp8_bytes<<<1024, 256>>>(reinterpret_cast<uint8_t*>(pool8.p), int64_t(pool_elems), 4);
  CK(cudaGetLastError());
  P8 p8 = fp8_params(in.P, pool8.p, static_cast<const e4m3*>(nullptr));
  p8.k_scale = 0.5f;
  p8.v_scale = 2.f;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto time_one = [&](const auto& P, const char* name) {
    using Params = std::decay_t<decltype(P)>;
    using Variant = DefaultAttention<Params>;
    const int64_t bytes =
        ws_bytes<true, kPaged, D, Z, bf16, Variant>(P, in.L.total_q, in.kv_rows, in.B, dev);
    DevBuf<uint8_t> ws(size_t(std::max<int64_t>(bytes, 16)));
    CK(cudaDeviceSynchronize());
    const double ms = time_median(
        [&]() {
          return call_kernel<true, kPaged, D, C, Z, PAGE, Variant>(P, in.L.total_q, in.kv_rows,
                                                                    ws.p, bytes, dev, st);
        },
        st, g_reps);
    const double tf = bench_flops<C>(32, D, lens) / (ms * 1e-3) / 1e12;
    std::printf("BENCH sm90 paged16 causal 16 x 512..4096 %-10s %9.3f ms %7.1f TFLOP/s\n", name,
                ms, tf);
    return ms;
  };
  const double ms16 = time_one(in.P, "bf16");
  const double ms8 = time_one(p8, "fp8_e4m3");
  std::printf("fp8_e4m3 / bf16: %.3f (goal: at most 1.10)\n", ms8 / ms16);
  CK(cudaStreamDestroy(st));
}

// ---------------------------------------------------------------- main
int main(int argc, char** argv) {
  bool tests = true, benches = true;
  parse_args(argc, argv, tests, benches, &g_reps);
  print_device();
  if (tests) {
    const std::vector<int> qo_mix = {7, 129, 0, 1000, 1, 300, 64};
    const std::vector<int> kv_mix = {7, 200, 50, 1000, 4097, 0, 33};
    const float ks = 0.37f, vs = 1.9f;  // scales that are not powers of two
    // ragged
    run_fp8<kRagged, bf16, e4m3, 128, C, DefaultAttention>({"r causal mix gqa4", 16, 4, qo_mix, kv_mix}, ks, vs);
    run_fp8<kRagged, half, e5m2, 128, N, DefaultAttention>({"r none mix gqa2", 8, 4, qo_mix, kv_mix}, ks, vs);
    run_fp8<kRagged, half, e4m3, 64, C, DefaultAttention>({"r causal d64 mix", 8, 8, qo_mix, kv_mix}, ks, vs);
    run_fp8<kRagged, bf16, e4m3, 128, C, DefaultAttention>({"r causal decode-like split", 32, 8, {1, 5}, {4097, 2000}}, ks, vs);
    // paged: page sizes 16 and 64 (TMA boxes), 1 (gather)
    run_fp8<kPaged, bf16, e4m3, 128, C, DefaultAttention, 16>({"p16 causal mix gqa4", 16, 4, qo_mix, kv_mix}, ks, vs);
    run_fp8<kPaged, bf16, e5m2, 128, C, DefaultAttention, 16>({"p16 causal mix gqa4", 16, 4, qo_mix, kv_mix}, ks, vs);
    run_fp8<kPaged, bf16, e4m3, 128, C, DefaultAttention, 1>({"p1 causal mix gqa4", 16, 4, qo_mix, kv_mix}, ks, vs);
    run_fp8<kPaged, bf16, e5m2, 128, N, DefaultAttention, 1>({"p1 none mix gqa2", 8, 4, qo_mix, kv_mix}, ks, vs);
    run_fp8<kPaged, bf16, e4m3, 128, N, DefaultAttention, 64>({"p64 none mix gqa4", 16, 4, qo_mix, kv_mix}, ks, vs);
    run_fp8<kPaged, bf16, e5m2, 128, C, DefaultAttention, 64>({"p64 causal mix gqa4", 16, 4, qo_mix, kv_mix}, ks, vs);
    {
      Spec s{"p16 none f16 HND-pages mix", 8, 2, qo_mix, kv_mix};
      s.hnd = true;
      run_fp8<kPaged, half, e4m3, 128, N, DefaultAttention, 16>(s, ks, vs);
      run_fp8<kPaged, half, e5m2, 128, N, DefaultAttention, 16>(s, ks, vs);
    }
    run_fp8<kPaged, bf16, e4m3, 128, C, DefaultAttention, 16>({"p16 causal decode-like split", 32, 8, {1, 5}, {4097, 2000}}, ks, vs);
    run_fp8<kPaged, bf16, e4m3, 256, C, DefaultAttention, 16>({"p16 causal d256 mix", 8, 4, qo_mix, kv_mix}, ks, vs);
    run_fp8<kPaged, bf16, e4m3, 64, C, DefaultAttention, 16>({"p16 causal d64 mix", 8, 8, qo_mix, kv_mix}, ks, vs);
    run_fp8<kPaged, bf16, e5m2, 64, N, DefaultAttention, 1>({"p1 none d64 mix gqa8", 8, 1, qo_mix, kv_mix}, ks, vs);
    // variants
    run_fp8<kPaged, bf16, e4m3, 128, C, ALiBi, 16>({"p16 causal alibi mix", 8, 8, qo_mix, kv_mix}, ks, vs);
    run_fp8<kPaged, bf16, e4m3, 128, C, SlidingWindow, 16>({"p16 causal sliding_window(37) mix", 8, 2, qo_mix, kv_mix}, ks, vs);
    {
      Spec s{"p16 causal soft_cap30 mix", 16, 4, qo_mix, kv_mix};
      s.soft_cap = 30.f;
      run_fp8<kPaged, bf16, e4m3, 128, C, LogitsSoftCap, 16>(s, ks, vs);
      Spec s2{"p16 none sigmoid(-2) mix", 8, 2, qo_mix, kv_mix};
      s2.sigmoid_bias = -2.f;
      run_fp8<kPaged, bf16, e5m2, 128, N, Sigmoid, 16>(s2, ks, vs);
    }
    std::printf("correctness: %d failure(s)\n", g_failures);
  }
  if (benches) {
    CK(cudaMalloc(&g_flush, kFlushBytes));
    bench_paged_fp8();
    CK(cudaFree(g_flush));
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "OK", g_failures);
  return g_failures ? 1 : 0;
}
