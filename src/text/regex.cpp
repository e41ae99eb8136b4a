#include "text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

#include "base/error.h"
#include "text/utf8.h"

namespace ds41 {
namespace {

// JIT stack: PCRE2's default (32 KiB on the machine stack) is enough for these patterns on
// ordinary text. When a match runs out of it, the match is retried once with a heap stack that
// may grow to 64 MiB (created on first need: creating it maps memory, too slow to do per call).
constexpr size_t kJitStackStart = 256 * 1024;
constexpr size_t kJitStackMax = 64 * 1024 * 1024;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string onig_to_pcre2(std::string_view p, const std::string& label) {
  auto refuse = [&](const std::string& what) {
    return Error(label + ": regex /" + std::string(p) + "/ uses " + what +
                 ", which this engine does not translate from Oniguruma to PCRE2");
  };
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_body_start = 0;  // offset in p where the current class's members begin
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) throw Error(label + ": regex /" + std::string(p) + "/ ends with a lone backslash");
      const char n = p[i + 1];
      switch (n) {
        case 's': out += "\\p{White_Space}"; break;
        case 'S': out += "\\P{White_Space}"; break;
        case 'h': out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
        case 'H':
          if (in_class) throw refuse("\\H inside a character class");
          out += "[^0-9a-fA-F]";
          break;
        case 'u': {
          if (i + 6 > p.size()) throw refuse("a truncated \\u escape");
          for (size_t k = 2; k < 6; ++k)
            if (!std::isxdigit(static_cast<unsigned char>(p[i + k]))) throw refuse("a malformed \\u escape");
          out += "\\x{" + std::string(p.substr(i + 2, 4)) + "}";
          i += 6;
          continue;
        }
        case 'w': case 'W': case 'b': case 'B':
          throw refuse(std::string("\\") + n + " (its Unicode definition differs)");
        default:
          out += c;
          out += n;
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == '[') throw refuse(i + 1 < p.size() && p[i + 1] == ':' ? "a POSIX bracket class" : "a nested character class");
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') throw refuse("character class intersection (&&)");
      if (c == ']' && i > class_body_start) in_class = false;
    } else if (c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      class_body_start = i;  // a ']' right here is a literal member
      continue;
    }
    out += c;
    ++i;
  }
  if (in_class) throw Error(label + ": regex /" + std::string(p) + "/ has an unterminated character class");
  return out;
}

Regex::Regex(std::string_view onig_pattern, const std::string& label, Engine engine)
    : pattern_(onig_pattern), label_(label) {
  const std::string translated = onig_to_pcre2(onig_pattern, label);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (!code_) {
    throw Error(label + ": cannot compile regex /" + pattern_ + "/ (as PCRE2 /" + translated + "/): " +
                pcre2_message(error) + " at offset " + std::to_string(offset));
  }
  // Without JIT (a PCRE2 built without it) matching still works, only slower.
  jit_ = engine == Engine::kJit && pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(code_); }

Regex::Regex(Regex&& o) noexcept
    : pattern_(std::move(o.pattern_)), label_(std::move(o.label_)), code_(o.code_), jit_(o.jit_) {
  o.code_ = nullptr;
}

Regex& Regex::operator=(Regex&& o) noexcept {
  if (this != &o) {
    pcre2_code_free(code_);
    pattern_ = std::move(o.pattern_);
    label_ = std::move(o.label_);
    code_ = o.code_;
    jit_ = o.jit_;
    o.code_ = nullptr;
  }
  return *this;
}

RegexMatcher::RegexMatcher(const Regex& re) : re_(re) {
  match_data_ = pcre2_match_data_create_from_pattern(re.code_, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  if (!match_data_ || !context_) throw std::bad_alloc();
}

RegexMatcher::~RegexMatcher() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(match_data_);
}

bool RegexMatcher::find(std::string_view subject, size_t from, size_t* begin, size_t* end) {
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  // The caller validated the UTF-8 once; PCRE2 would otherwise re-check the whole subject on
  // every call, which makes a scan quadratic.
  int rc = re_.jit_ ? pcre2_jit_match(re_.code_, s, subject.size(), from, 0, match_data_, context_)
                    : pcre2_match(re_.code_, s, subject.size(), from, PCRE2_NO_UTF_CHECK, match_data_, context_);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !jit_stack_) {
    jit_stack_ = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
    if (!jit_stack_) throw std::bad_alloc();
    pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
    rc = pcre2_jit_match(re_.code_, s, subject.size(), from, 0, match_data_, context_);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    throw Error(re_.label_ + ": matching regex /" + re_.pattern_ + "/ failed at byte " + std::to_string(from) +
                " of a " + std::to_string(subject.size()) + "-byte piece: " + pcre2_message(rc));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_data_);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

size_t RegexMatcher::next_char_length(std::string_view s, size_t i) {
  if (i >= s.size()) return 1;
  const Utf8Sequence seq = utf8_sequence_at(s, i);
  return size_t(seq.length);
}

}  // namespace ds41
