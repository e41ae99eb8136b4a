// CSA² compressor of a kv-source layer (spec backbone.md §5.4): turns every group of `ratio`
// consecutive tokens into one 512-d latent, then publishes it twice — as an index key (MXFP4,
// for the indexers) and as a compressed main-KV entry (FP4 with E4M3 scales per 16, for
// attention) — both rotated at the group's first position j·m.
//
// Ratio 1: a bf16 projection + norm per token. Ratio m > 1: fp32 projections k_t and gate z_t,
// then per channel a softmax over the group's m gates weighting the k_t (all fp32). Tokens of an
// incomplete group wait in the sequence state, so prefill, decode and any chunking pool exactly
// the same numbers.
#include <cmath>
#include <cstring>

#include "base/scratch.h"
#include "kernels/gemm.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/vector_exp.h"
#include "model/forward_context.h"

namespace ds41 {

int compressor_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x) {
  const ModelConfig& c = ctx.cfg;
  const int S = ctx.S, m = lp.ratio;
  const int64_t D = c.dim, Dh = c.head_dim, R = c.rope_head_dim, IH = c.index_head_dim;
  const float eps = float(c.norm_eps);
  LayerState& ls = ctx.state.layers[lp.id];

  DS41_SCRATCH_EMPTY(uint16_t, latents);  // [n][Dh] pre-RoPE, normalised
  DS41_SCRATCH_EMPTY(int64_t, entry_ids);
  DS41_SCRATCH(uint16_t, pooled_bf16, Dh);
  DS41_SCRATCH(uint16_t, normed, Dh);
  if (m == 1) {
    DS41_SCRATCH(uint16_t, proj, int64_t(S) * Dh);
    if (S < kPackedMaxRows && w.comp_wkv_packed.blocks) {
      // The packed copy's fp32 sums of the widened row, rounded: linear_bf16's values.
      DS41_SCRATCH(float, xf, int64_t(S) * D);
      DS41_SCRATCH(float, pf, int64_t(S) * Dh);
      for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x[i]);
      linear_f32_wbf16_maybe_packed(xf.data(), S, w.comp_wkv_packed, pf.data(), ctx.pool);
      for (size_t i = 0; i < pf.size(); ++i) proj[i] = f32_to_bf16(pf[i]);
    } else {
      linear_bf16(x, S, w.comp_wkv_bf16, Dh, D, proj.data(), ctx.pool);
    }
    latents.resize(size_t(S) * Dh);
    rmsnorm_rows(proj.data(), w.comp_norm, S, Dh, eps, latents.data());
    for (int s = 0; s < S; ++s) entry_ids.push_back(ctx.pos(s));
  } else {
    DS41_SCRATCH(float, xf, int64_t(S) * D);
    DS41_SCRATCH(float, kvf, int64_t(S) * Dh);
    DS41_SCRATCH(float, zf, int64_t(S) * Dh);
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x[i]);
    // fp32 products of the bf16 weights (widening is exact: the checkpoint's bytes are read,
    // not a widened copy of twice the size).
    if (S < kPackedMaxRows && w.comp_wkv_packed.blocks && w.comp_wgate_packed.blocks) {
      // Both from their packed copies in one parallel call.
      const PackedLinearJob jobs[2] = {{xf.data(), w.comp_wkv_packed, kvf.data()},
                                       {xf.data(), w.comp_wgate_packed, zf.data()}};
      linear_f32_wbf16_packed_batch(jobs, 2, S, ctx.pool);
    } else {
      linear_f32_wbf16(xf.data(), S, w.comp_wkv_bf16, Dh, D, kvf.data(), ctx.pool);
      linear_f32_wbf16(xf.data(), S, w.comp_wgate_bf16, Dh, D, zf.data(), ctx.pool);
    }
    DS41_SCRATCH(float, pooled, Dh);
    for (int s = 0; s < S; ++s) {
      const int64_t p = ctx.pos(s), slot = p % m;
      if (ctx.state.journal) {
        ctx.state.journal->record(p, ls.group_kv.data() + slot * Dh, size_t(Dh) * 4);
        ctx.state.journal->record(p, ls.group_score.data() + slot * Dh, size_t(Dh) * 4);
      }
      std::memcpy(ls.group_kv.data() + slot * Dh, kvf.data() + s * Dh, size_t(Dh) * 4);
      std::memcpy(ls.group_score.data() + slot * Dh, zf.data() + s * Dh, size_t(Dh) * 4);
      if ((p + 1) % m != 0) continue;
      for (int64_t ch = 0; ch < Dh; ++ch) {
        // softmax over the group's m gates of this channel, then the gated sum (t ascending).
        // torch.softmax over the group dim runs vectorized along the channels (a multiple of 8):
        // SLEEF's exp for every element.
        float mx = -INFINITY;
        for (int t = 0; t < m; ++t) mx = std::max(mx, ls.group_score[t * Dh + ch]);
        float e[64], sum = 0.f;
        for (int t = 0; t < m; ++t) {
          e[t] = torch_vec_expf(ls.group_score[t * Dh + ch] - mx);
          sum += e[t];
        }
        float acc = 0.f;
        for (int t = 0; t < m; ++t) acc += ls.group_kv[t * Dh + ch] * (e[t] / sum);
        pooled[ch] = acc;
      }
      for (int64_t ch = 0; ch < Dh; ++ch) pooled_bf16[ch] = f32_to_bf16(pooled[ch]);
      rmsnorm_row(pooled_bf16.data(), w.comp_norm, Dh, eps, normed.data());
      latents.insert(latents.end(), normed.begin(), normed.end());
      entry_ids.push_back(p / m);
    }
  }
  const int n = int(entry_ids.size());
  if (n == 0) return 0;

  // Index keys from the pre-RoPE latents (the reference's Indexer does this before Attention
  // rotates the latent in place).
  if (lp.owns_index_k) {
    DS41_SCRATCH(uint16_t, kp, int64_t(n) * IH);
    DS41_SCRATCH(uint16_t, kn, int64_t(n) * IH);
    linear_bf16(latents.data(), n, w.idx_wk, IH, Dh, kp.data(), ctx.pool);
    rmsnorm_rows(kp.data(), w.idx_k_norm, n, IH, eps, kn.data());
    const size_t old_codes = ls.ik_codes.size(), old_scales = ls.ik_scales.size();
    ls.ik_codes.resize(old_codes + size_t(n) * (IH / 2));
    ls.ik_scales.resize(old_scales + size_t(n) * (IH / 32));
    DS41_SCRATCH(float, cs, R / 2);
    DS41_SCRATCH(float, sn, R / 2);
    for (int i = 0; i < n; ++i) {
      const std::vector<float>& f = ctx.inv_freq(lp);
      rope_cos_sin_row(f.data(), int(f.size()), entry_ids[i] * m, cs.data(), sn.data());
      uint16_t* row = kn.data() + i * IH;
      rope_apply(row + (IH - R), cs.data(), sn.data(), int(R), false);
      mxfp4_quant_row(row, IH, ls.ik_codes.data() + old_codes + i * (IH / 2), ls.ik_scales.data() + old_scales + i * (IH / 32));
    }
  }
  // Main compressed KV: rotate at the group's first position, FP4 with E4M3 scales per 16.
  const size_t old_codes = ls.ckv_codes.size(), old_scales = ls.ckv_scales.size();
  ls.ckv_codes.resize(old_codes + size_t(n) * (Dh / 2));
  ls.ckv_scales.resize(old_scales + size_t(n) * (Dh / 16));
  DS41_SCRATCH(float, cs_kv, R / 2);
  DS41_SCRATCH(float, sn_kv, R / 2);
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& f = ctx.inv_freq(lp);
    rope_cos_sin_row(f.data(), int(f.size()), entry_ids[i] * m, cs_kv.data(), sn_kv.data());
    uint16_t* row = latents.data() + i * Dh;
    rope_apply(row + (Dh - R), cs_kv.data(), sn_kv.data(), int(R), false);
    nvfp4_quant_row(row, Dh, ls.ckv_codes.data() + old_codes + i * (Dh / 2), ls.ckv_scales.data() + old_scales + i * (Dh / 16));
  }
  ls.entries += n;
  return n;
}

}  // namespace ds41
