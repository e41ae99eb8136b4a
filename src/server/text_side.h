// The text half of serving: requests rendered to prompt token ids with the official prompt
// encoding, and generated ids turned back into reasoning / content / tool-call deltas while they
// stream (UTF-8-safe detokenisation, DSML parsing, stop sequences). The engine never sees text.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_request.h"

namespace ds41 {

class Tokenizer;

struct RenderedPrompt {
  std::vector<int32_t> ids;
  int64_t cache_prefix_at = 0;      // a boundary the next turn of this conversation will share
  std::vector<std::string> images;  // data URLs, in prompt order
};

struct ToolCallOut {
  std::string id, name, arguments;  // arguments: a JSON object as text
};

struct ReplyDelta {
  std::string reasoning, content;
  std::vector<ToolCallOut> tool_calls;
  bool stop_matched = false;  // a stop sequence ended the content
  std::string stop_sequence;  // which one
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ReplyDecoder {
 public:
  virtual ~ReplyDecoder() = default;
  virtual ReplyDelta feed(int32_t id) = 0;
  virtual ReplyDelta finish() = 0;
  virtual std::vector<std::string> warnings() const = 0;
};

class TextSide {
 public:
  // Loads `<dir>/tokenizer.json`; throws ds41::Error naming the file when it is missing or bad.
  // The tokenizer: `tokenizer_file` if given, else model_dir/tokenizer.json.
  explicit TextSide(const std::string& model_dir, const std::string& tokenizer_file = "");
  ~TextSide();

  RenderedPrompt render(const ApiRequest& r) const;
  std::vector<int32_t> stop_ids() const;  // EOS
  // tool_choice "required" / a named function: the tool-call block's opening (and the named
  // invoke header) forced at the start of the answer's content — right away in chat mode, after
  // the model's "</think>" in thinking mode. Empty `forced` for auto / none.
  struct ForcedContinuation {
    std::vector<int32_t> trigger, forced;
  };
  ForcedContinuation forced_tool_call(const ApiRequest& r) const;
  std::unique_ptr<ReplyDecoder> reply_decoder(const ApiRequest& r) const;
  const Tokenizer& tokenizer() const { return *tok_; }

 private:
  std::unique_ptr<Tokenizer> tok_;
  int32_t eos_ = 1, assistant_ = -1;
};

}  // namespace ds41
