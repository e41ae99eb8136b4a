// The grammar of one DSML tool-call block in model output (spec D.5), parsed incrementally.
//
// A block starts with "\n\n<｜DSML｜ calls" (found by the reply parser); this parser reads what
// follows it, exactly as the reference parser (`parse_tool_calls` of encoding.py) reads it:
//
//   >\n<｜DSML｜ invoke name="NAME">\n
//   <｜DSML｜ parameter name="KEY" string="true|false">VALUE</｜DSML｜ parameter>\n   (0 or more)
//   </｜DSML｜ invoke>\n                                         (more invokes may follow)
//   </｜DSML｜ calls>
//
// with the reference's leniencies reproduced: whitespace (Python's \s) before name=, one extra
// trailing newline in the invoke header and the parameter text (Python's `$`), names and values
// that contain anything but the next tag, and acceptance of text that ends right after a
// well-formed invoke header, after a parameter's closing tag, after an invoke's closing tag name
// or right after the block's opening tag (the reference stops reading there without an error). The text only ever grows between
// calls to advance(); the outcome (done at the same offset with the same calls, or failed with
// the same message) does not depend on how it was split.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ds41 {

struct DsmlParameter {
  std::string name, value;
  bool is_string = true;  // string="true": the value is raw text; otherwise raw JSON
};

struct DsmlCall {
  std::string name;
  std::vector<DsmlParameter> parameters;
  // The arguments JSON object as the reference rebuilds it: string values JSON-encoded, others
  // inserted as written (so it is not always valid JSON).
  std::string arguments_json() const;
};

class DsmlCallsParser {
 public:
  enum class Status { need_more, done, failed };

  // `text`: everything after "\n\n<｜DSML｜ calls" so far; `at_end`: no more text will come.
  Status advance(std::string_view text, bool at_end);
  size_t end() const { return end_; }  // after done: offset just past the block
  const std::vector<DsmlCall>& calls() const { return calls_; }
  const std::string& error() const { return error_; }

 private:
  enum class Step { between_invokes, invoke_header, parameter, after_parameter };
  Status fail(std::string message);

  Step step_ = Step::between_invokes;
  size_t cursor_ = 0;  // start of the unread text
  size_t scan_ = 0;    // where the search for the next tag resumes
  size_t end_ = 0;
  DsmlCall current_;
  std::vector<DsmlCall> calls_;
  std::string error_;
};

}  // namespace ds41
