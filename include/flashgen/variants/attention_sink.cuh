/**
 * @brief AttentionSink (gpt-oss): sliding_window attention whose softmax has one more logit per
 * query head, `sinks[qo_head]`, that joins the denominator and brings no value:
 *
 *   o = sum_j exp(s_j) v_j / (exp(sinks[h]) + sum_j exp(s_j)),  s_j = sm_scale * q.k_j
 *
 * over the keys SlidingWindow keeps (causal, and within window_left of the query when
 * window_left >= 0; < 0: no window). `sinks` is a device float array [num_qo_heads] in natural
 * log, on the scale of sm_scale * q.k. The LSE a call returns includes the sink: it is
 * log(exp(sinks[h]) + sum_j exp(s_j)), so (o, lse) describe one softmax. A row with no visible
 * key has o = 0 and LSE sinks[h]; a sink of -inf is plain sliding_window.
 */
#pragma once

#include "flashgen/variants/sliding_window.cuh"

template <typename ParamsT_>
struct AttentionSink : SlidingWindow<ParamsT_> {
  using ParamsT = ParamsT_;
  static constexpr bool use_softmax = true;

  __device__ __host__ AttentionSink(const ParamsT& params, uint32_t batch_idx, uint8_t* smem_ptr)
      : SlidingWindow<ParamsT_>(params, batch_idx, smem_ptr) {}

  /** The sink in the kernel's softmax units (base 2, like LogitsTransform's logits). */
  __device__ __forceinline__ float SinkLogit(const ParamsT& params, uint32_t, uint32_t,
                                             uint32_t qo_head_idx) {
    return __ldg(params.sinks + qo_head_idx) * math::log2e;
  }
};
