#include "cli/reply_printer.h"

#include <cstdio>
#include <unistd.h>

namespace ds41::cli {

ReplyPrinter::ReplyPrinter() : tty_(::isatty(1) == 1) {}

void ReplyPrinter::out(const std::string& s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
  at_line_start_ = s.back() == '\n';
  any_ = true;
}

void ReplyPrinter::print(const ReplyEvent& e) {
  switch (e.kind) {
    case ReplyEvent::Kind::reasoning:
      if (!in_reasoning_) {
        out(tty_ ? "\033[2m<think>\n" : "<think>\n");
        in_reasoning_ = true;
      }
      out(e.text);
      break;
    case ReplyEvent::Kind::content:
    case ReplyEvent::Kind::tool_call:
      if (in_reasoning_) {
        out(std::string(at_line_start_ ? "" : "\n") + (tty_ ? "</think>\033[0m\n" : "</think>\n"));
        in_reasoning_ = false;
      }
      if (e.kind == ReplyEvent::Kind::content) out(e.text);
      else out(std::string(at_line_start_ ? "" : "\n") + "[tool call] " + e.tool_call.name + " " + e.tool_call.arguments + "\n");
      break;
    case ReplyEvent::Kind::warning:
      std::fprintf(stderr, "\nwarning: %s\n", e.text.c_str());
      break;
  }
}

void ReplyPrinter::finish() {
  if (in_reasoning_) out(std::string(at_line_start_ ? "" : "\n") + (tty_ ? "</think>\033[0m\n" : "</think>\n"));
  in_reasoning_ = false;
  if (!at_line_start_ || !any_) out("\n");
}

}  // namespace ds41::cli
