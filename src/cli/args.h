// A small command-line parser shared by every subcommand: `--name value`, `--name=value`,
// boolean `--flag`, the short spellings llama.cpp users type (-m -p -n -c -t -f -s -o, where the
// command has the long option), positional arguments, `--help`. Unknown options, long or short,
// are errors rather than silently ignored or taken for positional arguments.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ds41 {
enum class PrefillMode;  // model/model.h
}

namespace ds41::cli {

struct OptionSpec {
  std::string name;        // without the leading dashes
  std::string value_name;  // empty: a boolean flag
  std::string help;
  std::string default_value;
};

class Args {
 public:
  Args(std::string command, std::string summary, std::string usage, std::vector<OptionSpec> options);
  // Returns false when --help was given (usage already printed to stdout).
  bool parse(int argc, char** argv);  // argv[0] is the subcommand name

  bool flag(const std::string& name) const;
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& fallback) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_double(const std::string& name, double fallback) const;
  // Every value of a repeatable option, in command-line order (get() returns the last one).
  std::vector<std::string> get_all(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  std::string help_text() const;

 private:
  const OptionSpec* find(const std::string& name) const;
  // The long option the short spelling -c stands for in this command (llama.cpp's -m -p -n -c -t
  // -f -s -o), if the command has that option.
  std::optional<std::string> short_alias(char c) const;
  std::string command_, summary_, usage_;
  std::vector<OptionSpec> options_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_values_;
  std::vector<std::string> positional_;
};

// A comma-separated list of integers ("0,5,9"); `what` names the option in errors.
std::vector<int64_t> parse_int_list(const std::string& s, const std::string& what);
// Token ids: parse_int_list plus a range check against the vocabulary.
std::vector<int32_t> parse_token_ids(const std::string& s, int64_t vocab, const std::string& what = "--tokens");

// --prefill full|ced.
PrefillMode parse_prefill_mode(const std::string& s);

// Threads: --threads N (0 = all cores).
int resolve_threads(int64_t requested);

}  // namespace ds41::cli
