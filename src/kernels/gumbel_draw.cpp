#include "kernels/gumbel_draw.h"

#include "kernels/simd_kernels.h"

namespace ds41 {

GumbelBest gumbel_argmax(const float* p, int64_t n, uint64_t key) {
  if (const simd::KernelTable* kt = simd::active_kernels(); kt && kt->gumbel_argmax) return kt->gumbel_argmax(p, n, key);
  return gumbel_argmax_reference(p, n, key);
}

GumbelBest gumbel_argmax_reference(const float* p, int64_t n, uint64_t key) {
  GumbelBest best;
  gumbel_scan(p, 0, n, key, best);
  return best;
}

}  // namespace ds41
