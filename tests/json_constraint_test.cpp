// Structured output (text/json_constraint.h): the byte automaton against hand-written documents,
// its shortest completion from every prefix, and token-level walks over the V3 vocabulary: every
// walk that follows the mask ends in a document that parses and validates against its schema,
// within the token budget it was given.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "test_paths.h"
#include "test_tokenizer_files.h"
#include "text/json_constraint.h"
#include "text/tokenizer.h"

namespace ds41 {
namespace {

using json = nlohmann::ordered_json;

// A validator for the supported keywords, written from the JSON Schema text (independent of the
// automaton): what a client's validator checks.
bool validates(const json& v, const json& s) {
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) {
    for (const json& e : s["enum"])
      if (v == e) return true;
    return false;
  }
  if (s.contains("anyOf")) {
    for (const json& alt : s["anyOf"])
      if (validates(v, alt)) return true;
    return false;
  }
  if (s.contains("type") && s["type"].is_array()) {
    for (const json& t : s["type"]) {
      json one = s;
      one["type"] = t;
      if (validates(v, one)) return true;
    }
    return false;
  }
  const std::string type = s.value("type", s.contains("properties") ? "object" : "");
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "array") {
    if (!v.is_array()) return false;
    if (s.contains("items"))
      for (const json& x : v)
        if (!validates(x, s["items"])) return false;
    return true;
  }
  if (type == "object") {
    if (!v.is_object()) return false;
    if (s.contains("required"))
      for (const json& r : s["required"])
        if (!v.contains(r.get<std::string>())) return false;
    if (s.contains("properties")) {
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!s["properties"].contains(it.key())) return false;  // only the listed properties are written
        if (!validates(it.value(), s["properties"][it.key()])) return false;
      }
    }
    return true;
  }
  return true;
}

const json kPerson = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "description": "who"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "kind": {"enum": ["a", "bb", 3, null]},
    "score": {"type": ["number", "null"]},
    "nested": {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "string"}}, "required": ["ok"]},
    "extra": {}
  },
  "required": ["name", "age", "tags", "kind", "nested"],
  "additionalProperties": false
})");

bool accepts(const std::shared_ptr<const JsonGrammar>& g, const std::string& doc) {
  JsonState st(g);
  return st.step(doc) && st.complete();
}

TEST(JsonConstraint, AnyObjectAcceptsJsonObjectsOnly) {
  const auto g = JsonGrammar::any_object();
  for (const char* ok : {"{}", R"({"a":1,"b":[true,null,{"c":"x\n\u00e9 \"q\""}],"d":-1.5e+3,"e":0,"f":{}})", R"({"":[]})"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"[]", "\"x\"", "1", R"({"a"})", R"({"a":01})", "{,}", R"({"a":1,})", R"({"a":tru})",
                          R"({"a":1}})", R"({"a":"x)", "{\"a\":\"\x01\"}", R"({"a":-})", R"({"a":1.})", R"({"a":"\x"})"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  JsonState st(g);
  EXPECT_TRUE(st.step(std::string("{\"a\":1")));
  EXPECT_FALSE(st.complete());
}

TEST(JsonConstraint, SchemaOrderTypesEnumsAndOptionalProperties) {
  const auto g = JsonGrammar::from_schema(kPerson);
  const std::string base = R"({"name":"x","age":3,"tags":["p","q"],"kind":"bb")";
  EXPECT_TRUE(accepts(g, base + R"(,"nested":{"ok":true}})"));
  EXPECT_TRUE(accepts(g, base + R"(,"score":null,"nested":{"ok":false,"note":"n"},"extra":[1,{"z":null}]})"));
  EXPECT_TRUE(accepts(g, R"({"name":"","age":-7,"tags":[],"kind":3,"score":2.5e-1,"nested":{"ok":true}})"));
  EXPECT_TRUE(accepts(g, R"({"name":"","age":0,"tags":[],"kind":null,"nested":{"ok":true}})"));
  EXPECT_FALSE(accepts(g, R"({"age":3,"name":"x","tags":[],"kind":"a","nested":{"ok":true}})")) << "schema order";
  EXPECT_FALSE(accepts(g, R"({"name":"x","age":3,"tags":[],"nested":{"ok":true}})")) << "a required property left out";
  EXPECT_FALSE(accepts(g, R"({"name":"x","age":1.5,"tags":[],"kind":"a","nested":{"ok":true}})")) << "integer";
  EXPECT_FALSE(accepts(g, R"({"name":"x","age":1,"tags":[2],"kind":"a","nested":{"ok":true}})")) << "items";
  EXPECT_FALSE(accepts(g, R"({"name":"x","age":1,"tags":[],"kind":"c","nested":{"ok":true}})")) << "enum";
  EXPECT_FALSE(accepts(g, R"({"name":"x","age":1,"tags":[],"kind":"a","nested":{"ok":true},"other":1})")) << "extra key";
  EXPECT_FALSE(accepts(g, R"({"name":"x","age":1,"tags":[],"kind":"a","score":"s","nested":{"ok":true}})")) << "type list";
  // Unsupported keywords are refused, not silently ignored.
  EXPECT_THROW(JsonGrammar::from_schema(json::parse(R"({"type":"string","pattern":"^a"})")), Error);
  EXPECT_THROW(JsonGrammar::from_schema(json::parse(R"({"anyOf":[{"type":"object"},{"type":"object","properties":{}}]})")), Error);
  EXPECT_THROW(JsonGrammar::from_schema(json::parse(R"({"type":"strin"})")), Error);
}

