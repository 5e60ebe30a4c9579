/**
 * @brief The stable C ABI every flashgen kernel module exports.
 *
 * Plain C so that any FFI (ctypes, cffi, Rust) can call it. Each kernel entry point takes one
 * pointer to a plain struct of its arguments (ABI version 2; version 1 passed them flat), so a
 * caller can prepare the struct once per shape. Pointers are device pointers unless noted; sizes
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

#define FLASHGEN_ABI_VERSION 2

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

/* ---- single_decode: q [num_qo_heads, head_dim], k/v [kv_len, num_kv_heads, head_dim] (NHD) or
 * [num_kv_heads, kv_len, head_dim] (HND), expressed through the k/v strides; o like q;
 * lse (optional, may be NULL) float32 [num_qo_heads], natural log.
 *
 * The arguments travel as one struct, read during the call only (the entry keeps no pointer to
 * it). The fields that change from call to call of one shape (the tensors' addresses, the
 * stream, the variant's parameters and the workspace) come first, inputs then outputs, all 8
 * bytes wide, so a caller that keeps one prepared struct per shape rewrites one contiguous block
 * per call. */
typedef struct FlashgenSingleDecodeArgs {
  const void* q;                 /* [num_qo_heads, head_dim] */
  const void* k;                 /* 16-byte aligned */
  const void* v;                 /* 16-byte aligned */
  void* o;                       /* like q */
  float* lse;                    /* float32 [num_qo_heads] or NULL */
  void* stream;                  /* the caller's cudaStream_t (NULL: the legacy default stream) */
  const void* additional_params; /* host pointer to the variant's parameters, NULL when none */
  void* workspace;               /* device memory, 16-byte aligned, or NULL when none is needed */
  int64_t workspace_bytes;       /* its size in bytes */
  int64_t num_qo_heads;          /* a positive multiple of num_kv_heads, at most 2^24 */
  int64_t num_kv_heads;          /* 1..65535 */
  int64_t kv_len;                /* 1..2^30 */
  int64_t head_dim;              /* one of the binary's head_dim values */
  int64_t q_stride_h;            /* elements between query heads */
  int64_t k_stride_n;            /* elements between tokens of k (a multiple of 8) */
  int64_t k_stride_h;            /* elements between heads of k (a multiple of 8) */
  int64_t v_stride_n;            /* likewise for v */
  int64_t v_stride_h;
  int64_t o_stride_h;            /* elements between output heads */
  int64_t dtype_code;            /* runtime code of the dtype axis */
  int64_t variant_code;          /* runtime code of the variant axis */
  float sm_scale;                /* the softmax scale every variant may read as params.sm_scale */
} FlashgenSingleDecodeArgs;

FLASHGEN_API int flashgen_single_decode_workspace_size(int64_t num_qo_heads, int64_t num_kv_heads,
                                                       int64_t kv_len, int64_t head_dim,
                                                       int64_t* bytes);
FLASHGEN_API int flashgen_single_decode(const FlashgenSingleDecodeArgs* args);
FLASHGEN_API int flashgen_single_decode_query(const int64_t* codes, int64_t ncodes, char* buf,
                                              int64_t buflen);

/* ---- batch_decode over a paged KV cache: q [batch, num_qo_heads, head_dim];
 * paged_kv [num_pages, 2, page_size, num_kv_heads, head_dim] (NHD) or
 * [num_pages, 2, num_kv_heads, page_size, head_dim] (HND), expressed through the strides
 * (kv_stride_page between pages, kv_stride_kv from K to V, kv_stride_n between tokens of a page,
 * kv_stride_h between heads); int32 CSR page table on the device: kv_indptr [batch + 1],
 * kv_indices [kv_indptr[batch]], kv_last_page_len [batch] (1..page_size);
 * o like q; lse (optional) float32 [batch, num_qo_heads]. Per-call fields first, as above. */
typedef struct FlashgenBatchDecodeArgs {
  const void* q;                    /* [batch, num_qo_heads, head_dim] */
  const void* paged_kv;             /* 16-byte aligned */
  const int32_t* kv_indptr;         /* [batch + 1] */
  const int32_t* kv_indices;        /* [kv_indptr[batch]] */
  const int32_t* kv_last_page_len;  /* [batch] */
  void* o;                          /* like q */
  float* lse;                       /* float32 [batch, num_qo_heads] or NULL */
  void* stream;                     /* the caller's cudaStream_t */
  const void* additional_params;    /* host pointer to the variant's parameters, or NULL */
  void* workspace;                  /* device memory, 16-byte aligned, or NULL when none is needed */
  int64_t workspace_bytes;          /* its size in bytes */
  int64_t batch_size;               /* 1..65535 */
  int64_t num_qo_heads;             /* a positive multiple of num_kv_heads, at most 2^24 */
  int64_t num_kv_heads;             /* 1..65535 */
  int64_t head_dim;                 /* one of the binary's head_dim values */
  int64_t page_size;                /* one of the binary's page_size values */
  int64_t q_stride_b;               /* elements between requests of q */
  int64_t q_stride_h;               /* elements between heads of q */
  int64_t kv_stride_page;           /* elements between pages (a multiple of 8) */
  int64_t kv_stride_kv;             /* elements from K to V within a page (a multiple of 8) */
  int64_t kv_stride_n;              /* elements between tokens of a page (a multiple of 8) */
  int64_t kv_stride_h;              /* elements between heads (a multiple of 8) */
  int64_t o_stride_b;               /* elements between requests of o */
  int64_t o_stride_h;               /* elements between heads of o */
  int64_t dtype_code;               /* runtime code of the dtype axis */
  int64_t variant_code;             /* runtime code of the variant axis */
  float sm_scale;                   /* the softmax scale */
} FlashgenBatchDecodeArgs;

FLASHGEN_API int flashgen_batch_decode_workspace_size(int64_t batch_size, int64_t num_qo_heads,
                                                      int64_t num_kv_heads, int64_t head_dim,
                                                      int64_t* bytes);
FLASHGEN_API int flashgen_batch_decode(const FlashgenBatchDecodeArgs* args);
FLASHGEN_API int flashgen_batch_decode_query(const int64_t* codes, int64_t ncodes, char* buf,
                                             int64_t buflen);

#ifdef __cplusplus
}
#endif

#endif  // FLASHGEN_ABI_H_
