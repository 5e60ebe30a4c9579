/**
 * @brief Host-side status reporting: the thread-local last error, dtype names, common exports.
 */
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flashgen/abi.h"

namespace flashgen {

inline char* last_error_buffer() {
  static thread_local char buf[512] = "no error";
  return buf;
}

/** Records a message for flashgen_last_error() and returns `status`. */
inline int fail(int status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(last_error_buffer(), 512, fmt, args);
  va_end(args);
  return status;
}

template <typename T>
constexpr const char* dtype_name();
template <>
constexpr const char* dtype_name<half>() { return "f16"; }
template <>
constexpr const char* dtype_name<__nv_bfloat16>() { return "bf16"; }
template <>
constexpr const char* dtype_name<float>() { return "f32"; }

/** Writes `text` into buf (buflen bytes, NUL included) for the *_query entry points. */
inline int write_query(char* buf, int64_t buflen, const char* text) {
  int64_t n = 0;
  while (text[n] != '\0') ++n;
  if (buf == nullptr || buflen < n + 1) {
    return fail(FLASHGEN_INVALID_ARGUMENT, "query: buffer of %lld bytes, need %lld",
                static_cast<long long>(buflen), static_cast<long long>(n + 1));
  }
  for (int64_t i = 0; i <= n; ++i) buf[i] = text[i];
  return FLASHGEN_OK;
}

}  // namespace flashgen

/** Each module's .cu expands this once: the exports every module shares. */
#define FLASHGEN_DEFINE_COMMON_ENTRY_POINTS()                                              \
  extern "C" FLASHGEN_API const char* flashgen_last_error(void) {                         \
    return flashgen::last_error_buffer();                                                 \
  }                                                                                       \
  extern "C" FLASHGEN_API int flashgen_abi_version(void) { return FLASHGEN_ABI_VERSION; }
