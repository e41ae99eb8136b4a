// Speculative decoding with the DSpark draft head (spec engram_dspark_vision.md §B.7-§B.8).
//
// One cycle, from a committed sequence of n positions and the pending token x_n (sampled, not
// yet consumed):
//  1. draft d1..dγ after x_n (model/dspark.h), optionally cut where the cumulative confidence
//     sigmoid(c_1)·…·sigmoid(c_k) falls below a threshold;
//  2. verify: one target forward over [x_n, d1..dγ] at positions n..n+γ with a state journal
//     attached, logits of every row and the drafter's main_hidden of every row;
//  3. accept: greedy — d_k while it equals the target's argmax of row k-1, bonus = argmax of the
//     first row not matched; sampling — d_k with probability min(1, p_k(d_k) / q_k(d_k)), on the
//     first rejection a token from normalise(max(p - q, 0)), after a full acceptance a bonus
//     from p_γ (lossless: every emitted token is distributed as under plain sampling); p and q are
//     the Sampler's distributions, penalties included (they see the sequence, pending token and
//     the chain's earlier drafts, as plain sampling would);
//     an EOS among the emitted tokens ends the run there;
//  4. commit: roll the target state back to the kept positions (Model::rollback), write the
//     draft rings for exactly those positions from the verify's main_hidden.
// The verify forward computes every row exactly as single-token decode does, and the rollback
// leaves exactly the state plain decoding of the kept tokens leaves: with greedy verification the
// emitted tokens are plain greedy decoding's, bit for bit, whatever the drafts.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace ds41 {

class ThreadPool;

struct SpeculativeOptions {
  int draft_tokens = 0;               // drafts per cycle, 1..dspark_block_size (0 = the block size)
  double confidence_threshold = 0.0;  // cut the draft below this cumulative confidence (0 = never)
  SamplerOptions sampling;            // temperature 0: greedy verification
  ForwardOptions forward;             // index-key reading (main_hidden_out / all_logits are set here);
                                      // head_top_k as Generation reads it (head_top_k_for in sampler.h)
  // Test hook: may rewrite the drafts of a cycle (same count) before verification; `pos` is the
  // position of the first draft.
  std::function<void(int64_t pos, std::vector<int32_t>& drafts)> override_drafts;
};

struct SpeculativeStats {
  int64_t cycles = 0;
  int64_t drafted = 0;   // drafts verified
  int64_t accepted = 0;  // drafts accepted
  int64_t emitted = 0;   // tokens emitted by cycles (accepted drafts + bonus tokens)
  double draft_s = 0, verify_s = 0, commit_s = 0;  // wall time per phase
  double acceptance_rate() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  double mean_accepted() const { return cycles ? double(accepted) / double(cycles) : 0.0; }
  double tokens_per_cycle() const { return cycles ? double(emitted) / double(cycles) : 0.0; }
};

// Counter-based uniform in [0, 1): the same (seed, key, slot, purpose) always gives the same
// value, so a seeded speculative run is reproducible. The decoder keys a cycle by the position of
// its first draft (plain sampling keys a draw by its position too).
double speculative_uniform(uint64_t seed, uint64_t key, uint64_t slot, uint64_t purpose);
// Index drawn from unnormalised non-negative weights w by inverse CDF with u in [0, 1).
int32_t draw_from_weights(const std::vector<float>& w, double u);

// Rejection sampling of one cycle (step 3, sampling): q[k] is the distribution draft k was drawn
// from, p[k] the target's at the same position (k = 0..γ; p has one more row, for the bonus).
// Rows are normalised here. `key` keys the cycle's uniforms (speculative_uniform). Returns the
// accepted draft count j and the token that follows them (the residual draw at the first
// rejection, or the bonus).
struct SampledAcceptance {
  int accepted = 0;
  int32_t next = 0;
};
SampledAcceptance accept_sampled(const std::vector<int32_t>& drafts, const std::vector<std::vector<float>>& q,
                                 const std::vector<std::vector<float>>& p, uint64_t seed, uint64_t key);
// The same over views, with the residual built in `residual` (a speculative loop's buffer).
SampledAcceptance accept_sampled(std::span<const int32_t> drafts, std::span<const std::vector<float>> q,
                                 std::span<const std::vector<float>> p, uint64_t seed, uint64_t key,
                                 std::vector<float>& residual);

class SpeculativeDecoder {
 public:
  // `state` must be a fresh sequence or one whose draft rings are in step (dspark_pos == pos);
  // a sequence restored without them may start its rings at the current position
  // (state.dspark_start = state.dspark_pos = state.pos), which only lowers acceptance.
  SpeculativeDecoder(const Model& model, SequenceState& state, const SpeculativeOptions& opt, ThreadPool* pool);

  // Consumes `tokens` (in calls of at most `chunk` tokens, 0 = one call), seeding the draft
  // rings; returns the logits of the last position (what the first token is sampled from).
  // `inputs` (optional): the token types and image-span rows of `tokens` (Model::forward).
  std::vector<float> prefill(const std::vector<int32_t>& tokens, int64_t chunk = 0, const InputEmbeddings* inputs = nullptr);
  // One cycle after the pending token (already emitted by the caller, not yet consumed).
  // Emits at most `max_new` (>= 1) tokens and returns them; the last one is the new pending
  // token. Stops after an EOS. Empty when no position is left for a token (max_seq_len). `logits_out`
  // (optional) receives the target's logits each emitted token was chosen from, [n][vocab]:
  // the rows plain decoding would have computed.
  std::vector<int32_t> step(int32_t pending, int64_t max_new, std::vector<float>* logits_out = nullptr);
  // The same into `out`. With the sequence reserved for its length (reserve_sequence) and `out`
  // and `logits_out` kept by the caller, a cycle allocates nothing once the first cycles have
  // sized the buffers (issue #10).
  void step_into(std::vector<int32_t>& out, int32_t pending, int64_t max_new, std::vector<float>* logits_out = nullptr);

  const SpeculativeStats& stats() const { return stats_; }

 private:
  const Model& model_;
  SequenceState& st_;
  SpeculativeOptions opt_;
  ThreadPool* pool_;
  Sampler sampler_;
  SpeculativeStats stats_;
  int draft_tokens_ = 0;
  // A cycle's buffers, kept from cycle to cycle.
  SamplerScratch sampler_scratch_;
  std::vector<int32_t> history_;             // penalties: the sequence, pending, the chain's drafts
  DSparkDraft draft_;
  std::vector<int32_t> drafts_;              // the drafts verified (cut or overridden)
  std::vector<std::vector<float>> q_, p_;    // sampling: draft and target distributions (first rows used)
  std::vector<float> residual_;
  std::vector<int32_t> verify_tokens_;
  std::vector<uint16_t> main_hidden_;
  std::vector<float> logits_;
  StateJournal journal_;
};

}  // namespace ds41