// From every prefix of valid documents, the shortest completion makes a complete document that
// parses and validates.
TEST(JsonConstraint, ShortestCompletionFromEveryPrefixIsAValidDocument) {
  const std::vector<std::pair<json, std::string>> cases = {
      {kPerson, R"({"name":"x\"y\\u00e9z","age":-30,"tags":["p","q"],"kind":"bb","score":-1.25e+2,"nested":{"ok":true,"note":"n"},"extra":{"k":[1,2]}})"},
      {json::parse(R"({"type":"array","items":{"type":"object","properties":{"v":{"type":"number"}},"required":["v"]}})"),
       R"([{"v":1},{"v":0.5},{"v":-2e3}])"},
      {json::parse(R"({"enum":[10,1,"x"]})"), "10"},
      {json::parse(R"({"type":"boolean"})"), "false"}};
  for (const auto& [schema, doc] : cases) {
    const auto g = JsonGrammar::from_schema(schema);
    ASSERT_TRUE(accepts(g, doc)) << doc;
    ASSERT_TRUE(validates(json::parse(doc), schema)) << doc;
    for (size_t k = 0; k <= doc.size(); ++k) {
      JsonState st(g);
      ASSERT_TRUE(st.step(doc.substr(0, k)));
      const std::string done = doc.substr(0, k) + st.shortest_completion();
      JsonState check(g);
      ASSERT_TRUE(check.step(done) && check.complete()) << done;
      const json v = json::parse(done, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << done;
      EXPECT_TRUE(validates(v, schema)) << done;
    }
  }
}

// Token walks over the V3 vocabulary: random logits, the mask applied, a token drawn among the
// allowed ones; the walk ends when the end of sequence is drawn. Every walk gives a valid
// document within its budget, and the mask never leaves the walk without a token.
TEST(JsonConstraint, MaskedTokenWalksEndInValidDocumentsWithinTheBudget) {
  if (!std::filesystem::exists(test::v3_tokenizer_path())) GTEST_SKIP() << "V3 tokenizer not in the shared assets";
  const Tokenizer tok = Tokenizer::load(test::v3_tokenizer_path());
  const int64_t vocab = tok.vocab_size();
  const int32_t eos = *tok.token_to_id("<｜end▁of▁sentence｜>");
  auto trie = std::make_shared<const TokenTrie>(tok, vocab);
  const std::vector<json> schemas = {json(), kPerson,
                                     json::parse(R"({"type":"object","properties":{"answer":{"enum":["yes","no"]},"why":{"type":"string"}},"required":["answer","why"]})")};
  std::mt19937 rng(51);
  std::vector<float> logits(static_cast<size_t>(vocab));
  int walks = 0;
  for (const json& schema : schemas) {
    const auto g = schema.is_null() ? JsonGrammar::any_object() : JsonGrammar::from_schema(schema);
    // The tightest budget the guarantee covers: one token per byte of the shortest document, and EOS.
    const int tightest = int(JsonState(g).shortest_completion().size()) + 1;
    for (int budget : {tightest, 2 * tightest, 150}) {
      for (int w = 0; w < 2; ++w) {
        const auto made = make_json_constraint(g, trie, eos);
        TokenConstraint& c = *made;
        std::string text;
        bool ended = false;
        for (int64_t left = budget; left > 0 && !ended; --left) {
          uint32_t x = uint32_t(rng());  // cheap noise: a draw per logit of the vocabulary every step
          for (float& l : logits) {
            x = x * 1664525u + 1013904223u;
            l = float(x >> 8) * (8.f / 16777216.f);
          }
          logits[size_t(eos)] += 4.f;  // a model that wants to stop early: the mask must hold it
          c.mask(logits.data(), vocab, left);
          int32_t best = -1;
          for (int64_t i = 0; i < vocab; ++i)
            if (logits[size_t(i)] > -1e30f && (best < 0 || logits[size_t(i)] > logits[size_t(best)])) best = int32_t(i);
          ASSERT_GE(best, 0) << "no token allowed after: " << text;
          ASSERT_TRUE(c.advance(best));
          if (best == eos) ended = true;
          else text += tok.token_bytes(best);
        }
        ++walks;
        ASSERT_TRUE(ended) << "budget " << budget << " ran out: " << text;
        const json v = json::parse(text, nullptr, false);
        ASSERT_FALSE(v.is_discarded()) << text;
        EXPECT_TRUE(v.is_object()) << text;
        if (!schema.is_null()) EXPECT_TRUE(validates(v, schema)) << text;
        EXPECT_GT(c.masks(), 0);
      }
    }
  }
  EXPECT_EQ(walks, 18);
}

}  // namespace
}  // namespace ds41
