// Sparse multi-query attention with an attention sink, for one query token (spec backbone.md
// §5.6, §12.6, §12.17). K = V = the same gathered latent rows (one KV head shared by all heads).
//
// Per head h, over the index list in order, in blocks of kSparseAttnBlock entries (the tilelang
// kernel's block; the port's sparse_attn reproduces it):
//   l_j   = fp32(q_h . kv_j) * scale        dot of bf16 operands summed in double, rounded once
//                                            (each bf16*bf16 product is exact); invalid
//                                            entries (nullptr) are l_j = -inf, i.e. excluded
//   M     = fp32(-1e30) at the start         (finite, so an all-invalid row gives exact zeros)
//   per block:  M'    = max(M, max_j l_j)
//               alpha = exp(M - M')
//               P_j   = exp(l_j - M')        (fp32; 0 for invalid entries)
//               denom = denom*alpha + sum_j P_j                  (fp32 P in the denominator)
//               acc   = acc*alpha + sum_j fp32(bf16(P_j)) * V_j  (P rounded to bf16 relative to
//                                                                the running max)
//               M     = M'
//   after all blocks: denom = denom + exp(sink_h - M)   (sink not scaled, denominator only)
//   out_h = bf16(acc / denom)
// Every exp is PyTorch's vectorized one (SLEEF's expf_u10, kernels/vector_exp.h), as the golden
// reference's kernel port computes them with torch.exp over whole tensors: libm's expf differs in
// the last bit for ~1 % of inputs, which moved a bf16(P) across its rounding boundary and an output
// by a bf16 ulp (three isolated divergences in the second set of golden cases).
// The two block sums are exact (summed in double, each term exact there) and rounded once to
// fp32, like the dot products: order-free, and what the reference's tensor-core block sums give.
// A sequential fp32 sum was measured to move one output by a bf16 ulp, which flipped an FP8 code
// downstream and cost 0.14 on a golden stream (dspark-a, decode row 1 of layer 5).
#pragma once

#include <cstdint>

namespace ds41 {

inline constexpr int kSparseAttnBlock = 64;
// The reference's finite starting value of the running max (kernel.py K41:352-355).
inline constexpr float kSparseAttnInitMax = -1e30f;

// fp32 scratch the kernel needs for head dim Dh: block logits + block PV sum + accumulator.
constexpr int64_t sparse_attention_scratch_floats(int64_t Dh) { return kSparseAttnBlock + 2 * Dh; }

// q [H][Dh] bf16; kv_rows[j] points at Dh bf16 values or is nullptr for an invalid (-1) index;
// attn_sink [H] fp32; softmax_scale as fp32 (released: 512^-0.5); out [H][Dh] bf16 (must not
// alias q or any kv row); scratch >= sparse_attention_scratch_floats(Dh) floats.
// n == 0 or all-invalid rows produce exact zeros.
void sparse_attention_row(const uint16_t* q, int H, int64_t Dh, const uint16_t* const* kv_rows,
                          int n, const float* attn_sink, float softmax_scale, uint16_t* out,
                          float* scratch);

}  // namespace ds41
