// Host check of flashgen/dtype.cuh's fp8 widening: every byte of e4m3 and e5m2 to f16 and bf16,
// against values computed from the formats' definitions. Prints each wrong value and exits 1 on
// any; run by tests/python/test_fp8_widen.py (compiled with nvcc, run on the CPU).
#include <cmath>
#include <cstdint>
#include <cstdio>

#include <cstddef>

// dtype.cuh includes ptx_sm80.cuh, whose smem_addr names this device intrinsic; a host compile
// needs its declaration only (nothing here calls it).
std::size_t __cvta_generic_to_shared(const void*);

#include "flashgen/dtype.cuh"

namespace {

enum class Kind { kFinite, kNaN, kInf };

struct Ref {
  Kind kind;
  double value;  // signed; -0.0 for the negative zero
};

// e4m3fn: bias 7, no Inf, NaN only at S.1111.111; e5m2: bias 15, IEEE Inf and NaN.
Ref reference(uint8_t b, bool e4m3) {
  const int ebits = e4m3 ? 4 : 5, mbits = 7 - ebits, bias = e4m3 ? 7 : 15;
  const int e = (b >> mbits) & ((1 << ebits) - 1), m = b & ((1 << mbits) - 1);
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (e4m3 && e == 15 && m == 7) return {Kind::kNaN, 0};
  if (!e4m3 && e == 31) return {m == 0 ? Kind::kInf : Kind::kNaN, sign};
  const double frac = static_cast<double>(m) / (1 << mbits);
  const double mag = e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1.0 + frac, e - bias);
  return {Kind::kFinite, sign * mag};
}

template <typename To, typename Fp8>
int check(const char* name, bool e4m3, bool bf16) {
  int wrong = 0;
  for (int i = 0; i < 256; ++i) {
    const uint8_t b = static_cast<uint8_t>(i);
    const uint32_t bits = flashgen::fp8::widen1<To, Fp8>(b);
    const float got = flashgen::fp8::bits_to_float<To>(bits);
    const Ref ref = reference(b, e4m3);
    bool ok;
    if (ref.kind == Kind::kFinite) {
      ok = static_cast<double>(got) == ref.value && std::signbit(got) == std::signbit(ref.value);
    } else if (e4m3) {  // documented: NaN -> +-480
      ok = std::fabs(got) == 480.f && std::signbit(got) == static_cast<bool>(b & 0x80);
    } else if (!bf16) {  // e5m2 -> f16 keeps Inf and NaN
      ok = ref.kind == Kind::kInf ? std::isinf(got) && (got < 0) == (ref.value < 0)
                                  : std::isnan(got);
    } else {  // e5m2 -> bf16: documented finite +-65536 .. +-114688
      ok = std::isfinite(got) && std::fabs(got) >= 65536.f && std::fabs(got) <= 114688.f &&
           std::signbit(got) == static_cast<bool>(b & 0x80);
    }
    if (!ok) {
      std::printf("%s: byte 0x%02x -> bits 0x%04x = %.9g, want %.9g\n", name, i, bits, got,
                  ref.value);
      ++wrong;
    }
  }
  // The four-byte form agrees with the scalar one, lane by lane.
  for (uint32_t x : {0x01234567u, 0x89abcdefu, 0x7f80ff00u, 0x38c07e3fu}) {
    uint32_t lo, hi;
    flashgen::fp8::widen4<To, Fp8>(x, lo, hi);
    const uint32_t want[4] = {flashgen::fp8::widen1<To, Fp8>(x & 0xff),
                              flashgen::fp8::widen1<To, Fp8>((x >> 8) & 0xff),
                              flashgen::fp8::widen1<To, Fp8>((x >> 16) & 0xff),
                              flashgen::fp8::widen1<To, Fp8>(x >> 24)};
    const uint32_t got[4] = {lo & 0xffff, lo >> 16, hi & 0xffff, hi >> 16};
    for (int k = 0; k < 4; ++k) {
      if (got[k] != want[k]) {
        std::printf("%s: widen4(0x%08x) element %d = 0x%04x, widen1 gives 0x%04x\n", name, x, k,
                    got[k], want[k]);
        ++wrong;
      }
    }
  }
  std::printf("%s: %d wrong\n", name, wrong);
  return wrong;
}

}  // namespace

int main() {
  int wrong = 0;
  wrong += check<half, __nv_fp8_e4m3>("e4m3->f16", true, false);
  wrong += check<half, __nv_fp8_e5m2>("e5m2->f16", false, false);
  wrong += check<__nv_bfloat16, __nv_fp8_e4m3>("e4m3->bf16", true, true);
  wrong += check<__nv_bfloat16, __nv_fp8_e5m2>("e5m2->bf16", false, true);
  return wrong == 0 ? 0 : 1;
}
