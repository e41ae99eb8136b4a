#include "server/response_writer.h"

#include <cmath>

#include "text/tokenizer.h"
#include "text/utf8.h"

namespace ds41 {

using json = nlohmann::json;

namespace {

std::string sse(const json& data) { return "data: " + wire_json(data) + "\n\n"; }
std::string sse_event(const std::string& event, const json& data) {
  return "event: " + event + "\ndata: " + wire_json(data) + "\n\n";
}

const char* openai_finish(EndReason why) {
  switch (why) {
    case EndReason::Length: return "length";
    case EndReason::ToolCalls: return "tool_calls";
    default: return "stop";
  }
}

json openai_usage(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// A token as logprobs spell it: its text (U+FFFD for a partial character) and its bytes.
struct TokenSpelling {
  std::string text;
  std::vector<uint8_t> bytes;
};
TokenSpelling spell(const Tokenizer* tok, int32_t id) {
  if (!tok || id < 0 || id >= tok->vocab_size()) return {"", {}};
  const std::string_view b = tok->token_bytes(id);
  return {utf8_lossy(b), std::vector<uint8_t>(b.begin(), b.end())};
}
// JSON has no -inf: an impossible token gets OpenAI's -9999.
double wire_logprob(float lp) { return std::isfinite(lp) ? double(lp) : -9999.0; }

// OpenAI chat's {"token", "logprob", "bytes", "top_logprobs"} entry.
json chat_logprob_entry(const Tokenizer* tok, const TokenLogprob& lp) {
  const TokenSpelling sp = spell(tok, lp.token);
  json top = json::array();
  for (const auto& [id, v] : lp.top) {
    const TokenSpelling t = spell(tok, id);
    top.push_back({{"token", t.text}, {"logprob", wire_logprob(v)}, {"bytes", t.bytes}});
  }
  return {{"token", sp.text}, {"logprob", wire_logprob(lp.logprob)}, {"bytes", sp.bytes}, {"top_logprobs", top}};
}

// OpenAI completions' parallel arrays, appended to as tokens come.
struct CompletionLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), text_offset = json::array();
  void add(const Tokenizer* tok, int32_t id, const TokenLogprob* lp, int64_t offset) {
    tokens.push_back(spell(tok, id).text);
    token_logprobs.push_back(lp ? json(wire_logprob(lp->logprob)) : json(nullptr));
    if (!lp) {
      top_logprobs.push_back(nullptr);
    } else {
      json top = json::object();
      for (const auto& [t, v] : lp->top) {
        const std::string key = spell(tok, t).text;
        if (!top.contains(key)) top[key] = wire_logprob(v);  // two ids of one spelling: the likelier
      }
      top_logprobs.push_back(top);
    }
    text_offset.push_back(offset);
  }
  bool empty() const { return tokens.empty(); }
  json to_json() const {
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", text_offset}};
  }
};

json tool_call_json(const ToolCallOut& t) {
  return {{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}};
}

class ChatWriter : public ResponseWriter {
 public:
  ChatWriter(const ApiRequest& r, std::string id, std::string model, int64_t created, const Tokenizer* tok)
      : stream_(r.stream), usage_chunk_(r.include_usage), logprobs_(r.logprobs >= 0), id_(std::move(id)),
        model_(std::move(model)), created_(created), tok_(tok) {}

  void token_logprob(const TokenLogprob& lp) override {
    (stream_ ? pending_logprobs_ : all_logprobs_).push_back(chat_logprob_entry(tok_, lp));
  }

  std::string start(const Usage&) override {
    if (!stream_) return {};
    return chunk({{"role", "assistant"}, {"content", ""}}, nullptr);
  }
  std::string delta(const ReplyDelta& d) override {
    reasoning_ += d.reasoning;
    content_ += d.content;
    std::string out;
    if (!stream_) {
      for (const auto& t : d.tool_calls) calls_.push_back(tool_call_json(t));
      return out;
    }
    if (!d.reasoning.empty()) out += chunk({{"reasoning_content", d.reasoning}}, nullptr);
    if (!d.content.empty()) out += chunk({{"content", d.content}}, nullptr);
    for (const auto& t : d.tool_calls) {
      json tc = tool_call_json(t);
      tc["index"] = n_calls_++;
      out += chunk({{"tool_calls", json::array({tc})}}, nullptr);
    }
    return out;
  }
  std::string finish(EndReason why, const std::string&, const Usage& u) override {
    if (!stream_) {
      json msg = {{"role", "assistant"}, {"content", content_}};
      if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
      if (!calls_.empty()) msg["tool_calls"] = calls_;
      body_ = {{"id", id_},
               {"object", "chat.completion"},
               {"created", created_},
               {"model", model_},
               {"choices", json::array({{{"index", index_}, {"message", msg}, {"finish_reason", openai_finish(why)},
                                         {"logprobs", logprobs_ ? json{{"content", all_logprobs_}, {"refusal", nullptr}} : json(nullptr)}}})},
               {"usage", openai_usage(u)}};
      return {};
    }
    std::string out = chunk(json::object(), openai_finish(why));
    if (!ends_stream_) return out;  // another choice is still going: it ends the stream
    if (usage_chunk_) {
      json j = base("chat.completion.chunk");
      j["choices"] = json::array();
      j["usage"] = openai_usage(u);
      out += sse(j);
    }
    return out + "data: [DONE]\n\n";
  }
  json body() const override { return body_; }
  std::string stream_error(const std::string& message) override {
    return sse({{"error", {{"message", message}, {"type", "server_error"}}}}) + "data: [DONE]\n\n";
  }

