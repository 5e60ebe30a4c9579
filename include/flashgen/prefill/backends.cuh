/**
 * @brief The prefill modules' kernels behind each value of the backend axis (variants.json),
 * under one set of names: PrefillBackend<FLASHGEN_CODE_backend_*, Tag> forwards to the host API of
 * prefill/launch.cuh (portable) or hopper/launch.cuh (sm90), which take the same arguments. The
 * sm90 one exists only in binaries whose generated header holds that backend (built for sm_90a
 * alone), so a portable instance never names Hopper code. Include after <flashgen_instance.cuh>.
 */
#pragma once

#include "flashgen/prefill/launch.cuh"
#if FLASHGEN_BACKEND_sm90
#include "flashgen/hopper/launch.cuh"
#endif

namespace flashgen {

/** The kernels of one backend for the variant of tag `Tag` (a generated FlashgenVariant_*), which
 *  each forwarder instantiates over the params it is given. */
template <int BACKEND, typename Tag>
struct PrefillBackend;

// The same forwarders for each backend's namespace (which no template parameter can name).
#define FLASHGEN_PREFILL_BACKEND(CODE, NS)                                                     \
  template <typename Tag>                                                                      \
  struct PrefillBackend<CODE, Tag> {                                                           \
    template <typename Params>                                                                 \
    using Variant = typename Tag::template type<Params>;                                       \
    template <int HEAD_DIM, int POS, typename Params, typename... A>                           \
    static int64_t single_workspace_bytes(const A&... a) {                                     \
      return NS::single_prefill_workspace_bytes<HEAD_DIM, POS, Variant<Params>, Params>(a...); \
    }                                                                                          \
    template <int HEAD_DIM, int POS, typename Params, typename... A>                           \
    static int64_t batch_workspace_bytes(const A&... a) {                                      \
      return NS::batch_prefill_workspace_bytes<HEAD_DIM, POS, Variant<Params>, Params>(a...);  \
    }                                                                                          \
    template <int HEAD_DIM, int MASK, int POS, typename Params, typename... A>                 \
    static int launch_single(const Params& p, const A&... a) {                                 \
      return NS::launch_single_prefill<HEAD_DIM, MASK, POS, Variant<Params>>(p, a...);         \
    }                                                                                          \
    template <int HEAD_DIM, int MASK, int POS, typename Params, typename... A>                 \
    static int launch_ragged(const Params& p, const A&... a) {                                 \
      return NS::launch_batch_prefill_ragged<HEAD_DIM, MASK, POS, Variant<Params>>(p, a...);   \
    }                                                                                          \
    template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Params, typename... A>  \
    static int launch_paged(const Params& p, const A&... a) {                                  \
      return NS::launch_batch_prefill_paged<HEAD_DIM, PAGE_SIZE, MASK, POS, Variant<Params>>(  \
          p, a...);                                                                            \
    }                                                                                          \
  };

FLASHGEN_PREFILL_BACKEND(FLASHGEN_CODE_backend_portable, prefill)
#if FLASHGEN_BACKEND_sm90
FLASHGEN_PREFILL_BACKEND(FLASHGEN_CODE_backend_sm90, hopper)
#endif
#undef FLASHGEN_PREFILL_BACKEND

}  // namespace flashgen
