/**
 * @brief The prefill modules' kernels behind each value of the backend axis (variants.json),
 * under one set of names: PrefillBackend<FLASHGEN_CODE_backend_*> forwards to the host API of
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

template <int BACKEND>
struct PrefillBackend;

template <>
struct PrefillBackend<FLASHGEN_CODE_backend_portable> {
  template <int HEAD_DIM, int POS, typename Variant, typename Params, typename... A>
  static int64_t single_workspace_bytes(const A&... a) {
    return prefill::single_prefill_workspace_bytes<HEAD_DIM, POS, Variant, Params>(a...);
  }
  template <int HEAD_DIM, int POS, typename Variant, typename Params, typename... A>
  static int64_t batch_workspace_bytes(const A&... a) {
    return prefill::batch_prefill_workspace_bytes<HEAD_DIM, POS, Variant, Params>(a...);
  }
  template <int HEAD_DIM, int MASK, int POS, typename Variant, typename... A>
  static int launch_single(const A&... a) {
    return prefill::launch_single_prefill<HEAD_DIM, MASK, POS, Variant>(a...);
  }
  template <int HEAD_DIM, int MASK, int POS, typename Variant, typename... A>
  static int launch_ragged(const A&... a) {
    return prefill::launch_batch_prefill_ragged<HEAD_DIM, MASK, POS, Variant>(a...);
  }
  template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename... A>
  static int launch_paged(const A&... a) {
    return prefill::launch_batch_prefill_paged<HEAD_DIM, PAGE_SIZE, MASK, POS, Variant>(a...);
  }
};

#if FLASHGEN_BACKEND_sm90
template <>
struct PrefillBackend<FLASHGEN_CODE_backend_sm90> {
  template <int HEAD_DIM, int POS, typename Variant, typename Params, typename... A>
  static int64_t single_workspace_bytes(const A&... a) {
    return hopper::single_prefill_workspace_bytes<HEAD_DIM, POS, Variant, Params>(a...);
  }
  template <int HEAD_DIM, int POS, typename Variant, typename Params, typename... A>
  static int64_t batch_workspace_bytes(const A&... a) {
    return hopper::batch_prefill_workspace_bytes<HEAD_DIM, POS, Variant, Params>(a...);
  }
  template <int HEAD_DIM, int MASK, int POS, typename Variant, typename... A>
  static int launch_single(const A&... a) {
    return hopper::launch_single_prefill<HEAD_DIM, MASK, POS, Variant>(a...);
  }
  template <int HEAD_DIM, int MASK, int POS, typename Variant, typename... A>
  static int launch_ragged(const A&... a) {
    return hopper::launch_batch_prefill_ragged<HEAD_DIM, MASK, POS, Variant>(a...);
  }
  template <int HEAD_DIM, int PAGE_SIZE, int MASK, int POS, typename Variant, typename... A>
  static int launch_paged(const A&... a) {
    return hopper::launch_batch_prefill_paged<HEAD_DIM, PAGE_SIZE, MASK, POS, Variant>(a...);
  }
};
#endif

}  // namespace flashgen
