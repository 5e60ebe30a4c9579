/**
 * What every standalone kernel harness starts with (prefill_harness_common.cuh for the prefill
 * harnesses, hopper_decode_harness.cu): the instance macro holding the union of the tested
 * variants' parameters, the built-in variants, the CUDA check macro, the common options and the
 * device line, and the input generator (Rng). Each harness includes its kernels' headers after
 * this one.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// The instance macros the harnesses need: the union of the tested variants' parameters.
#define ADDITIONAL_PARAMS_DECL \
  float logits_soft_cap;       \
  int32_t window_left;         \
  const float* alibi_slopes;   \
  float sigmoid_bias;

#include "flashgen/variant.cuh"
#include "flashgen/variants/alibi.cuh"
#include "flashgen/variants/default.cuh"
#include "flashgen/variants/sigmoid.cuh"
#include "flashgen/variants/sliding_window.cuh"
#include "flashgen/variants/soft_cap.cuh"
#include "flashgen/variant_hooks.cuh"

using namespace flashgen;
using bf16 = __nv_bfloat16;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, \
                   __LINE__, cudaGetErrorString(e_));                                      \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

/** The options every harness takes: --no-tests, --no-bench, --reps N (where reps is given) and
 *  one flag of the harness's own (flag: set to true when given); other words are ignored. */
inline void parse_args(int argc, char** argv, bool& tests, bool& benches, int* reps = nullptr,
                       const char* flag = nullptr, bool* flag_set = nullptr) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-bench")) benches = false;
    if (!std::strcmp(argv[i], "--no-tests")) tests = false;
    if (reps && !std::strcmp(argv[i], "--reps") && i + 1 < argc) *reps = std::atoi(argv[++i]);
    if (flag && !std::strcmp(argv[i], flag)) *flag_set = true;
  }
}

/** The line every harness starts its output with: device 0's name, SMs and compute capability. */
inline void print_device() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);
}

/** The harnesses' deterministic inputs (splitmix64). */
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uni() { return float((next() >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f; }  // [-1, 1)
  int below(int n) { return int(next() % uint64_t(n)); }
};

/** Benchmark inputs: n pseudo-random values in [-amp, amp) (never exactly 0), a hash of the
 *  index and seed, written on the device. */
template <typename T>
__global__ void fill_random(T* p, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    float f = (float(x & 0xFFFFFF) / 16777216.f * 2.f - 1.f) * amp;
    p[i] = T(f == 0.f ? 0.01f : f);
  }
}
