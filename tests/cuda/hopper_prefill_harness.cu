/**
 * Standalone GPU harness of the Hopper prefill kernel (include/flashgen/hopper/), beside the
 * portable kernel (include/flashgen/prefill/) in the same binary and the same run.
 *
 * Build: tests/cuda/run_hopper_prefill_harness.sh [out_dir]   (sm_90a, -Xptxas -v report)
 * Run:   ./hopper_prefill_harness [--no-bench] [--no-tests] [--reps N]
 *        (-DHOPPER_BENCH_ONLY: benchmarks only, fewer instances to compile)
 *
 * Correctness (single prefill and batch_prefill_ragged): fresh random inputs per case (never zeros), o and lse poisoned
 * with NaN bits, the workspace with 0xAB; an independent naive fp32 reference on the GPU (one
 * thread per (query, head), RoPE with double angles, the mask and the variant's hooks applied
 * literally: the portable harness's reference); rel = ||o - ref|| / ||ref||, max abs error,
 * max |lse - lse_ref| (natural log; -inf must match), no NaN. Tolerances as the portable
 * harness: bf16 rel < 1e-2, lse < 3e-2; f16 rel < 5e-3, lse < 1.5e-2. Each case also runs
 * twice to catch races (the two outputs must be bitwise equal).
 *
 * Benchmarks: cudaEvents around one call, L2 flushed before each call by a 256 MB memset,
 * median of 25 (or --reps) after 3 warm-ups; FLOPs = 4 * Hq * qo * kv * D, halved for causal.
 * Each case runs the Hopper and the portable kernel on the same buffers, alternating.
 * Exit status 1 on any failed check or CUDA error.
 */
#include "hopper_harness_common.cuh"

static int g_reps = 25;

