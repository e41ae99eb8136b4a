// Splits the model's output text into reasoning, content and tool calls while it streams.
//
// Grammar (spec D.5, the reference's `parse_message_from_completion_text`): in thinking mode the
// reply starts with reasoning up to "</think>"; then content up to the end-of-sentence token or
// up to "\n\n<｜DSML｜ calls", which opens a block of tool calls (dsml_calls_parser.h) that must
// be followed by nothing but the end-of-sentence token.
//
// Streaming: feed() the decoded text pieces as they come, then finish(). Markup never reaches a
// delta: text that could be the start of "</think>", of "\n\n<｜DSML｜ calls" or of the
// end-of-sentence token is held back until the next piece decides, a tool-call block is held
// until it is complete, and a delta never ends inside a UTF-8 character. Tool calls are reported
// once their block is complete.
//
// Where the reference parser raises, this one keeps going and warns (warnings come as the last
// events, from finish()), and markup never becomes content or reasoning: a malformed tool-call
// block is left out, its text (to the end-of-sentence token) given in a warning, and no tool call
// of it is reported; a block cut off by the end of the reply (a token limit) reports the calls it
// completed and gives the rest in a warning; a tool-call block inside the reasoning (the reference
// rejects DSML there) is parsed as tool calls and the reasoning goes on after it; unclosed reasoning stays reasoning; text after
// the tool calls or after the end-of-sentence token is content; special tokens inside the
// reasoning or the content are reported. Tool-call arguments are rebuilt exactly as the reference
// does (non-string values inserted as written), with a warning when the result is not valid
// JSON. A reply without the end-of-sentence token (generation stopped by a token limit, or the
// caller does not pass that token on) is not an error.
//
// The outcome does not depend on how the text is split into pieces: coalescing the deltas gives
// the same reasoning, content, tool calls and warnings for any split (parse_reply is one piece).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/dsml_calls_parser.h"
#include "text/prompt_encoder.h"

namespace ds41 {

struct ToolCall {
  std::string id;         // tool_call_id_prefix + running index ("call_0", "call_1", ...)
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

struct ReplyEvent {
  enum class Kind { reasoning, content, tool_call, warning };
  Kind kind;
  std::string text;  // the delta (reasoning, content) or the message (warning)
  ToolCall tool_call;
};

struct ReplyParserOptions {
  ThinkingMode thinking_mode = ThinkingMode::chat;  // as the prompt was encoded
  std::string tool_call_id_prefix = "call_";        // e.g. unique per request in a server
};

class ReplyParser {
 public:
  explicit ReplyParser(ReplyParserOptions options = {});
  std::vector<ReplyEvent> feed(std::string_view piece);
  // Flushes held-back text and reports the warnings. Nothing may be fed afterwards. `cut_off`:
  // the reply was stopped by a limit (token budget, context), not ended by the model: a tool-call
  // block still open then reports only the calls that closed (the reference's leniencies for text
  // that ends right after an invoke header are for replies the model ended).
  std::vector<ReplyEvent> finish(bool cut_off = false);

 private:
  enum class State { reasoning, content, tool_block, after_tool_calls, plain_content, invalid_block, after_eos };
  void run(std::vector<ReplyEvent>& out, bool at_end);
  void emit(std::vector<ReplyEvent>& out, ReplyEvent::Kind kind, std::string_view text);
  void flush_text(std::vector<ReplyEvent>& out, ReplyEvent::Kind kind, std::initializer_list<std::string_view> stops,
                  bool at_end);
  void warn(std::string message);
  void report_calls(std::vector<ReplyEvent>& out);  // the calls parser's complete calls, as events

  ReplyParserOptions options_;
  State state_;
  std::string pending_;  // text not yet emitted in the current state
  std::string block_;    // the tool-call block so far, from its "\n\n<｜DSML｜ calls"
  DsmlCallsParser calls_parser_;
  int next_call_ = 0;
  bool finished_ = false;
  std::vector<std::string> warnings_;
  bool cut_off_ = false;
  bool block_in_reasoning_ = false;  // the tool-call block opened inside the reasoning
  std::string block_error_;          // why the block in invalid_block state failed
  // The last few bytes emitted of each kind, to find special tokens that span two deltas.
  std::string reasoning_tail_, content_tail_;
  std::vector<std::string_view> tokens_in_reasoning_, tokens_in_content_;
};

// The whole reply at once; the same result as streaming it.
struct ParsedReply {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
  std::vector<std::string> warnings;
};
ParsedReply parse_reply(std::string_view text, const ReplyParserOptions& options = {});
// Adds events to a result (deltas concatenated), e.g. to collect a stream.
void collect_reply_events(ParsedReply& reply, const std::vector<ReplyEvent>& events);
// The assistant message in the form the prompt encoder takes back (and the reference parser
// returns): {"role", "content", "reasoning_content", "tool_calls": [{"id", "type", "function"}]}.
nlohmann::ordered_json reply_to_message(const ParsedReply& reply);

}  // namespace ds41
