#include "runtime/engine.h"

#include <chrono>
#include <cstdio>
#include <optional>

#include "base/error.h"
#include "runtime/request_decoder.h"
#include "vision/image_grid.h"
#include "vision/image_prompt.h"

namespace ds41 {

namespace {
double seconds_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}
double now_s() { return seconds_of(std::chrono::steady_clock::now()); }

void observe(std::atomic<int64_t>* counts, std::atomic<double>& sum, std::atomic<int64_t>& n, double v) {
  for (int i = 0; i < EngineMetrics::kBuckets; ++i)
    if (v <= EngineMetrics::kBounds[i]) ++counts[i];
  ++counts[EngineMetrics::kBuckets];  // +Inf
  sum.fetch_add(v);
  ++n;
}
}  // namespace

void EngineMetrics::observe_ttft(double s) { observe(ttft_counts, ttft_sum, ttft_n, s); }
void EngineMetrics::observe_tpot(double s) { observe(tpot_counts, tpot_sum, tpot_n, s); }

bool RequestHandle::next(EngineEvent& ev, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); })) return false;
  ev = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestHandle::push(EngineEvent ev) {
  std::function<void()> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(ev));
    wake = listener_;
    if (wake) ++waking_;
  }
  cv_.notify_all();
  if (!wake) return;
  wake();
  {
    std::lock_guard<std::mutex> lock(mu_);
    --waking_;
  }
  cv_.notify_all();
}

void RequestHandle::set_listener(std::function<void()> wake) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    listener_ = wake;
    // A call of the previous listener may be under way: once this returns, none is.
    cv_.wait(lock, [&] { return waking_ == 0; });
  }
  if (wake) wake();
}

struct Engine::Slot {
  EngineRequest req;
  std::shared_ptr<RequestHandle> handle;
  bool started = false;
  std::unique_ptr<RequestDecoder> decoder;  // plain or speculative; made at admission
  InputEmbeddings inputs;  // token types and span rows of an image prompt (empty: text only)
  size_t fed = 0;  // prompt tokens fed so far (cached prefix included)
  size_t forced_at = 0;    // ids of req.forced emitted so far
  bool forcing = false;    // the trigger was seen: emitting req.forced
  std::vector<int32_t> tail;  // the last generated ids, as many as the trigger has
  int index = 0;               // the choice this slot decodes (EngineRequest::n)
  bool forked = false;         // choices 1..n-1 made (after the prompt)
  bool constraining = false;   // structured output applies (its trigger was seen)
  std::vector<int32_t> constraint_tail;  // the last generated ids, as many as the constraint's trigger has
  int64_t generated = 0;
  double arrived_at = 0, last_token_at = 0;
  double prefill_started_at = 0;  // when the first prefill chunk started (the log of long prefills)
  int logged_quarter = -1;

  // The generation whose decode step joins this round's shared pass, or nullptr: prefilled, a
  // token pending, answer and context not used up, not cancelled, plain decoding.
  Generation* joins_batched_step() const {
    if (!decoder || fed != req.prompt.size() || generated >= req.max_tokens || handle->cancelled(index) ||
        (req.n > 1 && !forked))
      return nullptr;
    return decoder->batchable();
  }
};

Engine::Engine(const Model& model, ThreadPool* pool, EngineOptions opt)
    : model_(model), pool_(pool), opt_(opt), prefix_cache_(opt.prefix_cache_bytes) {
  if (opt_.max_batch < 1) throw Error("max batch must be >= 1");
  if (opt_.prefill_chunk < 1) throw Error("prefill chunk must be >= 1");
  if (opt_.max_context <= 0 || opt_.max_context > model.config().max_seq_len) opt_.max_context = model.config().max_seq_len;
  if (opt_.dspark && !model.has_dspark()) throw Error("--dspark: this checkpoint has no DSpark drafter (mtp.* tensors)");
  if (opt_.draft_tokens < 0 || opt_.draft_tokens > model.config().dspark_block_size)
    throw Error("--draft-tokens must be in 0.." + std::to_string(model.config().dspark_block_size));
  if (!(opt_.dspark_confidence >= 0.0 && opt_.dspark_confidence <= 1.0)) throw Error("--dspark-confidence must be in [0, 1]");
  if (!opt_.prefix_cache_dir.empty()) prefix_cache_.enable_disk(model, opt_.prefix_cache_dir, opt_.prefix_cache_disk_bytes);
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  try {
    prefix_cache_.flush_to_disk();  // the engine thread has stopped: nothing else touches the cache
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ds41: prefix cache: not written at shutdown: %s\n", e.what());
  }
}

