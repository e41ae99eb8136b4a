// JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it.
//
// The official prompt encoder serializes tool schemas, non-string tool-call arguments and
// response formats with that call, and the parser rebuilds tool-call arguments with it; the
// bytes are model input, so they must match: ", " and ": " separators, keys in document order
// (hence nlohmann::ordered_json), non-ASCII left as is, control characters as lowercase \u00XX,
// floats in Python's shortest repr ("1.0", "1e-05", "1e+16").
//
// Known gap: integers beyond 64 bits are floats in nlohmann::json, so they print as floats where
// Python keeps every digit.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ds41 {

std::string python_json_dumps(const nlohmann::ordered_json& value);
// One JSON string literal (with the quotes). Bytes that are not valid UTF-8 pass through
// unchanged (Python strings cannot hold them; model output can).
std::string python_json_string(std::string_view s);
// Python's repr() of a float, which json.dumps uses ("NaN"/"Infinity" for non-finite values).
std::string python_float_repr(double v);
// Python truthiness of a JSON value: null, false, 0, "", [] and {} are false.
bool python_truthy(const nlohmann::ordered_json& value);

}  // namespace ds41
