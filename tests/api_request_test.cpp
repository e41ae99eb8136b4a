#include "server/api_request.h"

#include <gtest/gtest.h>

#include "server/api_error.h"
#include "runtime/prefix_cache.h"

namespace ds41 {
namespace {

using json = nlohmann::ordered_json;

struct BadCase {
  const char* body;
  const char* param;  // expected ApiError::param (prefix match)
};

TEST(ApiRequest, MalformedChatRequestsNameTheField) {
  const BadCase cases[] = {
      {R"([])", ""},
      {R"({})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [1]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "audio"}]}]})", "messages[0].content[0].type"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0].text"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]})",
       "messages[0].content[0].image_url.url"},
      {R"({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]})",
       "messages[0].content[0]"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})", "messages[0].tool_calls[0].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 9})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", "stop[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [""]})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": 1})", "stream_options"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"})", "reasoning_effort"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": 0})", "reasoning_effort"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools[0].function"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "seed": "1"})", "seed"},
      {R"({"messages": [{"role": "user", "content": "x"}], "model": 3})", "model"},
      {R"({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "maybe"}})", "thinking.type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})", "response_format.type"},
  };
  ApiDefaults d;
  d.max_images = 1;
  for (const auto& c : cases) {
    try {
      parse_chat_completions(json::parse(c.body), d);
      ADD_FAILURE() << "accepted: " << c.body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param.rfind(c.param, 0), 0u) << c.body << " -> param " << e.param << ": " << e.what();
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  // Too many images.
  json two = json::parse(R"({"messages": [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]})");
  EXPECT_THROW(parse_chat_completions(two, d), ApiError);
}

TEST(ApiRequest, ChatFieldsAreReadAndNormalised) {
  ApiDefaults d;
  d.sampling.temperature = 1.0;
  auto r = parse_chat_completions(json::parse(R"({
    "model": "ds41", "temperature": 0, "top_p": 0.5, "max_tokens": 7, "seed": 3, "stop": "END",
    "stream": true, "stream_options": {"include_usage": true}, "reasoning_effort": "max",
    "messages": [
      {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}}})"), d);
  EXPECT_EQ(r.sampling.temperature, 0);
  EXPECT_EQ(r.sampling.top_p, 0.5);
  EXPECT_EQ(r.sampling.seed, 3u);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream && r.include_usage && r.thinking);
  EXPECT_EQ(r.reasoning_effort, 100);
  EXPECT_EQ(r.messages[0], json::parse(R"({"role": "system", "content": "a\n\nb"})"));
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"], "{\"x\":1}");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
  EXPECT_EQ(r.tool_choice, "function:f");
}

TEST(ApiRequest, AnthropicMessagesMapOntoTheChatForm) {
  ApiDefaults d;
  auto r = parse_anthropic_messages(json::parse(R"({
    "model": "ds41", "max_tokens": 100, "system": [{"type": "text", "text": "S"}],
    "stop_sequences": ["X"], "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "hi"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": "a"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "res"}]}],
    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any"}})"), d);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0], json::parse(R"({"role": "system", "content": "S"})"));
  EXPECT_EQ(r.messages[1]["content"][1]["image_url"]["url"], "data:image/png;base64,AA");
  EXPECT_EQ(r.messages[2]["reasoning_content"], "hmm");
  EXPECT_EQ(r.messages[2]["content"], "ok");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"], "{\"q\":\"a\"}");
  EXPECT_EQ(r.messages[3], json::parse(R"({"role": "tool", "tool_call_id": "t1", "content": "res"})"));
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["type"], "object");
  EXPECT_EQ(r.tool_choice, "required");
  EXPECT_TRUE(r.thinking);
  EXPECT_EQ(r.max_tokens, 100);
  // max_tokens is required there; images only in user turns.
  EXPECT_THROW(parse_anthropic_messages(json::parse(R"({"messages": [{"role": "user", "content": "x"}]})"), d), ApiError);
  EXPECT_THROW(parse_anthropic_messages(json::parse(R"({"max_tokens": 5, "messages": [{"role": "assistant", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]}]})"), d), ApiError);
}

TEST(ApiRequest, CompletionsPrompt) {
  ApiDefaults d;
  auto r = parse_completions(json::parse(R"({"prompt": "Once", "max_tokens": 5})"), d);
  EXPECT_EQ(r.prompt, "Once");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(parse_completions(json::parse(R"({"prompt": ["Once"]})"), d).max_tokens, 16);
  EXPECT_THROW(parse_completions(json::parse(R"({"prompt": ""})"), d), ApiError);
  EXPECT_THROW(parse_completions(json::parse(R"({"prompt": [1, 2]})"), d), ApiError);
  // echo and logprobs (0-20 alternatives; null: none); chat's logprobs / top_logprobs.
  const auto echo = parse_completions(json::parse(R"({"prompt": "x", "echo": true, "logprobs": 3})"), d);
  EXPECT_TRUE(echo.echo);
  EXPECT_EQ(echo.logprobs, 3);
  EXPECT_EQ(parse_completions(json::parse(R"({"prompt": "x", "logprobs": null})"), d).logprobs, -1);
  EXPECT_THROW(parse_completions(json::parse(R"({"prompt": "x", "logprobs": 21})"), d), ApiError);
  EXPECT_THROW(parse_completions(json::parse(R"({"prompt": "x", "logprobs": true})"), d), ApiError);
  const auto chat = [&](const char* extra) {
    return parse_chat_completions(json::parse(std::string(R"({"messages": [{"role": "user", "content": "hi"}])") + extra + "}"), d);
  };
  EXPECT_EQ(chat("").logprobs, -1);
  EXPECT_EQ(chat(R"(, "logprobs": true)").logprobs, 0);
  EXPECT_EQ(chat(R"(, "logprobs": true, "top_logprobs": 20)").logprobs, 20);
  EXPECT_THROW(chat(R"(, "top_logprobs": 2)"), ApiError);
  EXPECT_THROW(chat(R"(, "logprobs": true, "top_logprobs": -1)"), ApiError);
  EXPECT_EQ(chat("").n, 1);
  EXPECT_EQ(chat(R"(, "n": 8)").n, 8);
  EXPECT_THROW(chat(R"(, "n": 9)"), ApiError);
  EXPECT_THROW(chat(R"(, "n": 0)"), ApiError);
}

TEST(PrefixCache, LongestStrictPrefixWinsAndBytesAreBounded) {
  SequenceState a, b;
  a.pos = 2;
  a.token_history = {1, 2};
  b.pos = 3;
  b.token_history = {1, 2, 3};
  PrefixCache cache(1 << 20);
  cache.insert({1, 2}, a);
  cache.insert({1, 2, 3}, b);
  auto hit = cache.lookup({1, 2, 3, 4});
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->pos, 3);
  hit = cache.lookup({1, 2, 3});  // the equal-length entry is not usable: one token must remain
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->pos, 2);
  EXPECT_FALSE(cache.lookup({2, 1}));
  EXPECT_EQ(cache.hits(), 2);
  EXPECT_EQ(cache.misses(), 1);
  // A cache that holds one entry keeps the most recent.
  PrefixCache small(sequence_state_bytes(b) + 3 * 4);
  small.insert({1, 2}, a);
  small.insert({1, 2, 3}, b);
  EXPECT_EQ(small.entries(), 1u);
  EXPECT_TRUE(small.lookup({1, 2, 3, 4}));
  EXPECT_LE(small.bytes(), sequence_state_bytes(b) + 12);
}

}  // namespace
}  // namespace ds41
