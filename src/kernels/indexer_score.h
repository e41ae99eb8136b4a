// Indexer scores of one query against the visible index keys (spec backbone.md §5.5), in the
// reference's bf16 arithmetic:
//   dot_h(t)  = sum_d q[h][d] * K[t][d]           fp32, d ascending from +0 (exact bf16 products)
//   score(t)  = bf16( sum_h bf16( max(bf16(dot_h(t)), 0) * w[h] ) )   h ascending from +0, fp32
// where max is std::max(v, 0.0f) (NaN and -0 pass through). q is the query after RoPE and MXFP4
// QDQ, [n_heads][head_dim] bf16; w the scaled head weights [n_heads] bf16; K [count][head_dim]
// bf16. The scalar loop is the twin of the SIMD kernels (simd_attention.inc), used when
// simd_level() is Scalar.
#pragma once

#include <cstdint>

namespace ds41 {

void indexer_scores(const uint16_t* q, const uint16_t* w, int n_heads, int64_t head_dim, const uint16_t* keys,
                    int64_t count, float* scores);

// The same scores against MXFP4 keys as the cache stores them (codes [count][head_dim / 2],
// E8M0 scales [count][head_dim / 32]; head_dim % 32 == 0), each key's values those of
// mxfp4_dequant_row (quant.h). The SIMD kernels dequantize a few keys at a time as they score
// them, so no bf16 copy of the keys is written.
void indexer_scores_mxfp4(const uint16_t* q, const uint16_t* w, int n_heads, int64_t head_dim, const uint8_t* codes,
                          const uint8_t* scales, int64_t count, float* scores);

}  // namespace ds41
