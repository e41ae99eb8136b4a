// A generated corpus of DSML tool-call replies through the streaming reply parser (issue #51):
// 480 shapes - parameters of every JSON type, nested arrays and objects, unicode and markup-like
// text in values, one to three calls, calls after reasoning, inside the reasoning and in chat mode,
// content before the calls - each rendered by the official prompt encoder (what the model writes)
// and fed
//   - whole, split at every byte, and as the V3 tokenizer's tokens through the stream decoder (the
//     serving path): every call parsed with its arguments, reasoning and content exact;
//   - cut off at every byte (a token limit): no markup ever reaches the content or the reasoning,
//     the content and reasoning are prefixes of the whole reply's, exactly the calls whose invoke
//     had closed are reported, and a cut inside a block is reported as such.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_paths.h"
#include "test_tokenizer_files.h"
#include "text/prompt_encoder.h"
#include "text/reply_parser.h"
#include "text/stream_decoder.h"
#include "text/tokenizer.h"

namespace ds41 {
namespace {

using J = nlohmann::ordered_json;

struct Shape {
  ThinkingMode mode = ThinkingMode::chat;
  bool calls_in_reasoning = false;
  std::string reasoning, content;
  J calls = J::array();  // [{"name", "arguments": {...}}]
  std::string text;      // the reply as the model writes it, ending with EOS
};

constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";

// Values of every JSON type, nested to depth 3, with unicode and markup-like characters.
J value(std::mt19937& rng, int depth) {
  static const std::vector<std::string> strings = {
      "Beijing", "多行\n文本", "\"quoted\" and \\ backslash", "<b>bold</b> & <i>", "emoji 🌦🚀", "", " spaces ",
      "</think> inside a value", "a=\"1\" string=\"true\"", "tab\tand\rreturn", "Ünïcödé ßø", "{\"looks\": \"like json\"}",
      "｜fullwidth bar｜", "line1\n\nline3"};
  const int kind = int(rng() % (depth >= 3 ? 6u : 8u));
  switch (kind) {
    case 0: return strings[rng() % strings.size()];
    case 1: return int64_t(rng() % 2001) - 1000;
    case 2: return double(int64_t(rng() % 20001) - 10000) / 64.0;  // exact in binary: prints back the same
    case 3: return bool(rng() % 2);
    case 4: return nullptr;
    case 5: return strings[rng() % strings.size()] + std::to_string(rng() % 100);
    case 6: {
      J a = J::array();
      for (unsigned i = rng() % 4; i > 0; --i) a.push_back(value(rng, depth + 1));
      return a;
    }
    default: {
      J o = J::object();
      for (unsigned i = rng() % 4; i > 0; --i) o["k" + std::to_string(i) + (rng() % 3 == 0 ? "é" : "")] = value(rng, depth + 1);
      return o;
    }
  }
}

// The assistant turn as the official encoder renders it, without the header: what the model
// writes ("<think>" is part of the prompt in thinking mode, so the reply starts after it).
std::string render_reply(const Shape& s, const J& calls_json, const std::string& reasoning, const std::string& content) {
  J msg = {{"role", "assistant"}, {"content", content}, {"tool_calls", calls_json}};
  if (s.mode == ThinkingMode::thinking) msg["reasoning_content"] = reasoning;
  J messages = J::array({J{{"role", "user"}, {"content", "Q"}}, msg});
  J tools = J::array();
  PromptOptions o;
  o.thinking_mode = s.mode;
  const std::string prompt = encode_prompt(messages, o).text;
  const std::string header = "<｜Assistant｜>";
  std::string reply = prompt.substr(prompt.rfind(header) + header.size());
  const std::string opener = s.mode == ThinkingMode::thinking ? "<think>" : "</think>";
  if (reply.rfind(opener, 0) == 0) reply.erase(0, opener.size());
  return reply;
}

std::vector<Shape> corpus() {
  std::mt19937 rng(20261206);
  static const std::vector<std::string> names = {"get_weather", "search", "run_code", "send_email", "f", "lookup_ü",
                                                 "tool.with.dots", "a-b"};
  static const std::vector<std::string> texts = {"", "Sure.", "Let me check that — one moment.", "多语言 content 🌍",
                                                 "Plain words.\nTwo lines.", "x < y > z"};
  std::vector<Shape> out;
  for (int i = 0; i < 480; ++i) {
    Shape s;
    s.mode = i % 3 == 0 ? ThinkingMode::chat : ThinkingMode::thinking;
    s.calls_in_reasoning = s.mode == ThinkingMode::thinking && i % 5 == 1;
    s.reasoning = s.mode == ThinkingMode::thinking ? "Reasoning " + std::to_string(i) + " 🤔 about it." : "";
    s.content = texts[size_t(i) % texts.size()];
    J calls_json = J::array();
    for (unsigned c = 1 + rng() % 3; c > 0; --c) {
      J args = J::object();
      for (unsigned k = rng() % 5; k > 0; --k) args["p" + std::to_string(k) + (rng() % 4 == 0 ? "_名" : "")] = value(rng, 0);
      const std::string name = names[rng() % names.size()];
      s.calls.push_back({{"name", name}, {"arguments", args}});
      calls_json.push_back({{"type", "function"}, {"function", {{"name", name}, {"arguments", args.dump()}}}});
    }
    if (!s.calls_in_reasoning) {
      s.text = render_reply(s, calls_json, s.reasoning, s.content);
    } else {
      // The block inside the reasoning, the reasoning going on after it, then the content.
      Shape chat = s;
      chat.mode = ThinkingMode::chat;
      const std::string block = render_reply(chat, calls_json, "", "");  // "\n\n<｜DSML｜ calls>...</...calls>" + EOS
      const std::string calls_only = block.substr(0, block.size() - kEos.size());
      s.text = s.reasoning + calls_only + " More reasoning.</think>" + s.content + std::string(kEos);
      s.reasoning += " More reasoning.";
    }
    out.push_back(std::move(s));
  }
  return out;
}

struct Outcome {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  std::vector<std::string> warnings;
};

Outcome run_pieces(const Shape& s, const std::vector<std::string>& pieces, bool cut_off) {
  ReplyParserOptions o;
  o.thinking_mode = s.mode;
  ReplyParser p(o);
  ParsedReply r;
  for (const std::string& piece : pieces) collect_reply_events(r, p.feed(piece));
  collect_reply_events(r, p.finish(cut_off));
  return {r.reasoning, r.content, r.tool_calls, r.warnings};
}

void expect_complete(const Shape& s, const Outcome& got, const std::string& how) {
  SCOPED_TRACE(how);
  EXPECT_EQ(got.reasoning, s.reasoning);
  EXPECT_EQ(got.content, s.content);
  ASSERT_EQ(got.calls.size(), s.calls.size()) << s.text;
  for (size_t i = 0; i < got.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, s.calls[i]["name"].get<std::string>());
    const J args = J::parse(got.calls[i].arguments, nullptr, false);
    ASSERT_FALSE(args.is_discarded()) << got.calls[i].arguments;
    EXPECT_EQ(args, s.calls[i]["arguments"]) << got.calls[i].arguments;
  }
  for (const std::string& w : got.warnings)
    EXPECT_NE(w.find("inside the reasoning"), std::string::npos) << "unexpected warning: " << w;
}

bool has_markup(const std::string& text) {
  return text.find("｜DSML｜") != std::string::npos || text.find("<｜") != std::string::npos ||
         text.find("</think>") != std::string::npos;
}

TEST(DsmlCorpus, EveryShapeParsesWholeSplitAtEveryByteAndAsTokens) {
  const std::vector<Shape> shapes = corpus();
  ASSERT_GE(shapes.size(), 400u);
  std::optional<Tokenizer> tok;
  if (std::filesystem::exists(test::v3_tokenizer_path())) tok = Tokenizer::load(test::v3_tokenizer_path());
  int64_t parses = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    SCOPED_TRACE("shape " + std::to_string(i));
    expect_complete(s, run_pieces(s, {s.text}, false), "whole");
    for (size_t k = 1; k < s.text.size(); ++k) {
      const Outcome got = run_pieces(s, {s.text.substr(0, k), s.text.substr(k)}, false);
      ++parses;
      if (got.content != s.content || got.reasoning != s.reasoning || got.calls.size() != s.calls.size()) {
        expect_complete(s, got, "split at byte " + std::to_string(k));
        break;
      }
    }
    if (tok) {
      // As the server feeds it: token by token through the stream decoder (the EOS id ends the
      // reply, its text not passed on).
      const std::string body = s.text.substr(0, s.text.size() - kEos.size());
      StreamDecoder dec(*tok);
      std::vector<std::string> pieces;
      for (int32_t id : tok->encode(body)) pieces.push_back(dec.push(id));
      pieces.push_back(dec.flush());
      expect_complete(s, run_pieces(s, pieces, false), "V3 tokens");
    }
  }
  EXPECT_GT(parses, 100000);
}

