// The reply parser: streaming at every split equals one-shot, markup never in a delta, malformed
// DSML returned as content with a warning, and agreement with the official parser
// (parse_message_from_completion_text of encoding.py) on the recorded samples in
// tests/data/reply_parsing (see the README there).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/prompt_encoder.h"
#include "text/reply_parser.h"

namespace ds41 {
namespace {

using J = nlohmann::ordered_json;
using Kind = ReplyEvent::Kind;

const std::string EOS = "<｜end▁of▁sentence｜>";

std::string call_text(const std::string& name, const std::vector<std::array<std::string, 3>>& params) {
  std::string s = "<｜DSML｜ invoke name=\"" + name + "\">\n";
  for (const auto& [k, v, is_str] : params)
    s += "<｜DSML｜ parameter name=\"" + k + "\" string=\"" + is_str + "\">" + v + "</｜DSML｜ parameter>\n";
  return s + "</｜DSML｜ invoke>";
}
std::string calls_block(const std::vector<std::string>& calls) {
  std::string s = "\n\n<｜DSML｜ calls>\n";
  for (size_t i = 0; i < calls.size(); ++i) s += (i ? "\n" : "") + calls[i];
  return s + "\n</｜DSML｜ calls>";
}

// A thinking-mode reply with reasoning, content and two tool calls (multi-byte text throughout).
const std::string kReply = "Need weather 🌦 and a search.\n\nFirst the weather.</think>Checking both — one moment." +
                           calls_block({call_text("get_weather", {{{"location", "Beijing", "true"}, {"days", "3", "false"}}}),
                                        call_text("search", {{{"query", "多行\n\"quoted\" <b>", "true"},
                                                              {"filters", "{\"lang\": [\"zh\"], \"safe\": true}", "false"}}})}) +
                           EOS;

ReplyParserOptions thinking_options() {
  ReplyParserOptions o;
  o.thinking_mode = ThinkingMode::thinking;
  return o;
}

// Adjacent deltas of one kind joined: the stream's content independent of its chunking.
std::vector<std::string> normalized(const std::vector<ReplyEvent>& events) {
  std::vector<std::string> out;
  Kind last = Kind::warning;
  for (const ReplyEvent& e : events) {
    const bool delta = e.kind == Kind::reasoning || e.kind == Kind::content;
    if (delta && !out.empty() && last == e.kind) {
      out.back() += e.text;
    } else if (e.kind == Kind::tool_call) {
      out.push_back("T:" + e.tool_call.id + "|" + e.tool_call.name + "|" + e.tool_call.arguments);
    } else {
      out.push_back(std::string(e.kind == Kind::reasoning ? "R:" : e.kind == Kind::content ? "C:" : "W:") + e.text);
    }
    last = e.kind;
  }
  return out;
}

std::vector<ReplyEvent> stream(const std::string& text, const std::vector<size_t>& cuts, const ReplyParserOptions& o) {
  ReplyParser p(o);
  std::vector<ReplyEvent> all;
  size_t prev = 0;
  for (size_t c : cuts) {
    auto ev = p.feed(std::string_view(text).substr(prev, c - prev));
    all.insert(all.end(), ev.begin(), ev.end());
    prev = c;
  }
  auto ev = p.feed(std::string_view(text).substr(prev));
  all.insert(all.end(), ev.begin(), ev.end());
  ev = p.finish();
  all.insert(all.end(), ev.begin(), ev.end());
  return all;
}

bool splits_utf8(const std::string& s) {
  if (s.empty()) return false;
  size_t i = s.size();
  size_t k = 0;
  while (k < 4 && i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++k;
  if (i == 0) return true;
  const auto lead = static_cast<unsigned char>(s[i - 1]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return k + 1 != need;
}

TEST(ReplyParser, OneShotReasoningContentAndTwoToolCalls) {
  const ParsedReply r = parse_reply(kReply, thinking_options());
  EXPECT_EQ(r.reasoning, "Need weather 🌦 and a search.\n\nFirst the weather.");
  EXPECT_EQ(r.content, "Checking both — one moment.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].id, "call_0");
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"location": "Beijing", "days": 3})");
  EXPECT_EQ(r.tool_calls[1].id, "call_1");
  EXPECT_EQ(r.tool_calls[1].name, "search");
  EXPECT_EQ(r.tool_calls[1].arguments, R"({"query": "多行\n\"quoted\" <b>", "filters": {"lang": ["zh"], "safe": true}})");
  EXPECT_TRUE(r.warnings.empty()) << r.warnings[0];
}

TEST(ReplyParser, EveryByteBoundaryGivesTheOneShotEvents) {
  const auto o = thinking_options();
  const auto want = normalized(stream(kReply, {}, o));
  ASSERT_EQ(want.size(), 4u);  // reasoning, content, two tool calls
  for (size_t k = 0; k <= kReply.size(); ++k) ASSERT_EQ(normalized(stream(kReply, {k}, o)), want) << "split at " << k;
  // Byte by byte: the same, and no delta ever holds markup or half a character.
  std::vector<size_t> every(kReply.size());
  for (size_t k = 0; k < kReply.size(); ++k) every[k] = k;
  const auto events = stream(kReply, every, o);
  EXPECT_EQ(normalized(events), want);
  for (const ReplyEvent& e : events) {
    if (e.kind != Kind::reasoning && e.kind != Kind::content) continue;
    for (const char* markup : {"｜DSML｜", "</think>", "<｜end", "\n\n<"}) EXPECT_EQ(e.text.find(markup), std::string::npos) << e.text;
    EXPECT_FALSE(splits_utf8(e.text)) << e.text;
  }
}

TEST(ReplyParser, MarkupIsHeldBackUntilDecided) {
  ReplyParser p;  // chat mode
  auto ev = p.feed("Hello\n\n<｜DS");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "Hello");  // "\n\n<｜DS" may open a tool-call block
  ev = p.feed("ML｜ callx");           // it does not
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "\n\n<｜DSML｜ callx");
  ev = p.feed("<｜end▁of");
  EXPECT_TRUE(ev.empty());
  ev = p.feed("▁sentence｜>");
  EXPECT_TRUE(ev.empty());
  ev = p.finish();
  ASSERT_EQ(ev.size(), 1u);  // the DSML marker in the content is reported
  EXPECT_EQ(ev[0].kind, Kind::warning);