template <Kind K, typename T, int D, int MASK, int POS, template <class> class VariantT>
static void run_test(const Spec& s) {
  using Params = typename ParamsOf<K, T>::type;
  using Variant = VariantT<Params>;
  DeviceInfo dev;
  if (current_device(&dev)) { std::fprintf(stderr, "device query failed\n"); std::exit(1); }
  const int B = int(s.qo.size());
  const Lengths L = make_lengths(s.qo, s.kv);
  const int total_q = L.total_q, total_kv = L.total_kv;
  Rng r(s.seed * 7919 + D + total_q * 31 + total_kv);
  const int Hq = s.Hq, Hkv = s.Hkv;
  std::vector<T> q_h = rand_vec<T>(size_t(total_q) * Hq * D, r, 2.f);
  std::vector<T> k_h = rand_vec<T>(size_t(total_kv) * Hkv * D, r, 2.f);
  std::vector<T> v_h = rand_vec<T>(size_t(total_kv) * Hkv * D, r, 1.f);
  DevBuf<T> q(q_h.size()), k(k_h.size()), v(v_h.size()), o(q_h.size()), k_in(k_h.size()),
      v_in(v_h.size());
  DevBuf<float> lse(size_t(total_q) * Hq), o_ref(q_h.size()), lse_ref(size_t(total_q) * Hq),
      k_rot(k_h.size());
  DevBuf<int> d_qo(B + 1), d_kv(B + 1), d_tok(std::max(total_q, 1)), d_kvr(std::max(total_kv, 1)),
      d_qoff(B), d_kvoff(B);
  q.up(q_h);
  k.up(k_h);
  v.up(v_h);
  d_qo.up(L.qo_indptr);
  d_kv.up(L.kv_indptr);
  d_tok.up(L.req_of_token);
  d_kvr.up(L.req_of_kvrow);
  std::vector<int> qoff, kvoff;
  rope_offsets(B, s.offsets, r, qoff, kvoff);
  d_qoff.up(qoff);
  d_kvoff.up(kvoff);
  std::vector<float> sl(Hq);
  for (int h = 0; h < Hq; ++h) sl[h] = std::pow(2.f, -8.f * (h + 1) / Hq);
  DevBuf<float> slopes(Hq);
  slopes.up(sl);
  Params P{};
  set_shared(P, D, Hq, Hkv, q.p, o.p, lse.p, slopes.p, 5.f, 37, -1.f, s.rope_theta, s.rope_scale);
  set_kv(P, k.p, v.p, int64_t(Hkv) * D, D);
  if constexpr (K == kSingle) {
    P.qo_len = total_q;
    P.kv_len = total_kv;
    if (s.hnd) {
      std::vector<T> kh(k_h.size()), vh(v_h.size());
      for (int j = 0; j < total_kv; ++j)
        for (int h = 0; h < Hkv; ++h)
          for (int d = 0; d < D; ++d) {
            kh[(size_t(h) * total_kv + j) * D + d] = k_h[(size_t(j) * Hkv + h) * D + d];
            vh[(size_t(h) * total_kv + j) * D + d] = v_h[(size_t(j) * Hkv + h) * D + d];
          }
      k_in.up(kh);
      v_in.up(vh);
      set_kv(P, k_in.p, v_in.p, D, int64_t(total_kv) * D);
    }
  } else {
    P.qo_indptr = d_qo.p;
    P.kv_indptr = d_kv.p;
    P.q_rope_offset = s.offsets ? d_qoff.p : nullptr;
    P.kv_rope_offset = s.offsets ? d_kvoff.p : nullptr;
    P.batch_size = B;
  }
  const int64_t bytes = ws_bytes<true, K, D, POS, T, Variant>(P, total_q, total_kv, B, dev);
  DevBuf<uint8_t> ws(size_t(std::max<int64_t>(bytes, 16)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // reference
  {
    const int n = total_kv * Hkv;
    if (n > 0) {
      ref_rope_k<D, T><<<(n + 127) / 128, 128, 0, st>>>(k.p, d_kvr.p, d_kv.p, d_kvoff.p, total_kv,
                                                          Hkv, POS == prefill::kPosRopeLlama,
                                                          s.rope_theta, s.rope_scale, k_rot.p);
      CK(cudaGetLastError());
    }
    RefArgs a{q.p, k_rot.p, v.p, d_qo.p, d_kv.p, d_tok.p, d_qoff.p, Hq, Hkv, total_q,
              MASK == prefill::kMaskCausal, POS == prefill::kPosRopeLlama, s.rope_theta,
              s.rope_scale, o_ref.p, lse_ref.p};
    const int nt = total_q * Hq;
    if (nt > 0) {
      ref_attention<D, T, Variant, Params><<<(nt + 63) / 64, 64, 0, st>>>(P, a);
      CK(cudaGetLastError());
    }
    CK(cudaStreamSynchronize(st));
  }
  const std::vector<float> oref = o_ref.down(), lref = lse_ref.down();
  std::vector<T> first_o;
  Errors e{0, 0, 0, false, false};
  bool stable = true;
  for (int round = 0; round < 2; ++round) {
    CK(cudaMemset(o.p, 0xFF, o.n * sizeof(T)));
    CK(cudaMemset(lse.p, 0xFF, lse.n * sizeof(float)));
    CK(cudaMemset(ws.p, 0xAB, ws.n));
    const int rc =
        call_kernel<true, K, D, MASK, POS, 1, Variant>(P, total_q, total_kv, ws.p, bytes, dev, st);
    if (rc != 0) {
      std::printf("FAIL %-40s launch returned %d: %s\n", s.name.c_str(), rc, last_error_buffer());
      ++g_failures;
      CK(cudaStreamDestroy(st));
      return;
    }
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    const std::vector<T> oh = o.down();
    const std::vector<float> lh = lse.down();
    if (round == 0) {
      first_o = oh;
      compare_totals(e, oh, oref, lh, lref);
    } else {
      stable = std::memcmp(first_o.data(), oh.data(), oh.size() * sizeof(T)) == 0;
    }
  }
  const bool f16 = std::is_same<T, half>::value;
  const double tol = f16 ? 5e-3 : 1e-2, ltol = f16 ? 1.5e-2 : 3e-2;
  const bool ok = !e.nan && !e.inf_mismatch && e.rel < tol && e.lse_err < ltol && stable;
  if (!ok) ++g_failures;
  std::printf("%s %-40s %-6s %s D%-3d H%d/%d rel %.2e max %.2e lse %.2e%s%s%s\n",
              ok ? "PASS" : "FAIL", s.name.c_str(), K == kSingle ? "single" : "ragged",
              f16 ? "f16 " : "bf16", D, Hq, Hkv, e.rel, e.max_abs, e.lse_err,
              e.nan ? " NaN/unwritten" : "", e.inf_mismatch ? " -inf mismatch" : "",
              stable ? "" : " UNSTABLE (two runs differ)");
  CK(cudaStreamDestroy(st));
}

// ---------------------------------------------------------------- benchmarks

struct Row {
  std::string name;
  double hopper_ms, portable_ms, flops;
};
static std::vector<Row> g_rows;

/** Median time of each backend, alternating one call of each per repetition. */
template <typename F1, typename F2>
static void time_pair(F1&& f1, F2&& f2, cudaStream_t st, double& ms1, double& ms2) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) {
    if (f1() != 0 || f2() != 0) {
      std::printf("bench launch failed: %s\n", last_error_buffer());
      ++g_failures;
      ms1 = ms2 = -1;
      return;
    }
  }
  std::vector<float> t1, t2;
  for (int i = 0; i < g_reps; ++i) {
    for (int which = 0; which < 2; ++which) {
      CK(cudaMemsetAsync(g_flush, i & 0xFF, kFlushBytes, st));
      CK(cudaEventRecord(a, st));
      if (which == 0) f1(); else f2();
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      (which == 0 ? t1 : t2).push_back(ms);
    }
  }
  CK(cudaGetLastError());
  std::sort(t1.begin(), t1.end());
  std::sort(t2.begin(), t2.end());
  ms1 = t1[t1.size() / 2];
  ms2 = t2[t2.size() / 2];
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
}

