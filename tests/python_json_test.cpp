// python_json_dumps against what CPython 3.11's json.dumps(..., ensure_ascii=False) printed for the
// same values (expected strings recorded from the interpreter).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "text/python_json.h"

namespace ds41 {
namespace {

using J = nlohmann::ordered_json;

TEST(PythonJson, FloatReprMatchesCPython) {
  const std::pair<double, const char*> cases[] = {
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1.0, "1.0"},
      {-1.5, "-1.5"},
      {0.1, "0.1"},
      {1e-05, "1e-05"},
      {0.0001, "0.0001"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {1.2345678901234568e+17, "1.2345678901234568e+17"},
      {1.5e-07, "1.5e-07"},
      {3.141592653589793, "3.141592653589793"},
      {2.5e-300, "2.5e-300"},
      {1.7976931348623157e+308, "1.7976931348623157e+308"},
      {5e-324, "5e-324"},
      {100.0, "100.0"},
      {1e22, "1e+22"},
      {0.30000000000000004, "0.30000000000000004"},
      {12345.678, "12345.678"},
  };
  for (const auto& [v, want] : cases) EXPECT_EQ(python_float_repr(v), want) << v;
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "Infinity");
  EXPECT_EQ(python_float_repr(-std::numeric_limits<double>::infinity()), "-Infinity");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(PythonJson, SeparatorsOrderAndEscapes) {
  const J v = J::parse(R"({"b": [1, "x", null, true, {}], "a": {"k": "v\u0001\t\"\\ é/)"
                       "\x7f"
                       R"("}, "e": []})");
  EXPECT_EQ(python_json_dumps(v),
            "{\"b\": [1, \"x\", null, true, {}], \"a\": {\"k\": \"v\\u0001\\t\\\"\\\\ é/\x7f\"}, \"e\": []}");
  // Duplicate keys: the last value at the first position, as a Python dict built by json.loads.
  EXPECT_EQ(python_json_dumps(J::parse(R"({"a":1,"b":2,"a":3})")), R"({"a": 3, "b": 2})");
  EXPECT_EQ(python_json_dumps(J::parse("-12")), "-12");
  EXPECT_EQ(python_json_dumps(J::parse("18446744073709551615")), "18446744073709551615");
  EXPECT_EQ(python_json_string("\b\f\n\r\x1f"), "\"\\b\\f\\n\\r\\u001f\"");
}

TEST(PythonJson, InvalidUtf8PassesThrough) {
  EXPECT_EQ(python_json_string(std::string("a\xff\xc3", 3)), std::string("\"a\xff\xc3\"", 5));
}

TEST(PythonJson, Truthiness) {
  for (const char* falsy : {"null", "false", "0", "0.0", "\"\"", "[]", "{}"}) EXPECT_FALSE(python_truthy(J::parse(falsy))) << falsy;
  for (const char* truthy : {"true", "1", "-1", "0.5", "\"x\"", "[0]", "{\"a\":null}"})
    EXPECT_TRUE(python_truthy(J::parse(truthy))) << truthy;
}

}  // namespace
}  // namespace ds41
