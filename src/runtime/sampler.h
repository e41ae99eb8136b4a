// Token sampling: penalties, temperature, top-k, top-p, min-p, and a seeded draw.
//
// The pipeline, in this order (the order vLLM and the OpenAI API document):
//   1. penalties on the raw logits, from the counts of tokens in the recent history:
//      repetition (CTRL / HF rule: a seen token's logit is divided by r when positive, multiplied
//      by r when negative), presence (minus p once for a seen token), frequency (minus f × count);
//   2. temperature 0 → greedy argmax of the penalised logits (ties: lowest id);
//   3. otherwise top-k (k > 0 and below the vocabulary) keeps the k largest logits (ties broken
//      by lower id), and probs = softmax(logits / T) over the tokens kept (all of them without
//      top-k; zero for the others): exp(l * (1/T) - max) with SLEEF's expf (the exp of PyTorch's
//      vectorized CPU kernels), summed in double in a fixed lane order over the kept tokens in
//      order of id (kernels/softmax_exp.h), each exp times the sum's reciprocal (in double).
//      Only the k largest logits matter (logits outside them may be -inf: the head screen's
//      top-k logits give the same distribution);
//   4. top-p keeps the smallest prefix of the tokens sorted by probability (ties: lower id) whose
//      mass reaches p, min-p the tokens with prob >= min_p × the largest; when they drop a token,
//      the survivors are renormalised the same way (times the reciprocal of their lane sum);
//   5. the draw is the reference's Gumbel-max form (spec backbone.md §10): argmax(probs / E) with
//      E ~ Exponential(1) i.i.d. per token, equivalent to a multinomial draw, from our own
//      counter-based generator keyed by (seed, step), so a draw never depends on how many draws
//      came before (speculative decoding and batching change that count); kernels/gumbel_draw.h.
// `distribution()` exposes the exact distribution step 5 draws from, which lossless rejection
// sampling (speculative decoding) needs for both the draft and the target.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ds41 {

struct SamplerOptions {
  double temperature = 0.0;        // 0 = greedy
  int64_t top_k = 0;               // 0 = off
  double top_p = 1.0;              // 1 = off
  double min_p = 0.0;              // 0 = off
  double repetition_penalty = 1.0; // 1 = off; > 0
  double presence_penalty = 0.0;   // OpenAI range [-2, 2]
  double frequency_penalty = 0.0;  // OpenAI range [-2, 2]
  int64_t penalty_last_n = 0;      // how many recent tokens the penalties see; 0 = the whole history
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0; }
  bool has_penalties() const {
    return repetition_penalty != 1.0 || presence_penalty != 0.0 || frequency_penalty != 0.0;
  }
};

// The ForwardOptions::head_top_k a decode loop can ask for when it samples with `o`. Without
// penalties only the largest logits matter to greedy decoding and to top-k sampling, and the head
// screen (model/head_screen.h) gives those exactly: greedy gets `requested` if it is > 0, else 1;
// top-k sampling gets `requested` if it is at least k (a caller's choice, not the default: where
// the logits are flat the screen cannot narrow k tokens and falls back to the full product after
// its own pass - on the random-weight small preset top-40 decided 1 step in 21, and steps took
// 46.6 ms against 37.5 with k = 1). Anything else gets every logit (0), as does a negative
// `requested`.
inline int head_top_k_for(const SamplerOptions& o, int requested) {
  if (o.has_penalties() || requested < 0) return 0;
  if (o.greedy()) return std::max(requested, 1);
  return o.top_k > 0 && requested >= o.top_k ? requested : 0;
}

// Every problem with the options, as one message per problem (empty = valid).
std::vector<std::string> sampler_option_problems(const SamplerOptions& o);

// Buffers the sampler works in. A decode loop keeps one per sequence and passes it to every call,
// so that once they have grown to the vocabulary no call allocates (issue #10: no heap allocation
// in steady-state decode, sampling included). Not shared between threads.
struct SamplerScratch {
  std::vector<float> logits;    // the penalised copy of the logits
  std::vector<float> probs;     // sample()'s distribution
  std::vector<int32_t> order;   // token ids by descending probability (top-k / top-p)
  std::vector<float> kept;      // the probabilities of the tokens top-p keeps
  std::vector<float> top_logits, top_exp;  // top-k: the k tokens' logits and exponentials
  std::vector<int32_t> histogram;  // top-k / top-p selections: counts per value bucket
  std::vector<int32_t> counts;  // occurrences per token id in the penalty window (zero between calls)
  std::vector<int32_t> seen;    // the ids counted in this call
};

class Sampler {
 public:
  // Throws ds41::Error naming every invalid option.
  explicit Sampler(const SamplerOptions& o);

  const SamplerOptions& options() const { return opt_; }

  // One token for `step` from logits [vocab]. `history` = the sequence so far (prompt and
  // generated ids) for the penalties; may be empty.
  int32_t sample(const float* logits, int64_t vocab, uint64_t step, std::span<const int32_t> history = {}) const;
  int32_t sample(const float* logits, int64_t vocab, uint64_t step, std::span<const int32_t> history,
                 SamplerScratch& scratch) const;

  // The distribution `sample` draws from (sums to 1; zeros outside the kept set). Greedy gives a
  // one-hot vector at the argmax.
  std::vector<float> distribution(const float* logits, int64_t vocab, std::span<const int32_t> history = {}) const;
  // The same into `p` (resized to vocab), working in `scratch`.
  void distribution_into(std::vector<float>& p, const float* logits, int64_t vocab, std::span<const int32_t> history,
                         SamplerScratch& scratch) const;

  // The same distribution under the name speculative decoding uses (runtime/speculative.cpp): the
  // target's rows must be exactly this for rejection sampling to stay lossless.
  std::vector<float> probabilities(const float* logits, int64_t vocab, std::span<const int32_t> history = {}) const {
    return distribution(logits, vocab, history);
  }

  // A draw from any distribution `probs` (e.g. the normalised residual of rejection sampling) with
  // this sampler's generator; `stream` separates independent draws that share a step.
  int32_t draw(const std::vector<float>& probs, uint64_t step, uint64_t stream = 0) const;

  // A uniform number in [0, 1) for (step, stream), e.g. the acceptance test min(1, p/q) > u.
  double uniform(uint64_t step, uint64_t stream) const;

  // The penalised logits (a copy; unchanged when no penalty is set).
  std::vector<float> penalised_logits(const float* logits, int64_t vocab, std::span<const int32_t> history) const;

 private:
  // The logits the pipeline continues with: `logits` itself when no penalty applies, else the
  // penalised copy in scratch.logits.
  const float* penalised(const float* logits, int64_t vocab, std::span<const int32_t> history,
                         SamplerScratch& scratch) const;

  SamplerOptions opt_;
};

int32_t argmax_token(const float* logits, int64_t vocab);

}  // namespace ds41
