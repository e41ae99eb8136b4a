// Prints a streamed reply for a person: reasoning between "<think>" and "</think>" lines (dimmed
// on a terminal), then the answer, then each tool call as "[tool call] name {arguments}".
#pragma once

#include <string>

#include "text/reply_parser.h"

namespace ds41::cli {

class ReplyPrinter {
 public:
  ReplyPrinter();
  void print(const ReplyEvent& e);
  void finish();  // closes an open reasoning block, ends the line

 private:
  bool tty_ = false, in_reasoning_ = false, any_ = false, at_line_start_ = true;
  void out(const std::string& s);
};

}  // namespace ds41::cli
