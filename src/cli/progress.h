// Progress on stderr: on a terminal a one-line bar, redrawn at most ~20 times a second; in a log
// or a pipe (a server under systemd, CI) plain lines instead, never a carriage return: one per
// stage at each quarter of the way and at its end, with the seconds since the start.
#pragma once

#include <cstdint>
#include <memory>
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
  double last_draw_ = 0, start_ = 0;
  std::string logged_stage_;  // log mode: the stage of the last line, and its quarter
  int logged_quarter_ = -1;
};

// Prefill progress for Generation::feed's callback: nothing for a prefill that ends within half a
// second, then a ProgressBar ("prefill: tokens done/N"; `tokens` 0: a plain fraction), cleared at
// the end.
// Copyable (a std::function holds it); copies share the bar.
class PrefillProgress {
 public:
  explicit PrefillProgress(int64_t tokens);
  void operator()(int64_t done, int64_t total);

 private:
  int64_t tokens_;
  double start_;
  std::shared_ptr<ProgressBar> bar_;
};

}  // namespace ds41::cli
