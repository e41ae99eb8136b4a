// A one-line progress bar on stderr, drawn only when stderr is a terminal (logs and pipes get
// nothing), redrawn at most ~20 times a second.
#pragma once

#include <cstdint>
#include <string>

namespace ds41::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();  // clears the line if anything was drawn
  void update(const std::string& stage, int64_t done, int64_t total);
  void finish();

 private:
  std::string label_;
  bool tty_ = false, drawn_ = false;
  double last_draw_ = 0;
};

}  // namespace ds41::cli