std::shared_ptr<RequestHandle> Engine::submit(EngineRequest req) {
  const ModelConfig& c = model_.config();
  if (req.prompt.empty()) throw Error("the prompt is empty");
  for (int32_t id : req.prompt)
    if (id < 0 || id >= c.vocab_size) throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary");
  // With images the prompt grows by each image's span (the placeholder becomes the whole span).
  int64_t prompt_len = int64_t(req.prompt.size());
  if (!req.images.empty()) {
    if (!c.vision_enabled()) throw Error("this model has no vision encoder: images are not accepted");
    int64_t placeholders = 0;
    for (int32_t id : req.prompt) placeholders += id == c.image_token_id;
    if (placeholders != int64_t(req.images.size()))
      throw Error("the prompt has " + std::to_string(placeholders) + " image placeholder tokens for " +
                  std::to_string(req.images.size()) + " images");
    for (const RgbImage& im : req.images) prompt_len += plan_image_grid(im.width, im.height, c).span_length() - 1;
  }
  if (prompt_len >= opt_.max_context)
    throw Error("the prompt is " + std::to_string(prompt_len) + " tokens" + (req.images.empty() ? "" : " with its images") +
                "; the context is " + std::to_string(opt_.max_context) + " tokens");
  if (req.max_tokens < 0) throw Error("max_tokens must be >= 0");
  req.max_tokens = std::min(req.max_tokens, opt_.max_context - prompt_len);
  for (int32_t id : req.forced)
    if (id < 0 || id >= c.vocab_size) throw Error("forced token id " + std::to_string(id) + " is outside the vocabulary");
  if (req.logprobs < -1 || req.logprobs > kMaxTopLogprobs)
    throw Error("logprobs: at most " + std::to_string(kMaxTopLogprobs) + " alternatives per token");
  if (req.prompt_logprobs && !req.images.empty()) throw Error("prompt log-probabilities are not available with images");
  if (req.n < 1 || req.n > kMaxChoices) throw Error("n: 1 to " + std::to_string(kMaxChoices) + " choices");
  if (req.n > 1 && !req.forced.empty()) throw Error("n > 1 with a forced tool call is not supported");
  Sampler check(req.sampling);  // throws on invalid options
  (void)check;
  if (req.arrived == std::chrono::steady_clock::time_point{}) req.arrived = std::chrono::steady_clock::now();
  auto h = std::make_shared<RequestHandle>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(req), h);
    ++metrics_.requests;
    metrics_.waiting = int(queue_.size());
  }
  cv_.notify_all();
  return h;
}

