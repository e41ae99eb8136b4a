#include "kernels/vector_exp.h"

#include <cmath>

#include <sleef.h>

#include "kernels/simd_kernels.h"

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

void torch_vec_expf_in_place(float* x, int64_t n) {
  if (const simd::KernelTable* kt = simd::active_kernels()) return kt->exp_in_place(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] = torch_vec_expf(x[i]);
}

float torch_vec_log1pf(float x) {
  static const bool fma = cpu_has_fma();
  return fma ? Sleef_log1pf1_u10purecfma(x) : Sleef_log1pf1_u10purec(x);
}

float torch_scalar_sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace ds41
