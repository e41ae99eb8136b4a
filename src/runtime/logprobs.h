// Log-probabilities of generated tokens for the APIs' `logprobs` / `top_logprobs`: the model's
// own distribution (log-softmax of the raw logits: before temperature, penalties and the
// samplers' filters, as vLLM reports by default), exact over the whole vocabulary. Ids a model
// may not produce (-inf logits) get -inf and are never among the alternatives.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ds41 {

// The most a request may ask for (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the `top_n` likeliest ids, likeliest first (ties: lower id first)
};

// log_softmax(logits)[token] and the top_n (0..kMaxTopLogprobs) likeliest entries. The sum runs in
// double over every finite logit, so the value does not depend on how the vocabulary is cut.
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t token, int top_n);

}  // namespace ds41