void Engine::run() {
  std::vector<std::unique_ptr<Slot>> active;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !active.empty(); });
      if (stop_) break;
      while (int(active.size()) < opt_.max_batch && !queue_.empty()) {
        auto s = std::make_unique<Slot>();
        s->req = std::move(queue_.front().first);
        s->handle = std::move(queue_.front().second);
        queue_.pop_front();
        s->arrived_at = seconds_of(s->req.arrived);
        active.push_back(std::move(s));
      }
      metrics_.waiting = int(queue_.size());
    }
    metrics_.active = int(active.size());
    ++metrics_.steps;
    metrics_.step_rows += int64_t(active.size());
    // Decode steps of every request that will sample this round go through the model together
    // (one pass over the weights for all of them); each step() below then only samples.
    std::vector<Generation*> decoding;
    for (auto& s : active)
      if (Generation* g = s->joins_batched_step()) decoding.push_back(g);
    if (decoding.size() > 1) {
      try {
        Generation::commit_pending_together(decoding);
        metrics_.batched_rows += int64_t(decoding.size());
        ++metrics_.batched_steps;
      } catch (const std::exception&) {
        // Left pending: each request commits its own token in step() and reports its own error.
      }
    }
    for (size_t i = 0; i < active.size();) {
      bool keep = false;
      try {
        keep = step(*active[i]);
      } catch (const std::exception& e) {
        ++metrics_.requests_failed;
        --metrics_.active;
        active[i]->handle->push({EngineEvent::Kind::Error, -1, FinishReason::Stop, e.what()});
      }
      if (keep) ++i;
      else active.erase(active.begin() + long(i));
    }
    for (auto& f : forks_) active.push_back(std::move(f));  // the choices forked this round
    forks_.clear();
    // Again after the step: when the last request finishes, the loop goes to sleep and the gauge
    // must already read 0.
    metrics_.active = int(active.size());
  }
  for (auto& s : active) s->handle->push({EngineEvent::Kind::Error, -1, FinishReason::Stop, "the server is shutting down"});
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& q : queue_) q.second->push({EngineEvent::Kind::Error, -1, FinishReason::Stop, "the server is shutting down"});
}

// A server's log says how a long prefill is going: once it has run for 2 s, a line at each quarter
// of the prompt (and at its end).
// The prompt's own log-probabilities (completions' echo): one forward pass with every
// position's logits over a fresh sequence, beside the request's (whose prefill may come from the
// prefix cache and runs in chunks).
std::function<void(float*, int64_t)> Engine::logit_filter(Slot* sp) {
  if (!sp->req.constraint) return {};
  // Slots do not move (each is held by a unique_ptr).
  return [sp, this](float* logits, int64_t vocab) {
    if (!sp->constraining) return;
    TokenConstraint& c = *sp->req.constraint;
    const double before = c.mask_seconds();
    c.mask(logits, vocab, sp->req.max_tokens - sp->generated);
    ++metrics_.constraint_masks;
    metrics_.constraint_seconds = metrics_.constraint_seconds + (c.mask_seconds() - before);
  };
}

void Engine::fork_choices(Slot& s) {
  s.forked = true;
  for (int i = 1; i < s.req.n; ++i) {
    auto f = std::make_unique<Slot>();
    f->req = s.req;
    f->req.images.clear();
    f->req.cache_prefix_at = 0;
    f->req.prompt_logprobs = false;
    f->req.sampling.seed = s.req.sampling.seed + uint64_t(i);
    // Its own place in the document (the constraint's state is per choice).
    if (s.req.constraint) f->req.constraint = s.req.constraint->clone();
    f->handle = s.handle;
    f->index = i;
    f->forked = true;
    f->started = true;
    f->fed = s.fed;
    f->arrived_at = s.arrived_at;
    f->constraining = s.constraining;
    f->decoder = s.decoder->fork(f->req.sampling, logit_filter(f.get()));
    ++metrics_.active;
    forks_.push_back(std::move(f));
  }
}

EngineEvent Engine::prompt_logprobs(const Slot& s) const {
  EngineEvent ev;
  ev.kind = EngineEvent::Kind::Prompt;
  const std::vector<int32_t>& prompt = s.req.prompt;
  SequenceState st = model_.new_sequence();
  ForwardOptions fo;
  fo.all_logits = true;
  const int64_t V = model_.config().vocab_size;
  // In chunks of 64 positions: every position's logits at once would be 0.5 MB a token.
  constexpr size_t kChunk = 64;
  std::vector<float> logits;
  for (size_t at = 0; at + 1 < prompt.size(); at += kChunk) {
    const size_t end = std::min(prompt.size() - 1, at + kChunk);  // the last token predicts nothing asked for
    model_.forward_into(logits, st, std::vector<int32_t>(prompt.begin() + long(at), prompt.begin() + long(end)), fo, pool_);
    for (size_t i = at; i < end; ++i)
      ev.prompt.push_back(token_logprob(logits.data() + int64_t(i - at) * V, V, prompt[i + 1], std::max(0, s.req.logprobs)));
  }
  return ev;
}

