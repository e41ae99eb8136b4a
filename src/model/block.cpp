// One hyper-connected block (spec backbone.md §7): attention and MoE sublayers, each between
// hc_pre and hc_post with single-pass coefficients. Shared by the backbone and the DSpark stages,
// which differ only in their attention.
#include <array>

#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/hyper_connection.h"
#include "kernels/rmsnorm.h"
#include "kernels/vector_exp.h"
#include "model/forward_context.h"

namespace ds41 {

namespace {

template <class T>
void size_to(std::vector<T>& v, size_t n) {
  scratch_reserve(v, n);
  v.resize(n);
}

}  // namespace

void BlockScratch::resize(int S, int hc, int64_t D) {
  const size_t n = size_t(S) * size_t(hc), rows = size_t(S) * size_t(D);
  for (auto* v : {&h, &hn, &y}) size_to(*v, rows);
  for (Mix* m : {&attn, &ffn}) {
    size_to(m->pre, n);
    size_to(m->post, n);
    size_to(m->comb, n * size_t(hc));
  }
}

void run_block(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, uint16_t* X, std::vector<float>& a_in,
               BlockScratch& b, const AttentionBody& attention) {
  const ModelConfig& c = ctx.cfg;
  const int S = ctx.S, hc = c.hc_mult;
  const int64_t D = c.dim;
  const float norm_eps = float(c.norm_eps), hc_eps = float(c.hc_eps);
  // One sublayer: coefficients from the stream, input = norm(hc_pre(X, mix_in)), then
  // X = hc_post(body(input), X) in place (hc_post reads a column before writing it).
  auto sublayer = [&](const float* fn, const float* fn_t, const float* base, const float* scale,
                      const uint16_t* norm_w, const std::vector<float>& mix_in, BlockScratch::Mix& mix,
                      auto&& body) {
    // The mixes' dot products (most of the work) over (row, range of mixes) tasks: with fewer
    // rows than threads (decode) each row's mixes are split too (each mix is its own chain).
    const int threads = ctx.pool ? ctx.pool->size() : 1;
    const int64_t parts = S >= threads ? 1 : threads;
    const int nmix = hc_mix_count(hc);
    DS41_SCRATCH(float, dots, int64_t(S) * nmix);
    parallel_for(ctx.pool, S * parts, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t s = t / parts, part = t % parts;
        const int k0 = int(nmix * part / parts), k1 = int(nmix * (part + 1) / parts);
        hc_mix_dots(X + s * hc * D, hc, D, fn, fn_t, k0, k1, dots.data() + s * nmix + k0);
      }
    });
    parallel_for(ctx.pool, S, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        std::array<float, hc_mix_count(kMaxHc)> mixes;
        hc_mixes_from_dots(X + s * hc * D, hc, D, dots.data() + s * nmix, norm_eps, mixes.data());
        hc_split_sinkhorn(mixes.data(), hc, base, scale, c.hc_sinkhorn_iters, hc_eps, mix.pre.data() + s * hc,
                          mix.post.data() + s * hc, mix.comb.data() + s * hc * hc,
                          int(ctx.opt.reference_call_shapes ? torch_scalar_tail_from(s, S, hc) : hc));
        hc_pre(X + s * hc * D, mix_in.data() + s * hc, hc, D, b.h.data() + s * D);
        rmsnorm_row(b.h.data() + s * D, norm_w, D, norm_eps, b.hn.data() + s * D);
      }
    });
    body();
    // Rows in parallel; with fewer rows than threads (decode) each row's columns are split too.
    parallel_for(ctx.pool, S * parts, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t s = t / parts, part = t % parts;
        hc_post_columns(b.y.data() + s * D, X + s * hc * D, mix.post.data() + s * hc, mix.comb.data() + s * hc * hc,
                        hc, D, D * part / parts, D * (part + 1) / parts, X + s * hc * D);
      }
    });
  };
  sublayer(w.hc_attn_fn, w.hc_attn_fn_t, w.hc_attn_base, w.hc_attn_scale, w.attn_norm, a_in, b.attn,
           [&] { attention(b.hn.data(), b.y.data()); });
  // The FFN's input mix is the attention sublayer's `pre` (single pass); the FFN's own `pre`
  // goes to the next block.
  sublayer(w.hc_ffn_fn, w.hc_ffn_fn_t, w.hc_ffn_base, w.hc_ffn_scale, w.ffn_norm, b.attn.pre, b.ffn,
           [&] { moe_forward(ctx, lp, w, b.hn.data(), b.y.data()); });
  std::swap(a_in, b.ffn.pre);
}

}  // namespace ds41
