/**
 * What a plain read of single decode's K/V costs on this GPU, with nothing else in the kernel:
 * the floor under issue 10's single-decode goals (32768 tokens > 3.8 TB/s, 1024 tokens < 8 us),
 * measured with the decode benchmarks' method (bf16, 8 kv heads, head_dim 128, NHD K and V of
 * [tokens][8][128]; cudaEvents around one launch, L2 flushed by a 256 MB memset before every
 * call, configurations alternated call by call, median).
 *
 * Patterns:
 * - rows: decode's access. CTA (split s, kv head h) reads the 256-byte rows of head h (2 KB
 *   apart) of tokens [s * chunk, (s + 1) * chunk) of K and V, 512 threads, U rows of K and U of
 *   V in flight per thread group (U * 16 KB a CTA). `rot` starts each CTA at another point of
 *   its range (same bytes, other order): splits that start on 8 MB multiples and run in lockstep
 *   could crowd the same DRAM channels.
 * - stream: the same bytes as G contiguous pieces, one per CTA (the best case of a plain read).
 * - bulk: the same bytes by the bulk copy engine (cp.async.bulk, no tensor map), one thread per
 *   CTA keeping S copies of B bytes in flight into a shared-memory ring: what the sm90 decode's
 *   engine can read with nothing else in the way.
 * - pages: batch decode's access to a paged cache (16-token pages of [16][8][128], shuffled page
 *   table): CTA (piece s, kv head h) reads head h's rows of a run of logical pages, 2 * U pages
 *   in flight. Run at the batch-decode goals' sizes (64 x 4096 and 128 x 8192 tokens) beside
 *   the stream, it is the floor under those goals (>= 4.35 and >= 4.6 TB/s).
 *   64 x 8192 rows are the bytes of 128 x 8192 tokens of an fp8 cache (2.15 GB): the best plain
 *   read of them is the ceiling an fp8 batch decode is measured against (bench_decode.py
 *   --fp8-ceiling).
 *
 *   nvcc -O3 -std=c++17 -Iinclude -gencode=arch=compute_90a,code=sm_90a -L<nvcc root>/lib \
 *     -cudart=static benches/read_ceiling.cu -o read_ceiling && ./read_ceiling [reps]
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashgen/hopper/mbarrier.cuh"

using flashgen::hopper::mbar_arrive_expect_tx;
using flashgen::hopper::mbar_init;
using flashgen::hopper::mbar_init_fence;
using flashgen::hopper::mbar_wait;

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

constexpr int kThreads = 512;
constexpr int kRowU4 = 16;       // a head's row: 128 bf16 = 256 bytes = 16 uint4
constexpr int kHeads = 8;
constexpr int kRowStrideU4 = kHeads * kRowU4;  // NHD: 2 KB between a head's rows
constexpr int kRowsPerPass = kThreads / kRowU4;  // 32

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

/** One pass: U 16-byte loads of K and U of V (all issued before any is used) at offset(u), or
 *  none where offset(u) < 0; returns them folded into one word. */
template <int U, typename Offset>
__device__ __forceinline__ unsigned read_pass(const uint4* __restrict__ k,
                                              const uint4* __restrict__ v, Offset offset) {
  uint4 a[U], b[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t off = offset(u);
    if (off >= 0) {
      a[u] = ldg_stream(k + off);
      b[u] = ldg_stream(v + off);
    } else {
      a[u] = b[u] = make_uint4(0, 0, 0, 0);
    }
  }
  unsigned acc = 0;
#pragma unroll
  for (int u = 0; u < U; ++u) acc ^= a[u].x ^ b[u].y ^ a[u].z ^ b[u].w;
  return acc;
}

template <int U>
__global__ void __launch_bounds__(kThreads, 1)
    read_rows(const uint4* __restrict__ k, const uint4* __restrict__ v, int rows, int chunk,
              int rot, unsigned* sink) {
  const int s = blockIdx.x, h = blockIdx.y;
  const int begin = min(rows, s * chunk), end = min(rows, begin + chunk);
  const int step = kRowsPerPass * U;
  const int iters = (end - begin + step - 1) / step;
  const int r0 = iters > 0 && rot ? (s * 5 + h * 3) % iters : 0;
  const int lr = threadIdx.x / kRowU4, col = threadIdx.x % kRowU4;
  unsigned acc = 0;
  for (int it = 0; it < iters; ++it) {
    const int base = begin + ((it + r0) % iters) * step;
    acc ^= read_pass<U>(k, v, [&](int u) {
      const int row = base + u * kRowsPerPass + lr;
      return row < end ? int64_t(row) * kRowStrideU4 + h * kRowU4 + col : int64_t(-1);
    });
  }
  if (acc == 0x9e3779b9u) sink[threadIdx.x] = acc;  // keeps the loads; never true for zeros
}

