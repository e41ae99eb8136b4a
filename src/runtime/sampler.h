// Token sampling. Temperature 0 is greedy argmax (ties: lowest id). Otherwise the reference's
// rule (spec backbone.md §10): probs = softmax(logits / T) in fp32, token = argmax(probs / E) with
// E ~ Exponential(1) i.i.d. (the Gumbel-max trick, equivalent to multinomial sampling), drawn
// from our own counter-based generator so that the same seed gives the same tokens everywhere.
// top_p < 1 restricts the draw to the smallest set of tokens whose probability reaches top_p
// (an engine option; the model card recommends T = 1.0, top_p 0.95).
#pragma once

#include <cstdint>
#include <vector>

namespace ds41 {

struct SamplerOptions {
  double temperature = 0.0;
  double top_p = 1.0;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o) : opt_(o) {}
  // `step` makes each draw depend only on (seed, step), not on how many draws came before.
  int32_t sample(const float* logits, int64_t vocab, uint64_t step) const;
  // The weights `sample` draws from (temperature > 0): softmax(logits / T), then zero outside
  // top_p (not renormalised: the draw does not need it). Speculative decoding stays lossless
  // only with exactly this distribution (normalised).
  std::vector<float> probabilities(const float* logits, int64_t vocab) const;
  const SamplerOptions& options() const { return opt_; }

 private:
  SamplerOptions opt_;
};

int32_t argmax_token(const float* logits, int64_t vocab);

}  // namespace ds41
