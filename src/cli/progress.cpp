#include "cli/progress.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unistd.h>

namespace ds41::cli {

namespace {
double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressBar::ProgressBar(std::string label) : label_(std::move(label)), tty_(::isatty(2) == 1), start_(seconds_now()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(const std::string& stage, int64_t done, int64_t total) {
  if (total <= 0) return;
  const double now = seconds_now();
  if (!tty_) {
    const int quarter = int(4 * done / total);
    if (stage == logged_stage_ && quarter <= logged_quarter_) return;
    logged_stage_ = stage;
    logged_quarter_ = quarter;
    std::fprintf(stderr, "%s: %s %lld/%lld (%d%%, %.1f s)\n", label_.c_str(), stage.c_str(), (long long)done,
                 (long long)total, int(100 * done / total), now - start_);
    return;
  }
  if (done < total && now - last_draw_ < 0.05) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = int(double(kWidth) * double(done) / double(total));
  std::string bar(size_t(filled), '#');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r\033[K%s [%s] %3d%% %s %lld/%lld", label_.c_str(), bar.c_str(), int(100 * done / total),
               stage.c_str(), (long long)done, (long long)total);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
}

PrefillProgress::PrefillProgress(int64_t tokens) : tokens_(tokens), start_(seconds_now()) {}

void PrefillProgress::operator()(int64_t done, int64_t total) {
  if (!bar_) {
    if (seconds_now() - start_ < 0.5 || done >= total) return;
    bar_ = std::make_shared<ProgressBar>("prefill");
  }
  // In tokens where the count is known (the work is token-layers: a layer of a chunk counts its tokens).
  if (tokens_ > 0) bar_->update("tokens", done * tokens_ / std::max<int64_t>(total, 1), tokens_);
  else bar_->update("", done, total);
  if (done >= total) bar_.reset();  // cleared before the answer prints on that line
}

}  // namespace ds41::cli