 private:
  json base(const char* object) const { return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}}; }
  // A chunk carries the log-probabilities of the tokens since the previous chunk.
  std::string chunk(const json& delta, const char* finish) {
    json j = base("chat.completion.chunk");
    json lp = nullptr;
    if (logprobs_ && (!pending_logprobs_.empty() || finish)) {
      lp = {{"content", pending_logprobs_}, {"refusal", nullptr}};
      pending_logprobs_ = json::array();
    }
    j["choices"] = json::array({{{"index", index_}, {"delta", delta}, {"logprobs", lp},
                                 {"finish_reason", finish ? json(finish) : json(nullptr)}}});
    return sse(j);
  }
  bool stream_, usage_chunk_, logprobs_;
  std::string id_, model_;
  int64_t created_;
  const Tokenizer* tok_;
  json pending_logprobs_ = json::array(), all_logprobs_ = json::array();
  std::string reasoning_, content_;
  json calls_ = json::array();
  int n_calls_ = 0;
  json body_;
};

class CompletionWriter : public ResponseWriter {
 public:
  CompletionWriter(const ApiRequest& r, std::string id, std::string model, int64_t created, const Tokenizer* tok)
      : stream_(r.stream), usage_chunk_(r.include_usage), logprobs_(r.logprobs >= 0), echo_(r.echo), prompt_(r.prompt),
        id_(std::move(id)), model_(std::move(model)), created_(created), tok_(tok) {}
  std::string start(const Usage&) override {
    if (!echo_) return {};
    // echo: the answer's text starts with the prompt.
    if (!stream_) {
      text_ = prompt_;
      return {};
    }
    return chunk(prompt_, nullptr);
  }
  void prompt_logprobs(const std::vector<int32_t>& ids, const std::vector<TokenLogprob>& lps) override {
    // Each prompt token at its byte offset in the echoed text; the first has no log-probability.
    // A BOS the server put before the client's text is not part of it: left out (the next token's
    // value, conditioned on it, stays).
    const bool added_bos = !ids.empty() && tok_ && tok_->is_special(ids[0]) && prompt_.rfind(spell(tok_, ids[0]).text, 0) != 0;
    for (size_t i = added_bos ? 1 : 0; i < ids.size(); ++i) add(ids[i], i == 0 ? nullptr : &lps[i - 1]);
  }
  void token_logprob(const TokenLogprob& lp) override { add(lp.token, &lp); }
  std::string delta(const ReplyDelta& d) override {
    const std::string t = d.reasoning + d.content;
    text_ += t;
    if (!stream_ || t.empty()) return {};
    return chunk(t, nullptr);
  }
  std::string finish(EndReason why, const std::string&, const Usage& u) override {
    if (!stream_) {
      body_ = base();
      body_["choices"] = json::array({{{"index", index_}, {"text", text_}, {"logprobs", logprobs_ ? all_.to_json() : json(nullptr)},
                                       {"finish_reason", openai_finish(why)}}});
      body_["usage"] = openai_usage(u);
      return {};
    }
    std::string out = chunk("", openai_finish(why));
    if (!ends_stream_) return out;
    if (usage_chunk_) {
      json j = base();
      j["choices"] = json::array();
      j["usage"] = openai_usage(u);
      out += sse(j);
    }
    return out + "data: [DONE]\n\n";
  }
  json body() const override { return body_; }
  std::string stream_error(const std::string& message) override {
    return sse({{"error", {{"message", message}, {"type", "server_error"}}}}) + "data: [DONE]\n\n";
  }

 private:
  json base() const { return {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_}}; }
  std::string chunk(const std::string& text, const char* finish) {
    json j = base();
    json lp = nullptr;
    if (logprobs_ && (!pending_.empty() || finish)) {
      lp = pending_.to_json();
      pending_ = CompletionLogprobs{};
    }
    j["choices"] = json::array({{{"index", index_}, {"text", text}, {"logprobs", lp},
                                 {"finish_reason", finish ? json(finish) : json(nullptr)}}});
    return sse(j);
  }
  bool stream_, usage_chunk_, logprobs_, echo_;
  std::string prompt_;
  std::string id_, model_;
  int64_t created_;
  const Tokenizer* tok_;
  // A token at its offset in the text, in characters as OpenAI counts them (the characters the
  // tokens before it began: a token that ends inside a character counts it).
  void add(int32_t id, const TokenLogprob* lp) {
    (stream_ ? pending_ : all_).add(tok_, id, lp, chars_);
    if (tok_)
      for (const char c : tok_->token_bytes(id)) chars_ += (uint8_t(c) & 0xC0) != 0x80;
  }
  CompletionLogprobs pending_, all_;
  int64_t chars_ = 0;
  std::string text_;
  json body_;
};

