// The exponentials and sums of a softmax over a vocabulary (token sampling, runtime/sampler.h).
//
//   out[i] = exp(x[i] * scale - shift)        (the product and the difference rounded in fp32)
//   return   the sum of out[0, n) in double
//
// exp is SLEEF's expf_u10 with FMA (torch_vec_expf, kernels/vector_exp.h: the exp of PyTorch's
// vectorized CPU kernels), whose 8-lane AVX2 form gives the scalar form's values bit for bit, so
// every SIMD level returns the scalar twin's numbers. The sum runs in 8 lanes - lane j adds the
// out[i] with i mod 8 = j in order of i - combined as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
// (l6 + l7)): a fixed order (the same for any ISA or thread count) without one long chain of
// dependent adds (a 129K vocabulary in one chain costs ~0.15 ms, as much as the exponentials).
#pragma once

#include <cstdint>

namespace ds41 {

double scaled_exp_sum(const float* x, int64_t n, float scale, float shift, float* out);
// The scalar twin.
double scaled_exp_sum_reference(const float* x, int64_t n, float scale, float shift, float* out);

// The sum of x[0, n) in double, in the lane order above.
double lane_sum(const float* x, int64_t n);
// The lanes' sums combined in that order: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
double combine_lanes(const double* lanes);

// The largest x[i] * scale (each product rounded in fp32), NaN products ignored; -inf when there is
// none. Equal to a sequential scan's max (the lanes' maxima of a finite set are the same values;
// for +0 and -0 it may return either, whose differences with any x are the same).
float scaled_max(const float* x, int64_t n, float scale);

}  // namespace ds41
