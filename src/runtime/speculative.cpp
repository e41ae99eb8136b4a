#include "runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/error.h"
#include "base/hash.h"

namespace ds41 {

namespace {

// Purposes of the counter-based uniforms of one cycle (each used once per slot).
enum : uint64_t { kDrawDraft = 1, kAccept = 2, kResidual = 3, kBonus = 4 };

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double weight_sum(const std::vector<float>& w) {
  double s = 0;
  for (float v : w) s += double(v);
  return s;
}

// Detaches the verify journal whatever happens (an exception leaves no dangling pointer).
struct JournalScope {
  SequenceState& st;
  StateJournal journal;
  explicit JournalScope(SequenceState& s) : st(s) { st.journal = &journal; }
  ~JournalScope() { st.journal = nullptr; }
};

}  // namespace

double speculative_uniform(uint64_t seed, uint64_t cycle, uint64_t slot, uint64_t purpose) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed ^ 0x5eedd5a7ull) ^ cycle) ^ (slot << 8 | purpose));
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
                                 const std::vector<std::vector<float>>& p, uint64_t seed, uint64_t cycle) {
  const size_t gamma = drafts.size();
  if (q.size() != gamma || p.size() != gamma + 1)
    throw Error("speculative sampling: need one draft distribution per draft and one target distribution more");
  for (size_t k = 0; k < gamma; ++k) {
    const double sq = weight_sum(q[k]), sp = weight_sum(p[k]);
    const int32_t d = drafts[k];
    const double qd = double(q[k][size_t(d)]) / sq, pd = double(p[k][size_t(d)]) / sp;
    // Accept with probability min(1, p/q): u < p/q for u uniform in [0, 1).
    if (speculative_uniform(seed, cycle, k, kAccept) * qd < pd) continue;
    // Rejected: the next token comes from the residual max(p - q, 0), renormalised.
    std::vector<float> residual(p[k].size());
    for (size_t i = 0; i < residual.size(); ++i)
      residual[i] = float(std::max(0.0, double(p[k][i]) / sp - double(q[k][i]) / sq));
    const double u = speculative_uniform(seed, cycle, k, kResidual);
    // p == q up to rounding leaves no residual mass; then p itself is the right law.
    const int32_t next = weight_sum(residual) > 0 ? draw_from_weights(residual, u) : draw_from_weights(p[k], u);
    return {int(k), next};
  }
  return {int(gamma), draw_from_weights(p[gamma], speculative_uniform(seed, cycle, gamma, kBonus))};
}

SpeculativeDecoder::SpeculativeDecoder(const Model& model, SequenceState& state, const SpeculativeOptions& opt,
                                       ThreadPool* pool)
    : model_(model), st_(state), opt_(opt), pool_(pool), sampler_(opt.sampling) {
  const ModelConfig& c = model.config();
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
}

std::vector<float> SpeculativeDecoder::prefill(const std::vector<int32_t>& tokens, int64_t chunk) {
  if (tokens.empty()) throw Error("prefill: no tokens given");
  if (chunk < 0) throw Error("prefill: chunk must be >= 0");
  std::vector<float> logits;
  std::vector<uint16_t> main_hidden;
  ForwardOptions fo = opt_.forward;
  fo.all_logits = false;
  fo.main_hidden_out = &main_hidden;
  const size_t step = chunk ? size_t(chunk) : tokens.size();
  for (size_t i = 0; i < tokens.size(); i += step) {
    const size_t end = std::min(tokens.size(), i + step);
    logits = model_.forward(st_, std::vector<int32_t>(tokens.begin() + long(i), tokens.begin() + long(end)), fo, pool_);
    model_.dspark_commit(st_, main_hidden.data(), int64_t(end - i), pool_);
  }
  return logits;
}

