// The serving engine: one thread that owns the model and runs every active request a step at a
// time — a prefill chunk or one decoded token — so new requests join between steps and a long
// prompt never stalls the others for more than one chunk (continuous batching, token level).
// Requests are token ids in, token ids out; text, prompts and parsing live in the HTTP layer.
//
// Outputs do not depend on what else is running: every request has its own sequence state and
// sampler (draws keyed by seed and position), and the forward pass is row-independent.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/generation.h"
#include "runtime/logprobs.h"
#include "runtime/sampler.h"
#include "runtime/prefix_cache.h"
#include "text/json_constraint.h"
#include "vision/image_decode.h"

namespace ds41 {

class ThreadPool;

struct EngineOptions {
  int max_batch = 8;                   // requests decoded concurrently; more wait in a queue
  int64_t prefill_chunk = 256;         // prompt tokens per step of one request
  int64_t prefix_cache_bytes = int64_t(1) << 30;
  std::string prefix_cache_dir;        // spill evicted prefixes here (empty = memory only)
  int64_t prefix_cache_disk_bytes = int64_t(8) << 30;
  int64_t max_context = 0;             // prompt + answer tokens per request (0 = the model's max_seq_len)
  // DSpark speculative decoding for every request (except those with a forced continuation):
  // each decode step of such a request runs a draft + verify cycle and its tokens are streamed one
  // per round. Greedy answers equal plain decoding's; sampled ones follow the same law.
  bool dspark = false;
  int draft_tokens = 0;                // drafts per cycle (0 = the model's block size)
  double dspark_confidence = 0.0;      // cut a draft below this cumulative confidence
};

struct EngineRequest {
  std::vector<int32_t> prompt;
  SamplerOptions sampling;
  int64_t max_tokens = 256;
  std::vector<int32_t> stop_ids;
  // Prompt length at which the state is saved in the prefix cache (0 = no save): the caller
  // picks a boundary a follow-up request will share (e.g. before the last assistant header).
  int64_t cache_prefix_at = 0;
  // Decoded images, one per image placeholder id of `prompt`, in order. The engine runs the vision
  // tower when the request starts and feeds the expanded prompt (image spans); such a prompt is
  // never stored in the prefix cache (its ids do not identify the images).
  std::vector<RgbImage> images;
  // A forced continuation (tool_choice "required" or a named function): once the generated ids end
  // with `force_trigger` (empty: right away), the ids of `forced` are emitted as if sampled, once.
  std::vector<int32_t> force_trigger, forced;
  // When the request arrived (the HTTP layer: its head was read); time to first token counts from
  // here, queueing included. Unset: the moment submit() is called.
  std::chrono::steady_clock::time_point arrived{};
  std::string label;  // names the request in the server's log (its response id)
  // -1: no log-probabilities. 0..kMaxTopLogprobs: each token event carries the token's
  // log-probability and this many likeliest alternatives (runtime/logprobs.h); such a request
  // decodes plainly (no DSpark) and its steps compute every logit (no greedy head screen).
  int logprobs = -1;
  // The prompt's log-probabilities too (completions' echo): one Prompt event before the first
  // token, from one extra forward pass over the prompt.
  bool prompt_logprobs = false;
  // Structured output and constrained tool-call arguments (text/token_constraint.h): every token
  // after `constraint_trigger` (empty: from the first) is chosen among those the constraint
  // allows; the request decodes plainly with every logit computed.
  std::shared_ptr<TokenConstraint> constraint;
  std::vector<int32_t> constraint_trigger;
  // Choices (1..kMaxChoices): the prompt is prefilled once, then the sequence is forked into `n`
  // that decode side by side, choice i sampling with seed + i. Events carry the choice's index;
  // each choice ends with its own Done. Such a request decodes plainly (no DSpark).
  int n = 1;
};

inline constexpr int kMaxChoices = 8;

struct EngineEvent {
  enum class Kind { Token, Done, Error, Prompt } kind = Kind::Token;
  int32_t token = -1;
  FinishReason finish = FinishReason::Stop;
  std::string error;
  int index = 0;                      // the choice (EngineRequest::n)
  TokenLogprob logprob;               // Token, when the request asked for logprobs
  std::vector<TokenLogprob> prompt;   // Prompt: positions 1 .. P-1 of the prompt (position 0 has none)
};

// The request's side of the conversation with the engine; shared by the HTTP handler and the
// engine thread.
class RequestHandle {
 public:
  // Blocks until an event arrives (or `timeout_ms` passes: returns false; 0 polls).
  bool next(EngineEvent& ev, int timeout_ms);
  // `wake` is called (on the engine's thread, without locks held: it must not block) after each
  // event is queued, and once right away so that events queued before it was set are not missed.
  // An asynchronous reader calls next(ev, 0) from it. Empty: no calls. When it returns, no call
  // of the listener it replaced is under way (the caller may then destroy what that one used).
  void set_listener(std::function<void()> wake);
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // One choice of several (a stop sequence matched in it): the others go on.
  void cancel_choice(int index) {
    if (index >= 0 && index < kMaxChoices) choice_cancelled_[index] = true;
  }
  bool cancelled(int index) const {
    return cancelled_ || (index >= 0 && index < kMaxChoices && choice_cancelled_[index].load());
  }

