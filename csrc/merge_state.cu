/**
 * @brief merge_state: the C entry points that merge attention states by their LSE
 * (include/flashgen/merge_state.cuh). One code path for the three Python functions: two states
 * (v_a with one state per token, plus v_b), the same in place (v_out = v_a, with a token mask),
 * and a stack of states per token (v_a alone).
 */
#include <flashgen_instance.cuh>

#include "flashgen/entry.cuh"
#include "flashgen/launch.cuh"
#include "flashgen/merge_state.cuh"

namespace {

using namespace flashgen;

using Args = FLASHGEN_ARGS;  // generated from variants.json modules.merge_state.args

constexpr int64_t kMaxRows = (int64_t{1} << 31) - 1;

inline bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3) == 0; }

struct MergeState {
  static int check_shape(const Args& a) {
    if (a.num_tokens < 0 || a.num_heads < 1 || a.num_heads > 65536 || a.num_states_a < 1 ||
        a.num_states_a > 65536) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "merge_state: num_tokens (%lld) must be at least 0, num_heads (%lld) and "
                  "num_states_a (%lld) in [1, 65536]",
                  static_cast<long long>(a.num_tokens), static_cast<long long>(a.num_heads),
                  static_cast<long long>(a.num_states_a));
    }
    if (a.head_dim < 8 || a.head_dim > 4096 || a.head_dim % 8 != 0) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "merge_state: head_dim %lld must be a multiple of 8 in [8, 4096] (rows are "
                  "read as 16-byte vectors)",
                  static_cast<long long>(a.head_dim));
    }
    if (a.num_tokens > kMaxRows / a.num_heads) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "merge_state: num_tokens * num_heads (%lld * %lld) must be below 2^31",
                  static_cast<long long>(a.num_tokens), static_cast<long long>(a.num_heads));
    }
    return FLASHGEN_OK;
  }

  static int check_call(const Args& a) {
    if (int st = check_shape(a)) return st;
    if (a.num_tokens == 0) return FLASHGEN_OK;  // nothing is read or written
    if (a.v_a == nullptr || a.s_a == nullptr || a.v_out == nullptr || a.s_out == nullptr ||
        (a.v_b == nullptr) != (a.s_b == nullptr)) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "merge_state: v_a, s_a, v_out and s_out must not be NULL, and v_b and s_b are "
                  "given together (v_a %p s_a %p v_b %p s_b %p v_out %p s_out %p)",
                  a.v_a, static_cast<const void*>(a.s_a), a.v_b, static_cast<const void*>(a.s_b),
                  a.v_out, static_cast<const void*>(a.s_out));
    }
    if (!aligned16(a.v_a) || !aligned16(a.v_b) || !aligned16(a.v_out) || !aligned4(a.s_a) ||
        !aligned4(a.s_b) || !aligned4(a.s_out)) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "merge_state: v_a, v_b and v_out must be 16-byte aligned, s_a, s_b and s_out "
                  "4-byte aligned (v_a %p v_b %p v_out %p s_a %p s_b %p s_out %p)",
                  a.v_a, a.v_b, a.v_out, static_cast<const void*>(a.s_a),
                  static_cast<const void*>(a.s_b), static_cast<const void*>(a.s_out));
    }
    // A row reads its states and writes its own row only: the output may be the input it
    // replaces, which is the same row only when each token has one state in v_a.
    if (a.num_states_a != 1 && (a.v_out == a.v_a || a.s_out == a.s_a)) {
      return fail(FLASHGEN_INVALID_ARGUMENT,
                  "merge_state: v_out and s_out may be v_a and s_a only when num_states_a is 1 "
                  "(got %lld)",
                  static_cast<long long>(a.num_states_a));
    }
    return FLASHGEN_OK;
  }

  template <typename DType>
  struct Instance {
    static int64_t workspace_bytes(const Args&, const DeviceInfo&) { return 0; }

    static int run(const Args& a, const DeviceInfo&) {
      merge_state::Problem<DType> p{};
      p.v_a = static_cast<const DType*>(a.v_a);
      p.s_a = a.s_a;
      p.v_b = static_cast<const DType*>(a.v_b);
      p.s_b = a.s_b;
      p.mask = static_cast<const uint8_t*>(a.mask);
      p.v_out = static_cast<DType*>(a.v_out);
      p.s_out = a.s_out;
      p.rows = static_cast<uint32_t>(a.num_tokens * a.num_heads);
      p.num_heads = static_cast<uint32_t>(a.num_heads);
      p.stack = static_cast<uint32_t>(a.num_states_a);
      p.head_dim = static_cast<uint32_t>(a.head_dim);
      return merge_state::launch_merge(p, static_cast<cudaStream_t>(a.stream));
    }
  };
};

}  // namespace

FLASHGEN_DEFINE_ENTRY_POINTS(merge_state, MergeState, FG_dtype)
