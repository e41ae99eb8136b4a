// One request's decoding behind one interface, plain or speculative: the serving engine feeds the
// prompt in chunks, then takes the answer a token at a time (a DSpark cycle's tokens are handed
// out one per call, so they stream one per scheduling round), and may force ids (tool_choice).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/model.h"
#include "model/sequence_state.h"
#include "runtime/generation.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"

namespace ds41 {

class ThreadPool;

class RequestDecoder {
 public:
  // Plain decoding, or DSpark draft + verify cycles when `speculative` is given (the caller gives
  // it only to requests with nothing to force).
  // `full_logits`: every step computes all logits (no greedy head screen), for logprobs.
  static std::unique_ptr<RequestDecoder> make(const Model& model, SequenceState start, const SamplerOptions& sampling,
                                              ThreadPool* pool, const SpeculativeOptions* speculative,
                                              bool full_logits = false,
                                              std::function<void(float*, int64_t)> logit_filter = {});
  virtual ~RequestDecoder() = default;

  virtual void feed(const std::vector<int32_t>& ids, const InputEmbeddings* inputs) = 0;
  // The next token; `budget` (the tokens the request may still produce) bounds a speculative
  // cycle. nullopt: the context is full.
  virtual std::optional<int32_t> next_token(int64_t budget) = 0;
  // Emits `id` as the next token (plain decoding only; throws otherwise).
  virtual std::optional<int32_t> force_token(int32_t id) = 0;
  virtual const SequenceState& state() const = 0;
  // The Generation whose pending decode step may go through the pass shared by several requests
  // (Generation::commit_pending_together), or nullptr (nothing pending, context full, speculative).
  virtual Generation* batchable() = 0;
  virtual SpeculativeStats speculative_stats() const { return {}; }
  // Plain decoding, right after the prompt: a decoder of the same sequence and next-token logits
  // with other sampling options (choices of one request); speculative decoding throws.
  virtual std::unique_ptr<RequestDecoder> fork(const SamplerOptions& sampling,
                                               std::function<void(float*, int64_t)> logit_filter) const = 0;
  // Plain decoding: the logits the last next_token() / force_token() chose from (null otherwise).
  virtual const std::vector<float>* step_logits() const { return nullptr; }
};

}  // namespace ds41