  ReplyParser q(thinking_options());
  auto e = q.feed("abc</thi");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "abc");
  e = q.feed("nk>x");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, Kind::content);
  EXPECT_EQ(e[0].text, "x");
}

TEST(ReplyParser, MalformedOrCutBlocksAreLeftOutOfTheContentWithAWarning) {
  // A parameter that never closes (the reply was cut off): no call, no markup in the content, the
  // unfinished block in a warning.
  const std::string broken = "Sure.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"k\" string=\"true\">v";
  ParsedReply r = parse_reply(broken);
  EXPECT_EQ(r.content, "Sure.");
  EXPECT_TRUE(r.tool_calls.empty());
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("cut off at the end of the reply"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("string=\"true\">v"), std::string::npos) << "the cut text is in the warning";

  // Cut off after a complete first call: that call is reported.
  const std::string first_whole = "\n\n<｜DSML｜ calls>\n" + call_text("f", {{{"a", "1", "false"}}}) + "\n<｜DSML｜ invoke name=\"g\">\n<｜DSML｜ par";
  r = parse_reply(first_whole);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("1 complete call(s) reported"), std::string::npos) << r.warnings[0];

  // A malformed block (not cut off): no call of it, even a complete first one; none of it is
  // content; the end-of-sentence token still ends the message and the rest is content.
  const std::string second_bad = "\n\n<｜DSML｜ calls>\n" + call_text("f", {}) + "\n<｜DSML｜ invoke nam=\"g\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  r = parse_reply(second_bad + EOS + "tail");
  EXPECT_EQ(r.content, "tail");
  EXPECT_TRUE(r.tool_calls.empty());
  ASSERT_EQ(r.warnings.size(), 2u);  // malformed block (with its text), text after EOS
  EXPECT_NE(r.warnings[0].find("malformed tool-call block left out"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("invoke nam=\"g\""), std::string::npos) << r.warnings[0];

  // Non-string values are inserted as written, as the reference does: flagged, not changed.
  r = parse_reply(calls_block({call_text("f", {{{"k", "abc", "false"}}})}));
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"k": abc})");
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("not valid JSON"), std::string::npos);

  // Text after the calls block is content.
  r = parse_reply(calls_block({call_text("f", {})}) + "more" + EOS);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.content, "more");
  ASSERT_EQ(r.warnings.size(), 1u);

  // Unclosed reasoning stays reasoning.
  r = parse_reply("still thinking", thinking_options());
  EXPECT_EQ(r.reasoning, "still thinking");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.warnings.size(), 1u);
}

