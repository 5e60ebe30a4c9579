/**
 * GPU harness of the Hopper paged prefill (hopper::launch_batch_prefill_paged) and of CUDA-graph
 * replay of the Hopper batch launches, derived from the portable harness (prefill_harness.cu):
 * the same Problem builder (page cache filled with random data, shuffled pages, NHD or HND
 * pages, page sizes 1 and 16, empty requests, RoPE offsets), the same independent fp32
 * reference and the same checks and tolerances (rel, max, lse, per-row bounds, dead rows).
 * Every non-graph case also runs a second time and must give bitwise the same output (race
 * check); graph cases capture once with lengths A and replay with lengths B (same batch size).
 *
 * Build: tests/cuda/run_hopper_paged_harness.sh [out_dir]   (sm_90a, -Xptxas -v report)
 * Run:   ./hopper_paged_harness [--no-bench] [--no-tests] [--reps N] [--seq-pages]
 * Benchmarks: Hopper ragged vs Hopper paged (16, 1) vs portable paged / ragged on the same
 * lengths, cudaEvents around one call, L2 flushed (256 MB memset) before each, median of N.
 */
#include "hopper_harness_common.cuh"

static int g_reps = 25;
static bool g_seq_pages = false;  // --seq-pages: benches keep pages in order (no shuffle)

template <Kind K, typename T, int D, int MASK, int POS, template <class> class VariantT,
          int PAGE = 1>
static void run_test(const Spec& s) {
  using Variant = VariantT<typename ParamsOf<K, T, PAGE>::type>;
  run_case<K, T, D, MASK, POS, Variant, PAGE>(s, true, ws_bytes<true, K, D, POS, T, Variant>,
                                              call_kernel<true, K, D, MASK, POS, PAGE, Variant>);
}

// ---------------------------------------------------------------- benchmarks

struct BenchRow {
  std::string name;
  double ms, tflops;
};
static std::vector<BenchRow> g_rows;

/** Batch bench over lengths (qo = kv per request); kind ragged or paged (page 16). */
template <bool H, Kind K, typename T, int D, int MASK, int POS, template <class> class VariantT,
          int PAGE = 1>
