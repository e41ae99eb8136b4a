// Stop sequences over streamed text: text is released only once it cannot be the start of a stop
// sequence, and the first complete match ends the stream with the match (and all after it) cut
// off — what the OpenAI and Anthropic APIs specify, also when a stop sequence spans tokens.
#pragma once

#include <string>
#include <vector>

namespace ds41 {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends `text`; returns what can be released now. After a match, stopped() is true and
  // further input is ignored.
  std::string feed(const std::string& text);
  // End of the stream: releases whatever was held back.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace ds41