template <int U>
__global__ void __launch_bounds__(kThreads, 1)
    read_stream(const uint4* __restrict__ k, const uint4* __restrict__ v, int64_t n_u4,
                unsigned* sink) {
  const int64_t per = (n_u4 + gridDim.x - 1) / gridDim.x;
  const int64_t begin = min(n_u4, per * blockIdx.x), end = min(n_u4, begin + per);
  unsigned acc = 0;
  for (int64_t base = begin; base < end; base += int64_t(kThreads) * U) {
    acc ^= read_pass<U>(k, v, [&](int u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      return i < end ? i : int64_t(-1);
    });
  }
  if (acc == 0x9e3779b9u) sink[threadIdx.x] = acc;
}

constexpr int kPage = 16;

template <int U>
__global__ void __launch_bounds__(kThreads, 1)
    read_pages(const uint4* __restrict__ k, const uint4* __restrict__ v,
               const int* __restrict__ table, int pages, int per_cta, unsigned* sink) {
  const int s = blockIdx.x, h = blockIdx.y;
  const int p_begin = min(pages, s * per_cta), p_end = min(pages, p_begin + per_cta);
  const int lr = threadIdx.x / kRowU4, col = threadIdx.x % kRowU4;
  constexpr int kPagesPerPass = kRowsPerPass / kPage;  // 2
  unsigned acc = 0;
  for (int p = p_begin; p < p_end; p += kPagesPerPass * U) {
    acc ^= read_pass<U>(k, v, [&](int u) {
      const int page = p + u * kPagesPerPass + lr / kPage;
      if (page >= p_end) return int64_t(-1);
      const int64_t row = int64_t(table[page]) * kPage + lr % kPage;
      return row * kRowStrideU4 + h * kRowU4 + col;
    });
  }
  if (acc == 0x9e3779b9u) sink[threadIdx.x] = acc;
}

template <int STAGES, int BYTES>
__global__ void __launch_bounds__(32, 1)
    read_bulk(const uint8_t* __restrict__ k, const uint8_t* __restrict__ v, int64_t half,
              int64_t per) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t bars[STAGES];
  if (threadIdx.x != 0) return;
  const int64_t begin = min(2 * half, per * blockIdx.x), end = min(2 * half, begin + per);
  const uint32_t ring_a = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  const uint32_t bar_a = static_cast<uint32_t>(__cvta_generic_to_shared(bars));
  for (int s = 0; s < STAGES; ++s) mbar_init(bar_a + 8 * s, 1);
  mbar_init_fence();
  const int64_t n = (end - begin + BYTES - 1) / BYTES;
  for (int64_t i = 0; i < n; ++i) {
    const int slot = int(i % STAGES);
    if (i >= STAGES) mbar_wait(bar_a + 8 * slot, uint32_t(i / STAGES - 1) & 1);
    const int64_t o = begin + i * BYTES;
    const uint32_t bytes = uint32_t(min(int64_t(BYTES), end - o));
    const uint8_t* src = o < half ? k + o : v + (o - half);  // pieces never straddle K and V
    mbar_arrive_expect_tx(bar_a + 8 * slot, bytes);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            ring_a + slot * BYTES),
        "l"(src), "r"(bytes), "r"(bar_a + 8 * slot)
        : "memory");
  }
  for (int64_t i = n > STAGES ? n - STAGES : 0; i < n; ++i) {
    mbar_wait(bar_a + 8 * int(i % STAGES), uint32_t(i / STAGES) & 1);
  }
}

