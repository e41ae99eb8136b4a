#include "runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>

#include "base/error.h"
#include "base/hash.h"

namespace ds41 {

namespace {

// Purposes of the counter-based uniforms of one cycle (each used once per slot).
enum : uint64_t { kDrawDraft = 1, kAccept = 2, kResidual = 3, kBonus = 4 };

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double weight_sum(std::span<const float> w) {
  double s = 0;
  for (float v : w) s += double(v);
  return s;
}

// Row k of a cycle's distributions. Rows are never dropped, so each keeps its capacity from
// cycle to cycle; the caller tracks how many are in use.
std::vector<float>& distribution_row(std::vector<std::vector<float>>& rows, size_t k) {
  if (rows.size() <= k) rows.resize(k + 1);
  return rows[k];
}

// Attaches the verify journal (emptied) and detaches it whatever happens (an exception leaves no
// dangling pointer).
struct JournalScope {
  SequenceState& st;
  JournalScope(SequenceState& s, StateJournal& journal) : st(s) {
    journal.clear();
    st.journal = &journal;
  }
  ~JournalScope() { st.journal = nullptr; }
};

}  // namespace

double speculative_uniform(uint64_t seed, uint64_t key, uint64_t slot, uint64_t purpose) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed ^ 0x5eedd5a7ull) ^ key) ^ (slot << 8 | purpose));
  return double(h >> 11) * (1.0 / 9007199254740992.0);  // 53 bits: [0, 1)
}

int32_t draw_from_weights(const std::vector<float>& w, double u) {
  const double target = u * weight_sum(w);
  double acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!(w[i] > 0.f)) continue;
    acc += double(w[i]);
    last = int32_t(i);
    if (acc > target) return last;
  }
  if (last < 0) throw Error("sampling: the distribution has no token with positive probability");
  return last;  // u * total rounded up to the total
}

SampledAcceptance accept_sampled(const std::vector<int32_t>& drafts, const std::vector<std::vector<float>>& q,
                                 const std::vector<std::vector<float>>& p, uint64_t seed, uint64_t key) {
  std::vector<float> residual;
  return accept_sampled(std::span<const int32_t>(drafts), std::span<const std::vector<float>>(q),
                        std::span<const std::vector<float>>(p), seed, key, residual);
}

SampledAcceptance accept_sampled(std::span<const int32_t> drafts, std::span<const std::vector<float>> q,
                                 std::span<const std::vector<float>> p, uint64_t seed, uint64_t key,
                                 std::vector<float>& residual) {
  const size_t gamma = drafts.size();
  if (q.size() != gamma || p.size() != gamma + 1)
    throw Error("speculative sampling: need one draft distribution per draft and one target distribution more");
  for (size_t k = 0; k < gamma; ++k) {
    const double sq = weight_sum(q[k]), sp = weight_sum(p[k]);
    const int32_t d = drafts[k];
    const double qd = double(q[k][size_t(d)]) / sq, pd = double(p[k][size_t(d)]) / sp;
    // Accept with probability min(1, p/q): u < p/q for u uniform in [0, 1).
    if (speculative_uniform(seed, key, k, kAccept) * qd < pd) continue;
    // Rejected: the next token comes from the residual max(p - q, 0), renormalised.
    residual.resize(p[k].size());
    for (size_t i = 0; i < residual.size(); ++i)
      residual[i] = float(std::max(0.0, double(p[k][i]) / sp - double(q[k][i]) / sq));
    const double u = speculative_uniform(seed, key, k, kResidual);
    // p == q up to rounding leaves no residual mass; then p itself is the right law.
    const int32_t next = weight_sum(residual) > 0 ? draw_from_weights(residual, u) : draw_from_weights(p[k], u);
    return {int(k), next};
  }
  return {int(gamma), draw_from_weights(p[gamma], speculative_uniform(seed, key, gamma, kBonus))};
}

