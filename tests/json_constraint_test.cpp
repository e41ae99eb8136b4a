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
#include "constraint_walk.h"
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
  // An enum or an object beyond what the automaton indexes is refused, not cut short.
  json big_enum = {{"enum", json::array()}};
  for (size_t i = 0; i <= kMaxAlternatives; ++i) big_enum["enum"].push_back(int(i));
  EXPECT_THROW(JsonGrammar::from_schema(big_enum), Error);
  big_enum["enum"].erase(0);
  EXPECT_NO_THROW(JsonGrammar::from_schema(big_enum));
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
      EXPECT_EQ(st.completion_length(), st.shortest_completion().size()) << doc.substr(0, k);
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
  const test::V3Vocabulary v;
  const std::vector<json> schemas = {json(), kPerson,
                                     json::parse(R"({"type":"object","properties":{"answer":{"enum":["yes","no"]},"why":{"type":"string"}},"required":["answer","why"]})")};
  std::mt19937 rng(51);
  int walks = 0;
  for (const json& schema : schemas) {
    const auto g = schema.is_null() ? JsonGrammar::any_object() : JsonGrammar::from_schema(schema);
    // The tightest budget the guarantee covers: one token per byte of the shortest document, and EOS.
    const int tightest = int(JsonState(g).shortest_completion().size()) + 1;
    for (int budget : {tightest, 2 * tightest, 150}) {
      for (int w = 0; w < 2; ++w) {
        const auto c = make_json_constraint(g, v.trie, v.eos);
        const test::Walk walk = test::walk_constraint(*c, v, budget, rng);
        ++walks;
        ASSERT_FALSE(walk.stuck) << "no token allowed after: " << walk.text;
        ASSERT_TRUE(walk.ended) << "budget " << budget << " ran out: " << walk.text;
        const json val = json::parse(walk.text, nullptr, false);
        ASSERT_FALSE(val.is_discarded()) << walk.text;
        EXPECT_TRUE(val.is_object()) << walk.text;
        if (!schema.is_null()) EXPECT_TRUE(validates(val, schema)) << walk.text;
        EXPECT_GT(c->masks(), 0);
      }
    }
  }
  EXPECT_EQ(walks, 18);
}

}  // namespace
}  // namespace ds41
