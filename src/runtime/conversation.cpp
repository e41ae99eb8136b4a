#include "runtime/conversation.h"

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "runtime/session.h"
#include "text/stream_decoder.h"
#include "text/tokenizer.h"

namespace ds41 {

using ojson = nlohmann::ordered_json;

namespace {

bool is_prefix(const std::vector<int32_t>& p, const std::vector<int32_t>& of) {
  return p.size() < of.size() && std::equal(p.begin(), p.end(), of.begin());
}

// Writes `text` to `path` atomically (temp file, fsync by close, rename).
void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(tmp + ": cannot write");
    f << text;
    f.flush();
    if (!f) throw Error(tmp + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(path + ": cannot replace (" + ec.message() + ")");
}

}  // namespace

Conversation::Conversation(const Model& model, const Tokenizer& tokenizer, const SamplerOptions& sampling, ThreadPool* pool,
                           ForwardOptions forward)
    : model_(model), tok_(tokenizer), sampling_(sampling), pool_(pool), forward_(forward) {
  auto need = [&](const char* token) {
    auto id = tok_.token_to_id(token);
    if (!id) throw Error(tok_.source() + ": the tokenizer has no " + std::string(token) + " token");
    return *id;
  };
  eos_ = need("<｜end▁of▁sentence｜>");
  assistant_ = need("<｜Assistant｜>");
}

void Conversation::set_system(const std::string& text) { system_ = text; }

void Conversation::reset() {
  messages_ = ojson::array();
  gen_.reset();
  seq_ids_.clear();
  snapshot_.reset();
  snapshot_ids_.clear();
}

std::vector<int32_t> Conversation::encode_conversation(bool) const {
  ojson all = ojson::array();
  if (!system_.empty()) all.push_back({{"role", "system"}, {"content", system_}});
  for (const auto& m : messages_) all.push_back(m);
  const EncodedPrompt ep = encode_prompt(all, prompt_);
  return tok_.encode(ep.text, ep.text_spans);  // client text stays text
}

void Conversation::start_sequence(const std::vector<int32_t>& ids, TurnResult& r, int64_t chunk) {
  // Pick the longest reusable start: the live sequence, the saved snapshot, or nothing.
  size_t base = 0;
  if (gen_ && is_prefix(seq_ids_, ids)) {
    base = seq_ids_.size();
  } else if (snapshot_ && is_prefix(snapshot_ids_, ids)) {
    gen_ = std::make_unique<Generation>(model_, *snapshot_, Sampler(sampling_), pool_, forward_);
    base = snapshot_ids_.size();
  } else {
    gen_ = std::make_unique<Generation>(model_, model_.new_sequence(), Sampler(sampling_), pool_, forward_);
  }
  r.reused_tokens = int64_t(base);
  // Feed up to the last assistant header, keep that state for the next turn, then the rest.
  size_t boundary = 0;
  for (size_t i = ids.size(); i-- > base;)
    if (ids[i] == assistant_) {
      boundary = i;
      break;
    }
  double prefill_s = 0;
  // Progress over both feeds as one: scaled to the tokens this turn prefills.
  const int64_t turn_tokens = int64_t(ids.size() - base) + (gen_->pending() ? 1 : 0);
  auto feed = [&](size_t from, size_t to) {
    if (from >= to && !gen_->pending()) return;
    const int64_t before = int64_t(from - base);
    std::function<void(int64_t, int64_t)> progress;
    if (prefill_progress_)
      progress = [&, before, n = int64_t(to - from) + (gen_->pending() ? 1 : 0)](int64_t done, int64_t total) {
        const int64_t layers = total / std::max<int64_t>(n, 1);
        prefill_progress_(before * layers + done, turn_tokens * layers);
      };
    gen_->feed(std::vector<int32_t>(ids.begin() + long(from), ids.begin() + long(to)), chunk, progress);
    prefill_s += gen_->last_feed_stats().prefill_s;
  };
  if (boundary > base) {
    feed(base, boundary);
    snapshot_ = gen_->state();
    snapshot_ids_.assign(ids.begin(), ids.begin() + long(boundary));
    feed(boundary, ids.size());
  } else {
    feed(base, ids.size());
  }
  seq_ids_ = ids;
  r.stats.prefill_s = prefill_s;
}

TurnResult Conversation::ask(const std::string& user_text, const GenerationLimits& limits,
                             const std::function<void(const ReplyEvent&)>& on_event, int64_t prefill_chunk) {
  TurnResult r;
  messages_.push_back({{"role", "user"}, {"content", user_text}});
  std::vector<int32_t> ids;
  try {
    ids = encode_conversation(true);
    if (int64_t(ids.size()) >= model_.config().max_seq_len)
      throw Error("the conversation is " + std::to_string(ids.size()) + " tokens, the model's context is " +
                  std::to_string(model_.config().max_seq_len) + " (start over with /reset)");
    r.prompt_tokens = int64_t(ids.size());
    start_sequence(ids, r, prefill_chunk);
  } catch (...) {
    messages_.erase(messages_.end() - 1);
    throw;
  }
  const double prefill_s = r.stats.prefill_s;
  StreamDecoder decoder(tok_);
  ReplyParser parser(ReplyParserOptions{prompt_.thinking_mode, "call_"});
  auto deliver = [&](const std::vector<ReplyEvent>& events) {
    collect_reply_events(r.reply, events);
    if (on_event)
      for (const auto& e : events) on_event(e);
  };
  GenerationLimits lim = limits;
  if (std::find(lim.stop_ids.begin(), lim.stop_ids.end(), eos_) == lim.stop_ids.end()) lim.stop_ids.push_back(eos_);
  r.stats = gen_->generate(lim, [&](int32_t tok) {
    r.generated.push_back(tok);
    if (tok != eos_) deliver(parser.feed(decoder.push(tok)));
    return true;
  });
  r.stats.prefill_s = prefill_s;
  r.stats.prompt_tokens = r.prompt_tokens - r.reused_tokens;
  std::vector<ReplyEvent> tail = parser.feed(decoder.flush());
  std::vector<ReplyEvent> fin = parser.finish(/*cut_off=*/r.generated.empty() || r.generated.back() != eos_);
  tail.insert(tail.end(), fin.begin(), fin.end());
  deliver(tail);
  seq_ids_.insert(seq_ids_.end(), r.generated.begin(), r.generated.end());
  messages_.push_back(reply_to_message(r.reply));
  return r;
}

void Conversation::save(const std::string& path) {
  if (!gen_) throw Error("nothing to save yet: the conversation is empty");
  gen_->commit_pending();
  save_session(path, model_, gen_->state(), SessionKind::Exact);  // a chat continues bit-identically
  ojson j = {{"format", "ds41-chat"},
             {"version", 1},
             {"system", system_},
             {"thinking", prompt_.thinking_mode == ThinkingMode::thinking},
             {"reasoning_effort", prompt_.reasoning_effort},
             {"messages", messages_},
             {"tokens", int64_t(seq_ids_.size())}};
  write_file_atomic(path + ".chat.json", j.dump(1));
}

void Conversation::load(const std::string& path) {
  SequenceState st = load_session(path, model_);
  const std::string chat_path = path + ".chat.json";
  std::ifstream f(chat_path);
  if (!f) throw Error(chat_path + ": missing (a chat session is the session file plus this conversation file)");
  ojson j = ojson::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "ds41-chat" || !j.contains("messages") ||
      !j["messages"].is_array())
    throw Error(chat_path + ": not a ds41 chat file");
  if (j.value("version", 0) != 1) throw Error(chat_path + ": written by a newer ds41 (version " + j["version"].dump() + ")");
  if (j.value("tokens", int64_t(-1)) != st.pos)
    throw Error(chat_path + ": belongs to another session (" + j["tokens"].dump() + " tokens, the session holds " +
                std::to_string(st.pos) + ")");
  reset();
  system_ = j.value("system", "");
  prompt_.thinking_mode = j.value("thinking", false) ? ThinkingMode::thinking : ThinkingMode::chat;
  prompt_.reasoning_effort = j.value("reasoning_effort", 75);
  messages_ = j["messages"];
  seq_ids_ = st.token_history;
  gen_ = std::make_unique<Generation>(model_, std::move(st), Sampler(sampling_), pool_, forward_);
}

}  // namespace ds41
