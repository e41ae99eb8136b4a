#include "kernels/indexer_score.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "base/scratch.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/simd_kernels.h"

// Each fp32 product and sum rounds on its own, as in the reference's bf16/fp32 tensor ops.
#include "base/fp_contract_off.h"

namespace ds41 {

void indexer_scores(const uint16_t* q, const uint16_t* w, int n_heads, int64_t head_dim, const uint16_t* keys,
                    int64_t count, float* scores) {
  if (const simd::KernelTable* kt = simd::active_kernels())
    return kt->indexer_scores(q, w, n_heads, head_dim, keys, count, scores);
  for (int64_t t = 0; t < count; ++t) {
    float acc = 0.f;
    for (int h = 0; h < n_heads; ++h) {
      const uint16_t* qv = q + int64_t(h) * head_dim;
      const uint16_t* kv = keys + t * head_dim;
      float dot = 0.f;
      for (int64_t d = 0; d < head_dim; ++d) dot += bf16_to_f32(qv[d]) * bf16_to_f32(kv[d]);
      const float r = std::max(round_bf16(dot), 0.f);
      acc += round_bf16(r * bf16_to_f32(w[h]));
    }
    scores[t] = round_bf16(acc);
  }
}

void indexer_scores_mxfp4(const uint16_t* q, const uint16_t* w, int n_heads, int64_t head_dim, const uint8_t* codes,
                          const uint8_t* scales, int64_t count, float* scores) {
  if (head_dim <= 0 || head_dim % kMxfp4Block != 0)
    throw Error("indexer: MXFP4 index keys of " + std::to_string(head_dim) + " values are not whole blocks of " +
                std::to_string(kMxfp4Block));
  if (const simd::KernelTable* kt = simd::active_kernels())
    return kt->indexer_scores_mxfp4(q, w, n_heads, head_dim, codes, scales, count, scores);
  DS41_SCRATCH_UNINIT(uint16_t, key, head_dim, head_dim);  // written before it is read
  for (int64_t t = 0; t < count; ++t) {
    mxfp4_dequant_row(codes + t * (head_dim / 2), scales + t * (head_dim / 32), head_dim, key.data());
    indexer_scores(q, w, n_heads, head_dim, key.data(), 1, scores + t);
  }
}

}  // namespace ds41
