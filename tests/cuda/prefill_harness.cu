/**
 * Standalone GPU harness of the prefill kernels (include/flashgen/prefill/).
 *
 * Build: tests/cuda/run_prefill_harness.sh [out_dir]   (nvcc from the project venv, sm_90a; it
 *        also compile-checks sm_80 and prints the -Xptxas -v report of every kernel)
 * Run:   ./prefill_harness [--no-bench] [--no-tests]
 *        (A/B builds: -DPREFILL_BENCH_ONLY compiles the benchmarks only, ~25-50 s instead of
 *        ~3.5 min; -DPREFILL_D128_BENCH_ONLY only the D=128 default-variant benchmarks;
 *        -DPREFILL_VARIANT_BENCH_ONLY the variant-cost rows: single causal 8192 default,
 *        soft_cap, alibi, sigmoid, each between two default runs, then ragged, paged16 causal,
 *        paged16 non-causal, paged16 causal RoPE, paged1 causal.)
 *
 * Correctness: every case draws fresh random inputs (never zeros), poisons o and lse with NaN
 * bits and the workspace with 0xAB, runs the kernel and an independent naive fp32 reference on
 * the GPU (one thread per (query, head), looping over the keys, RoPE with double-precision
 * angles, the mask and the variant's hooks applied literally), and compares:
 *   rel = ||o - ref||_2 / ||ref||_2 over all outputs, max abs error, max |lse - lse_ref|
 *   (natural log; -inf must match exactly), and no NaN anywhere.
 * Tolerances: bf16 rel < 1e-2, lse < 3e-2; f16 rel < 5e-3, lse < 1.5e-2. Inputs are 16-bit, the
 * kernel rounds the transformed query and P to the input dtype before the tensor cores. Also the
 * per-row bounds of tests/python/test_prefill_gpu.py (u = 2^-8 bf16, 2^-10 f16): each (query,
 * head) row's relative L2 error <= 2.5 u, |lse - ref| <= 0.5 u + 4 u / sqrt(n_eff) with n_eff =
 * (sum w)^2 / sum w^2 from the reference, rows that see no key exactly 0 with lse -inf; printed
 * as `row` (worst row error in u) and `lse/bound` (worst ratio, <= 1 passes); the row bound is
 * not enforced for RoPE cases (see run_test).
 *
 * Benchmarks: cudaEvents around one call, the L2 flushed before each call by a 256 MB memset,
 * median of 25 calls after 3 warm-ups; FLOPs = 4 * Hq * qo * kv * D, halved for causal.
 * Exit status 1 on any failed check or CUDA error.
 */
#include "prefill_harness_common.cuh"

template <Kind K, int D, int MASK, int POS, int PAGE, typename Variant, typename Params>
static int call_kernel(const Params& p, int64_t total_q, int64_t kv_rows, void* ws, int64_t bytes,
                       const DeviceInfo& dev, cudaStream_t st) {
  if constexpr (K == kSingle) {
    return prefill::launch_single_prefill<D, MASK, POS, Variant>(p, ws, bytes, dev, st);
  } else if constexpr (K == kRagged) {
    return prefill::launch_batch_prefill_ragged<D, MASK, POS, Variant>(p, total_q, kv_rows, ws,
                                                                        bytes, dev, st);
  } else {
    return prefill::launch_batch_prefill_paged<D, PAGE, MASK, POS, Variant>(p, total_q, kv_rows, ws,
                                                                             bytes, dev, st);
  }
}

template <Kind K, int D, int POS, typename Variant, typename Params>
static int64_t ws_bytes(const Params& p, int64_t total_q, int64_t kv_rows, int64_t batch,
                        const DeviceInfo& dev) {
  if constexpr (K == kSingle) {
    return prefill::single_prefill_workspace_bytes<D, POS, Variant, Params>(
        p.qo_len, p.kv_len, p.num_qo_heads, p.num_kv_heads, dev.sm_count);
  } else {
    return prefill::batch_prefill_workspace_bytes<D, POS, Variant, Params>(
        total_q, kv_rows, batch, p.num_qo_heads, p.num_kv_heads, dev.sm_count);
  }
}

template <Kind K, typename T, int D, int MASK, int POS, template <class> class VariantT,
          int PAGE = 1>
static void run_test(const Spec& s) {
  using Variant = VariantT<typename ParamsOf<K, T, PAGE>::type>;
  run_case<K, T, D, MASK, POS, Variant, PAGE>(s, false, ws_bytes<K, D, POS, Variant>, call_kernel<K, D, MASK, POS, PAGE, Variant>);
}

