// Scalar reference sparse attention (the twin of the SIMD kernels in simd_attention.inc, which
// run instead when simd_level() is not Scalar); see sparse_attention.h for the operation order.
#include "kernels/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/numeric_formats.h"
#include "kernels/vector_exp.h"
#include "kernels/simd_kernels.h"

// denom*alpha + sum and acc*alpha + partial are separate fp32 roundings in the reference:
// forbid FMA contraction, which -march=native would otherwise allow.
#include "base/fp_contract_off.h"

namespace ds41 {

void sparse_attention_row(const uint16_t* q, int H, int64_t Dh, const uint16_t* const* kv_rows,
                          int n, const float* attn_sink, float softmax_scale, uint16_t* out,
                          float* scratch) {
  if (const simd::KernelTable* kt = simd::active_kernels())
    return kt->sparse_attention_row(q, H, Dh, kv_rows, n, attn_sink, softmax_scale, out);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* logits = scratch;                       // [kSparseAttnBlock]
  float* block_pv = scratch + kSparseAttnBlock;  // [Dh]
  float* acc = block_pv + Dh;                    // [Dh]

  for (int h = 0; h < H; ++h) {
    const uint16_t* qh = q + static_cast<int64_t>(h) * Dh;
    float running_max = kSparseAttnInitMax;
    float denom = 0.0f;
    std::fill(acc, acc + Dh, 0.0f);

    for (int start = 0; start < n; start += kSparseAttnBlock) {
      const int len = std::min(kSparseAttnBlock, n - start);
      const uint16_t* const* rows = kv_rows + start;

      // Scores; invalid entries are -inf and never raise the max.
      float block_max = kNegInf;
      for (int j = 0; j < len; ++j) {
        if (!rows[j]) {
          logits[j] = kNegInf;
          continue;
        }
        // q.k of bf16 operands: exact products, summed in double and rounded once to fp32
        // (the reference's tensor-core GEMM is far closer to exact than a sequential fp32 sum).
        double dot = 0.0;
        for (int64_t d = 0; d < Dh; ++d) dot += double(bf16_to_f32(qh[d])) * double(bf16_to_f32(rows[j][d]));
        logits[j] = static_cast<float>(dot) * softmax_scale;
        block_max = std::max(block_max, logits[j]);
      }

      const float new_max = std::max(running_max, block_max);
      const float alpha = torch_vec_expf(running_max - new_max);
      // Block sums of P and of bf16(P) * V: exact in double (fp32 P, and bf16 P times a bf16 V,
      // are exact there), rounded once to fp32. logits[j] is reused for bf16(P_j).
      double p_sum = 0.0;
      for (int j = 0; j < len; ++j) {
        if (!rows[j]) {  // P = exp(-inf) = 0 adds nothing to either sum
          logits[j] = 0.0f;
          continue;
        }
        const float p = torch_vec_expf(logits[j] - new_max);
        p_sum += double(p);
        logits[j] = round_bf16(p);  // probabilities enter the PV product as bf16
      }
      for (int64_t d = 0; d < Dh; ++d) {
        double pv = 0.0;
        for (int j = 0; j < len; ++j)
          if (rows[j]) pv += double(logits[j]) * double(bf16_to_f32(rows[j][d]));
        block_pv[d] = static_cast<float>(pv);
      }
      const float scaled_denom = denom * alpha;
      denom = scaled_denom + static_cast<float>(p_sum);
      for (int64_t d = 0; d < Dh; ++d) {
        const float scaled = acc[d] * alpha;
        acc[d] = scaled + block_pv[d];
      }
      running_max = new_max;
    }

    // The sink only enters the denominator, unscaled. With no valid entry the max is still
    // -1e30, exp(sink + 1e30) = inf and 0 / inf = 0: exact zeros, as in the reference.
    denom = denom + torch_vec_expf(attn_sink[h] - running_max);
    uint16_t* oh = out + static_cast<int64_t>(h) * Dh;
    for (int64_t d = 0; d < Dh; ++d) oh[d] = f32_to_bf16(acc[d] / denom);
  }
}

}  // namespace ds41
