#include "runtime/generation.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"

namespace ds41 {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::ContextFull: return "context_full";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

Generation::Generation(const Model& model, SequenceState state, const Sampler& sampler, ThreadPool* pool,
                       ForwardOptions forward)
    : model_(model), state_(std::move(state)), sampler_(sampler), pool_(pool), forward_(forward) {
  forward_.all_logits = false;
  forward_.head_top_k = head_top_k_for(sampler_.options(), forward_.head_top_k);
}

void Generation::feed(const std::vector<int32_t>& ids, int64_t chunk, const std::function<void(int64_t, int64_t)>& on_progress,
                      const InputEmbeddings* inputs) {
  if (chunk < 0) throw Error("prefill chunk must be >= 0");
  if (inputs && inputs->token_types.size() != ids.size()) throw Error("feed: token types given for a different number of tokens");
  std::vector<int32_t> all;
  all.reserve(ids.size() + 1);
  if (pending_) all.push_back(*pending_);
  all.insert(all.end(), ids.begin(), ids.end());
  const ModelConfig& c = model_.config();
  for (int32_t id : all)
    if (id < 0 || id >= c.vocab_size)
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(c.vocab_size - 1) + ")");
  if (state_.pos + int64_t(all.size()) > c.max_seq_len)
    throw Error("the sequence would be " + std::to_string(state_.pos + int64_t(all.size())) +
                " tokens long, more than the model's max_seq_len " + std::to_string(c.max_seq_len));
  feed_start_ = now_s();
  last_feed_ = GenerationStats{};
  last_feed_.prompt_tokens = int64_t(all.size());
  if (all.empty()) return;
  // The pending token is text: it goes in front of the given inputs.
  InputEmbeddings all_inputs;
  if (inputs) {
    all_inputs = *inputs;
    if (pending_) all_inputs.token_types.insert(all_inputs.token_types.begin(), int8_t(TokenType::Text));
  }
  const size_t step = chunk > 0 ? size_t(chunk) : all.size();
  for (size_t i = 0; i < all.size(); i += step) {
    const size_t end = std::min(all.size(), i + step);
    InputEmbeddings part;
    if (inputs) part = all_inputs.slice(int64_t(i), int64_t(end), c.dim);
    ForwardOptions fo = forward_;
    if (on_progress)  // token-layers: each layer of a chunk counts the chunk's tokens
      fo.on_layer = [&](int done, int total) {
        on_progress(int64_t(i) * total + int64_t(end - i) * done, int64_t(all.size()) * total);
      };
    model_.forward_into(logits_, state_, std::vector<int32_t>(all.begin() + long(i), all.begin() + long(end)), fo, pool_,
                        nullptr, inputs ? &part : nullptr);
  }
  pending_.reset();
  last_feed_.prefill_s = now_s() - feed_start_;
}

void Generation::resume(std::vector<float> logits) {
  if (int64_t(logits.size()) != model_.config().vocab_size || pending_ || state_.pos == 0)
    throw Error("resume: needs a sequence with no pending token and its last position's logits");
  logits_ = std::move(logits);
  feed_start_ = now_s();
  last_feed_ = GenerationStats{};
}

void Generation::commit_pending() {
  if (!pending_) return;
  const int32_t tok = *pending_;
  pending_.reset();
  step_token_[0] = tok;  // decode steps reuse this vector and logits_: no allocation
  model_.forward_into(logits_, state_, step_token_, forward_, pool_);
}

void Generation::commit_pending_together(const std::vector<Generation*>& gens) {
  std::vector<Generation*> todo;
  for (Generation* g : gens)
    if (g->pending_) todo.push_back(g);
  if (todo.size() <= 1) {
    for (Generation* g : todo) g->commit_pending();
    return;
  }
  const Generation& first = *todo[0];
  std::vector<SequenceState*> states;
  std::vector<int32_t> tokens;
  for (Generation* g : todo) {
    if (&g->model_ != &first.model_ || g->pool_ != first.pool_ ||
        g->forward_.corrected_index_keys != first.forward_.corrected_index_keys || g->forward_.prefill != first.forward_.prefill)
      throw Error("commit_pending_together: the generations differ in model, pool or numerics options");
    states.push_back(&g->state_);
    tokens.push_back(*g->pending_);
  }
  // The head screen serves the batch only if every generation can take it (one k for all rows:
  // the largest asked for).
  ForwardOptions fo = first.forward_;
  for (Generation* g : todo)
    fo.head_top_k = g->forward_.head_top_k > 0 && fo.head_top_k > 0 ? std::max(fo.head_top_k, g->forward_.head_top_k) : 0;
  static thread_local std::vector<float> logits;
  first.model_.forward_batch(logits, states, tokens, fo, first.pool_);
  const size_t V = size_t(first.model_.config().vocab_size);
  for (size_t i = 0; i < todo.size(); ++i) {
    todo[i]->logits_.assign(logits.begin() + long(i * V), logits.begin() + long((i + 1) * V));
    todo[i]->pending_.reset();
  }
}

std::optional<int32_t> Generation::next_token() {
  if (logits_.empty()) throw Error("generate: nothing has been fed yet");
  // The next token goes to position length(); it must fit the context to be fed later.
  if (length() >= model_.config().max_seq_len) return std::nullopt;
  commit_pending();  // the previous token has to go in before the next can be sampled
  if (filter_) filter_(logits_.data(), model_.config().vocab_size);
  const int32_t tok = sampler_.sample(logits_.data(), model_.config().vocab_size, uint64_t(state_.pos), state_.token_history,
                                        sampler_scratch_);
  pending_ = tok;
  return tok;
}

std::optional<int32_t> Generation::force_token(int32_t token) {
  if (logits_.empty()) throw Error("generate: nothing has been fed yet");
  if (token < 0 || token >= model_.config().vocab_size) throw Error("forced token id " + std::to_string(token) + " is outside the vocabulary");
  if (length() >= model_.config().max_seq_len) return std::nullopt;
  commit_pending();
  pending_ = token;
  return token;
}

GenerationStats Generation::generate(const GenerationLimits& limits, const std::function<bool(int32_t)>& on_token) {
  if (limits.max_tokens < 0) throw Error("max_tokens must be >= 0");
  if (logits_.empty() && limits.max_tokens > 0) throw Error("generate: nothing has been fed yet");
  GenerationStats st = last_feed_;
  double first_token_at = 0;
  st.finish = FinishReason::Length;
  for (int64_t n = 0; n < limits.max_tokens; ++n) {
    if (limits.cancel && limits.cancel->load()) {
      st.finish = FinishReason::Cancelled;
      break;
    }
    const std::optional<int32_t> next = next_token();
    if (!next) {
      st.finish = FinishReason::ContextFull;
      break;
    }
    const int32_t tok = *next;
    ++st.generated_tokens;
    const double t = now_s();
    if (n == 0) {
      first_token_at = t;
      st.time_to_first_token_s = t - feed_start_;
    }
    st.decode_s = t - first_token_at;
    bool go_on = on_token ? on_token(tok) : true;
    bool stop = false;
    for (int32_t s : limits.stop_ids) stop |= s == tok;
    if (stop || !go_on) {
      st.finish = FinishReason::Stop;
      break;
    }
  }
  return st;
}

}  // namespace ds41
