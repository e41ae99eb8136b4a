#include "text/dsml_calls_parser.h"

#include <algorithm>
#include <initializer_list>

#include "text/dsml_tokens.h"
#include "text/python_json.h"

namespace ds41 {

namespace {

using namespace dsml;

// The reference searches for the parameter end without its angle brackets: the '<' before it is
// part of the parameter text (the `<$` of its pattern) and the '>' is checked afterwards.
constexpr std::string_view kParamEnd = "/｜DSML｜ parameter";

// Python's `\s` on str patterns: the characters for which str.isspace() is true.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Length of the UTF-8 encoded whitespace character at s[i], or 0.
size_t python_space_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return is_python_space(c) ? 1 : 0;
  size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  char32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  return is_python_space(cp) ? n : 0;
}

// `^\s*name="(.*?)">\n$` (DOTALL) on the invoke header.
bool match_invoke_header(std::string_view seg, std::string& name) {
  size_t i = 0;
  while (i < seg.size()) {
    const size_t n = python_space_at(seg, i);
    if (n == 0) break;
    i += n;
  }
  constexpr std::string_view kOpen = "name=\"";
  if (seg.substr(i, kOpen.size()) != kOpen) return false;
  const std::string_view rest = seg.substr(i + kOpen.size());
  // `$` also matches before one final newline, and the lazy group takes the shortest name.
  if (rest.size() >= 4 && rest.substr(rest.size() - 4) == "\">\n\n") {
    name = rest.substr(0, rest.size() - 4);
    return true;
  }
  if (rest.size() >= 3 && rest.substr(rest.size() - 3) == "\">\n") {
    name = rest.substr(0, rest.size() - 3);
    return true;
  }
  return false;
}

// `^ name="(.*?)" string="(true|false)">(.*?)<$` (DOTALL) on the parameter text.
bool match_parameter(std::string_view seg, DsmlParameter& p) {
  constexpr std::string_view kOpen = " name=\"";
  if (seg.substr(0, kOpen.size()) != kOpen) return false;
  size_t value_end;
  if (seg.size() >= 2 && seg.substr(seg.size() - 2) == "<\n") {
    value_end = seg.size() - 2;
  } else if (!seg.empty() && seg.back() == '<') {
    value_end = seg.size() - 1;
  } else {
    return false;
  }
  constexpr std::string_view kTrue = "\" string=\"true\">", kFalse = "\" string=\"false\">";
  for (size_t q = kOpen.size(); q < seg.size(); ++q) {
    const std::string_view at = seg.substr(q);
    const bool t = at.substr(0, kTrue.size()) == kTrue, f = at.substr(0, kFalse.size()) == kFalse;
    if (!t && !f) continue;
    const size_t value_begin = q + (t ? kTrue.size() : kFalse.size());
    if (value_begin > value_end) return false;  // every later name would overlap the final '<' too
    p.name = seg.substr(kOpen.size(), q - kOpen.size());
    p.is_string = t;
    p.value = seg.substr(value_begin, value_end - value_begin);
    return true;
  }
  return false;
}

// Where the text after the cursor must be exactly ">\n" followed by one of `tags`: the index of
// the tag found, -1 if the text so far can still become one, -2 if it cannot.
int match_gap_then_tag(std::string_view avail, std::initializer_list<std::string_view> tags) {
  bool possible = false;
  int i = 0;
  for (std::string_view tag : tags) {
    std::string want = ">\n";
    want += tag;
    if (avail.substr(0, want.size()) == want) return i;
    if (avail.size() < want.size() && std::string_view(want).substr(0, avail.size()) == avail) possible = true;
    ++i;
  }
  return possible ? -1 : -2;
}

}  // namespace

std::string DsmlCall::arguments_json() const {
  std::string out = "{";
  for (size_t i = 0; i < parameters.size(); ++i) {
    const DsmlParameter& p = parameters[i];
    if (i) out += ", ";
    out += python_json_string(p.name);
    out += ": ";
    out += p.is_string ? python_json_string(p.value) : p.value;
  }
  return out + "}";
}

DsmlCallsParser::Status DsmlCallsParser::fail(std::string message) {
  error_ = std::move(message);
  return Status::failed;
}

