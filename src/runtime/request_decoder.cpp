#include "runtime/request_decoder.h"

#include <deque>

#include "base/error.h"

namespace ds41 {

namespace {

class PlainDecoder final : public RequestDecoder {
 public:
  PlainDecoder(const Model& model, SequenceState start, const SamplerOptions& sampling, ThreadPool* pool, bool full_logits)
      : model_(model), pool_(pool), full_logits_(full_logits),
        gen_(model, std::move(start), Sampler(sampling), pool, forward_options(full_logits)) {}
  std::unique_ptr<RequestDecoder> fork(const SamplerOptions& sampling,
                                       std::function<void(float*, int64_t)> logit_filter) const override {
    if (gen_.pending()) throw Error("fork: a token is pending (fork right after the prompt)");
    auto d = std::make_unique<PlainDecoder>(model_, gen_.state(), sampling, pool_, full_logits_);
    d->gen_.resume(gen_.last_logits());
    if (logit_filter) d->set_logit_filter(std::move(logit_filter));
    return d;
  }
  static ForwardOptions forward_options(bool full_logits) {
    ForwardOptions fo;
    if (full_logits) fo.head_top_k = -1;  // every logit, whatever the sampler
    return fo;
  }
  const std::vector<float>* step_logits() const override { return &gen_.last_logits(); }
  void set_logit_filter(std::function<void(float*, int64_t)> f) { gen_.set_logit_filter(std::move(f)); }
  void feed(const std::vector<int32_t>& ids, const InputEmbeddings* inputs) override { gen_.feed(ids, 0, {}, inputs); }
  std::optional<int32_t> next_token(int64_t) override { return gen_.next_token(); }
  std::optional<int32_t> force_token(int32_t id) override { return gen_.force_token(id); }
  const SequenceState& state() const override { return gen_.state(); }
  Generation* batchable() override {
    return gen_.pending() && gen_.length() < model_.config().max_seq_len ? &gen_ : nullptr;
  }

 private:
  const Model& model_;
  ThreadPool* pool_;
  bool full_logits_;
  Generation gen_;
};

class SpeculativeRequestDecoder final : public RequestDecoder {
 public:
  SpeculativeRequestDecoder(const Model& model, SequenceState start, const SamplerOptions& sampling, ThreadPool* pool,
                            SpeculativeOptions opt)
      : model_(model), first_(sampling) {
    // A state from a plain request (a prefix-cache hit) has no draft rings: they restart at its
    // end (only acceptance suffers).
    if (start.dspark_pos != start.pos) start.dspark_start = start.dspark_pos = start.pos;
    state_ = std::make_unique<SequenceState>(std::move(start));
    opt.sampling = sampling;
    spec_ = std::make_unique<SpeculativeDecoder>(model, *state_, opt, pool);
  }
  void feed(const std::vector<int32_t>& ids, const InputEmbeddings* inputs) override {
    logits_ = spec_->prefill(ids, 0, inputs);
  }
  std::optional<int32_t> next_token(int64_t budget) override {
    if (out_.empty()) {
      if (!pending_) {
        // The first token comes from the prefill's logits exactly as in plain decoding.
        if (state_->pos >= model_.config().max_seq_len) return std::nullopt;
        out_.push_back(first_.sample(logits_.data(), model_.config().vocab_size, uint64_t(state_->pos), state_->token_history));
      } else {
        spec_->step_into(cycle_, *pending_, budget);
        if (cycle_.empty()) return std::nullopt;
        out_.insert(out_.end(), cycle_.begin(), cycle_.end());
      }
      pending_ = out_.back();
    }
    const int32_t tok = out_.front();
    out_.pop_front();
    return tok;
  }
  std::optional<int32_t> force_token(int32_t) override {
    throw Error("a speculative request cannot force tokens (forced requests decode plainly)");
  }
  const SequenceState& state() const override { return *state_; }
  Generation* batchable() override { return nullptr; }
  SpeculativeStats speculative_stats() const override { return spec_->stats(); }
  std::unique_ptr<RequestDecoder> fork(const SamplerOptions&, std::function<void(float*, int64_t)>) const override {
    throw Error("a speculative request cannot be forked (requests with several choices decode plainly)");
  }

 private:
  const Model& model_;
  Sampler first_;
  std::unique_ptr<SequenceState> state_;  // the decoder keeps a reference: a stable address
  std::unique_ptr<SpeculativeDecoder> spec_;
  std::vector<float> logits_;         // the last prefill's
  std::optional<int32_t> pending_;    // the last token handed out by a cycle, not yet consumed
  std::deque<int32_t> out_;           // the current cycle's tokens not yet handed out
  std::vector<int32_t> cycle_;        // kept: a cycle allocates nothing
};

}  // namespace

std::unique_ptr<RequestDecoder> RequestDecoder::make(const Model& model, SequenceState start, const SamplerOptions& sampling,
                                                     ThreadPool* pool, const SpeculativeOptions* speculative,
                                                     bool full_logits, std::function<void(float*, int64_t)> logit_filter) {
  if (speculative && (full_logits || logit_filter)) throw Error("a speculative request does not give every step's logits");
  if (speculative) return std::make_unique<SpeculativeRequestDecoder>(model, std::move(start), sampling, pool, *speculative);
  auto d = std::make_unique<PlainDecoder>(model, std::move(start), sampling, pool, full_logits);
  if (logit_filter) d->set_logit_filter(std::move(logit_filter));
  return d;
}

}  // namespace ds41