TEST(DsmlCorpus, ACutAtEveryByteLeaksNoMarkupAndReportsOnlyClosedCalls) {
  const std::vector<Shape> shapes = corpus();
  int64_t cuts_in_blocks = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    SCOPED_TRACE("shape " + std::to_string(i));
    const std::string body = s.text.substr(0, s.text.size() - kEos.size());
    const size_t block_at = body.find("\n\n<｜DSML｜ calls");
    for (size_t k = 0; k <= body.size(); ++k) {
      const std::string cut = body.substr(0, k);
      const Outcome got = run_pieces(s, {cut}, /*cut_off=*/true);
      SCOPED_TRACE("cut at byte " + std::to_string(k));
      ASSERT_FALSE(has_markup(got.content)) << got.content;
      ASSERT_FALSE(has_markup(got.reasoning)) << got.reasoning;
      ASSERT_EQ(s.content.compare(0, got.content.size(), got.content), 0) << got.content;
      ASSERT_EQ(s.reasoning.compare(0, got.reasoning.size(), got.reasoning), 0) << got.reasoning;
      // Exactly the calls whose closing tag had begun before the cut ("</｜DSML｜ invoke": every
      // parameter is known then).
      size_t closed = 0;
      for (size_t at = cut.find("</｜DSML｜ invoke"); at != std::string::npos; at = cut.find("</｜DSML｜ invoke", at + 1))
        ++closed;
      ASSERT_EQ(got.calls.size(), closed);
      for (size_t c = 0; c < closed; ++c) {
        EXPECT_EQ(got.calls[c].name, s.calls[c]["name"].get<std::string>());
        EXPECT_EQ(J::parse(got.calls[c].arguments, nullptr, false), s.calls[c]["arguments"]);
      }
      // A cut inside the block (before its closing tag) is reported as a cut-off block.
      const bool inside = block_at != std::string::npos && k > block_at + 2 + std::string("<｜DSML｜ calls").size() &&
                          cut.find("</｜DSML｜ calls>") == std::string::npos;
      if (inside) {
        ++cuts_in_blocks;
        bool reported = false;
        for (const std::string& w : got.warnings) reported |= w.find("cut off") != std::string::npos;
        ASSERT_TRUE(reported) << "a cut inside the tool-call block was not reported";
      }
    }
  }
  EXPECT_GT(cuts_in_blocks, 50000);
}

}  // namespace
}  // namespace ds41
