// The backbone forward pass (spec backbone.md §4, §7, §9): embedding -> hc copies -> blocks
// (Engram, attention and MoE between hc_pre / hc_post, single-pass coefficients) -> collapse with
// the last FFN pre-mix -> final norm -> fp32 head.
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/hyper_connection.h"
#include "kernels/numeric_formats.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "model/forward_context.h"
#include "model/weight_catalogue.h"

namespace ds41 {

std::unique_ptr<Model> Model::load(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) throw Error(dir + ": not a directory (expected a checkpoint directory)");
  std::unique_ptr<Model> m(new Model());
  m->config_ = load_model_dir_config(dir);
  validate_config(m->config_);
  m->plan_ = build_model_plan(m->config_);
  auto store = std::make_shared<TensorStore>(TensorStore::open(dir));
  check_checkpoint_against_catalogue(*store, build_weight_catalogue(m->config_));
  m->weights_ = load_model_weights(store, m->config_, m->plan_);
  const ModelConfig& c = m->config_;
  m->inv_freq_plain_ = rope_inv_freq(int(c.rope_head_dim), c.rope_theta, 0, c.rope_factor, c.beta_fast, c.beta_slow);
  m->inv_freq_compressed_ = rope_inv_freq(int(c.rope_head_dim), c.compress_rope_theta, c.original_seq_len,
                                          c.rope_factor, c.beta_fast, c.beta_slow);
  return m;
}

std::vector<float> Model::forward(SequenceState& state, const std::vector<int32_t>& tokens, const ForwardOptions& opt,
                                  ThreadPool* pool, const ForwardHooks* hooks,
                                  const std::vector<uint8_t>* image_mask) const {
  const ModelConfig& c = config_;
  const int S = int(tokens.size());
  if (S == 0) throw Error("forward: no tokens given");
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(c.vocab_size - 1) + ")");
  if (image_mask && int(image_mask->size()) != S) throw Error("forward: image mask length differs from the token count");
  for (const LayerPlan& lp : plan_.layers)
    if (lp.engram && !lp.is_dspark)
      throw Error("this checkpoint uses Engram (layers with n-gram hash memory), which this build does not implement yet");

  ForwardContext ctx{c, plan_, weights_, state, opt, pool, hooks, image_mask, inv_freq_plain_, inv_freq_compressed_};
  ctx.start = state.pos;
  ctx.S = S;
  ctx.topk.resize(plan_.layers.size());

  const int hc = c.hc_mult;
  const int64_t D = c.dim;
  const float norm_eps = float(c.norm_eps), hc_eps = float(c.hc_eps);
  // Stream X [S][hc][D]: every copy starts as the embedding (§7).
  std::vector<uint16_t> X(size_t(S) * hc * D), Xres(size_t(S) * hc * D);
  for (int s = 0; s < S; ++s)
    for (int ci = 0; ci < hc; ++ci)
      std::memcpy(X.data() + (int64_t(s) * hc + ci) * D, weights_.embed + int64_t(tokens[s]) * D, size_t(D) * 2);
  std::vector<float> a_in(size_t(S) * hc, 0.f);  // one-hot [1,0,..] for layer 0, exactly 1.0
  for (int s = 0; s < S; ++s) a_in[int64_t(s) * hc] = 1.f;

  const int mixes = (2 + hc) * hc;
  std::vector<float> pre(size_t(S) * hc), post(size_t(S) * hc), comb(size_t(S) * hc * hc);
  std::vector<float> pre2(size_t(S) * hc), post2(size_t(S) * hc), comb2(size_t(S) * hc * hc);
  std::vector<uint16_t> h(size_t(S) * D), hn(size_t(S) * D), y(size_t(S) * D);
  (void)mixes;

  for (const LayerPlan& lp : plan_.layers) {
    if (lp.is_dspark) continue;  // drafter stages run only in speculative decoding
    const BlockWeights& w = weights_.blocks[lp.id];
    if (hooks && hooks->before_block) hooks->before_block(lp.id, S, X.data(), a_in.data());

    // Attention sublayer.
    Xres = X;
    parallel_for(pool, S, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        hc_coefficients(X.data() + s * hc * D, hc, D, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale,
                        c.hc_sinkhorn_iters, hc_eps, norm_eps, pre.data() + s * hc, post.data() + s * hc,
                        comb.data() + s * hc * hc);
        hc_pre(X.data() + s * hc * D, a_in.data() + s * hc, hc, D, h.data() + s * D);
        rmsnorm_row(h.data() + s * D, w.attn_norm, D, norm_eps, hn.data() + s * D);
      }
    });
    attention_forward(ctx, lp, w, hn.data(), y.data());
    for (int s = 0; s < S; ++s)
      hc_post(y.data() + int64_t(s) * D, Xres.data() + int64_t(s) * hc * D, post.data() + s * hc,
              comb.data() + int64_t(s) * hc * hc, hc, D, X.data() + int64_t(s) * hc * D);

    // FFN sublayer: its input mix is the attention sublayer's `pre` (single pass).
    Xres = X;
    parallel_for(pool, S, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        hc_coefficients(X.data() + s * hc * D, hc, D, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale,
                        c.hc_sinkhorn_iters, hc_eps, norm_eps, pre2.data() + s * hc, post2.data() + s * hc,
                        comb2.data() + s * hc * hc);
        hc_pre(X.data() + s * hc * D, pre.data() + s * hc, hc, D, h.data() + s * D);
        rmsnorm_row(h.data() + s * D, w.ffn_norm, D, norm_eps, hn.data() + s * D);
      }
    });
    moe_forward(ctx, lp, w, hn.data(), y.data());
    for (int s = 0; s < S; ++s)
      hc_post(y.data() + int64_t(s) * D, Xres.data() + int64_t(s) * hc * D, post2.data() + s * hc,
              comb2.data() + int64_t(s) * hc * hc, hc, D, X.data() + int64_t(s) * hc * D);
    a_in = pre2;
    if (hooks && hooks->after_block) hooks->after_block(lp.id, S, X.data(), a_in.data());
  }

  // Collapse with the last FFN pre-mix, final norm, fp32 head (§4, §7).
  const int first_row = opt.all_logits ? 0 : S - 1;
  const int rows = S - first_row;
  std::vector<float> hf(size_t(rows) * D);
  for (int r = 0; r < rows; ++r) {
    const int s = first_row + r;
    hc_pre(X.data() + int64_t(s) * hc * D, a_in.data() + s * hc, hc, D, h.data());
    rmsnorm_row(h.data(), weights_.norm, D, norm_eps, hn.data());
    for (int64_t d = 0; d < D; ++d) hf[r * D + d] = bf16_to_f32(hn[d]);
  }
  std::vector<float> logits(size_t(rows) * c.vocab_size);
  linear_f32_wbf16(hf.data(), rows, weights_.head, c.vocab_size, D, logits.data(), pool);

  state.pos += S;
  state.token_history.insert(state.token_history.end(), tokens.begin(), tokens.end());
  return logits;
}

}  // namespace ds41
