/**
 * @brief The C entry points of a module, written once for every module (csrc/<module>.cu).
 *
 * Each module exports, for its generated arguments struct FLASHGEN_ARGS (variants.json
 * modules.<module>.args):
 *   int flashgen_<module>(const Args*)                                  the call
 *   int flashgen_<module>_workspace_size(const Args*, int64_t* bytes)   the call's workspace
 *   int flashgen_<module>_query(codes, ncodes, buf, buflen)             an instance's parameters
 *   const char* flashgen_last_error(void), int flashgen_abi_version(void)
 * returning the FLASHGEN_* status codes of abi.h. A module's .cu supplies only what differs: a
 * struct (in an anonymous namespace) with
 *   static int check_shape(const Args&);   the shape checks of both entry points
 *   static int check_call(const Args&);    all checks of the call (pointers, check_shape, ...)
 *   template <axis values...> struct Instance {   one instance's params struct and variant
 *     static int64_t workspace_bytes(const Args&, const DeviceInfo&);
 *     static int run(const Args&, const DeviceInfo&);
 *   };
 * and expands, once,
 *   FLASHGEN_DEFINE_ENTRY_POINTS(<module>, <struct>, FG_<axis>, ...)
 * naming the FG_<axis> values of the generated FLASHGEN_DISPATCH_ARGS in the order Instance
 * takes them. Both entry points dispatch the same way, so the workspace a call asks for is the one
 * of the instance that runs. Compile-time values come only through the generated dispatch, so a
 * module builds in the one-instance and in the dispatching form of <flashgen_instance.cuh>.
 */
#pragma once

#include <cstdint>

#include "flashgen/abi.h"
#include "flashgen/launch.cuh"
#include "flashgen/status.cuh"

#define FLASHGEN_DEFINE_ENTRY_POINTS(module, Entry, ...)                                      \
  FLASHGEN_DEFINE_COMMON_ENTRY_POINTS()                                                       \
                                                                                              \
  extern "C" FLASHGEN_API int flashgen_##module##_workspace_size(const FLASHGEN_ARGS* args,   \
                                                                 int64_t* bytes) {            \
    if (args == nullptr || bytes == nullptr) {                                                \
      return ::flashgen::fail(FLASHGEN_INVALID_ARGUMENT,                                      \
                              #module "_workspace_size: args or bytes is NULL");              \
    }                                                                                         \
    const FLASHGEN_ARGS& a = *args;                                                           \
    if (int st = Entry::check_shape(a)) return st;                                            \
    ::flashgen::DeviceInfo dev;                                                               \
    if (int st = ::flashgen::current_device(&dev)) return st;                                 \
    const bool hit = FLASHGEN_DISPATCH_ARGS(                                                  \
        a, { *bytes = Entry::Instance<__VA_ARGS__>::workspace_bytes(a, dev); });     \
    return hit ? FLASHGEN_OK : FLASHGEN_FAIL_NO_INSTANCE(a);                                  \
  }                                                                                           \
                                                                                              \
  extern "C" FLASHGEN_API int flashgen_##module(const FLASHGEN_ARGS* args) {                  \
    if (args == nullptr) {                                                                    \
      return ::flashgen::fail(FLASHGEN_INVALID_ARGUMENT, #module ": args is NULL");           \
    }                                                                                         \
    const FLASHGEN_ARGS& a = *args;                                                           \
    if (int st = Entry::check_call(a)) return st;                                             \
    ::flashgen::DeviceInfo dev;                                                               \
    if (int st = ::flashgen::current_device(&dev)) return st;                                 \
    int status = FLASHGEN_OK;                                                                 \
    const bool hit =                                                                          \
        FLASHGEN_DISPATCH_ARGS(a, { status = Entry::Instance<__VA_ARGS__>::run(a, dev); }); \
    return hit ? status : FLASHGEN_FAIL_NO_INSTANCE(a);                                       \
  }                                                                                           \
                                                                                              \
  FLASHGEN_DEFINE_QUERY_ENTRY_POINT()