std::vector<int32_t> SpeculativeDecoder::step(int32_t pending, int64_t max_new, std::vector<float>* logits_out) {
  const ModelConfig& c = model_.config();
  if (max_new < 1) throw Error("speculative step: max_new must be >= 1");
  const int64_t n = st_.pos;
  // Emitted tokens take positions n+1, n+2, ...: like plain decoding, never beyond max_seq_len - 1.
  max_new = std::min(max_new, c.max_seq_len - 1 - n);
  if (max_new < 1) return {};
  const bool greedy = opt_.sampling.temperature <= 0;
  const uint64_t cycle = uint64_t(stats_.cycles);
  int gamma = int(std::min<int64_t>(draft_tokens_, max_new - 1));

  // 1. Draft.
  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> q;
  if (gamma > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    DraftPicker pick;
    if (!greedy)
      pick = [&](int k, const float* logits, int64_t vocab) {
        q.push_back(sampler_.probabilities(logits, vocab));
        return draw_from_weights(q.back(), speculative_uniform(opt_.sampling.seed, cycle, uint64_t(k), kDrawDraft));
      };
    DSparkDraft d = model_.dspark_draft(st_, pending, gamma, pick, pool_);
    drafts = d.drafts;
    if (opt_.confidence_threshold > 0) {
      // sigmoid(c_k) estimates P(d_k accepted | d_1..d_k-1 accepted): keep the prefix whose
      // survival probability stays above the threshold. Cutting never changes the output.
      double survival = 1;
      size_t keep = 0;
      while (keep < drafts.size()) {
        survival *= 1.0 / (1.0 + std::exp(-double(d.confidence[keep])));
        if (survival < opt_.confidence_threshold) break;
        ++keep;
      }
      drafts.resize(keep);
      if (!greedy) q.resize(keep);
    }
    stats_.draft_s += seconds_since(t0);
  }
  if (opt_.override_drafts) {
    const size_t count = drafts.size();
    opt_.override_drafts(n + 1, drafts);
    if (drafts.size() != count) throw Error("speculative decoding: the draft override changed the draft count");
  }
  gamma = int(drafts.size());

  // 2. Verify: one target call over [pending, d1..dγ], journaled so it can be cut back.
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<uint16_t> main_hidden;
  std::vector<float> logits;
  {
    JournalScope scope(st_);
    ForwardOptions fo = opt_.forward;
    fo.all_logits = true;
    fo.main_hidden_out = &main_hidden;
    std::vector<int32_t> tokens{pending};
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    logits = model_.forward(st_, tokens, fo, pool_);
    stats_.verify_s += seconds_since(t1);

    // 3. Accept.
    const int64_t V = c.vocab_size;
    int accepted = 0;
    int32_t next = 0;
    if (greedy) {
      while (accepted < gamma && drafts[size_t(accepted)] == argmax_token(logits.data() + accepted * V, V)) ++accepted;
      next = argmax_token(logits.data() + accepted * V, V);
    } else {
      std::vector<std::vector<float>> p;
      for (int k = 0; k <= gamma; ++k) p.push_back(sampler_.probabilities(logits.data() + k * V, V));
      const SampledAcceptance a = accept_sampled(drafts, q, p, opt_.sampling.seed, cycle);
      accepted = a.accepted;
      next = a.next;
    }
    std::vector<int32_t> out(drafts.begin(), drafts.begin() + accepted);
    out.push_back(next);
    auto eos = std::find(out.begin(), out.end(), int32_t(c.eos_token_id));
    if (eos != out.end()) out.erase(eos + 1, out.end());
    if (logits_out) logits_out->assign(logits.begin(), logits.begin() + long(out.size()) * V);

    // 4. Commit: the pending token and every emitted token but the last are now consumed.
    const auto t2 = std::chrono::steady_clock::now();
    const int64_t keep = n + int64_t(out.size());
    model_.rollback(st_, keep);
    model_.dspark_commit(st_, main_hidden.data(), keep - n, pool_);
    stats_.commit_s += seconds_since(t2);

    ++stats_.cycles;
    stats_.drafted += gamma;
    stats_.accepted += accepted;
    stats_.emitted += int64_t(out.size());
    return out;
  }
}

}  // namespace ds41