static void bench(const std::string& name, int Hq, int Hkv, const std::vector<int>& lens) {
  using Params = typename ParamsOf<K, T, PAGE>::type;
  using Variant = VariantT<Params>;
  DeviceInfo dev;
  current_device(&dev);
  BenchInputs<K, T, D, PAGE> in(Hq, Hkv, lens, !g_seq_pages);
  Params& P = in.P;
  const Lengths& L = in.L;
  const int B = in.B;
  const int64_t kv_rows = in.kv_rows;
  const int64_t bytes = ws_bytes<H, K, D, POS, T, Variant>(P, L.total_q, kv_rows, B, dev);
  DevBuf<uint8_t> ws(size_t(std::max<int64_t>(bytes, 16)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());
  const double ms = time_median(
      [&]() {
        return call_kernel<H, K, D, MASK, POS, PAGE, Variant>(P, L.total_q, kv_rows, ws.p, bytes,
                                                               dev, st);
      },
      st, g_reps);
  const double tf = bench_flops<MASK>(Hq, D, lens) / (ms * 1e-3) / 1e12;
  g_rows.push_back({std::string(H ? "sm90 " : "portable ") + name, ms, tf});
  std::printf("BENCH %-9s %-44s %9.3f ms %7.1f TFLOP/s\n", H ? "sm90" : "portable", name.c_str(),
              ms, tf);
  CK(cudaStreamDestroy(st));
}

// ---------------------------------------------------------------- main
int main(int argc, char** argv) {
  bool tests = true, benches = true;
  parse_args(argc, argv, tests, benches, &g_reps, "--seq-pages", &g_seq_pages);
  print_device();
#ifdef HOPPER_BENCH_ONLY
  tests = false;
#else
  if (tests) {
    const std::vector<int> qo_mix = {7, 129, 0, 1000, 1, 300, 64};
    const std::vector<int> kv_mix = {7, 200, 50, 1000, 4097, 0, 33};
    // ---- ragged graph replay (the portable harness's cases)
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
    // ---- paged (the portable harness's cases, then more page-size-1 / HND / variant cases)
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
      Spec s1{"p1 causal graph split->nosplit", 32, 8, {1, 2}, {4097, 2000}};
      s1.qo2 = {2, 1};
      s1.kv2 = {7, 129};
      run_test<kPaged, bf16, 128, C, Z, DefaultAttention, 1>(s1);
    }
    {
      Spec s{"p1 causal rope HND mix offsets", 8, 2, qo_mix, kv_mix};
      s.hnd = true;
      s.offsets = true;
      run_test<kPaged, bf16, 128, C, R, DefaultAttention, 1>(s);
    }
    run_test<kPaged, bf16, 64, C, Z, DefaultAttention, 16>({"p16 causal d64 mix", 8, 8, qo_mix, kv_mix});
    run_test<kPaged, bf16, 64, N, Z, DefaultAttention, 1>({"p1 none d64 mix gqa8", 8, 1, qo_mix, kv_mix});
    run_test<kPaged, bf16, 128, C, Z, SlidingWindow, 16>({"p16 causal sliding_window(37) mix", 8, 2, qo_mix, kv_mix});
    {
      Spec s{"p16 causal soft_cap30 HND mix", 16, 4, qo_mix, kv_mix};
      s.soft_cap = 30.f;
      s.hnd = true;
      run_test<kPaged, bf16, 128, C, Z, LogitsSoftCap, 16>(s);
      Spec s2{"p16 none sigmoid(-2) mix", 8, 2, qo_mix, kv_mix};
      s2.sigmoid_bias = -2.f;
      run_test<kPaged, bf16, 128, N, Z, Sigmoid, 16>(s2);
    }
    {
      Spec s{"p16 causal f16 d256 rope HND mix", 8, 4, qo_mix, kv_mix};
      s.offsets = true;
      s.hnd = true;
      run_test<kPaged, half, 256, C, R, DefaultAttention, 16>(s);
    }
    std::printf("correctness: %d failure(s)\n", g_failures);
  }
#endif
  if (benches) {
    CK(cudaMalloc(&g_flush, kFlushBytes));
    std::vector<int> mix;
    for (int i = 0; i < 16; ++i) mix.push_back(512 + (4096 - 512) * i / 15);
    const std::string m = "causal 16 x 512..4096";
    bench<true, kRagged, bf16, 128, C, Z, DefaultAttention>("ragged " + m, 32, 32, mix);
    bench<true, kPaged, bf16, 128, C, Z, DefaultAttention, 16>("paged16 " + m, 32, 32, mix);
    bench<true, kPaged, bf16, 128, C, Z, DefaultAttention, 1>("paged1 " + m, 32, 32, mix);
    bench<false, kPaged, bf16, 128, C, Z, DefaultAttention, 16>("paged16 " + m, 32, 32, mix);
    bench<false, kRagged, bf16, 128, C, Z, DefaultAttention>("ragged " + m, 32, 32, mix);
    bench<true, kRagged, bf16, 128, C, Z, DefaultAttention>("ragged " + m + " (again)", 32, 32, mix);
    bench<true, kPaged, bf16, 128, C, Z, DefaultAttention, 16>("paged16 " + m + " (again)", 32, 32, mix);
    const std::vector<int> s8k = {8192};
    bench<true, kRagged, bf16, 128, C, Z, DefaultAttention>("ragged causal 1 x 8192", 32, 32, s8k);
    bench<true, kPaged, bf16, 128, C, Z, DefaultAttention, 16>("paged16 causal 1 x 8192", 32, 32, s8k);
    bench<true, kPaged, bf16, 128, C, R, DefaultAttention, 16>("paged16 " + m + " rope", 32, 32, mix);
    bench<true, kRagged, bf16, 128, C, R, DefaultAttention>("ragged " + m + " rope", 32, 32, mix);
    std::printf("\n| case | ms | TFLOP/s |\n| --- | --- | --- |\n");
    for (auto& r : g_rows) std::printf("| %s | %.3f | %.1f |\n", r.name.c_str(), r.ms, r.tflops);
    CK(cudaFree(g_flush));
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "OK", g_failures);
  return g_failures ? 1 : 0;
}
