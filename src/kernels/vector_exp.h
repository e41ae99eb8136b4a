// exp and log1p as PyTorch's vectorized CPU kernels compute them, for the places where the official
// reference applies torch.exp / sigmoid / softmax / silu / softplus to whole tensors, and its
// kernel port does the same in the sparse attention and the hyper-connection coefficients.
//
// PyTorch's Vectorized<float>::exp is SLEEF's expf_u10 (FMA build). It differs from libm's expf in
// the last bit for ~1% of inputs, which was enough to change Sinkhorn-normalised hyper-connection
// weights and, through them, bf16 streams of the golden cases. Debian ships SLEEF; this calls
// its scalar FMA variant, which is bit-identical to the vector one (checked against torch.sigmoid
// on 10^6 inputs, tests/vector_exp_test.cpp). On a CPU without FMA the non-FMA variant is used:
// still a faithful exp, no longer bit-identical to the reference.
//
// PyTorch applies the scalar libm path to the last (n mod 16) elements of a tensor of n
// (torch_scalar_tail_from); by default we do not follow call shapes, so a token's values never
// depend on how many tokens share a call (batch / chunk independence).
#pragma once

#include <cstdint>

namespace ds41 {

float torch_vec_expf(float x);
// x[i] = torch_vec_expf(x[i]) for i < n: 8 lanes at a time at the AVX2 and AVX-512 levels (SLEEF's
// vector form, whose values are the scalar form's bit for bit), one by one at the scalar level.
void torch_vec_expf_in_place(float* x, int64_t n);
// log1p of PyTorch's vectorized CPU kernels (SLEEF's log1pf_u10; its scalar FMA variant gives the
// AVX2 vector's values bit for bit).
float torch_vec_log1pf(float x);

// torch.sigmoid on a float tensor (vectorized path): (1 + exp(0 - x)).reciprocal().
inline float torch_vec_sigmoid(float x) { return 1.0f / (1.0f + torch_vec_expf(0.0f - x)); }
// Its scalar loop (the tail): 1 / (1 + exp(-x)) with libm's expf.
float torch_scalar_sigmoid(float x);

// PyTorch runs an elementwise op over a contiguous tensor of n elements in vectors of 2 x 8
// (AVX2), and its last n mod 16 elements through the scalar loop (libm). For row `row` of a
// [rows][row_len] tensor: the first column in that scalar tail (row_len when none is). The
// reference's per-call tensors make this depend on the call's row count: the engine follows it
// only under ForwardOptions::reference_call_shapes, and otherwise takes the vector path throughout
// (pass row_len as the column, i.e. none in the tail).
inline int64_t torch_scalar_tail_from(int64_t row, int64_t rows, int64_t row_len) {
  const int64_t vector_end = rows * row_len / 16 * 16, from = vector_end - row * row_len;
  return from < 0 ? 0 : from > row_len ? row_len : from;
}

}  // namespace ds41