// ---------------------------------------------------------------- benchmarks

struct BenchRow {
  std::string name;
  double ms, tflops;
};
static std::vector<BenchRow> g_rows;

/** Batch bench over lengths (qo = kv per request); kind ragged or paged (page 16). */
template <Kind K, typename T, int D, int MASK, int POS, template <class> class VariantT,
          int PAGE = 1>
static void bench(const std::string& name, int Hq, int Hkv, const std::vector<int>& lens) {
  using Params = typename ParamsOf<K, T, PAGE>::type;
  using Variant = VariantT<Params>;
  DeviceInfo dev;
  current_device(&dev);
  BenchInputs<K, T, D, PAGE> in(Hq, Hkv, lens, true);
  Params& P = in.P;
  const Lengths& L = in.L;
  const int B = in.B;
  const int64_t kv_rows = in.kv_rows;
  const int64_t bytes = ws_bytes<K, D, POS, Variant>(P, L.total_q, kv_rows, B, dev);
  DevBuf<uint8_t> ws(size_t(std::max<int64_t>(bytes, 16)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());
  const double ms = time_median(
      [&]() {
        return call_kernel<K, D, MASK, POS, PAGE, Variant>(P, L.total_q, kv_rows, ws.p, bytes, dev,
                                                            st);
      },
      st, 25);
  const double tf = bench_flops<MASK>(Hq, D, lens) / (ms * 1e-3) / 1e12;
  g_rows.push_back({name, ms, tf});
  std::printf("BENCH %-44s %9.3f ms %7.1f TFLOP/s\n", name.c_str(), ms, tf);
  CK(cudaStreamDestroy(st));
}

// ---------------------------------------------------------------- main
int main(int argc, char** argv) {
  bool tests = true, benches = true;
  parse_args(argc, argv, tests, benches);
  print_device();
#if defined(PREFILL_D128_BENCH_ONLY) || defined(PREFILL_BENCH_ONLY) || \
    defined(PREFILL_VARIANT_BENCH_ONLY)
  tests = false;
#else
  if (tests) {
    // ---- single
    run_test<kSingle, bf16, 128, C, Z, DefaultAttention>({"s causal eq 1000", 8, 8, {1000}, {1000}});
    run_test<kSingle, bf16, 128, C, Z, DefaultAttention>({"s causal qo<kv 129/4097 gqa8 split", 32, 4, {129}, {4097}});
    {
      Spec s{"s causal qo>kv 1000/129 gqa4 HND", 8, 2, {1000}, {129}};
      s.hnd = true;
      run_test<kSingle, bf16, 128, C, Z, DefaultAttention>(s);
    }
    run_test<kSingle, bf16, 128, N, Z, DefaultAttention>({"s none 1/4097 gqa4 split", 32, 8, {1}, {4097}});
    {
      Spec s{"s none 7/1000 gqa4 HND", 8, 2, {7}, {1000}};
      s.hnd = true;
      run_test<kSingle, bf16, 128, N, Z, DefaultAttention>(s);
    }
    run_test<kSingle, bf16, 128, N, Z, DefaultAttention>({"s none eq 4097", 4, 4, {4097}, {4097}});
    run_test<kSingle, bf16, 64, C, Z, DefaultAttention>({"s causal d64 4097", 8, 8, {4097}, {4097}});
    run_test<kSingle, bf16, 64, C, Z, DefaultAttention>({"s causal d64 7/129 gqa8", 8, 1, {7}, {129}});
    run_test<kSingle, bf16, 256, C, Z, DefaultAttention>({"s causal d256 1000 gqa4", 8, 2, {1000}, {1000}});
    run_test<kSingle, bf16, 256, C, Z, DefaultAttention>({"s causal d256 129/4097 split", 8, 8, {129}, {4097}});
    run_test<kSingle, half, 128, C, Z, DefaultAttention>({"s causal f16 1000 gqa8", 8, 1, {1000}, {1000}});
    run_test<kSingle, bf16, 128, C, Z, LogitsSoftCap>({"s causal soft_cap 1000", 8, 4, {1000}, {1000}});
    run_test<kSingle, bf16, 128, N, Z, Sigmoid>({"s none sigmoid 129/1000", 8, 4, {129}, {1000}});
    {
      Spec s{"s causal rope 1000 HND", 8, 2, {1000}, {1000}};
      s.hnd = true;
      run_test<kSingle, bf16, 128, C, R, DefaultAttention>(s);
      Spec s2{"s causal rope 7/4097 theta5e5 scale2 split", 8, 2, {7}, {4097}};
      s2.rope_theta = 5e5f;
      s2.rope_scale = 2.f;
      run_test<kSingle, bf16, 128, C, R, DefaultAttention>(s2);
    }
    // ---- variants in depth (prefill-only paths: ALiBi's hoisted bias, soft_cap's fixed
    // reference and FMA-pipe exp2, sigmoid's FMA-pipe reciprocal)
    {
      auto sp = [](const char* n, int hq, int hkv, int qo, int kv, float cap, float bias) {
        Spec s{n, hq, hkv, {qo}, {kv}};
        s.soft_cap = cap;
        s.sigmoid_bias = bias;
        return s;
      };
      run_test<kSingle, bf16, 128, C, Z, LogitsSoftCap>(sp("s causal soft_cap30 1000 gqa4", 8, 2, 1000, 1000, 30.f, 0.f));
      run_test<kSingle, bf16, 128, C, Z, LogitsSoftCap>(sp("s causal soft_cap1.5 129/1000", 8, 8, 129, 1000, 1.5f, 0.f));
      run_test<kSingle, bf16, 128, C, Z, LogitsSoftCap>(sp("s causal soft_cap4 qo>kv 1000/129", 8, 4, 1000, 129, 4.f, 0.f));
      run_test<kSingle, bf16, 128, C, Z, LogitsSoftCap>(sp("s causal soft_cap30 7/4097 split", 32, 4, 7, 4097, 30.f, 0.f));
      run_test<kSingle, bf16, 128, N, Z, LogitsSoftCap>(sp("s none soft_cap(off) 129/1000", 8, 8, 129, 1000, 0.f, 0.f));
      run_test<kSingle, half, 128, C, Z, LogitsSoftCap>(sp("s causal f16 soft_cap4 1000", 8, 2, 1000, 1000, 4.f, 0.f));
      run_test<kSingle, bf16, 256, C, Z, LogitsSoftCap>(sp("s causal d256 soft_cap30 1000", 8, 8, 1000, 1000, 30.f, 0.f));
      run_test<kSingle, bf16, 64, C, Z, LogitsSoftCap>(sp("s causal d64 soft_cap30 1000", 8, 8, 1000, 1000, 30.f, 0.f));
      run_test<kSingle, bf16, 128, C, Z, Sigmoid>(sp("s causal sigmoid(-2) 1000", 8, 4, 1000, 1000, 0.f, -2.f));
      run_test<kSingle, bf16, 128, C, Z, Sigmoid>(sp("s causal sigmoid(0.5) qo>kv 1000/129", 8, 8, 1000, 129, 0.f, 0.5f));
      run_test<kSingle, half, 128, N, Z, Sigmoid>(sp("s none f16 sigmoid(-2) 129/1000", 8, 2, 129, 1000, 0.f, -2.f));
      run_test<kSingle, bf16, 128, C, Z, ALiBi>(sp("s causal alibi 1000 gqa4", 8, 2, 1000, 1000, 0.f, 0.f));
      run_test<kSingle, bf16, 128, C, Z, ALiBi>(sp("s causal alibi qo<kv 129/4097 split", 32, 4, 129, 4097, 0.f, 0.f));
      run_test<kSingle, bf16, 128, N, Z, ALiBi>(sp("s none alibi 7/1000", 8, 8, 7, 1000, 0.f, 0.f));
      run_test<kSingle, half, 128, C, Z, ALiBi>(sp("s causal f16 alibi qo>kv 1000/129", 8, 4, 1000, 129, 0.f, 0.f));
      run_test<kSingle, bf16, 64, C, Z, ALiBi>(sp("s causal d64 alibi 1000", 8, 8, 1000, 1000, 0.f, 0.f));
      run_test<kSingle, bf16, 256, C, Z, ALiBi>(sp("s causal d256 alibi 1000", 8, 8, 1000, 1000, 0.f, 0.f));
    }
    // ---- ragged
    const std::vector<int> qo_mix = {7, 129, 0, 1000, 1, 300, 64};
    const std::vector<int> kv_mix = {7, 200, 50, 1000, 4097, 0, 33};
    run_test<kRagged, bf16, 128, C, Z, DefaultAttention>({"r causal mix gqa4", 16, 4, qo_mix, kv_mix});
    run_test<kRagged, bf16, 128, N, Z, DefaultAttention>({"r none mix gqa4", 16, 4, qo_mix, kv_mix});
    {
      Spec s{"r causal rope mix offsets", 8, 8, qo_mix, kv_mix};
      s.offsets = true;
      run_test<kRagged, bf16, 128, C, R, DefaultAttention>(s);
    }
    run_test<kRagged, bf16, 128, C, Z, SlidingWindow>({"r causal sliding_window(37) mix", 8, 2, qo_mix, kv_mix});
    run_test<kRagged, bf16, 64, C, Z, DefaultAttention>({"r causal d64 mix", 8, 8, qo_mix, kv_mix});
    {
      Spec s{"r causal f16 d256 rope mix", 8, 4, qo_mix, kv_mix};
      s.offsets = true;
      run_test<kRagged, half, 256, C, R, DefaultAttention>(s);
    }
    run_test<kRagged, bf16, 128, C, Z, DefaultAttention>({"r causal decode-like split", 32, 8, {1, 1, 3}, {4097, 1000, 129}});
    {
      Spec s{"r causal graph", 16, 4, {100, 7, 1000, 0}, {100, 4097, 1000, 5}};
      s.qo2 = {1, 900, 0, 206};
      s.kv2 = {3000, 901, 17, 2000};
      run_test<kRagged, bf16, 128, C, Z, DefaultAttention>(s);
      Spec s3{"r causal graph split->nosplit", 32, 8, {1, 2}, {4097, 2000}};
      s3.qo2 = {2, 1};
      s3.kv2 = {7, 129};
      run_test<kRagged, bf16, 128, C, Z, DefaultAttention>(s3);
    }
    // ---- paged
    run_test<kPaged, bf16, 128, C, Z, DefaultAttention, 16>({"p16 causal mix gqa4", 16, 4, qo_mix, kv_mix});
    run_test<kPaged, bf16, 128, C, Z, DefaultAttention, 1>({"p1 causal mix gqa4", 16, 4, qo_mix, kv_mix});
    {
      Spec s{"p16 causal rope mix offsets", 8, 2, qo_mix, kv_mix};
      s.offsets = true;
      run_test<kPaged, bf16, 128, C, R, DefaultAttention, 16>(s);
    }
    run_test<kPaged, bf16, 128, C, Z, ALiBi, 16>({"p16 causal alibi mix", 8, 8, qo_mix, kv_mix});
    {
      Spec s{"p16 causal alibi rope HND mix offsets", 8, 2, qo_mix, kv_mix};
      s.hnd = true;
      s.offsets = true;
      run_test<kPaged, bf16, 128, C, R, ALiBi, 16>(s);
      Spec s2{"r causal soft_cap30 mix gqa4", 16, 4, qo_mix, kv_mix};
      s2.soft_cap = 30.f;
      run_test<kRagged, bf16, 128, C, Z, LogitsSoftCap>(s2);
      Spec s3{"r causal sigmoid(-2) mix", 8, 2, qo_mix, kv_mix};
      s3.sigmoid_bias = -2.f;
      run_test<kRagged, bf16, 128, C, Z, Sigmoid>(s3);
    }
    {
      Spec s{"p16 none f16 HND-pages mix", 8, 2, qo_mix, kv_mix};
      s.hnd = true;
      run_test<kPaged, half, 128, N, Z, DefaultAttention, 16>(s);
    }
    run_test<kPaged, bf16, 256, C, Z, DefaultAttention, 16>({"p16 causal d256 mix", 8, 4, qo_mix, kv_mix});
    run_test<kPaged, bf16, 128, C, Z, DefaultAttention, 16>({"p16 causal decode-like split", 32, 8, {1, 5}, {4097, 2000}});
    {
      Spec s{"p16 causal graph", 16, 4, {100, 7, 1000, 0}, {100, 4097, 1000, 5}};
      s.qo2 = {1, 900, 0, 206};
      s.kv2 = {3000, 901, 17, 2000};
      run_test<kPaged, bf16, 128, C, Z, DefaultAttention, 16>(s);
    }
    std::printf("correctness: %d failure(s)\n", g_failures);
  }
#endif
  if (benches) {
    CK(cudaMalloc(&g_flush, kFlushBytes));
    const std::vector<int> s8k = {8192}, s1k = {1024};
    std::vector<int> mix;
    for (int i = 0; i < 16; ++i) mix.push_back(512 + (4096 - 512) * i / 15);
    int total = 0;
    for (int x : mix) total += x;
    bench<kSingle, bf16, 128, C, Z, DefaultAttention>("single causal d128 8192", 32, 32, s8k);
#ifdef PREFILL_VARIANT_BENCH_ONLY
    // Variant cost over default (benches/bench_prefill.py's rows): each variant between two
    // default runs (the clock drifts down under sustained load: compare with their mean).
    bench<kSingle, bf16, 128, C, Z, LogitsSoftCap>("single causal d128 8192 soft_cap", 32, 32, s8k);
    bench<kSingle, bf16, 128, C, Z, DefaultAttention>("single causal d128 8192 (2)", 32, 32, s8k);
    bench<kSingle, bf16, 128, C, Z, ALiBi>("single causal d128 8192 alibi", 32, 32, s8k);
    bench<kSingle, bf16, 128, C, Z, DefaultAttention>("single causal d128 8192 (3)", 32, 32, s8k);
    bench<kSingle, bf16, 128, C, Z, Sigmoid>("single causal d128 8192 sigmoid", 32, 32, s8k);
    bench<kSingle, bf16, 128, C, Z, DefaultAttention>("single causal d128 8192 (again)", 32, 32, s8k);
    bench<kRagged, bf16, 128, C, Z, DefaultAttention>("ragged causal 16 x 512..4096", 32, 32, mix);
    bench<kPaged, bf16, 128, C, Z, DefaultAttention, 16>("paged16 causal 16 x 512..4096", 32, 32, mix);
    bench<kPaged, bf16, 128, N, Z, DefaultAttention, 16>("paged16 none 16 x 512..4096", 32, 32, mix);
    bench<kPaged, bf16, 128, C, R, DefaultAttention, 16>("paged16 causal 16 x 512..4096 rope", 32, 32, mix);
    bench<kPaged, bf16, 128, C, Z, DefaultAttention, 1>("paged1 causal 16 x 512..4096", 32, 32, mix);
#else
    bench<kSingle, bf16, 128, N, Z, DefaultAttention>("single none d128 8192", 32, 32, s8k);
#ifndef PREFILL_D128_BENCH_ONLY
    bench<kSingle, bf16, 64, C, Z, DefaultAttention>("single causal d64 8192", 32, 32, s8k);
    bench<kSingle, bf16, 256, C, Z, DefaultAttention>("single causal d256 8192", 32, 32, s8k);
#endif
    bench<kSingle, bf16, 128, C, Z, DefaultAttention>("single causal d128 1024", 32, 32, s1k);
    bench<kSingle, bf16, 128, N, Z, DefaultAttention>("single none d128 1024", 32, 32, s1k);
#ifndef PREFILL_D128_BENCH_ONLY
    bench<kSingle, bf16, 128, C, Z, DefaultAttention>("single causal d128 " + std::to_string(total), 32, 32, {total});
    bench<kSingle, bf16, 128, C, Z, LogitsSoftCap>("single causal d128 8192 soft_cap", 32, 32, s8k);
    bench<kSingle, bf16, 128, C, Z, ALiBi>("single causal d128 8192 alibi", 32, 32, s8k);
    bench<kSingle, bf16, 128, C, Z, Sigmoid>("single causal d128 8192 sigmoid", 32, 32, s8k);
    bench<kSingle, bf16, 128, N, Z, Sigmoid>("single none d128 8192 sigmoid", 32, 32, s8k);
    bench<kSingle, bf16, 128, C, R, DefaultAttention>("single causal d128 8192 rope", 32, 32, s8k);
#endif
    bench<kRagged, bf16, 128, C, Z, DefaultAttention>("ragged causal 16 x 512..4096", 32, 32, mix);
#ifndef PREFILL_D128_BENCH_ONLY
    bench<kRagged, bf16, 128, C, R, DefaultAttention>("ragged causal 16 x 512..4096 rope", 32, 32, mix);
    bench<kRagged, bf16, 128, C, Z, SlidingWindow>("ragged causal 16x sliding_window(1024)", 32, 32, mix);
#endif
    bench<kPaged, bf16, 128, C, Z, DefaultAttention, 16>("paged16 causal 16 x 512..4096", 32, 32, mix);
#ifndef PREFILL_D128_BENCH_ONLY
    bench<kPaged, bf16, 128, C, Z, ALiBi, 16>("paged16 causal 16 x 512..4096 alibi", 32, 32, mix);
#endif
#endif
    std::printf("\n| case | ms | TFLOP/s |\n| --- | --- | --- |\n");
    for (auto& r : g_rows) std::printf("| %s | %.3f | %.1f |\n", r.name.c_str(), r.ms, r.tflops);
    CK(cudaFree(g_flush));
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "OK", g_failures);
  return g_failures ? 1 : 0;
}
