#include "kernels/vector_exp.h"

#include <sleef.h>

// sleef.h declares the FMA variant only when the includer is compiled with FMA enabled
// (FP_FAST_FMA); the library always exports it, and we choose at run time.
extern "C" float Sleef_expf1_u10purecfma(float);

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

}  // namespace ds41