TEST(ReplyParser, MissingEndOfSentenceIsFine) {
  const ParsedReply r = parse_reply("r</think>answer", thinking_options());
  EXPECT_EQ(r.reasoning, "r");
  EXPECT_EQ(r.content, "answer");
  EXPECT_TRUE(r.warnings.empty());
}

TEST(ReplyParser, ToolCallIdPrefix) {
  ReplyParserOptions o;
  o.tool_call_id_prefix = "chatcmpl-7-";
  const ParsedReply r = parse_reply(calls_block({call_text("a", {}), call_text("b", {})}), o);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].id, "chatcmpl-7-0");
  EXPECT_EQ(r.tool_calls[1].id, "chatcmpl-7-1");
}

TEST(ReplyParser, NothingAfterFinish) {
  ReplyParser p;
  p.finish();
  EXPECT_THROW(p.feed("x"), Error);
  EXPECT_THROW(p.finish(), Error);
}

// Parsing a reply and encoding it back as an assistant turn reproduces the reply (the encoder and
// the parser agree on the grammar).
TEST(ReplyParser, ParsedReplyEncodesBackToTheSameText) {
  const ParsedReply r = parse_reply(kReply, thinking_options());
  J messages = J::array({J{{"role", "user"}, {"content", "U"}}, reply_to_message(r)});
  PromptOptions o;
  o.thinking_mode = ThinkingMode::thinking;
  const std::string prompt = encode_prompt(messages, o).text;
  const std::string header = "<｜Assistant｜><think>";
  EXPECT_EQ(prompt.substr(prompt.find(header) + header.size()), kReply);
}

J load_official_cases() {
  std::ifstream f(std::filesystem::path(DS41_SOURCE_DIR) / "tests/data/reply_parsing/official_parser_cases.json");
  return J::parse(std::string(std::istreambuf_iterator<char>(f), {}));
}

ReplyParserOptions options_for(const J& c) {
  ReplyParserOptions o;
  o.thinking_mode = parse_thinking_mode(c["thinking_mode"].get<std::string>());
  return o;
}

TEST(ReplyParser, AgreesWithTheOfficialParser) {
  const J cases = load_official_cases();
  ASSERT_GE(cases.size(), 30u);
  for (const J& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const ParsedReply r = parse_reply(c["text"].get<std::string>(), options_for(c));
    if (c.contains("expected")) {
      const J& e = c["expected"];
      EXPECT_EQ(r.reasoning, e["reasoning_content"].get<std::string>());
      EXPECT_EQ(r.content, e["content"].get<std::string>());
      ASSERT_EQ(r.tool_calls.size(), e["tool_calls"].size());
      for (size_t i = 0; i < r.tool_calls.size(); ++i) {
        EXPECT_EQ(r.tool_calls[i].name, e["tool_calls"][i]["name"].get<std::string>());
        EXPECT_EQ(r.tool_calls[i].arguments, e["tool_calls"][i]["arguments"].get<std::string>());
      }
      // Accepted by the reference: no warning, except for arguments that are not JSON.
      for (const std::string& w : r.warnings) EXPECT_NE(w.find("not valid JSON"), std::string::npos) << w;
    } else {
      EXPECT_FALSE(r.warnings.empty()) << "the reference rejects this: " << c["error"].get<std::string>();
    }
  }
}

TEST(ReplyParser, EverySplitOfEveryOfficialSampleGivesTheOneShotEvents) {
  std::mt19937 rng(7);
  for (const J& c : load_official_cases()) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string text = c["text"].get<std::string>();
    const auto o = options_for(c);
    const auto want = normalized(stream(text, {}, o));
    for (size_t k = 0; k <= text.size(); ++k) ASSERT_EQ(normalized(stream(text, {k}, o)), want) << "split at " << k;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<size_t> cuts;
      for (size_t k = 1; k < text.size(); ++k)
        if (rng() % 4 == 0) cuts.push_back(k);
      ASSERT_EQ(normalized(stream(text, cuts, o)), want);
    }
  }
}

}  // namespace
}  // namespace ds41
