// Unicode regular expressions for the tokenizer's pre-tokenizer, on PCRE2 (JIT-compiled).
//
// tokenizer.json patterns are written for Oniguruma (Ruby syntax), which HF tokenizers uses.
// PCRE2 with PCRE2_UTF | PCRE2_UCP agrees with it on the constructs these files use (\p{..}
// categories, classes, greedy and optional repeats, alternation in order, lookahead), except:
//   - \s / \S: Oniguruma's is the White_Space property; PCRE2's also matches U+180E MONGOLIAN
//     VOWEL SEPARATOR (via \h). They are rewritten to \p{White_Space} / \P{White_Space}.
//   - \h / \H mean a hex digit in Oniguruma (horizontal space in PCRE2): rewritten.
//   - \uHHHH (Oniguruma) becomes \x{HHHH}.
//   - ^ and $ match at line starts / ends in Ruby syntax: compiled with PCRE2_MULTILINE.
//   - \w \W \b \B (whose Unicode definitions differ between the two) and nested character
//     classes are refused with an error rather than silently matched differently.
// Character data: PCRE2 10.42 (Debian 12) carries Unicode 14.0; see tokenizer.h for how that
// compares with the Oniguruma build inside HF tokenizers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

// PCRE2 types, forward-declared so users of this header need not see pcre2.h.
struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace ds41 {

// Rewrites an Oniguruma (Ruby syntax) pattern into an equivalent PCRE2 pattern (see above).
// Throws ds41::Error naming `label` for constructs that are refused.
std::string onig_to_pcre2(std::string_view pattern, const std::string& label);

class Regex {
 public:
  // How matches are run: JIT-compiled machine code (the default, falling back to the interpreter
  // when PCRE2 has no JIT for this CPU), or always the interpreter (for tests).
  enum class Engine { kJit, kInterpreter };

  // Compiles an Oniguruma-syntax pattern; throws ds41::Error naming `label` (e.g. the file and
  // the pre-tokenizer step) when it cannot.
  Regex(std::string_view onig_pattern, const std::string& label, Engine engine = Engine::kJit);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& pattern() const { return pattern_; }  // the original, for messages
  bool jit_compiled() const { return jit_; }

 private:
  friend class RegexMatcher;
  std::string pattern_, label_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

// Per-thread matching state for one Regex (match data and JIT stack). Not thread-safe; create
// one per thread or per call.
class RegexMatcher {
 public:
  explicit RegexMatcher(const Regex& re);
  ~RegexMatcher();
  RegexMatcher(const RegexMatcher&) = delete;
  RegexMatcher& operator=(const RegexMatcher&) = delete;

  // The non-overlapping matches in `subject` (valid UTF-8, not re-checked), left to right, as
  // Oniguruma's find_iter in the Rust `onig` crate yields them: each search starts where the
  // previous match ended, and an empty match right at the end of the previous match is skipped
  // (the search moves on by one character). Calls on_match(begin, end) with byte offsets.
  // Whether a match has needed more than PCRE2's default JIT stack (then a heap stack is used).
  bool uses_heap_stack() const { return jit_stack_ != nullptr; }

  template <class F>
  void for_each_match(std::string_view subject, F&& on_match) {
    size_t search_from = 0, last_match_end = std::string_view::npos;
    size_t begin, end;
    while (search_from <= subject.size() && find(subject, search_from, &begin, &end)) {
      if (begin == end && end == last_match_end) {
        search_from += next_char_length(subject, search_from);
        continue;
      }
      search_from = end;
      last_match_end = end;
      on_match(begin, end);
    }
  }

 private:
  bool find(std::string_view subject, size_t from, size_t* begin, size_t* end);
  static size_t next_char_length(std::string_view s, size_t i);
  const Regex& re_;
  pcre2_real_match_data_8* match_data_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;
  pcre2_real_jit_stack_8* jit_stack_ = nullptr;
};

}  // namespace ds41
