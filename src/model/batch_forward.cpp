// One decode step for several sequences in one pass (Model::forward_batch): the rows of every
// sequence go through each layer's linears, MoE and Engram together — one pass over each expert's
// weights for all the rows routed to it — while attention runs per sequence against its own caches.
// Every step of a row is row-independent (the kernels' results do not depend on how many rows a
// call has), so each row's logits equal those of a single-token forward of its sequence.
#include <cstring>

#include "base/error.h"
#include "base/scratch.h"
#include "kernels/gemm.h"
#include "kernels/hyper_connection.h"
#include "kernels/numeric_formats.h"
#include "kernels/rmsnorm.h"
#include "model/forward_context.h"
#include "text/compressed_vocab.h"

namespace ds41 {

void Model::forward_batch(std::vector<float>& logits, const std::vector<SequenceState*>& states,
                          const std::vector<int32_t>& tokens, const ForwardOptions& opt, ThreadPool* pool) const {
  const ModelConfig& c = config_;
  const int B = int(states.size());
  if (B == 0) throw Error("forward_batch: no sequences given");
  if (int(tokens.size()) != B) throw Error("forward_batch: one token per sequence is needed");
  if (opt.bounded_replay || opt.all_logits || opt.main_hidden_out || opt.prefill != PrefillMode::Full)
    throw Error("forward_batch: decode steps only (no replay, CED, all-logits or drafter capture)");
  for (int b = 0; b < B; ++b) {
    const SequenceState& st = *states[size_t(b)];
    if (tokens[size_t(b)] < 0 || tokens[size_t(b)] >= c.vocab_size)
      throw Error("token id " + std::to_string(tokens[size_t(b)]) + " is outside the vocabulary");
    if (st.journal) throw Error("forward_batch: a journaled sequence (speculative verification) runs on its own");
    if (int64_t(st.engram_history.size()) != (engram_hash_ ? st.pos - st.history_start : 0))
      throw Error("forward: sequence state does not belong to this model (Engram history out of step)");
    if (st.pos + 1 > c.max_seq_len) throw Error("forward_batch: a sequence is at the model's max_seq_len");
    for (int a = 0; a < b; ++a)
      if (states[size_t(a)] == states[size_t(b)]) throw Error("forward_batch: a sequence is given twice");
  }

  // Engram rows of every sequence's new position (its history first, as in forward_call).
  const int hc = c.hc_mult;
  const int64_t D = c.dim;
  int engram_cols = 0;
  DS41_SCRATCH_EMPTY(int64_t, engram_ids);
  if (engram_hash_) {
    engram_cols = engram_hash_->columns;
    const int64_t per_row = int64_t(engram_hash_->n_layers) * engram_cols;
    engram_ids.resize(size_t(int64_t(B) * per_row));
    for (int b = 0; b < B; ++b) {
      SequenceState& st = *states[size_t(b)];
      st.engram_history.push_back(int64_t(compressed_vocab_[size_t(tokens[size_t(b)])]));
      try {
        engram_hash_positions(*engram_hash_, st.engram_history.data(), st.pos, 1, engram_ids.data() + b * per_row,
                              st.history_start);
      } catch (...) {
        for (int a = 0; a <= b; ++a) {
          SequenceState& sa = *states[size_t(a)];
          sa.engram_history.resize(size_t(sa.pos - sa.history_start));
        }
        throw;
      }
    }
  }

  // One context per sequence (its attention, caches and index-key reading, as a one-token call),
  // and one over all rows for the row-wise parts (MoE, Engram, hyper-connections).
  std::vector<ForwardContext> ctxs;
  ctxs.reserve(size_t(B));
  std::vector<int> publisher_after(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    SequenceState& st = *states[size_t(b)];
    ctxs.push_back(ForwardContext{c, plan_, weights_, st, opt, pool, nullptr, nullptr, nullptr, inv_freq_plain_,
                                  inv_freq_compressed_});
    ForwardContext& ctx = ctxs.back();
    ctx.start = st.pos;
    ctx.S = 1;
    ctx.topk.resize(plan_.layers.size());
    publisher_after[size_t(b)] = st.index_k_publisher;
    if (st.pos > 0) {
      if (!opt.corrected_index_keys) ctx.publisher_before_row.assign(1, st.index_k_publisher);
      publisher_after[size_t(b)] = reference_publisher_after(plan_, st.index_k_publisher, st.pos);
    }
  }
  ForwardContext all{c, plan_, weights_, *states[0], opt, pool, nullptr, nullptr, nullptr, inv_freq_plain_,
                     inv_freq_compressed_};
  all.start = states[0]->pos;  // unused by the row-wise parts
  all.S = B;

  DS41_SCRATCH(uint16_t, X, int64_t(B) * hc * D);
  for (int b = 0; b < B; ++b)
    for (int ci = 0; ci < hc; ++ci)
      std::memcpy(X.data() + (int64_t(b) * hc + ci) * D, weights_.embed + int64_t(tokens[size_t(b)]) * D, size_t(D) * 2);
  DS41_SCRATCH(float, a_in, int64_t(B) * hc);
  for (int b = 0; b < B; ++b) a_in[int64_t(b) * hc] = 1.f;
  static thread_local BlockScratch scratch;
  scratch.resize(B, hc, D);

  for (const LayerPlan& lp : plan_.layers) {
    if (lp.is_dspark) continue;
    const BlockWeights& w = weights_.blocks[lp.id];
    if (lp.engram) {
      DS41_SCRATCH(int64_t, rows, int64_t(B) * engram_cols);
      for (int b = 0; b < B; ++b)
        std::memcpy(rows.data() + int64_t(b) * engram_cols,
                    engram_ids.data() + (int64_t(b) * engram_hash_->n_layers + lp.engram_index) * engram_cols,
                    size_t(engram_cols) * sizeof(int64_t));
      engram_forward(all, lp, w, rows.data(), engram_cols, X.data());
    }
    auto attention = [&](const uint16_t* in, uint16_t* out) {
      for (int b = 0; b < B; ++b) attention_forward(ctxs[size_t(b)], lp, w, in + int64_t(b) * D, out + int64_t(b) * D);
    };
    run_block(all, lp, w, X.data(), a_in, scratch, attention);
  }

  DS41_SCRATCH(uint16_t, h, D);
  DS41_SCRATCH(uint16_t, hn, D);
  DS41_SCRATCH(float, hf, int64_t(B) * D);
  for (int b = 0; b < B; ++b) {
    hc_pre(X.data() + int64_t(b) * hc * D, a_in.data() + b * hc, hc, D, h.data());
    rmsnorm_row(h.data(), weights_.norm, D, float(c.norm_eps), hn.data());
    for (int64_t d = 0; d < D; ++d) hf[b * D + d] = bf16_to_f32(hn[d]);
  }
  logits.resize(size_t(B) * c.vocab_size);
  head_logits(hf.data(), B, opt, pool, nullptr, logits.data());  // the screen reads its int8 head once for all rows

  for (int b = 0; b < B; ++b) {
    SequenceState& st = *states[size_t(b)];
    if (st.pos > 0) st.index_k_publisher = publisher_after[size_t(b)];
    st.pos += 1;
    st.token_history.push_back(tokens[size_t(b)]);
  }
}

}  // namespace ds41
