// The three generation APIs — OpenAI chat completions, OpenAI (legacy) completions, Anthropic
// messages — parsed and validated into one request shape. Every malformed field is an ApiError
// (400) naming the field, raised before any work is queued.
//
// Chat messages are normalised to the prompt encoder's OpenAI-style form: role + content (string
// or blocks), assistant `tool_calls` with JSON-string arguments, `reasoning_content`, tool results
// as role "tool" with `tool_call_id`. Anthropic content blocks (text, image, tool_use,
// tool_result, thinking) map onto the same form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"

namespace ds41 {

enum class ApiKind { ChatCompletions, Completions, AnthropicMessages };

struct ApiRequest {
  ApiKind kind = ApiKind::ChatCompletions;
  std::string model;
  // ordered_json: key order is model input (tool schemas are rendered in document order).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // chat / messages
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();     // [{"type":"function","function":{...}}]
  std::string tool_choice = "auto";                   // auto | none | required | function:<name>
  std::string prompt;                                 // completions
  bool thinking = false;
  int reasoning_effort = 75;
  SamplerOptions sampling;
  int64_t max_tokens = -1;  // -1 = until the context is full
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
  nlohmann::ordered_json response_format;  // OpenAI response_format (json_schema passed to the encoder)
  // -1: none; 0..20: each token's log-probability and this many alternatives (chat logprobs +
  // top_logprobs; completions logprobs).
  int logprobs = -1;
  bool echo = false;  // completions: the prompt leads the text (and its logprobs, with logprobs)
  int n = 1;          // choices (OpenAI n: 1-8); choice i samples with seed + i
};

struct ApiDefaults {
  SamplerOptions sampling;   // server-wide defaults (the model card's T 1.0, top-p 0.95)
  bool thinking = false;
  int reasoning_effort = 75;
  int64_t max_tokens = -1;
  int max_images = 8;
};

ApiRequest parse_chat_completions(const nlohmann::ordered_json& body, const ApiDefaults& d);
ApiRequest parse_completions(const nlohmann::ordered_json& body, const ApiDefaults& d);
ApiRequest parse_anthropic_messages(const nlohmann::ordered_json& body, const ApiDefaults& d);

// reasoning_effort as the APIs spell it: low | medium | high | max | xhigh or an integer 1-100.
int api_reasoning_effort(const nlohmann::ordered_json& v, const std::string& param);

}  // namespace ds41
