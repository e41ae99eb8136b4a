#include "cli/args.h"

#include <algorithm>
#include <map>
#include <cstdio>
#include <thread>

#include "base/error.h"
#include "model/model.h"

namespace ds41::cli {

Args::Args(std::string command, std::string summary, std::string usage, std::vector<OptionSpec> options)
    : command_(std::move(command)), summary_(std::move(summary)), usage_(std::move(usage)),
      options_(std::move(options)) {
  options_.push_back({"help", "", "show this help and exit", ""});
}

namespace {
// The short spellings llama.cpp users type, each standing for a long option where the command has it.
const std::map<char, std::string>& short_aliases() {
  static const std::map<char, std::string> m = {{'m', "model"},      {'p', "prompt"}, {'n', "max-tokens"},
                                                {'c', "ctx"},        {'t', "threads"}, {'f', "file"},
                                                {'s', "seed"},       {'o', "out"}};
  return m;
}
}  // namespace

std::optional<std::string> Args::short_alias(char c) const {
  const auto& m = short_aliases();
  if (auto it = m.find(c); it != m.end() && find(it->second)) return it->second;
  return std::nullopt;
}

const OptionSpec* Args::find(const std::string& name) const {
  for (const auto& o : options_)
    if (o.name == name) return &o;
  return nullptr;
}

bool Args::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h") a = "--help";
    // Short options (-m DIR, -n 64): an option named by the letter, else the alias's long option.
    if (a.size() == 2 && a[0] == '-' && a[1] != '-') {
      if (find(a.substr(1))) a = "-" + a;
      else if (auto alias = short_alias(a[1])) a = "--" + *alias;
    }
    // Anything else that looks like an option and is not one is an error, never a positional
    // argument ("-" alone is: standard input where a command reads a file or text).
    if (a.size() > 1 && a[0] == '-' && a.compare(0, 2, "--") != 0)
      throw Error("ds41 " + command_ + ": unknown option '" + a + "' (see ds41 " + command_ + " --help)");
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      std::string name = a.substr(2), value;
      bool has_inline = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_inline = true;
      }
      const OptionSpec* o = find(name);
      if (!o) {
        std::string known;
        for (const auto& k : options_) known += " --" + k.name;
        throw Error("ds41 " + command_ + ": unknown option '--" + name + "' (options:" + known + ")");
      }
      if (o->name == "help") {
        std::fputs(help_text().c_str(), stdout);
        return false;
      }
      if (o->value_name.empty()) {
        if (has_inline) throw Error("ds41 " + command_ + ": --" + name + " takes no value");
        values_[name] = "1";
        continue;
      }
      if (!has_inline) {
        if (i + 1 >= argc) throw Error("ds41 " + command_ + ": --" + name + " needs a value (" + o->value_name + ")");
        value = argv[++i];
      }
      values_[name] = value;
      all_values_[name].push_back(value);
    } else {
      positional_.push_back(a);
    }
  }
  return true;
}

bool Args::flag(const std::string& name) const { return values_.count(name) > 0; }

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  const OptionSpec* o = find(name);
  if (o && !o->default_value.empty()) return o->default_value;
  return std::nullopt;
}

std::string Args::get_or(const std::string& name, const std::string& fallback) const {
  auto v = get(name);
  return v ? *v : fallback;
}

int64_t Args::get_int(const std::string& name, int64_t fallback) const {
  auto v = get(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    long long x = std::stoll(*v, &used, 0);
    if (used != v->size()) throw std::invalid_argument("trailing");
    return x;
  } catch (const std::exception&) {
    throw Error("ds41 " + command_ + ": --" + name + " expects an integer, got '" + *v + "'");
  }
}

std::vector<std::string> Args::get_all(const std::string& name) const {
  auto it = all_values_.find(name);
  return it == all_values_.end() ? std::vector<std::string>{} : it->second;
}

double Args::get_double(const std::string& name, double fallback) const {
  auto v = get(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    double x = std::stod(*v, &used);
    if (used != v->size()) throw std::invalid_argument("trailing");
    return x;
  } catch (const std::exception&) {
    throw Error("ds41 " + command_ + ": --" + name + " expects a number, got '" + *v + "'");
  }
}

std::string Args::help_text() const {
  std::string s = "ds41 " + command_ + " - " + summary_ + "\n\nusage: " + usage_ + "\n\noptions:\n";
  std::map<std::string, char> short_of;
  for (const auto& [c, name] : short_aliases())
    if (find(name)) short_of[name] = c;
  for (const auto& o : options_) {
    std::string left = "  ";
    if (auto it = short_of.find(o.name); it != short_of.end()) left += std::string("-") + it->second + ", ";
    left += "--" + o.name + (o.value_name.empty() ? "" : " " + o.value_name);
    if (left.size() < 26) left.resize(26, ' ');
    else left += "\n" + std::string(26, ' ');
    s += left + o.help;
    if (!o.default_value.empty()) s += " (default: " + o.default_value + ")";
    s += "\n";
  }
  return s;
}

std::vector<int64_t> parse_int_list(const std::string& s, const std::string& what) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = std::min(s.find(',', start), s.size());
    const std::string item = s.substr(start, comma - start);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) throw Error(what + ": '" + item + "' is not an integer (expected e.g. 0,5,9)");
    out.push_back(v);
    start = comma + 1;
  }
  return out;
}

std::vector<int32_t> parse_token_ids(const std::string& s, int64_t vocab, const std::string& what) {
  if (s.empty()) throw Error(what + ": no token ids given");
  std::vector<int32_t> out;
  for (int64_t v : parse_int_list(s, what)) {
    if (v < 0 || v >= vocab)
      throw Error(what + ": id " + std::to_string(v) + " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
    out.push_back(int32_t(v));
  }
  return out;
}

int resolve_threads(int64_t requested) {
  if (requested < 0) throw Error("--threads must be >= 0 (0 = all cores)");
  if (requested == 0) {
    unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
  }
  // More threads than cores only time-slice them (each parallel step then waits for the slowest
  // slice): capped, with a warning.
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && requested > int64_t(cores)) {
    std::fprintf(stderr, "warning: --threads %lld is more than the %u cores of this machine: using %u\n",
                 (long long)requested, cores, cores);
    return int(cores);
  }
  return int(requested);
}

PrefillMode parse_prefill_mode(const std::string& s) {
  if (s == "full") return PrefillMode::Full;
  if (s == "ced") return PrefillMode::Ced;
  throw Error("--prefill: unknown mode '" + s + "' (expected full or ced)");
}

}  // namespace ds41::cli
