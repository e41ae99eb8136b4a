// One sequence's generation loop over Model::forward: prefill (whole or chunked), then sample and
// feed one token at a time until a stop token, the token budget, the context limit, or a
// cancellation. Shared by `ds41 run`, `ds41 chat` and the server so that they stop, count and time
// tokens the same way.
//
// A sampled token is *pending* until it is fed: the loop does not run a forward pass for the last
// token it returns (nobody needs its logits), but `feed()` puts it in the sequence first, so a
// conversation that continues after an answer sees every token the model produced, EOS included.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace ds41 {

class ThreadPool;

enum class FinishReason { Stop, Length, ContextFull, Cancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "context_full", "cancelled"

struct GenerationLimits {
  int64_t max_tokens = 256;            // tokens to generate (>= 0)
  std::vector<int32_t> stop_ids;       // any of these ends the answer (it is returned, then counted)
  const std::atomic<bool>* cancel = nullptr;  // checked between forward calls
};

struct GenerationStats {
  int64_t prompt_tokens = 0;     // fed by the last feed() (pending token included)
  int64_t generated_tokens = 0;
  double prefill_s = 0;          // the last feed()
  double time_to_first_token_s = 0;  // feed() start → first token sampled
  double decode_s = 0;           // first token sampled → last token sampled
  FinishReason finish = FinishReason::Stop;
  double prefill_tokens_per_s() const { return prefill_s > 0 ? double(prompt_tokens) / prefill_s : 0; }
  double decode_tokens_per_s() const {
    return decode_s > 0 && generated_tokens > 1 ? double(generated_tokens - 1) / decode_s : 0;
  }
};

class Generation {
 public:
  // `state` may already hold a sequence (a loaded session); `pool` may be null (inline).
  // forward.head_top_k: with a greedy sampler without penalties, 0 (the default) becomes 1 and
  // k > 0 stays (last_logits() then holds the exact k largest logits, -inf elsewhere:
  // model/head_screen.h); a top-k sampler without penalties keeps a k at least its own (the same
  // draws), else gets every logit, as does a negative k. Penalties always get all
  // (head_top_k_for in sampler.h).
  Generation(const Model& model, SequenceState state, const Sampler& sampler, ThreadPool* pool,
             ForwardOptions forward = {});

  // Feeds the pending token (if any) and `ids`, in calls of at most `chunk` tokens (0 = one
  // call). Throws ds41::Error, before running anything, if the sequence would pass max_seq_len.
  // `on_progress(done, total)` is called after each layer of each chunk, in token-layers (a layer
  // of a chunk counts its tokens). `inputs` (optional) are the token types and image-span rows of `ids` (Model::forward's InputEmbeddings), cut along with the chunks.
  void feed(const std::vector<int32_t>& ids, int64_t chunk = 0,
            const std::function<void(int64_t, int64_t)>& on_progress = {}, const InputEmbeddings* inputs = nullptr);

  // Samples up to limits.max_tokens tokens; `on_token(id)` sees each one as it is sampled and may
  // return false to stop (finish = Stop). Needs logits: call feed() first. The sampling step of a
  // token is its position in the sequence, so a seed gives the same tokens however the sequence
  // was fed (chunks, sessions). Penalties see the sequence's tokens (prompt and generated).
  GenerationStats generate(const GenerationLimits& limits, const std::function<bool(int32_t)>& on_token = {});

  // One step of generate(): feeds the pending token, samples the next (it becomes pending).
  // nullopt when the context is full.
  std::optional<int32_t> next_token();
  // Called on the logits (in place, [vocab]) before each next_token() samples: what structured
  // output uses to forbid tokens (-inf). Empty: none.
  void set_logit_filter(std::function<void(float* logits, int64_t vocab)> filter) { filter_ = std::move(filter); }
  // Same step with `token` chosen by the caller instead of sampled (forced continuations such as
  // an enforced tool call). The draws of later steps do not change: they are keyed by position.
  std::optional<int32_t> force_token(int32_t token);

  // Starts from next-token logits computed elsewhere for the sequence as it stands (a compact
  // session's replay: load_session's replay_logits) instead of feeding tokens; generate() then
  // samples from them. `logits` must be [vocab] fp32 of the state's last position.
  void resume(std::vector<float> logits);

  // Puts the pending token into the sequence (e.g. before saving a session).
  void commit_pending();
  // Batched decoding (the server): puts the pending tokens of `gens` (one model, one pool, the
  // same numerics options) into their sequences with one Model::forward_batch; each generation's
  // next next_token() then only samples. Same logits and states as committing one by one.
  static void commit_pending_together(const std::vector<Generation*>& gens);

  const SequenceState& state() const { return state_; }
  SequenceState& state() { return state_; }
  std::optional<int32_t> pending() const { return pending_; }
  // Positions the sequence has consumed plus the pending token.
  int64_t length() const { return state_.pos + (pending_ ? 1 : 0); }
  const std::vector<float>& last_logits() const { return logits_; }
  // Prompt tokens and prefill time of the last feed().
  const GenerationStats& last_feed_stats() const { return last_feed_; }

 private:
  const Model& model_;
  SequenceState state_;
  Sampler sampler_;
  SamplerScratch sampler_scratch_;  // reused by every step: sampling allocates nothing once warm
  ThreadPool* pool_;
  ForwardOptions forward_;
  std::vector<float> logits_;
  std::vector<int32_t> step_token_ = std::vector<int32_t>(1);
  std::optional<int32_t> pending_;
  std::function<void(float*, int64_t)> filter_;
  GenerationStats last_feed_;
  double feed_start_ = 0;
};

}  // namespace ds41