__global__ void empty_kernel() {}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int max_rows = 128 * 8192;
  const size_t bytes1 = size_t(max_rows) * kRowStrideU4 * 16;
  uint4 *k, *v;
  unsigned* sink;
  void* flush;
  CK(cudaMalloc(&k, bytes1));
  CK(cudaMalloc(&v, bytes1));
  CK(cudaMalloc(&sink, kThreads * 4));
  CK(cudaMalloc(&flush, 256 << 20));
  CK(cudaMemset(k, 0, bytes1));
  CK(cudaMemset(v, 0, bytes1));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // A shuffled page table over the whole buffer; a size of R tokens uses its first R / 16 entries
  // (pages anywhere in the 4.3 GB).
  std::vector<int> h_table(max_rows / kPage);
  std::iota(h_table.begin(), h_table.end(), 0);
  std::shuffle(h_table.begin(), h_table.end(), std::mt19937(0));
  int* table;
  CK(cudaMalloc(&table, h_table.size() * sizeof(int)));
  CK(cudaMemcpy(table, h_table.data(), h_table.size() * sizeof(int), cudaMemcpyHostToDevice));
  for (int rows : {32768, 1024, 64 * 4096, 64 * 8192, 128 * 8192}) {
    const bool batch = rows > 32768;
    struct Cfg {
      std::string name;
      std::function<void()> run;
    };
    std::vector<Cfg> cfgs;
    auto rows_cfg = [&](int splits, int u, int rot) {
      const int chunk = (rows + splits - 1) / splits;
      char name[96];
      std::snprintf(name, sizeof name, "rows %3d x 8 CTAs, U%-2d %s", splits, u,
                    rot ? "rotated" : "in order");
      auto run = [=] {
        const dim3 grid(splits, kHeads);
        if (u == 4) read_rows<4><<<grid, kThreads>>>(k, v, rows, chunk, rot, sink);
        if (u == 8) read_rows<8><<<grid, kThreads>>>(k, v, rows, chunk, rot, sink);
        if (u == 16) read_rows<16><<<grid, kThreads>>>(k, v, rows, chunk, rot, sink);
      };
      cfgs.push_back({name, run});
    };
    auto stream_cfg = [&](int grid, int u) {
      char name[96];
      std::snprintf(name, sizeof name, "stream %3d CTAs, U%-2d", grid, u);
      const int64_t n = int64_t(rows) * kRowStrideU4;
      auto run = [=] {
        if (u == 4) read_stream<4><<<grid, kThreads>>>(k, v, n, sink);
        if (u == 8) read_stream<8><<<grid, kThreads>>>(k, v, n, sink);
      };
      cfgs.push_back({name, run});
    };
    auto pages_cfg = [&](int pieces, int u) {
      const int pages = rows / kPage;
      const int per = (pages + pieces - 1) / pieces;
      char name[96];
      std::snprintf(name, sizeof name, "pages %3d x 8 CTAs, U%-2d", pieces, u);
      auto run = [=] {
        const dim3 grid(pieces, kHeads);
        if (u == 4) read_pages<4><<<grid, kThreads>>>(k, v, table, pages, per, sink);
        if (u == 8) read_pages<8><<<grid, kThreads>>>(k, v, table, pages, per, sink);
      };
      cfgs.push_back({name, run});
    };
    auto bulk_cfg = [&](int grid, int stages, int kb) {
      char name[96];
      std::snprintf(name, sizeof name, "bulk %4d CTAs, %d x %d KB", grid, stages, kb);
      const int64_t half = int64_t(rows) * kRowStrideU4 * 16;
      const int64_t piece = int64_t(kb) * 1024;
      const int64_t per = (2 * half / grid + piece - 1) / piece * piece;
      auto run = [=] {
        auto launch = [&](auto kernel, int smem) {
          CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          kernel<<<grid, 32, smem>>>(reinterpret_cast<const uint8_t*>(k),
                                     reinterpret_cast<const uint8_t*>(v), half, per);
        };
        if (stages == 4 && kb == 32) launch(read_bulk<4, 32768>, 4 * 32768);
        if (stages == 6 && kb == 32) launch(read_bulk<6, 32768>, 6 * 32768);
        if (stages == 8 && kb == 16) launch(read_bulk<8, 16384>, 8 * 16384);
        if (stages == 4 && kb == 16) launch(read_bulk<4, 16384>, 4 * 16384);
      };
      cfgs.push_back({name, run});
    };
    bulk_cfg(sms, 4, 32);
    bulk_cfg(sms, 6, 32);
    bulk_cfg(sms, 8, 16);
    bulk_cfg(2 * sms, 4, 16);
    bulk_cfg(64, 4, 32);
    if (batch) {
      stream_cfg(sms, 8);
      stream_cfg(2 * sms, 4);
      stream_cfg(8 * sms, 4);
      pages_cfg(sms / 8, 8);  // 128 CTAs
      pages_cfg(2 * (sms / 8), 4);
      pages_cfg(8 * (sms / 8), 4);
      pages_cfg(64 * (sms / 8), 4);
    }
    for (int rot : {0, 1}) {
      if (batch) break;
      rows_cfg(8, 8, rot);
      rows_cfg(8, 16, rot);
      rows_cfg(16, 8, rot);
      rows_cfg(sms / 8 + (sms % 8 ? 1 : 0) - 1, 8, rot);  // one CTA per SM, 8 heads
      rows_cfg(33, 4, rot);
    }
    if (!batch) {
      stream_cfg(64, 8);
      stream_cfg(sms, 8);
      stream_cfg(2 * sms, 4);
      stream_cfg(4 * sms, 4);
    }
    cfgs.push_back({"empty kernel, 132 CTAs", [&] { empty_kernel<<<sms, kThreads>>>(); }});
    for (auto& c : cfgs)
      for (int w = 0; w < 3; ++w) c.run();
    CK(cudaDeviceSynchronize());
    std::vector<std::vector<float>> t(cfgs.size());
    for (int r = 0; r < reps; ++r) {
      for (size_t i = 0; i < cfgs.size(); ++i) {
        const size_t j = (r & 1) ? cfgs.size() - 1 - i : i;
        CK(cudaMemsetAsync(flush, 0, 256 << 20));
        CK(cudaEventRecord(e0));
        cfgs[j].run();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[j].push_back(ms * 1e3f);
      }
    }
    CK(cudaGetLastError());
    const double bytes = 2.0 * rows * kRowStrideU4 * 16;
    std::printf(
        "\nplain read of K and V, %d tokens x 8 heads x 128 bf16 (%.1f MB), %d SMs, median of %d, "
        "L2 flushed\n",
        rows, bytes / 1e6, sms, reps);
    for (size_t i = 0; i < cfgs.size(); ++i) {
      std::sort(t[i].begin(), t[i].end());
      const float us = t[i][t[i].size() / 2];
      std::printf("  %-36s %8.2f us %6.3f TB/s\n", cfgs[i].name.c_str(), us, bytes / us / 1e6);
    }
  }
  return 0;
}