void Engine::log_prefill(Slot& s, size_t prompt_tokens) {
  const double took = now_s() - s.prefill_started_at;
  if (took < 2.0 && s.logged_quarter < 0) return;
  const int quarter = int(4 * s.fed / std::max<size_t>(prompt_tokens, 1));
  if (quarter <= s.logged_quarter) return;
  s.logged_quarter = quarter;
  std::fprintf(stderr, "ds41 serve: %s: prefill %zu/%zu tokens (%d%%, %.1f s)\n", s.req.label.empty() ? "request" : s.req.label.c_str(),
               s.fed, prompt_tokens, int(100 * s.fed / std::max<size_t>(prompt_tokens, 1)), took);
}

bool Engine::step(Slot& s) {
  RequestHandle& h = *s.handle;
  auto finish = [&](FinishReason r) {
    if (s.decoder) {
      const SpeculativeStats st = s.decoder->speculative_stats();
      metrics_.dspark_cycles += st.cycles;
      metrics_.dspark_drafted += st.drafted;
      metrics_.dspark_accepted += st.accepted;
    }
    if (r == FinishReason::Cancelled) ++metrics_.requests_cancelled;
    else ++metrics_.requests_finished;
    --metrics_.active;  // before the client hears it is done (the step loop recounts after)
    EngineEvent done{EngineEvent::Kind::Done, -1, r, {}};
    done.index = s.index;
    h.push(std::move(done));
    return false;
  };
  if (h.cancelled(s.index)) return finish(FinishReason::Cancelled);
  if (!s.started && !s.req.images.empty()) {
    // The vision tower runs here, on the engine's threads, as one step of this request.
    const double t0 = now_s();
    ImagePrompt ip = build_image_prompt(model_, s.req.prompt, s.req.images, pool_);
    s.req.prompt = std::move(ip.tokens);
    s.inputs = std::move(ip.inputs);
    metrics_.images += int64_t(s.req.images.size());
    metrics_.vision_s = metrics_.vision_s + (now_s() - t0);
    s.req.images.clear();
    s.req.cache_prefix_at = 0;  // image spans keep the placeholder id: ids do not identify an image prompt
  }
  const std::vector<int32_t>& prompt = s.req.prompt;
  const bool has_images = !s.inputs.token_types.empty();
  if (!s.started) {
    s.started = true;
    // Admission: start from the longest cached prefix, if any. Cached prompts hold no image spans
    // (never stored) and text never contains the image id, so a match ends before any image.
    std::optional<SequenceState> cached = prefix_cache_.lookup(prompt);
    ++metrics_.prefix_lookups;
    metrics_.prefix_disk_hits = prefix_cache_.disk_hits();
    if (cached && has_images) {
      const int8_t* types = s.inputs.token_types.data();
      for (int64_t i = 0; i < cached->pos; ++i)
        if (types[i] != int8_t(TokenType::Text)) {
          cached.reset();
          break;
        }
    }
    if (cached) {
      ++metrics_.prefix_hits;
      s.fed = size_t(cached->pos);
      metrics_.cached_prompt_tokens += cached->pos;
    }
    h.cached_tokens = int64_t(s.fed);
    h.prompt_tokens = int64_t(prompt.size());
    h.queued_s = now_s() - s.arrived_at;
    metrics_.prompt_tokens += int64_t(prompt.size());
    SequenceState start = cached ? std::move(*cached) : model_.new_sequence();
    std::optional<SpeculativeOptions> spec;
    const bool logprobs = s.req.logprobs >= 0;
    s.constraining = s.req.constraint && s.req.constraint_trigger.empty();
    if (opt_.dspark && s.req.forced.empty() && !logprobs && !s.req.constraint && s.req.n == 1) {
      spec.emplace();
      spec->draft_tokens = opt_.draft_tokens;
      spec->confidence_threshold = opt_.dspark_confidence;
    }
    s.decoder = RequestDecoder::make(model_, std::move(start), s.req.sampling, pool_, spec ? &*spec : nullptr,
                                     logprobs || s.req.constraint != nullptr, logit_filter(&s));
    if (s.req.prompt_logprobs) h.push(prompt_logprobs(s));
  }
  if (s.fed < prompt.size()) {
    if (s.prefill_started_at == 0) s.prefill_started_at = now_s();  // before the first chunk runs
    // One prefill chunk, cut at the cache boundary so the state there can be saved.
    size_t end = std::min(prompt.size(), s.fed + size_t(opt_.prefill_chunk));
    const size_t boundary = size_t(s.req.cache_prefix_at);
    if (boundary > s.fed && boundary < end) end = boundary;
    const std::vector<int32_t> part(prompt.begin() + long(s.fed), prompt.begin() + long(end));
    InputEmbeddings inputs;
    if (has_images) inputs = s.inputs.slice(int64_t(s.fed), int64_t(end), model_.config().dim);
    s.decoder->feed(part, has_images ? &inputs : nullptr);
    s.fed = end;
    log_prefill(s, prompt.size());
    if (s.fed == boundary && boundary > 0)
      prefix_cache_.insert(std::vector<int32_t>(prompt.begin(), prompt.begin() + long(boundary)), s.decoder->state());
    return true;
  }
  if (s.req.n > 1 && !s.forked) fork_choices(s);  // the prompt is in: the other choices start from here
  if (s.generated >= s.req.max_tokens) return finish(FinishReason::Length);
  if (!s.forcing && s.forced_at == 0 && !s.req.forced.empty() && s.tail == s.req.force_trigger) s.forcing = true;
  std::optional<int32_t> tok;
  if (s.forcing) {
    tok = s.decoder->force_token(s.req.forced[s.forced_at]);
    if (++s.forced_at == s.req.forced.size()) s.forcing = false;
  } else {
    tok = s.decoder->next_token(s.req.max_tokens - s.generated);
  }
  if (!tok) return finish(FinishReason::ContextFull);
  const double t = now_s();
  if (s.generated == 0) {
    h.ttft_s = t - s.arrived_at;
    metrics_.observe_ttft(t - s.arrived_at);
  } else {
    metrics_.observe_tpot(t - s.last_token_at);
  }
  s.last_token_at = t;
  ++s.generated;
  ++metrics_.generated_tokens;
  EngineEvent ev{EngineEvent::Kind::Token, *tok, FinishReason::Stop, {}, s.index, {}, {}};
  if (s.req.logprobs >= 0) {
    const std::vector<float>* logits = s.decoder->step_logits();
    if (!logits) throw Error("logprobs: the decoder gave no logits (internal error)");
    ev.logprob = token_logprob(logits->data(), int64_t(logits->size()), *tok, s.req.logprobs);
  }
  h.push(std::move(ev));
  if (!s.req.force_trigger.empty() && s.forced_at == 0) {
    s.tail.push_back(*tok);
    if (s.tail.size() > s.req.force_trigger.size()) s.tail.erase(s.tail.begin());
  }
  if (s.req.constraint) {
    if (s.constraining) {
      s.req.constraint->advance(*tok);
    } else {  // waiting for the trigger (the end of the reasoning in thinking mode)
      s.constraint_tail.push_back(*tok);
      if (s.constraint_tail.size() > s.req.constraint_trigger.size()) s.constraint_tail.erase(s.constraint_tail.begin());
      s.constraining = s.constraint_tail == s.req.constraint_trigger;
    }
  }
  for (int32_t stop : s.req.stop_ids)
    if (*tok == stop) return finish(FinishReason::Stop);
  if (s.generated >= s.req.max_tokens) return finish(FinishReason::Length);
  return true;
}

}  // namespace ds41
