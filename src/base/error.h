// The one exception type of the engine. Every user-facing failure (bad file, bad config, bad
// request) is reported as a ds41::Error whose message names the thing that is wrong and, where
// possible, what to do about it. The CLI prints the message to stderr and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace ds41 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ds41
