#include "server/text_side.h"

#include <atomic>

#include "base/error.h"
#include "server/api_error.h"
#include "server/stop_matcher.h"
#include "text/dsml_tokens.h"
#include "text/prompt_encoder.h"
#include "text/reply_parser.h"
#include "text/stream_decoder.h"
#include "text/tokenizer.h"

namespace ds41 {

using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kBos = "<｜begin▁of▁sentence｜>";

class ChatReplyDecoder : public ReplyDecoder {
 public:
  ChatReplyDecoder(const Tokenizer& tok, int32_t eos, bool thinking, bool raw, std::vector<std::string> stops,
                   std::string call_prefix)
      : decoder_(tok), eos_(eos), raw_(raw), parser_(ReplyParserOptions{thinking ? ThinkingMode::thinking : ThinkingMode::chat,
                                                                        std::move(call_prefix)}),
        stops_(std::move(stops)) {}

  ReplyDelta feed(int32_t id) override {
    // The end-of-sentence token ends the reply; its text is not part of it.
    if (id == eos_) saw_eos_ = true;
    if (id == eos_ || stops_.stopped()) return {};
    return route(decoder_.push(id), false);
  }
  ReplyDelta finish() override {
    if (finished_) return {};
    finished_ = true;
    ReplyDelta d = route(decoder_.flush(), true);
    if (!stops_.stopped()) d.content += stops_.flush();
    return d;
  }
  std::vector<std::string> warnings() const override { return warnings_; }

 private:
  ReplyDelta route(const std::string& text, bool at_end) {
    ReplyDelta d;
    if (raw_) {
      d.content = stops_.feed(text);
    } else {
      std::vector<ReplyEvent> events = parser_.feed(text);
      if (at_end) {
        auto more = parser_.finish(/*cut_off=*/!saw_eos_);
        events.insert(events.end(), more.begin(), more.end());
      }
      for (const ReplyEvent& e : events) {
        if (stops_.stopped()) break;
        switch (e.kind) {
          case ReplyEvent::Kind::reasoning: d.reasoning += e.text; break;
          case ReplyEvent::Kind::content: d.content += stops_.feed(e.text); break;
          case ReplyEvent::Kind::tool_call: d.tool_calls.push_back({e.tool_call.id, e.tool_call.name, e.tool_call.arguments}); break;
          case ReplyEvent::Kind::warning: warnings_.push_back(e.text); break;
        }
      }
    }
    if (stops_.stopped()) {
      d.stop_matched = true;
      d.stop_sequence = stops_.matched();
    }
    return d;
  }
  StreamDecoder decoder_;
  int32_t eos_;
  bool raw_;
  ReplyParser parser_;
  StopMatcher stops_;
  bool finished_ = false;
  bool saw_eos_ = false;  // the model ended the reply (else a limit cut it off)
  std::vector<std::string> warnings_;
};

}  // namespace

TextSide::TextSide(const std::string& model_dir, const std::string& tokenizer_file)
    : tok_(std::make_unique<Tokenizer>(Tokenizer::load(tokenizer_file.empty() ? model_dir : tokenizer_file))) {
  auto need = [&](const char* token) {
    auto id = tok_->token_to_id(token);
    if (!id) throw Error(tok_->source() + ": the tokenizer has no " + std::string(token) + " token");
    return *id;
  };
  eos_ = need("<｜end▁of▁sentence｜>");
  assistant_ = need("<｜Assistant｜>");
}

TextSide::~TextSide() = default;

std::vector<int32_t> TextSide::stop_ids() const { return {eos_}; }

RenderedPrompt TextSide::render(const ApiRequest& r) const {
  RenderedPrompt out;
  if (r.kind == ApiKind::Completions) {
    // A raw prompt: the text as given, with the BOS the model was trained to see first.
    std::string text = r.prompt;
    if (text.rfind(kBos, 0) != 0) text = kBos + text;
    out.ids = tok_->encode(text);
    return out;
  }
  ojson messages = r.messages;
  // Tool schemas and a response schema are rendered inside the leading system message.
  const bool tools = !r.tools.empty() && r.tool_choice != "none";
  const bool schema = r.response_format.is_object() && r.response_format.value("type", "") == "json_schema" &&
                      r.response_format["json_schema"].contains("schema");
  if ((tools || schema) && (messages.empty() || messages[0]["role"] != "system"))
    messages.insert(messages.begin(), ojson{{"role", "system"}, {"content", ""}});
  if (tools) messages[0]["tools"] = r.tools;
  if (schema) messages[0]["response_format"] = r.response_format["json_schema"]["schema"];
  PromptOptions po;
  po.thinking_mode = r.thinking ? ThinkingMode::thinking : ThinkingMode::chat;
  po.reasoning_effort = r.reasoning_effort;
  EncodedPrompt ep;
  try {
    ep = encode_prompt(messages, po);
  } catch (const Error& e) {
    throw bad_request(e.what(), "messages");
  }
  out.ids = tok_->encode(ep.text, ep.text_spans);  // client text stays text
  for (const auto& img : ep.images) out.images.push_back(img.value("url", img.dump()));
  // The state before the last assistant header is what the next turn shares (in thinking mode
  // that header changes from "<think>" to "</think>" once the turn is in the past).
  for (size_t i = out.ids.size(); i-- > 0;)
    if (out.ids[i] == assistant_) {
      out.cache_prefix_at = int64_t(i);
      break;
    }
  return out;
}

TextSide::ForcedContinuation TextSide::forced_tool_call(const ApiRequest& r) const {
  ForcedContinuation f;
  if (r.kind == ApiKind::Completions || r.tools.empty() || (r.tool_choice != "required" && r.tool_choice.rfind("function:", 0) != 0))
    return f;
  // The answer's content starts after "</think>": the prompt's last token in chat mode, the
  // model's own in thinking mode. Text after a special token encodes on its own, so these ids
  // are the ones the block would have in context.
  if (r.thinking) f.trigger = tok_->encode(std::string(dsml::kThinkEnd));
  std::string text = "\n\n" + std::string(dsml::kCallsOpen) + "\n";
  if (r.tool_choice != "required") text += std::string(dsml::kInvokeOpen) + " name=\"" + r.tool_choice.substr(9) + "\">\n";
  f.forced = tok_->encode(text);
  return f;
}

std::unique_ptr<ReplyDecoder> TextSide::reply_decoder(const ApiRequest& r) const {
  static std::atomic<uint64_t> counter{0};
  return std::make_unique<ChatReplyDecoder>(*tok_, eos_, r.thinking && r.kind != ApiKind::Completions,
                                            r.kind == ApiKind::Completions, r.stop,
                                            "call_" + std::to_string(++counter) + "_");
}

}  // namespace ds41