/** Benchmark over lengths (qo = kv per request): single (one length) or ragged. */
template <Kind K, typename T, int D, int MASK, int POS, template <class> class VariantT>
static void bench(const std::string& name, int Hq, int Hkv, const std::vector<int>& lens) {
  using Params = typename ParamsOf<K, T>::type;
  using Variant = VariantT<Params>;
  DeviceInfo dev;
  current_device(&dev);
  // The portable harness's bench inputs (sigmoid_bias 0 there, -1 in the tests here: no bench
  // here runs Sigmoid).
  BenchInputs<K, T, D, 1> in(Hq, Hkv, lens, true);
  const Params& P = in.P;
  const int B = in.B, total = in.L.total_q;
  const int64_t b1 = ws_bytes<true, K, D, POS, T, Variant>(P, total, total, B, dev);
  const int64_t b2 = ws_bytes<false, K, D, POS, T, Variant>(P, total, total, B, dev);
  DevBuf<uint8_t> ws1(size_t(std::max<int64_t>(b1, 16))), ws2(size_t(std::max<int64_t>(b2, 16)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize());
  double ms1, ms2;
  time_pair([&]() { return call_kernel<true, K, D, MASK, POS, 1, Variant>(P, total, total, ws1.p, b1, dev, st); },
            [&]() { return call_kernel<false, K, D, MASK, POS, 1, Variant>(P, total, total, ws2.p, b2, dev, st); },
            st, ms1, ms2);
  const double flops = bench_flops<MASK>(Hq, D, lens);
  g_rows.push_back({name, ms1, ms2, flops});
  std::printf("BENCH %-40s sm90 %8.3f ms %6.1f TFLOP/s | portable %8.3f ms %6.1f TFLOP/s\n",
              name.c_str(), ms1, flops / ms1 / 1e9, ms2, flops / ms2 / 1e9);
  CK(cudaStreamDestroy(st));
}

int main(int argc, char** argv) {
  bool tests = true, benches = true;
  parse_args(argc, argv, tests, benches, &g_reps);
  print_device();
#ifdef HOPPER_BENCH_ONLY
  tests = false;
#else
  if (tests) {
    constexpr Kind S1 = kSingle, RG = kRagged;
    run_test<S1, bf16, 128, C, Z, DefaultAttention>({"causal eq 1000", 8, 8, {1000}, {1000}});
    run_test<S1, bf16, 128, C, Z, DefaultAttention>({"causal eq 128", 4, 4, {128}, {128}});
    run_test<S1, bf16, 128, C, Z, DefaultAttention>({"causal qo<kv 129/4097 gqa8 split", 32, 4, {129}, {4097}});
    run_test<S1, bf16, 128, C, Z, DefaultAttention>({"causal qo>kv 1000/129 gqa4 HND", 8, 2, {1000}, {129}, true});
    run_test<S1, bf16, 128, C, Z, DefaultAttention>({"causal gqa3 777/2000", 6, 2, {777}, {2000}});
    run_test<S1, bf16, 128, C, Z, DefaultAttention>({"causal kv 0", 4, 4, {5}, {0}});
    run_test<S1, bf16, 128, N, Z, DefaultAttention>({"none 1/4097 gqa4 split", 32, 8, {1}, {4097}});
    run_test<S1, bf16, 128, N, Z, DefaultAttention>({"none 7/1000 gqa4 HND", 8, 2, {7}, {1000}, true});
    run_test<S1, bf16, 128, N, Z, DefaultAttention>({"none eq 4097", 4, 4, {4097}, {4097}});
    run_test<S1, bf16, 128, N, Z, DefaultAttention>({"none 300/65", 4, 1, {300}, {65}});
#ifndef HOPPER_D128_BENCH_ONLY
    run_test<S1, half, 128, C, Z, DefaultAttention>({"causal f16 1000 gqa8", 8, 1, {1000}, {1000}});
    run_test<S1, half, 128, C, Z, DefaultAttention>({"causal f16 3000/4097", 4, 4, {3000}, {4097}});
    run_test<S1, bf16, 64, C, Z, DefaultAttention>({"causal d64 4097", 8, 8, {4097}, {4097}});
    run_test<S1, bf16, 64, C, Z, DefaultAttention>({"causal d64 7/129 gqa8", 8, 1, {7}, {129}});
    run_test<S1, bf16, 256, C, Z, DefaultAttention>({"causal d256 1000 gqa4", 8, 2, {1000}, {1000}});
    run_test<S1, bf16, 256, C, Z, DefaultAttention>({"causal d256 129/4097 split", 8, 8, {129}, {4097}});
    run_test<S1, bf16, 128, C, Z, LogitsSoftCap>({"causal soft_cap 1000", 8, 4, {1000}, {1000}});
    run_test<S1, bf16, 128, N, Z, Sigmoid>({"none sigmoid 129/1000", 8, 4, {129}, {1000}});
    run_test<S1, bf16, 128, C, Z, SlidingWindow>({"causal sliding_window(37) 1000/1300", 8, 2, {1000}, {1300}});
    run_test<S1, bf16, 128, C, Z, ALiBi>({"causal alibi 1000", 8, 8, {1000}, {1000}});
    run_test<S1, bf16, 128, C, R, DefaultAttention>({"causal rope 1000 HND", 8, 2, {1000}, {1000}, true});
    {
      Spec s{"causal rope 7/4097 theta5e5 scale2 split", 8, 2, {7}, {4097}};
      s.rope_theta = 5e5f;
      s.rope_scale = 2.f;
      run_test<S1, bf16, 128, C, R, DefaultAttention>(s);
    }
#endif
    // ---- ragged (the portable harness's mix: empty requests, qo > kv, decode-like rows)
    const std::vector<int> qo_mix = {7, 129, 0, 1000, 1, 300, 64};
    const std::vector<int> kv_mix = {7, 200, 50, 1000, 4097, 0, 33};
    run_test<RG, bf16, 128, C, Z, DefaultAttention>({"r causal mix gqa4", 16, 4, qo_mix, kv_mix});
    run_test<RG, bf16, 128, N, Z, DefaultAttention>({"r none mix gqa4", 16, 4, qo_mix, kv_mix});
    run_test<RG, bf16, 128, C, Z, DefaultAttention>({"r causal decode-like split", 32, 8, {1, 1, 3}, {4097, 1000, 129}});
#ifndef HOPPER_D128_BENCH_ONLY
    {
      Spec s{"r causal rope mix offsets", 8, 8, qo_mix, kv_mix};
      s.offsets = true;
      run_test<RG, bf16, 128, C, R, DefaultAttention>(s);
    }
    run_test<RG, bf16, 128, C, Z, SlidingWindow>({"r causal sliding_window(37) mix", 8, 2, qo_mix, kv_mix});
    run_test<RG, bf16, 64, C, Z, DefaultAttention>({"r causal d64 mix", 8, 8, qo_mix, kv_mix});
    {
      Spec s{"r causal f16 d256 rope mix", 8, 4, qo_mix, kv_mix};
      s.offsets = true;
      run_test<RG, half, 256, C, R, DefaultAttention>(s);
    }
#endif
    std::printf("correctness: %d failure(s)\n", g_failures);
  }
#endif
  if (benches) {
    CK(cudaMalloc(&g_flush, kFlushBytes));
    constexpr Kind S1 = kSingle, RG = kRagged;
    std::vector<int> mix;
    for (int i = 0; i < 16; ++i) mix.push_back(512 + (4096 - 512) * i / 15);
    bench<S1, bf16, 128, C, Z, DefaultAttention>("single causal d128 8192", 32, 32, {8192});
    bench<S1, bf16, 128, N, Z, DefaultAttention>("single none d128 8192", 32, 32, {8192});
    bench<S1, bf16, 128, C, Z, DefaultAttention>("single causal d128 1024", 32, 32, {1024});
    bench<S1, bf16, 128, C, Z, DefaultAttention>("single causal d128 2048", 32, 32, {2048});
    bench<S1, bf16, 128, C, Z, DefaultAttention>("single causal d128 4096", 32, 32, {4096});
    bench<S1, bf16, 128, C, Z, DefaultAttention>("single causal d128 1024 gqa4", 32, 8, {1024});
    bench<S1, bf16, 128, C, Z, DefaultAttention>("single causal d128 32768", 32, 32, {32768});
    bench<RG, bf16, 128, C, Z, DefaultAttention>("ragged causal 16 x 512..4096", 32, 32, mix);
#ifndef HOPPER_D128_BENCH_ONLY
    bench<S1, bf16, 64, C, Z, DefaultAttention>("single causal d64 8192", 32, 32, {8192});
    bench<S1, bf16, 256, C, Z, DefaultAttention>("single causal d256 8192", 32, 32, {8192});
    bench<S1, bf16, 128, C, R, DefaultAttention>("single causal d128 8192 rope", 32, 32, {8192});
    // Variant cost (issue 8's < 5 %): the same shape as the default row above.
    bench<S1, bf16, 128, C, Z, LogitsSoftCap>("single causal d128 8192 soft_cap", 32, 32, {8192});
    bench<S1, bf16, 128, C, Z, ALiBi>("single causal d128 8192 alibi", 32, 32, {8192});
#endif
    std::printf("\n| case | sm90 ms | sm90 TFLOP/s | portable ms | portable TFLOP/s |\n"
                "| --- | --- | --- | --- | --- |\n");
    for (auto& r : g_rows) {
      std::printf("| %s | %.3f | %.1f | %.3f | %.1f |\n", r.name.c_str(), r.hopper_ms,
                  r.flops / r.hopper_ms / 1e9, r.portable_ms, r.flops / r.portable_ms / 1e9);
    }
    CK(cudaFree(g_flush));
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "OK", g_failures);
  return g_failures ? 1 : 0;
}