class AnthropicWriter : public ResponseWriter {
 public:
  AnthropicWriter(const ApiRequest& r, std::string id, std::string model)
      : stream_(r.stream), id_(std::move(id)), model_(std::move(model)) {}

  std::string start(const Usage& u) override {
    if (!stream_) return {};
    json msg = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", json::array()},
                {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                {"usage", {{"input_tokens", u.prompt_tokens}, {"output_tokens", 0}}}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", msg}}) + sse_event("ping", {{"type", "ping"}});
  }
  std::string delta(const ReplyDelta& d) override {
    std::string out;
    if (!d.reasoning.empty()) out += text_block("thinking", "thinking_delta", d.reasoning);
    if (!d.content.empty()) out += text_block("text", "text_delta", d.content);
    for (const auto& t : d.tool_calls) {
      json input = json::parse(t.arguments, nullptr, false);
      if (input.is_discarded() || !input.is_object()) input = json::object();
      if (!stream_) {
        blocks_.push_back({{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", input}});
        continue;
      }
      out += close_block();
      out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_},
                                               {"content_block", {{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", json::object()}}}});
      out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                               {"delta", {{"type", "input_json_delta"}, {"partial_json", input.dump()}}}});
      out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
      ++index_;
    }
    return out;
  }
  std::string finish(EndReason why, const std::string& stop_sequence, const Usage& u) override {
    const char* reason = why == EndReason::Length ? "max_tokens"
                         : why == EndReason::StopSequence ? "stop_sequence"
                         : why == EndReason::ToolCalls ? "tool_use"
                                                       : "end_turn";
    const json seq = why == EndReason::StopSequence ? json(stop_sequence) : json(nullptr);
    if (!stream_) {
      body_ = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", blocks_},
               {"stop_reason", reason}, {"stop_sequence", seq},
               {"usage", {{"input_tokens", u.prompt_tokens}, {"output_tokens", u.completion_tokens},
                          {"cache_read_input_tokens", u.cached_tokens}}}};
      return {};
    }
    std::string out = close_block();
    out += sse_event("message_delta", {{"type", "message_delta"}, {"delta", {{"stop_reason", reason}, {"stop_sequence", seq}}},
                                       {"usage", {{"output_tokens", u.completion_tokens}}}});
    out += sse_event("message_stop", {{"type", "message_stop"}});
    return out;
  }
  json body() const override { return body_; }
  std::string stream_error(const std::string& message) override {
    return sse_event("error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}});
  }

 private:
  // Appends to the open block of `type` or opens a new one (thinking, then text, then tools).
  std::string text_block(const char* type, const char* delta_type, const std::string& text) {
    if (!stream_) {
      if (blocks_.empty() || blocks_.back()["type"] != type) blocks_.push_back({{"type", type}, {type, ""}});
      blocks_.back()[type] = blocks_.back()[type].get<std::string>() + text;
      return {};
    }
    std::string out;
    if (open_ != type) {
      out += close_block();
      out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_},
                                               {"content_block", {{"type", type}, {type, ""}}}});
      open_ = type;
    }
    out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                             {"delta", {{"type", delta_type}, {type, text}}}});
    return out;
  }
  std::string close_block() {
    if (open_.empty()) return {};
    std::string out = sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    open_.clear();
    ++index_;
    return out;
  }
  bool stream_;
  std::string id_, model_;
  json blocks_ = json::array();
  std::string open_;
  int index_ = 0;
  json body_;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_response_writer(const ApiRequest& r, const std::string& id,
                                                     const std::string& model_name, int64_t created,
                                                     const Tokenizer* tokenizer) {
  switch (r.kind) {
    case ApiKind::ChatCompletions: return std::make_unique<ChatWriter>(r, id, model_name, created, tokenizer);
    case ApiKind::Completions: return std::make_unique<CompletionWriter>(r, id, model_name, created, tokenizer);
    case ApiKind::AnthropicMessages: return std::make_unique<AnthropicWriter>(r, id, model_name);
  }
  return nullptr;
}

std::string wire_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(ApiKind kind, int status, const std::string& type, const std::string& message, const std::string& param) {
  if (kind == ApiKind::AnthropicMessages) return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
                     {"code", status == 404 && param == "model" ? json("model_not_found") : json(nullptr)}}}};
}

}  // namespace ds41
