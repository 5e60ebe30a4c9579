/**
 * @brief Host-side launch helpers: cached device properties, the dynamic shared-memory opt-in,
 * argument checks shared by the entry points, and the copy of the variant's additional params.
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <cuda_runtime.h>

#include "flashgen/abi.h"
#include "flashgen/params.cuh"
#include "flashgen/status.cuh"

namespace flashgen {

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int device;
  int sm_count;
  int smem_per_sm;     // bytes of shared memory per multiprocessor
  int smem_per_block;  // opt-in maximum per block
  int major;           // compute capability major
};

/** Properties of the current device, read once per device. */
inline int current_device(DeviceInfo* info) {
  static DeviceInfo cache[kMaxDevices];
  static std::atomic<bool> ready[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) {
    return fail(FLASHGEN_CUDA_ERROR, "cudaGetDevice: %s", cudaGetErrorString(err));
  }
  if (dev >= 0 && dev < kMaxDevices && ready[dev].load(std::memory_order_acquire)) {
    *info = cache[dev];
    return FLASHGEN_OK;
  }
  DeviceInfo d{dev, 0, 0, 0, 0};
  err = cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&d.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  }
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
  }
  if (err != cudaSuccess) {
    return fail(FLASHGEN_CUDA_ERROR, "reading properties of device %d: %s", dev,
                cudaGetErrorString(err));
  }
  if (dev >= 0 && dev < kMaxDevices) {
    cache[dev] = d;
    ready[dev].store(true, std::memory_order_release);
  }
  *info = d;
  return FLASHGEN_OK;
}

/** Raises a kernel's dynamic shared-memory limit on the current device, once per device. */
template <typename Kernel>
inline int allow_smem(Kernel kernel, const DeviceInfo& dev, int bytes, std::atomic<uint64_t>& done) {
  if (bytes > dev.smem_per_block) {
    return fail(FLASHGEN_INVALID_ARGUMENT,
                "kernel needs %d bytes of shared memory; device %d allows %d per block", bytes,
                dev.device, dev.smem_per_block);
  }
  const uint64_t bit = dev.device < 64 ? (uint64_t{1} << dev.device) : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return FLASHGEN_OK;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) {
    return fail(FLASHGEN_CUDA_ERROR, "cudaFuncSetAttribute: %s", cudaGetErrorString(err));
  }
  done.fetch_or(bit, std::memory_order_acq_rel);
  return FLASHGEN_OK;
}

/**
 * Launches `kernel`. A plain launch (cudaLaunchKernel) unless `dependent` (sm_90+), which makes it
 * a programmatic dependent launch, so that its launch overlaps the tail of the kernel before it
 * (which must be waited on in the kernel with griddepcontrol.wait; see decode/merge.cuh). The launch's
 * status is its return value; a failure also clears this runtime's sticky last error, so that a
 * later call does not report it again.
 */
template <typename... KernelArgs, typename... Args>
inline int launch(const char* what, void (*kernel)(KernelArgs...), dim3 grid, int threads,
                  int smem, cudaStream_t stream, bool dependent, Args&&... args) {
  static_assert(sizeof...(KernelArgs) == sizeof...(Args), "launch: wrong number of arguments");
  cudaError_t err;
  if (dependent) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  } else {
    // The kernel's own parameter types, converted once, then their addresses.
    std::tuple<std::decay_t<KernelArgs>...> values(std::forward<Args>(args)...);
    err = std::apply(
        [&](auto&... v) {
          void* argv[] = {static_cast<void*>(&v)...};
          return cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, dim3(threads),
                                  argv, static_cast<size_t>(smem), stream);
        },
        values);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(FLASHGEN_CUDA_ERROR, "%s: %s (%s)", what, cudaGetErrorString(err),
                cudaGetErrorName(err));
  }
  return FLASHGEN_OK;
}

/** Copies the caller's additional-params struct (laid out as ADDITIONAL_PARAMS_DECL). */
inline int copy_additional_params(AdditionalParams* dst, const void* src, const char* module) {
  if constexpr (!std::is_empty<AdditionalParams>::value) {
    if (src == nullptr) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "%s: additional_params is NULL but this variant takes parameters", module);
    }
    std::memcpy(static_cast<void*>(dst), src, sizeof(AdditionalParams));
  }
  return FLASHGEN_OK;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

/** K/V rows are read as 16-byte vectors: their strides must be multiples of 8 elements. */
inline bool vec_stride(int64_t stride) { return stride % 8 == 0; }

}  // namespace flashgen
