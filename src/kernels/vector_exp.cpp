#include "kernels/vector_exp.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <sleef.h>

// sleef.h declares the FMA variant only when the includer is compiled with FMA enabled
// (FP_FAST_FMA); the library always exports it, and we choose at run time.
extern "C" float Sleef_expf1_u10purecfma(float);
extern "C" float Sleef_log1pf1_u10purecfma(float);

namespace ds41 {

namespace {

bool cpu_has_fma() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("fma");
#else
  return true;  // elsewhere SLEEF's purecfma variant uses the C library's fma
#endif
}

}  // namespace

float torch_vec_expf(float x) {
  static const bool fma = cpu_has_fma();
  return fma ? Sleef_expf1_u10purecfma(x) : Sleef_expf1_u10purec(x);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Only what lies between the target pragmas is compiled for AVX2 (and runs only on CPUs that
// have it). SLEEF declares its AVX2 functions only to includers compiled with AVX2; the library
// always exports them.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
extern "C" __m256 Sleef_expf8_u10avx2(__m256);

namespace {
void expf_in_place_avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, Sleef_expf8_u10avx2(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = Sleef_expf1_u10purecfma(x[i]);
}
}  // namespace
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

void torch_vec_expf_in_place(float* x, int64_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return expf_in_place_avx2(x, n);
#endif
  for (int64_t i = 0; i < n; ++i) x[i] = torch_vec_expf(x[i]);
}

float torch_vec_log1pf(float x) {
  static const bool fma = cpu_has_fma();
  return fma ? Sleef_log1pf1_u10purecfma(x) : Sleef_log1pf1_u10purec(x);
}

float torch_scalar_sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace ds41
