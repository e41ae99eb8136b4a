// exp as PyTorch's vectorized CPU kernels compute it, for the places where the official reference
// applies torch.exp / torch.sigmoid to whole tensors (hyper-connection coefficients).
//
// PyTorch's Vectorized<float>::exp is SLEEF's expf_u10 (FMA build). It differs from libm's expf in
// the last bit for ~1% of inputs, which was enough to change Sinkhorn-normalised hyper-connection
// weights and, through them, bf16 streams of the golden cases. Debian ships SLEEF; this calls
// its scalar FMA variant, which is bit-identical to the vector one (checked against torch.sigmoid
// on 10^6 inputs, tests/vector_exp_test.cpp). On a CPU without FMA the non-FMA variant is used:
// still a faithful exp, no longer bit-identical to the reference.
//
// PyTorch applies the scalar libm path to the last (n mod 16) elements of a tensor of n; we do
// not follow call shapes, so a token's coefficients never depend on how many tokens share a call
// (batch / chunk independence).
#pragma once

namespace ds41 {

float torch_vec_expf(float x);

// torch.sigmoid on a float tensor (vectorized path): (1 + exp(0 - x)).reciprocal().
inline float torch_vec_sigmoid(float x) { return 1.0f / (1.0f + torch_vec_expf(0.0f - x)); }

}  // namespace ds41