SpeculativeDecoder::SpeculativeDecoder(const Model& model, SequenceState& state, const SpeculativeOptions& opt,
                                       ThreadPool* pool)
    : model_(model), st_(state), opt_(opt), pool_(pool), sampler_(opt.sampling) {
  const ModelConfig& c = model.config();
  // Greedy verification needs each row's largest logits only (the head screen, as in Generation;
  // top-k sampled verification when asked for).
  opt_.forward.head_top_k = head_top_k_for(opt_.sampling, opt_.forward.head_top_k);
  if (!model.has_dspark()) throw Error("--dspark: this model has no DSpark draft head (dspark_block_size is 0)");
  draft_tokens_ = opt.draft_tokens ? opt.draft_tokens : c.dspark_block_size;
  if (draft_tokens_ < 1 || draft_tokens_ > c.dspark_block_size)
    throw Error("--draft-tokens must be 1.." + std::to_string(c.dspark_block_size) + " (the model's DSpark block size), got " +
                std::to_string(opt.draft_tokens));
  if (opt.confidence_threshold < 0 || opt.confidence_threshold >= 1)
    throw Error("--dspark-confidence must be in [0, 1), got " + std::to_string(opt.confidence_threshold));
  if (state.dspark_pos != state.pos)
    throw Error("DSpark: the sequence's draft rings end at position " + std::to_string(state.dspark_pos) +
                " but the sequence is at " + std::to_string(state.pos));
  if (opt.override_drafts && opt.sampling.temperature > 0)
    throw Error("speculative decoding: drafts can only be overridden with greedy verification");
  // Penalties copy the sequence into the cycle's history: room for the planned length up front.
  if (opt.sampling.has_penalties())
    history_.reserve(size_t(std::max<int64_t>(state.reserved_tokens, state.pos)) + size_t(c.dspark_block_size) + 1);
}

std::vector<float> SpeculativeDecoder::prefill(const std::vector<int32_t>& tokens, int64_t chunk,
                                               const InputEmbeddings* inputs) {
  if (tokens.empty()) throw Error("prefill: no tokens given");
  if (chunk < 0) throw Error("prefill: chunk must be >= 0");
  if (inputs && inputs->token_types.size() != tokens.size())
    throw Error("prefill: token types given for a different number of tokens");
  std::vector<float> logits;
  std::vector<uint16_t> main_hidden;
  ForwardOptions fo = opt_.forward;
  fo.all_logits = false;
  fo.main_hidden_out = &main_hidden;
  const size_t step = chunk ? size_t(chunk) : tokens.size();
  for (size_t i = 0; i < tokens.size(); i += step) {
    const size_t end = std::min(tokens.size(), i + step);
    InputEmbeddings part;
    if (inputs) part = inputs->slice(int64_t(i), int64_t(end), model_.config().dim);
    model_.forward_into(logits, st_, std::vector<int32_t>(tokens.begin() + long(i), tokens.begin() + long(end)), fo, pool_,
                        nullptr, inputs ? &part : nullptr);
    model_.dspark_commit(st_, main_hidden.data(), int64_t(end - i), pool_);
  }
  return logits;
}

std::vector<int32_t> SpeculativeDecoder::step(int32_t pending, int64_t max_new, std::vector<float>* logits_out) {
  std::vector<int32_t> out;
  step_into(out, pending, max_new, logits_out);
  return out;
}

