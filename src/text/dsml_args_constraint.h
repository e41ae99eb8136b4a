// A forced tool call's arguments held to its function's JSON schema, in the DSML the model writes
// (text/dsml_calls_parser.h): after the forced `<｜DSML｜ invoke name="NAME">\n`, only
//   <｜DSML｜ parameter name="KEY" string="true">TEXT</｜DSML｜ parameter>\n    (string properties)
//   <｜DSML｜ parameter name="KEY" string="false">JSON</｜DSML｜ parameter>\n   (the others)
// for properties of the schema, each at most once, every required one before
//   </｜DSML｜ invoke>\n</｜DSML｜ calls>
// and then the end of sequence. A non-string value is a JSON value of the property's schema
// (text/json_constraint.h, compact); a string value is any UTF-8 text without the closing tag.
// Parameters may come in any order.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/json_constraint.h"
#include "text/token_constraint.h"

namespace ds41 {

struct DsmlArgsSchema {
  struct Param {
    std::string name;
    bool is_string = false;
    bool required = false;
    std::shared_ptr<const JsonGrammar> value;  // non-string parameters
    std::string head;                          // `NAME" string="true|false">`
    std::string minimal;                       // the whole parameter with its shortest value
  };
  std::vector<Param> params;
  int64_t growth = 0;  // the end tag and every parameter's shortest form: a bound on what one token adds
  // A function's `parameters` schema (an object schema); throws ds41::Error for what is not
  // supported (as JsonGrammar::from_schema).
  static std::shared_ptr<const DsmlArgsSchema> from_parameters(const nlohmann::ordered_json& parameters);
};

class DsmlArgsState {
 public:
  explicit DsmlArgsState(std::shared_ptr<const DsmlArgsSchema> schema);
  bool step(uint8_t byte);
  bool step(std::string_view bytes);
  bool complete() const { return phase_ == Phase::Done; }
  std::string shortest_completion() const;
  size_t completion_length() const;
  std::string key() const;
  bool plain_byte(uint8_t byte) const;
  int64_t growth() const;

 private:
  enum class Phase : uint8_t { Head, Name, Text, Json, Close, Done };
  void enter(Phase p);
  std::string rest_after(const std::vector<uint8_t>& written) const;  // required params left + the end
  size_t rest_after_length(const std::vector<uint8_t>& written, int also = -1) const;

  std::shared_ptr<const DsmlArgsSchema> s_;
  Phase phase_ = Phase::Head;
  std::vector<uint8_t> written_;           // per parameter
  std::vector<const std::string*> candidates_;  // Head, Name, Close: the literals that may come (null: none)
  std::vector<uint16_t> alive_;
  size_t index_ = 0;                       // bytes of the literal matched; Text: bytes of the closing tag matched
  int current_ = -1;                       // the parameter being written
  Utf8Stepper utf8_;                       // Text: the character being read
  std::shared_ptr<JsonState> json_;        // Json: the value so far
};

// tool_choice "required": after the forced `<｜DSML｜ calls>\n`, one invoke of any of the tools,
// its arguments held to that tool's schema.
struct DsmlToolSet {
  struct Tool {
    std::string header;  // `<｜DSML｜ invoke name="NAME">\n`
    std::shared_ptr<const DsmlArgsSchema> args;
  };
  std::vector<Tool> tools;
  // OpenAI tools ([{"type": "function", "function": {"name", "parameters"}}]); throws ds41::Error.
  static std::shared_ptr<const DsmlToolSet> from_tools(const nlohmann::ordered_json& tools);
};

class DsmlCallState {
 public:
  explicit DsmlCallState(std::shared_ptr<const DsmlToolSet> tools);
  bool step(uint8_t byte);
  bool step(std::string_view bytes);
  bool complete() const { return args_ && args_->complete(); }
  std::string shortest_completion() const;
  size_t completion_length() const { return args_ ? args_->completion_length() : shortest_completion().size(); }
  std::string key() const;
  bool plain_byte(uint8_t byte) const { return args_ && args_->plain_byte(byte); }
  int64_t growth() const;

 private:
  std::shared_ptr<const DsmlToolSet> t_;
  std::vector<uint16_t> alive_;  // tools whose header still matches
  size_t index_ = 0;             // bytes of the header matched
  std::optional<DsmlArgsState> args_;
};

std::shared_ptr<TokenConstraint> make_dsml_call_constraint(std::shared_ptr<const DsmlToolSet> tools,
                                                           std::shared_ptr<const TokenTrie> trie, int32_t eos);

// The constraint for a forced call of a function with these parameters.
std::shared_ptr<TokenConstraint> make_dsml_args_constraint(std::shared_ptr<const DsmlArgsSchema> schema,
                                                           std::shared_ptr<const TokenTrie> trie, int32_t eos);

}  // namespace ds41
