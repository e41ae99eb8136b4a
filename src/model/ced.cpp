// CED prefill (tech report §2.2 and §3.2.2 "Decoder SWA Bounded Replay"; seed §3): the decoder's
// global KV is a per-token projection of the encoder's output — the compressor of the first decoder
// layer, the decoder's only kv source — so a long prompt needs the decoder layers only for the
// window rings the first decode steps will read. The encoder layers run over every token; at the
// first decoder layer its compressor runs over the attention input of every row (exact: the same
// per-row numbers a full prefill computes), then only the last window_size rows go on through the
// decoder, each decoder layer's window starting at the first of them. The decoder rings then hold
// exactly the window the next decode step reads, but the first replayed positions saw a shorter
// window than a full prefill gives them: that is CED's approximation, measured by
// runtime/prefill_compare.
#include <cstring>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/hyper_connection.h"
#include "kernels/rmsnorm.h"
#include "model/forward_context.h"

namespace ds41 {

namespace {

// Keeps the last `keep` of `rows` rows of `row_len` elements, moved to the front.
template <typename T>
void keep_last_rows(std::vector<T>& v, int rows, int keep) {
  if (v.empty()) return;
  const size_t row_len = v.size() / size_t(rows);
  v.erase(v.begin(), v.begin() + long(size_t(rows - keep) * row_len));
}

}  // namespace

bool ced_narrows(const ModelConfig& c, const ModelPlan& plan, const ForwardOptions& opt, int S, const ForwardHooks* hooks) {
  if (opt.prefill != PrefillMode::Ced) return false;
  if (opt.bounded_replay) throw Error("forward: a bounded replay runs every layer; it cannot also be a CED prefill");
  if (S <= c.window_size || plan.decoder_start >= plan.n_layers) return false;
  if (opt.all_logits)
    throw Error("forward: a CED prefill of more than window_size tokens computes the last position's logits only "
                "(every position's logits need a full prefill)");
  if (hooks)
    throw Error("forward: per-position hooks observe every position of every layer; a CED prefill of more than "
                "window_size tokens skips the decoder for most of them (use a full prefill)");
  return true;
}

int ced_enter_decoder(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, std::vector<uint16_t>& X,
                      std::vector<float>& a_in, std::vector<int64_t>& engram_ids, std::vector<uint8_t>& text_mask) {
  const ModelConfig& c = ctx.cfg;
  if (!lp.kv_source || lp.id != ctx.plan.decoder_start)
    throw Error("CED prefill: layer " + std::to_string(lp.id) + " is not the decoder's kv source");
  const int S = ctx.S, hc = c.hc_mult;
  const int keep = int(c.window_size);
  const int64_t D = c.dim;
  const float eps = float(c.norm_eps);

  // The layer's attention input for every row — the attention sublayer's first steps
  // (transformer.cpp): norm(hc_pre(X, incoming pre-mix)) — feeds its compressor.
  std::vector<uint16_t> h(size_t(S) * D), x(size_t(S) * D);
  parallel_for(ctx.pool, S, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      hc_pre(X.data() + s * hc * D, a_in.data() + s * hc, hc, D, h.data() + s * D);
      rmsnorm_row(h.data() + s * D, w.attn_norm, D, eps, x.data() + s * D);
    }
  });
  if (compressor_forward(ctx, lp, w, x.data()) > 0) ctx.state.index_k_publisher = lp.id;
  ctx.global_cache_ready = true;

  // From here on the call is its last window: the replay segment.
  keep_last_rows(X, S, keep);
  keep_last_rows(a_in, S, keep);
  keep_last_rows(engram_ids, S, keep);
  keep_last_rows(text_mask, S, keep);
  if (!ctx.publisher_before_row.empty())  // per-row index-key reading (calls at start_pos > 0)
    ctx.publisher_before_row.erase(ctx.publisher_before_row.begin(), ctx.publisher_before_row.end() - keep);
  if (ctx.image_mask) {
    ctx.image_mask_rows.assign(ctx.image_mask->end() - keep, ctx.image_mask->end());
    ctx.image_mask = &ctx.image_mask_rows;
  }
  ctx.start += S - keep;
  ctx.S = keep;
  for (const LayerPlan& d : ctx.plan.layers)
    if (!d.is_dspark && d.id >= lp.id) ctx.state.layers[size_t(d.id)].ring_start = ctx.start;
  return keep;
}

}  // namespace ds41
