// A forced tool call's arguments held to the function's schema (text/dsml_args_constraint.h):
// the DSML automaton against written parameters, its shortest completion from every prefix, and
// token walks over the V3 vocabulary whose replies the reply parser reads as a call with valid
// arguments.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "constraint_walk.h"
#include "test_paths.h"
#include "test_tokenizer_files.h"
#include "text/dsml_args_constraint.h"
#include "text/reply_parser.h"
#include "text/tokenizer.h"

namespace ds41 {
namespace {

using json = nlohmann::ordered_json;

const json kParams = json::parse(R"({
  "type": "object",
  "properties": {
    "city": {"type": "string"},
    "days": {"type": "integer"},
    "units": {"enum": ["c", "f"]},
    "hours": {"type": "array", "items": {"type": "integer"}}
  },
  "required": ["city", "days"]
})");

const std::string kCallHead = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"weather\">\n";
const std::string kEnd = "</｜DSML｜ invoke>\n</｜DSML｜ calls>";

std::string param(const std::string& name, bool is_string, const std::string& value) {
  return "<｜DSML｜ parameter name=\"" + name + "\" string=\"" + (is_string ? "true" : "false") + "\">" + value +
         "</｜DSML｜ parameter>\n";
}

bool accepts(const std::string& args) {
  DsmlArgsState st(DsmlArgsSchema::from_parameters(kParams));
  return st.step(args) && st.complete();
}

// The arguments the reply parser reads from a reply made of the forced head and `args`; they
// must be JSON that satisfies kParams (required present, types).
void expect_valid_call(const std::string& args) {
  const ParsedReply r = parse_reply(kCallHead + args + "<｜end▁of▁sentence｜>");
  ASSERT_EQ(r.tool_calls.size(), 1u) << args;
  const json a = json::parse(r.tool_calls[0].arguments, nullptr, false);
  ASSERT_TRUE(a.is_object()) << r.tool_calls[0].arguments;
  EXPECT_TRUE(a.contains("city") && a["city"].is_string()) << a.dump();
  EXPECT_TRUE(a.contains("days") && a["days"].is_number_integer()) << a.dump();
  if (a.contains("units")) {
    EXPECT_TRUE(a["units"] == "c" || a["units"] == "f") << a.dump();
  }
  if (a.contains("hours")) {
    EXPECT_TRUE(a["hours"].is_array()) << a.dump();
  }
}

TEST(DsmlArgsConstraint, WrittenParametersAgainstTheSchema) {
  EXPECT_TRUE(accepts(param("city", true, "Paris") + param("days", false, "3") + kEnd));
  EXPECT_TRUE(accepts(param("days", false, "-2") + param("units", false, "\"f\"") + param("city", true, "多行\n<b>") +
                      param("hours", false, "[1,2]") + kEnd));
  EXPECT_FALSE(accepts(param("city", true, "Paris") + kEnd)) << "days is required";
  EXPECT_FALSE(accepts(param("city", false, "\"Paris\"") + param("days", false, "3") + kEnd)) << "city is a string";
  EXPECT_FALSE(accepts(param("city", true, "P") + param("days", false, "3.5") + kEnd)) << "integer";
  EXPECT_FALSE(accepts(param("city", true, "P") + param("days", false, "3") + param("days", false, "4") + kEnd)) << "twice";
  EXPECT_FALSE(accepts(param("city", true, "P") + param("days", false, "3") + param("wind", false, "1") + kEnd)) << "unknown";
  EXPECT_FALSE(accepts(param("city", true, "P") + param("days", false, "3") + param("units", false, "\"k\"") + kEnd));
  // Text that starts the closing tag and leaves it inside its "｜": the character must still be whole.
  EXPECT_TRUE(accepts(param("city", true, "a</｜x") + param("days", false, "1") + kEnd));
  DsmlArgsState half(DsmlArgsSchema::from_parameters(kParams));
  EXPECT_TRUE(half.step("<｜DSML｜ parameter name=\"city\" string=\"true\">a</\xEF\xBC"));
  EXPECT_FALSE(half.step("x")) << "'x' inside a 3-byte character";
  EXPECT_THROW(DsmlArgsSchema::from_parameters(json::parse(R"({"properties": {"x": {"type": "string", "pattern": "a"}}})")), Error);
  // The object schema itself is checked as a response_format schema is: a `required` that is not
  // an array, an unsupported keyword beside `properties`, a non-object type are refused (not
  // ignored); descriptive keywords such as additionalProperties pass.
  for (const char* bad : {R"({"type": "object", "properties": {"x": {"type": "integer"}}, "required": "x"})",
                          R"({"type": "object", "properties": {"x": {"type": "integer"}}, "patternProperties": {}})",
                          R"({"type": "object", "properties": []})", R"({"type": "string"})"})
    EXPECT_THROW(DsmlArgsSchema::from_parameters(json::parse(bad)), Error) << bad;
  EXPECT_NO_THROW(DsmlArgsSchema::from_parameters(json::parse(
      R"({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false})")));
}

TEST(DsmlArgsConstraint, ShortestCompletionFromEveryPrefixIsAValidCall) {
  const std::string args = param("units", false, "\"c\"") + param("city", true, "Ünïcode <i>") +
                           param("hours", false, "[10,11]") + param("days", false, "12") + kEnd;
  ASSERT_TRUE(accepts(args));
  for (size_t k = 0; k <= args.size(); ++k) {
    DsmlArgsState st(DsmlArgsSchema::from_parameters(kParams));
    ASSERT_TRUE(st.step(args.substr(0, k))) << k;
    const std::string done = args.substr(0, k) + st.shortest_completion();
    DsmlArgsState check(DsmlArgsSchema::from_parameters(kParams));
    ASSERT_TRUE(check.step(done) && check.complete()) << done;
    EXPECT_EQ(st.completion_length(), st.shortest_completion().size());
    expect_valid_call(done);
  }
}

TEST(DsmlArgsConstraint, MaskedTokenWalksEndInValidCalls) {
  if (!std::filesystem::exists(test::v3_tokenizer_path())) GTEST_SKIP() << "V3 tokenizer not in the shared assets";
  const test::V3Vocabulary v;
  const auto schema = DsmlArgsSchema::from_parameters(kParams);
  const int tightest = int(DsmlArgsState(schema).shortest_completion().size()) + 1;
  std::mt19937 rng(77);
  for (int budget : {tightest, 3 * tightest}) {
    const auto c = make_dsml_args_constraint(schema, v.trie, v.eos);
    const test::Walk walk = test::walk_constraint(*c, v, budget, rng);
    ASSERT_FALSE(walk.stuck) << "no token allowed after: " << walk.text;
    ASSERT_TRUE(walk.ended) << "budget " << budget << " ran out: " << walk.text;
    expect_valid_call(walk.text);
  }
}

// tool_choice "required": one invoke of any tool, the arguments held to that tool's schema.
TEST(DsmlArgsConstraint, RequiredCallPicksAToolAndHoldsItsArguments) {
  const json tools = json::array(
      {json{{"type", "function"}, {"function", {{"name", "weather"}, {"parameters", kParams}}}},
       json{{"type", "function"}, {"function", {{"name", "search"}, {"parameters", json::parse(R"({"type": "object",
            "properties": {"q": {"type": "string"}, "top": {"type": "integer"}}, "required": ["q"]})")}}}}});
  const auto set = DsmlToolSet::from_tools(tools);
  const auto accepts_call = [&](const std::string& text) {
    DsmlCallState st(set);
    return st.step(text) && st.complete();
  };
  const std::string weather = "<｜DSML｜ invoke name=\"weather\">\n" + param("city", true, "Oslo") + param("days", false, "1") + kEnd;
  const std::string search = "<｜DSML｜ invoke name=\"search\">\n" + param("q", true, "ds41") + kEnd;
  EXPECT_TRUE(accepts_call(weather));
  EXPECT_TRUE(accepts_call(search));
  EXPECT_FALSE(accepts_call("<｜DSML｜ invoke name=\"other\">\n" + kEnd));
  EXPECT_FALSE(accepts_call("<｜DSML｜ invoke name=\"search\">\n" + param("city", true, "Oslo") + kEnd)) << "weather's parameter";
  EXPECT_FALSE(accepts_call("<｜DSML｜ invoke name=\"search\">\n" + kEnd)) << "q is required";
  for (const std::string& call : {weather, search})
    for (size_t k = 0; k <= call.size(); ++k) {
      DsmlCallState st(set);
      ASSERT_TRUE(st.step(call.substr(0, k)));
      const std::string done = call.substr(0, k) + st.shortest_completion();
      ASSERT_TRUE(accepts_call(done)) << done;
      const ParsedReply r = parse_reply("\n\n<｜DSML｜ calls>\n" + done + "<｜end▁of▁sentence｜>");
      ASSERT_EQ(r.tool_calls.size(), 1u) << done;
      EXPECT_TRUE(json::parse(r.tool_calls[0].arguments, nullptr, false).is_object()) << r.tool_calls[0].arguments;
    }
  if (!std::filesystem::exists(test::v3_tokenizer_path())) return;
  const test::V3Vocabulary v;
  std::mt19937 rng(5);
  const auto c = make_dsml_call_constraint(set, v.trie, v.eos);
  const test::Walk walk = test::walk_constraint(*c, v, 200, rng);
  ASSERT_TRUE(walk.ended && !walk.stuck) << walk.text;
  const ParsedReply r = parse_reply("\n\n<｜DSML｜ calls>\n" + walk.text + "<｜end▁of▁sentence｜>");
  ASSERT_EQ(r.tool_calls.size(), 1u) << walk.text;
  EXPECT_TRUE(r.tool_calls[0].name == "weather" || r.tool_calls[0].name == "search");
}

}  // namespace
}  // namespace ds41