void SpeculativeDecoder::step_into(std::vector<int32_t>& out, int32_t pending, int64_t max_new,
                                   std::vector<float>* logits_out) {
  const ModelConfig& c = model_.config();
  if (max_new < 1) throw Error("speculative step: max_new must be >= 1");
  out.clear();
  const int64_t n = st_.pos;
  // Emitted tokens take positions n+1, n+2, ...: like plain decoding, never beyond max_seq_len - 1.
  max_new = std::min(max_new, c.max_seq_len - 1 - n);
  if (max_new < 1) return;
  const bool greedy = opt_.sampling.temperature <= 0;
  // Draws are keyed by the cycle's first position (n + 1, where the first draft goes), as plain
  // sampling keys a draw by its position: cycles start at increasing positions, so no two share
  // a key, and a seeded run does not depend on how the sequence was fed.
  const uint64_t key = uint64_t(n + 1);
  // Penalties see the sequence so far, as plain sampling does: row k (the token after d_k) sees
  // the consumed tokens, the pending token and d_1..d_k.
  // (Greedy decoding with penalties takes the argmax of the penalised logits.)
  const bool penalised = opt_.sampling.has_penalties();
  std::vector<int32_t>& history = history_;
  history.clear();
  if (penalised) {
    history.assign(st_.token_history.begin(), st_.token_history.end());
    history.push_back(pending);
  }
  const size_t history_base = history.size();
  // The history row k of a chain sees: the sequence, pending, then its first k tokens.
  auto history_upto = [&](int k) { return std::span<const int32_t>(history.data(), penalised ? history_base + size_t(k) : 0); };
  int gamma = int(std::min<int64_t>(draft_tokens_, max_new - 1));

  // 1. Draft.
  std::vector<int32_t>& drafts = drafts_;
  drafts.clear();
  size_t q_rows = 0;
  if (gamma > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    // The picker captures two pointers, which std::function stores without allocating.
    struct Cycle {
      decltype(history_upto)& history;
      uint64_t key;
      bool penalised;
      size_t& q_rows;
    } cycle{history_upto, key, penalised, q_rows};
    DraftPicker pick;
    if (!greedy)
      pick = [this, &cycle](int k, const float* logits, int64_t vocab) {
        std::vector<float>& q = distribution_row(q_, size_t(k));
        sampler_.distribution_into(q, logits, vocab, cycle.history(k), sampler_scratch_);
        cycle.q_rows = size_t(k) + 1;
        const int32_t d = draw_from_weights(q, speculative_uniform(opt_.sampling.seed, cycle.key, uint64_t(k), kDrawDraft));
        if (cycle.penalised) history_.push_back(d);
        return d;
      };
    model_.dspark_draft_into(draft_, st_, pending, gamma, pick, pool_);
    drafts.assign(draft_.drafts.begin(), draft_.drafts.end());
    if (opt_.confidence_threshold > 0) {
      // sigmoid(c_k) estimates P(d_k accepted | d_1..d_k-1 accepted): keep the prefix whose
      // survival probability stays above the threshold. Cutting never changes the output.
      double survival = 1;
      size_t keep = 0;
      while (keep < drafts.size()) {
        survival *= 1.0 / (1.0 + std::exp(-double(draft_.confidence[keep])));
        if (survival < opt_.confidence_threshold) break;
        ++keep;
      }
      drafts.resize(keep);
      if (!greedy) q_rows = keep;
    }
    stats_.draft_s += seconds_since(t0);
  }
  if (opt_.override_drafts) {
    const size_t count = drafts.size();
    opt_.override_drafts(n + 1, drafts);
    if (drafts.size() != count) throw Error("speculative decoding: the draft override changed the draft count");
  }
  gamma = int(drafts.size());
  if (penalised) {  // the verified chain: the drafts as cut or overridden
    history.resize(history_base);
    history.insert(history.end(), drafts.begin(), drafts.end());
  }

  // 2. Verify: one target call over [pending, d1..dγ], journaled so it can be cut back.
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<float>& logits = logits_;
  JournalScope scope(st_, journal_);
  ForwardOptions fo = opt_.forward;
  fo.all_logits = true;
  fo.main_hidden_out = &main_hidden_;
  fo.prefill = PrefillMode::Full;  // a verify call is a short decode chunk, never a CED prefill
  verify_tokens_.assign(1, pending);
  verify_tokens_.insert(verify_tokens_.end(), drafts.begin(), drafts.end());
  model_.forward_into(logits, st_, verify_tokens_, fo, pool_);
  stats_.verify_s += seconds_since(t1);

  // 3. Accept.
  const int64_t V = c.vocab_size;
  int accepted = 0;
  int32_t next = 0;
  if (greedy) {
    // The token plain greedy decoding picks after row k (penalised argmax when penalties are set).
    auto target = [&](int k) {
      return penalised ? sampler_.sample(logits.data() + k * V, V, 0, history_upto(k), sampler_scratch_)
                       : argmax_token(logits.data() + k * V, V);
    };
    while (accepted < gamma && drafts[size_t(accepted)] == target(accepted)) ++accepted;
    next = target(accepted);
  } else {
    for (int k = 0; k <= gamma; ++k)
      sampler_.distribution_into(distribution_row(p_, size_t(k)), logits.data() + k * V, V, history_upto(k), sampler_scratch_);
    const SampledAcceptance a =
        accept_sampled(std::span<const int32_t>(drafts), std::span<const std::vector<float>>(q_.data(), q_rows),
                       std::span<const std::vector<float>>(p_.data(), size_t(gamma) + 1), opt_.sampling.seed, key, residual_);
    accepted = a.accepted;
    next = a.next;
  }
  out.assign(drafts.begin(), drafts.begin() + accepted);
  out.push_back(next);
  auto eos = std::find(out.begin(), out.end(), int32_t(c.eos_token_id));
  if (eos != out.end()) out.erase(eos + 1, out.end());
  if (logits_out) logits_out->assign(logits.begin(), logits.begin() + long(out.size()) * V);

  // 4. Commit: the pending token and every emitted token but the last are now consumed.
  const auto t2 = std::chrono::steady_clock::now();
  const int64_t keep = n + int64_t(out.size());
  model_.rollback(st_, keep);
  model_.dspark_commit(st_, main_hidden_.data(), keep - n, pool_);
  stats_.commit_s += seconds_since(t2);

  ++stats_.cycles;
  stats_.drafted += gamma;
  stats_.accepted += accepted;
  stats_.emitted += int64_t(out.size());
}

}  // namespace ds41
