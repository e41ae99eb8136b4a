// The DeepSeek-V4.1 prompt format: OpenAI-style messages -> the prompt text the model reads.
//
// Reproduces the release's `encoding/encoding.py` (`encode_messages`) byte for byte: there is no
// chat template at the pinned revision, that encoder is the format (spec D.4). Messages are
// nlohmann::ordered_json because key order is model input (tool schemas are serialized in
// document order, as Python dicts keep it).
//
// Accepted message fields (everything else is ignored, as in the reference):
//   role             system | user | assistant | tool | latest_reminder
//   content          string, array of content blocks, or null/absent (not null for user, tool and
//                    latest_reminder: the reference would print Python's "None" or fail)
//   content_blocks   array of content blocks (the reference's internal form of array content)
//   reasoning_content  string (assistant)
//   tool_calls       [{id?, function: {name, arguments}}] (assistant; arguments: object, JSON
//                    string, doubly encoded JSON string, or any other value)
//   tool_call_id     string (tool)
//   tools            [{function: {...}}] (rendered in system messages; any message carrying
//                    tools turns drop_thinking off)
//   response_format  any JSON (system messages)
//   task             action | query | authority | domain | title | read_url
//   wo_eos           truthy: assistant turn without the end-of-sentence token
// Content blocks: {type: text, text}, {type: image_url, image_url: URL | {url}},
// {type: image, source|url|data}, {type: tool_result, tool_use_id, content: string | blocks};
// other types render as "[Unsupported TYPE]" in user messages.
//
// Note (reference behaviour, kept): tools are rendered only in system messages, so top-level
// tools given with a conversation that does not start with a system message are not shown to
// the model (they still turn drop_thinking off); a server should put them on a system message.
//
// Deviations, all on input the reference mishandles: unknown roles are errors everywhere (the
// reference silently drops them before the last user turn in thinking mode), null content where
// the reference would print "None", and non-string names/texts/ids are errors; the context is
// validated like the messages. Tool-call argument strings that only Python's json.loads accepts
// (NaN, Infinity, lone surrogate escapes) are kept as one "arguments" string.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds41 {

enum class ThinkingMode { chat, thinking };

struct PromptOptions {
  ThinkingMode thinking_mode = ThinkingMode::chat;
  // 1..100, rendered only in thinking mode ("high" = 75 is the reference's default).
  int reasoning_effort = 75;
  // Thinking mode: strip the reasoning of assistant turns before the last user turn. Ignored
  // (off) when any message carries tools.
  bool drop_thinking = true;
  // Start with the BOS text; never emitted when continuing a context.
  bool add_bos = true;
};

struct EncodedPrompt {
  std::string text;
  // Byte ranges [begin, end) of `text` that hold client text (message content, reasoning, tool
  // results, tool-call names and arguments), ascending: tokenize with Tokenizer::encode(text,
  // text_spans) so that a special-token string typed there stays text, as only the template may
  // insert control tokens. `text` itself is byte-identical to the official encoder's.
  std::vector<std::pair<size_t, size_t>> text_spans;
  // One record per image placeholder of `messages` (not of the context), in prompt order:
  // {"type": "image", "url": ...} or the source/url/data fields of an {"type": "image"} block.
  std::vector<nlohmann::ordered_json> images;
};

// Encodes `messages` as the continuation of `context` (messages already in the sequence; empty:
// a fresh prompt). Throws ds41::Error naming the message and field for malformed input.
EncodedPrompt encode_prompt(const nlohmann::ordered_json& messages, const PromptOptions& options,
                            const nlohmann::ordered_json& context = nlohmann::ordered_json::array());

// "low" (50), "high" (75), "max" (100) or an integer 1..100 ("75"); anything else is an error.
int parse_reasoning_effort(std::string_view text);
// The same from a JSON value: an integer 1..100 or one of the names (not a float or a bool).
int reasoning_effort_from_json(const nlohmann::ordered_json& value);
ThinkingMode parse_thinking_mode(std::string_view text);  // "chat" | "thinking"

// A conversation as the reference's `load_cases` reads it from a JSON file.
struct PromptCase {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json context = nlohmann::ordered_json::array();
  std::optional<ThinkingMode> thinking_mode;
  std::optional<int> reasoning_effort;
};
// Accepts {"messages": [...], "tools": [...], "context": [...], "thinking_mode": ...,
// "reasoning_effort": ...}, a bare message array, or an array of such objects. Top-level tools
// are attached to the first message, as the reference does.
std::vector<PromptCase> load_prompt_cases(const nlohmann::ordered_json& file);

}  // namespace ds41
