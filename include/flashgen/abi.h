/**
 * @brief The stable C ABI every flashgen kernel module exports.
 *
 * Plain C so that any FFI (ctypes, cffi, Rust) can call it. Each kernel entry point takes one
 * pointer to a plain struct of its arguments, declared per module in variants.json and generated
 * (ABI version 3; version 2 wrote the structs here by hand, version 1 passed arguments flat), so
 * a caller can prepare the struct once per shape. Pointers are device pointers unless noted; sizes
 * and strides are in elements; `stream` is the caller's cudaStream_t. Entry points
 * return FLASHGEN_OK or a nonzero status and leave a message for flashgen_last_error(); they never
 * abort the process. `additional_params` is a host pointer, read during the call, to a struct laid
 * out as the ADDITIONAL_PARAMS_DECL of the header the binary was built from (in the instance form:
 * the variant's own parameters in declared order); device arrays inside it (alibi_slopes) are
 * device pointers. `workspace` is device memory of at least the *_workspace_size bytes, computed
 * for the current device; its contents need no initialization.
 */
#ifndef FLASHGEN_ABI_H_
#define FLASHGEN_ABI_H_

#include <stdint.h>

#define FLASHGEN_ABI_VERSION 3

#if defined(__GNUC__)
#define FLASHGEN_API __attribute__((visibility("default")))
#else
#define FLASHGEN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum FlashgenStatus {
  FLASHGEN_OK = 0,
  FLASHGEN_INVALID_ARGUMENT = 1,    /* shapes, strides, alignment or null pointers */
  FLASHGEN_NO_INSTANCE = 2,         /* a runtime code this binary holds no instantiation for */
  FLASHGEN_WORKSPACE_TOO_SMALL = 3, /* workspace_bytes below what *_workspace_size reported */
  FLASHGEN_CUDA_ERROR = 4,          /* a launch or a CUDA runtime call failed */
};

/** Message of the last failure on this thread (in this module); never NULL. */
FLASHGEN_API const char* flashgen_last_error(void);
FLASHGEN_API int flashgen_abi_version(void);

/* ---- Each module's entry points, with FLASHGEN_ARGS the module's arguments struct (generated
 * from variants.json modules.<module>.args into the instance header: per-call fields first, one
 * block of 8-byte words, then the per-shape fields; read during the call only):
 *
 *   int flashgen_<module>(const FLASHGEN_ARGS* args);
 *   int flashgen_<module>_workspace_size(const FLASHGEN_ARGS* args, int64_t* bytes);
 *       the workspace the call needs on the current device; reads the shape fields only
 *   int flashgen_<module>_query(const int64_t* codes, int64_t ncodes, char* buf, int64_t buflen);
 *       dispatches over the runtime codes (axis order) and writes "axis=value ..." as the
 *       instantiation it reached sees them; FLASHGEN_NO_INSTANCE when none (generated too:
 *       FLASHGEN_DEFINE_QUERY_ENTRY_POINT()).
 */

#ifdef __cplusplus
}
#endif

#endif  // FLASHGEN_ABI_H_