  // Filled by the engine before the first token event.
  std::atomic<int64_t> prompt_tokens{0};
  std::atomic<int64_t> cached_tokens{0};  // prompt tokens served from the prefix cache
  std::atomic<double> queued_s{0}, ttft_s{0};

 private:
  friend class Engine;
  void push(EngineEvent ev);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineEvent> events_;
  std::function<void()> listener_;
  int waking_ = 0;  // calls of listener_ under way
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> choice_cancelled_[kMaxChoices]{};
};

struct EngineMetrics {
  std::atomic<int64_t> requests{0}, requests_finished{0}, requests_cancelled{0}, requests_failed{0};
  std::atomic<int64_t> prompt_tokens{0}, generated_tokens{0}, cached_prompt_tokens{0};
  std::atomic<int64_t> prefix_hits{0}, prefix_lookups{0}, prefix_disk_hits{0};
  std::atomic<int64_t> images{0};
  std::atomic<double> vision_s{0};  // vision tower time, all requests
  std::atomic<int> active{0}, waiting{0};
  // Histograms (cumulative Prometheus buckets) of time to first token and time per output token.
  static constexpr int kBuckets = 12;
  static constexpr double kBounds[kBuckets] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  std::atomic<int64_t> ttft_counts[kBuckets + 1]{}, tpot_counts[kBuckets + 1]{};
  std::atomic<double> ttft_sum{0}, tpot_sum{0};
  std::atomic<int64_t> ttft_n{0}, tpot_n{0};
  std::atomic<int64_t> steps{0}, step_rows{0};  // engine steps and requests served per step
  std::atomic<int64_t> batched_steps{0}, batched_rows{0};  // decode passes shared by several requests
  std::atomic<int64_t> dspark_cycles{0}, dspark_drafted{0}, dspark_accepted{0};
  std::atomic<int64_t> constraint_masks{0};     // structured-output token masks computed
  std::atomic<double> constraint_seconds{0};    // and the time they took
  void observe_ttft(double s);
  void observe_tpot(double s);
};

class Engine {
 public:
  Engine(const Model& model, ThreadPool* pool, EngineOptions opt);
  ~Engine();  // stops the thread; unfinished requests get an error event
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (token range, context length with the images' spans, image placeholders, sampling
  // options) and queues the request; throws ds41::Error for a request that cannot run.
  std::shared_ptr<RequestHandle> submit(EngineRequest req);

  const EngineMetrics& metrics() const { return metrics_; }
  const Model& model() const { return model_; }
  const EngineOptions& options() const { return opt_; }

 private:
  struct Slot;
  void run();
  bool step(Slot& s);  // false when the slot is finished
  void log_prefill(Slot& s, size_t prompt_tokens);
  // The decoding of choices 1..n-1 of a request whose prompt `s` has just prefilled.
  void fork_choices(Slot& s);
  std::function<void(float*, int64_t)> logit_filter(Slot* s);
  std::vector<std::unique_ptr<Slot>> forks_;  // made in step(), joined to the active slots by run()
  EngineEvent prompt_logprobs(const Slot& s) const;

  const Model& model_;
  ThreadPool* pool_;
  EngineOptions opt_;
  EngineMetrics metrics_;
  PrefixCache prefix_cache_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<EngineRequest, std::shared_ptr<RequestHandle>>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ds41
