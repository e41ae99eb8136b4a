// The Gumbel-max draw of token sampling (runtime/sampler.h step 5): the index i that maximises
// p[i] / E_i over the tokens with p[i] > 0, E_i = -log(u_i) ~ Exponential(1),
//
//   u_i = ((splitmix64(key ^ i) >> 11) + 1) * 2^-53        in (0, 1], exact in double,
//
// first index on ties. Most tokens cannot beat the best so far, and knowing it needs no
// logarithm: -log(u) >= 1 - u, so p / E <= best once (1 - u) * best reaches p; the factor
// 1 - 2^-20 covers the roundings (1 - u is exact; the log and the float conversion lose less than
// 2^-23 relative, the two products 2^-52), so a token skipped that way is one the division would
// not have taken. The AVX-512 kernel hashes and tests eight tokens at once against the best at the
// start of the eight, and hands the tokens that pass to gumbel_consider in order of index, which
// tests them again against the best so far: the scalar twin's result, bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "base/hash.h"

namespace ds41 {

struct GumbelBest {
  int64_t index = -1;  // -1: no p[i] > 0
  float value = -1.f;  // p[index] / E_index
  bool nan = false;    // some p[i] was NaN
};

// The index maximising p[i] / E_i over [0, n) (the SIMD kernel of the active level if it has one).
GumbelBest gumbel_argmax(const float* p, int64_t n, uint64_t key);
// The scalar twin.
GumbelBest gumbel_argmax_reference(const float* p, int64_t n, uint64_t key);

inline double gumbel_uniform(uint64_t key, int64_t i) {
  return (double(splitmix64(key ^ uint64_t(i)) >> 11) + 1.0) * 0x1p-53;
}

// Token i (with q = p[i] > 0 and its uniform u) against the best so far.
inline void gumbel_consider(float q, double u, int64_t i, GumbelBest& best) {
  if (best.value > 0.f && (1.0 - u) * double(best.value) * (1.0 - 0x1p-20) >= double(q)) return;
  const float e = float(-std::log(u));
  const float v = q / e;
  if (v > best.value) {
    best.value = v;
    best.index = i;
  }
}

// Tokens [i0, n) one at a time onto `best`: the twin's loop, and the SIMD kernel's tail.
inline void gumbel_scan(const float* p, int64_t i0, int64_t n, uint64_t key, GumbelBest& best) {
  for (int64_t i = i0; i < n; ++i) {
    const float q = p[i];
    if (!(q > 0.f)) {  // zero, negative or NaN: never drawn
      best.nan = best.nan || q != q;
      continue;
    }
    gumbel_consider(q, gumbel_uniform(key, i), i, best);
  }
}

}  // namespace ds41
