// DSpark drafting (spec engram_dspark_vision.md §B.4-§B.5; overview in model/dspark.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/hyper_connection.h"
#include "kernels/numeric_formats.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sparse_attention.h"
#include "model/forward_context.h"

namespace ds41 {

namespace {

// DSpark attention of one stage over the draft block (§B.5). Keys: the stage's ring rows of the
// committed positions lo..t (oldest first), then the block's own rows — the same list for every
// query (no causal mask inside the block). K = V = the FP8-QDQ'd latent.
void dspark_attention(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x,
                      uint16_t* y) {
  const ModelConfig& c = ctx.cfg;
  const int B = ctx.S;
  const int64_t H = c.n_heads, Dh = c.head_dim, R = c.rope_head_dim, W = c.window_size, Q = c.q_lora_rank;
  const std::vector<float>& inv_freq = ctx.inv_freq_plain;  // ratio 0: theta 10000, no YaRN (§B.1)
  const LayerState& ls = ctx.state.layers[lp.id];

  DS41_SCRATCH(int64_t, positions, B);
  DS41_SCRATCH(float, cs, int64_t(B) * (R / 2));
  DS41_SCRATCH(float, sn, int64_t(B) * (R / 2));
  for (int k = 0; k < B; ++k) {
    positions[size_t(k)] = ctx.pos(k);
    rope_cos_sin_row(inv_freq.data(), int(R / 2), ctx.pos(k), cs.data() + k * (R / 2), sn.data() + k * (R / 2));
  }
  DS41_SCRATCH(uint16_t, qa, int64_t(B) * Q);
  DS41_SCRATCH(uint16_t, qr, int64_t(B) * Q);
  DS41_SCRATCH(uint16_t, q, int64_t(B) * H * Dh);
  linear_fp8(x, B, w.wq_a, qa.data(), ctx.pool);
  rmsnorm_rows(qa.data(), w.q_norm, B, Q, float(c.norm_eps), qr.data());
  linear_fp8(qr.data(), B, w.wq_b, q.data(), ctx.pool);
  for (int k = 0; k < B; ++k)
    for (int64_t h = 0; h < H; ++h)
      rope_apply(q.data() + (k * H + h) * Dh + (Dh - R), cs.data() + k * (R / 2), sn.data() + k * (R / 2), int(R), false);

  DS41_SCRATCH(uint16_t, kv, int64_t(B) * Dh);
  DS41_SCRATCH(uint8_t, codes, int64_t(B) * Dh);
  DS41_SCRATCH(float, scales, int64_t(B) * (Dh / 32));
  window_kv_rows(c, w, x, B, positions.data(), inv_freq, ctx.pool, kv.data(), codes.data(), scales.data());

  const int64_t t = ctx.start - 1;
  const int64_t lo = std::max(ctx.state.dspark_start, t - (W - 1));
  const int64_t n_ring = t - lo + 1;
  DS41_SCRATCH_CAP(uint16_t, ring, n_ring * Dh, W * Dh);  // planned: a full window
  for (int64_t i = 0; i < n_ring; ++i) ring_row_bf16(ls, Dh, (lo + i) % W, ring.data() + i * Dh);
  DS41_SCRATCH_EMPTY(const uint16_t*, rows);
  scratch_reserve(rows, size_t(W + B));
  for (int64_t i = 0; i < n_ring; ++i) rows.push_back(ring.data() + i * Dh);
  for (int k = 0; k < B; ++k) rows.push_back(kv.data() + k * Dh);

  DS41_SCRATCH(uint16_t, o, int64_t(B) * H * Dh);
  const float softmax_scale = float(std::pow(double(Dh), -0.5));
  parallel_for(ctx.pool, B, [&](int64_t k0, int64_t k1) {
    DS41_SCRATCH(float, scratch, sparse_attention_scratch_floats(Dh));
    for (int64_t k = k0; k < k1; ++k) {
      sparse_attention_row(q.data() + k * H * Dh, int(H), Dh, rows.data(), int(rows.size()), w.attn_sink, softmax_scale,
                           o.data() + k * H * Dh, scratch.data());
      for (int64_t h = 0; h < H; ++h)  // de-rotate with the query position
        rope_apply(o.data() + (k * H + h) * Dh + (Dh - R), cs.data() + k * (R / 2), sn.data() + k * (R / 2), int(R), true);
    }
  });
  grouped_output(c, w, B, o.data(), y, ctx.pool);
}

}  // namespace

void Model::dspark_commit(SequenceState& state, const uint16_t* main_hidden, int64_t rows, ThreadPool* pool) const {
  const ModelConfig& c = config_;
  if (!has_dspark()) throw Error("this model has no DSpark draft head (dspark_block_size is 0)");
  if (rows < 0 || state.dspark_pos + rows > state.pos)
    throw Error("DSpark: draft rings can only take positions the target has consumed (" +
                std::to_string(state.dspark_pos + rows) + " > " + std::to_string(state.pos) + ")");
  if (rows == 0) return;
  const int64_t D = c.dim, Dh = c.head_dim, W = c.window_size;
  const int64_t in_dim = D * int64_t(c.dspark_target_layer_ids.size());
  // Rows older than the window would be overwritten within this call: skip them.
  const int64_t skip = std::max<int64_t>(0, rows - W);
  const int n = int(rows - skip);
  const int64_t first = state.dspark_pos + skip;
  DS41_SCRATCH(uint16_t, proj, int64_t(n) * D);
  DS41_SCRATCH(uint16_t, main_x, int64_t(n) * D);
  linear_fp8(main_hidden + skip * in_dim, n, weights_.dspark.main_proj, proj.data(), pool);
  rmsnorm_rows(proj.data(), weights_.dspark.main_norm, n, D, float(c.norm_eps), main_x.data());
  DS41_SCRATCH(int64_t, positions, n);
  for (int i = 0; i < n; ++i) positions[size_t(i)] = first + i;
  DS41_SCRATCH(uint16_t, kv, int64_t(n) * Dh);
  DS41_SCRATCH(uint8_t, codes, int64_t(n) * Dh);
  DS41_SCRATCH(float, scales, int64_t(n) * (Dh / 32));
  for (const LayerPlan& lp : plan_.layers) {
    if (!lp.is_dspark) continue;
    // Each stage projects the same main_x with its own wkv/kv_norm (§B.5 step 1).
    window_kv_rows(c, weights_.blocks[lp.id], main_x.data(), n, positions.data(), inv_freq_plain_, pool, kv.data(),
                   codes.data(), scales.data());
    LayerState& ls = state.layers[lp.id];
    for (int i = 0; i < n; ++i)
      ring_store(nullptr, ls, Dh, positions[size_t(i)], positions[size_t(i)] % W, codes.data() + i * Dh,
                 scales.data() + i * (Dh / 32));
  }
  state.dspark_pos += rows;
}

DSparkDraft Model::dspark_draft(SequenceState& state, int32_t token, int n_drafts, const DraftPicker& pick,
                                ThreadPool* pool, const ForwardHooks* hooks) const {
  DSparkDraft out;
  dspark_draft_into(out, state, token, n_drafts, pick, pool, hooks);
  return out;
}

void Model::dspark_draft_into(DSparkDraft& out, SequenceState& state, int32_t token, int n_drafts,
                              const DraftPicker& pick, ThreadPool* pool, const ForwardHooks* hooks) const {
  const ModelConfig& c = config_;
  if (!has_dspark()) throw Error("this model has no DSpark draft head (dspark_block_size is 0)");
  const int B = c.dspark_block_size;
  if (n_drafts < 1 || n_drafts > B)
    throw Error("DSpark: draft length must be 1.." + std::to_string(B) + " (the block size), got " + std::to_string(n_drafts));
  if (token < 0 || token >= c.vocab_size) throw Error("DSpark: token id " + std::to_string(token) + " is outside the vocabulary");
  if (state.dspark_pos <= state.dspark_start)
    throw Error("DSpark: nothing committed to the draft rings yet (drafting needs at least one position)");
  const int hc = c.hc_mult;
  const int64_t D = c.dim, V = c.vocab_size, Rk = c.dspark_markov_rank;

  ForwardOptions fo;
  ForwardContext ctx{c, plan_, weights_, state, fo, pool, hooks, nullptr, nullptr, inv_freq_plain_, inv_freq_compressed_};
  ctx.start = state.dspark_pos;  // block slot k sits at position t+1+k, t = dspark_pos - 1
  ctx.S = B;

  // Block input [token, noise, ...] embedded and copied to every hc copy; one-hot pre-mix (§B.4).
  DS41_SCRATCH(uint16_t, X, int64_t(B) * hc * D);
  for (int k = 0; k < B; ++k) {
    const int64_t id = k == 0 ? token : c.dspark_noise_token_id;
    for (int ci = 0; ci < hc; ++ci) std::memcpy(X.data() + (int64_t(k) * hc + ci) * D, weights_.embed + id * D, size_t(D) * 2);
  }
  DS41_SCRATCH(float, a_in, int64_t(B) * hc);
  for (int k = 0; k < B; ++k) a_in[size_t(k) * hc] = 1.f;
  static thread_local BlockScratch scratch;  // keeps its capacity from draft to draft
  scratch.resize(B, hc, D);
  for (const LayerPlan& lp : plan_.layers) {
    if (!lp.is_dspark) continue;
    const BlockWeights& w = weights_.blocks[lp.id];
    if (hooks && hooks->before_block) hooks->before_block(lp.id, B, X.data(), a_in.data());
    run_block(ctx, lp, w, X.data(), a_in, scratch,
              [&](const uint16_t* in, uint16_t* out) { dspark_attention(ctx, lp, w, in, out); });
    if (hooks && hooks->after_block) hooks->after_block(lp.id, B, X.data(), a_in.data());
  }

  // Head (§B.4 step 3): collapse with the last FFN pre-mix; base logits from the normalised
  // hidden through the shared head; the confidence reads the un-normalised hidden.
  const int n = n_drafts;
  DS41_SCRATCH(uint16_t, hidden, int64_t(n) * D);
  DS41_SCRATCH(uint16_t, normed, int64_t(n) * D);
  DS41_SCRATCH(float, hf, int64_t(n) * D);
  for (int k = 0; k < n; ++k) {
    hc_pre(X.data() + int64_t(k) * hc * D, a_in.data() + k * hc, hc, D, hidden.data() + k * D);
    rmsnorm_row(hidden.data() + k * D, weights_.dspark.norm, D, float(c.norm_eps), normed.data() + k * D);
  }
  for (size_t i = 0; i < hf.size(); ++i) hf[i] = bf16_to_f32(normed[i]);
  out.token = token;
  out.drafts.clear();
  out.confidence.clear();
  out.logits.resize(size_t(n) * V);
  linear_f32_wbf16_packed(hf.data(), n, weights_.head_packed, out.logits.data(), pool);

  // Markov chain, strictly in order: slot k's bias comes from the token picked before it.
  DS41_SCRATCH(float, bias, V);
  DS41_SCRATCH(float, e, Rk);
  DS41_SCRATCH(float, conf_in, D + Rk);
  int32_t prev = token;
  for (int k = 0; k < n; ++k) {
    const uint16_t* emb = weights_.dspark.markov_embed + int64_t(prev) * Rk;
    for (int64_t r = 0; r < Rk; ++r) e[size_t(r)] = bf16_to_f32(emb[r]);
    linear_f32_wbf16(e.data(), 1, weights_.dspark.markov_head, V, Rk, bias.data(), pool);
    float* row = out.logits.data() + int64_t(k) * V;
    for (int64_t v = 0; v < V; ++v) row[v] += bias[size_t(v)];
    mask_disallowed_output(row, 1);  // drafts are never ids without a token
    // Confidence of slot k: [hidden_k ; W1[previous token]] (the embedding of out[k], §B.4 step 4).
    for (int64_t d = 0; d < D; ++d) conf_in[size_t(d)] = bf16_to_f32(hidden[size_t(k * D + d)]);
    std::copy(e.begin(), e.end(), conf_in.begin() + D);
    float conf = 0.f;
    linear_f32(conf_in.data(), 1, weights_.dspark.confidence, 1, D + Rk, &conf, nullptr);
    out.confidence.push_back(conf);
    const int32_t next = pick ? pick(k, row, V) : [&] {
      return int32_t(std::max_element(row, row + V) - row);  // first maximum, like torch.argmax
    }();
    if (next < 0 || next >= V) throw Error("DSpark: draft picker returned token " + std::to_string(next));
    out.drafts.push_back(next);
    prev = next;
  }
}

}  // namespace ds41
