// One hyper-connected block (spec backbone.md §7): attention and MoE sublayers, each between
// hc_pre and hc_post with single-pass coefficients. Shared by the backbone and the DSpark stages,
// which differ only in their attention.
#include "base/thread_pool.h"
#include "kernels/hyper_connection.h"
#include "kernels/rmsnorm.h"
#include "model/forward_context.h"

namespace ds41 {

BlockScratch::BlockScratch(int S, int hc, int64_t D)
    : h(size_t(S) * D), hn(size_t(S) * D), y(size_t(S) * D) {
  const size_t n = size_t(S) * hc;
  attn = Mix{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n * hc)};
  ffn = attn;
}

void run_block(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, uint16_t* X, std::vector<float>& a_in,
               BlockScratch& b, const AttentionBody& attention) {
  const ModelConfig& c = ctx.cfg;
  const int S = ctx.S, hc = c.hc_mult;
  const int64_t D = c.dim;
  const float norm_eps = float(c.norm_eps), hc_eps = float(c.hc_eps);
  // One sublayer: coefficients from the stream, input = norm(hc_pre(X, mix_in)), then
  // X = hc_post(body(input), X) in place (hc_post reads a column before writing it).
  auto sublayer = [&](const float* fn, const float* base, const float* scale, const uint16_t* norm_w,
                      const std::vector<float>& mix_in, BlockScratch::Mix& mix, auto&& body) {
    parallel_for(ctx.pool, S, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        hc_coefficients(X + s * hc * D, hc, D, fn, base, scale, c.hc_sinkhorn_iters, hc_eps, norm_eps,
                        mix.pre.data() + s * hc, mix.post.data() + s * hc, mix.comb.data() + s * hc * hc);
        hc_pre(X + s * hc * D, mix_in.data() + s * hc, hc, D, b.h.data() + s * D);
        rmsnorm_row(b.h.data() + s * D, norm_w, D, norm_eps, b.hn.data() + s * D);
      }
    });
    body();
    for (int64_t s = 0; s < S; ++s)
      hc_post(b.y.data() + s * D, X + s * hc * D, mix.post.data() + s * hc, mix.comb.data() + s * hc * hc, hc, D,
              X + s * hc * D);
  };
  sublayer(w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale, w.attn_norm, a_in, b.attn,
           [&] { attention(b.hn.data(), b.y.data()); });
  // The FFN's input mix is the attention sublayer's `pre` (single pass); the FFN's own `pre`
  // goes to the next block.
  sublayer(w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale, w.ffn_norm, b.attn.pre, b.ffn,
           [&] { moe_forward(ctx, lp, w, b.hn.data(), b.y.data()); });
  std::swap(a_in, b.ffn.pre);
}

}  // namespace ds41