DsmlCallsParser::Status DsmlCallsParser::advance(std::string_view text, bool at_end) {
  if (!error_.empty()) return Status::failed;
  for (;;) {
    const std::string_view avail = text.substr(cursor_);
    switch (step_) {
      case Step::between_invokes: {
        // The reference stops here when the text ends (no invoke left to read).
        if (avail.empty() && at_end) {
          end_ = cursor_;
          return Status::done;
        }
        const int m = match_gap_then_tag(avail, {kInvokeOpen, kCallsClose});
        if (m == -1 && !at_end) return Status::need_more;
        if (m < 0) return fail("expected \">\\n\" and then an invoke or the end of the calls block");
        if (m == 1) {
          end_ = cursor_ + 2 + kCallsClose.size();
          return Status::done;
        }
        cursor_ += 2 + kInvokeOpen.size();
        scan_ = cursor_;
        current_ = DsmlCall{};
        step_ = Step::invoke_header;
        break;
      }
      case Step::invoke_header:
      case Step::parameter: {
        const bool header = step_ == Step::invoke_header;
        // Earliest tag after the cursor; the tags cannot overlap, so a tag found in a prefix of
        // the text is the one the whole text has there.
        size_t best = std::string_view::npos, tag_len = 0;
        bool params_follow = false;
        const auto look = [&](std::string_view tag, bool is_param) {
          const size_t p = text.find(tag, scan_);
          if (p != std::string_view::npos && p < best) {
            best = p;
            tag_len = tag.size();
            params_follow = is_param;
          }
        };
        size_t longest;
        if (header) {
          look(kParamOpen, true);
          look(kInvokeClose, false);
          longest = std::max(kParamOpen.size(), kInvokeClose.size());
        } else {
          look(kParamEnd, false);
          longest = kParamEnd.size();
        }
        if (best == std::string_view::npos) {
          if (!at_end) {
            scan_ = std::max(cursor_, text.size() >= longest ? text.size() - longest + 1 : 0);
            return Status::need_more;
          }
          // The reference reads a header up to the end of the text and accepts the call if the
          // header is well formed (nothing is left to read).
          if (header && match_invoke_header(avail, current_.name)) {
            calls_.push_back(std::move(current_));
            cursor_ = text.size();
            step_ = Step::between_invokes;
            break;
          }
          return fail(header ? "invoke header not followed by a parameter or </｜DSML｜ invoke>"
                             : "parameter not closed by </｜DSML｜ parameter>");
        }
        const std::string_view seg = text.substr(cursor_, best - cursor_);
        if (header) {
          if (!match_invoke_header(seg, current_.name))
            return fail("malformed invoke header (expected name=\"NAME\">\\n)");
          step_ = params_follow ? Step::parameter : Step::between_invokes;
          if (!params_follow) calls_.push_back(std::move(current_));
        } else {
          DsmlParameter p;
          if (!match_parameter(seg, p)) return fail("malformed parameter (expected name=\"KEY\" string=\"true|false\">VALUE)");
          for (const DsmlParameter& q : current_.parameters)
            if (q.name == p.name) return fail("duplicate parameter '" + p.name + "'");
          current_.parameters.push_back(std::move(p));
          step_ = Step::after_parameter;
        }
        cursor_ = best + tag_len;
        scan_ = cursor_;
        break;
      }
      case Step::after_parameter: {
        const int m = match_gap_then_tag(avail, {kParamOpen, kInvokeClose});
        if (m == -1 && !at_end) return Status::need_more;
        if (at_end && avail == ">\n") {  // the reference accepts a call cut off right here
          calls_.push_back(std::move(current_));
          cursor_ = text.size();
          step_ = Step::between_invokes;
          break;
        }
        if (m < 0) return fail("expected \">\\n\" and then a parameter or </｜DSML｜ invoke> after a parameter");
        if (m == 0) {
          cursor_ += 2 + kParamOpen.size();
          step_ = Step::parameter;
        } else {
          cursor_ += 2 + kInvokeClose.size();
          calls_.push_back(std::move(current_));
          step_ = Step::between_invokes;
        }
        scan_ = cursor_;
        break;
      }
    }
  }
}

}  // namespace ds41
