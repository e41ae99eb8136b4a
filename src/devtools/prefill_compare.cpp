#include "devtools/prefill_compare.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>

#include "base/error.h"
#include "model/model.h"
#include "runtime/session.h"

namespace ds41 {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of the whole process (every thread of the pool), seconds.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Lowest id among the largest logits (the greedy sampler's tie rule).
int32_t greedy(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// log-softmax of one row, in double.
std::vector<double> log_softmax(const float* x, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
  return out;
}

// Compares `other` (logits lo) with the exact sequence `exact` (logits le) over `steps` generated
// tokens; both states are copies and are advanced.
Divergence compare_continuations(const Model& model, SequenceState exact, std::vector<float> le, SequenceState other,
                                 std::vector<float> lo, int steps, const ForwardOptions& fo, ThreadPool* pool) {
  Divergence d;
  const int64_t V = int64_t(le.size());
  d.first_kl = logits_kl(le.data(), lo.data(), V);
  d.first_top1 = greedy(le) == greedy(lo);
  for (int64_t i = 0; i < V; ++i)
    d.first_max_logit_diff = std::max(d.first_max_logit_diff, double(std::fabs(le[size_t(i)] - lo[size_t(i)])));
  // Free-running greedy text of the other sequence (on a copy: the original is teacher-forced below).
  std::vector<int32_t> text;
  {
    SequenceState free_run = other;
    std::vector<float> l = lo;
    for (int k = 0; k < steps; ++k) {
      text.push_back(greedy(l));
      if (k + 1 < steps) l = model.forward(free_run, {text.back()}, fo, pool);
    }
  }
  // The exact run's greedy text, fed to both: per-step divergence of the distributions.
  int agree = 0;
  double kl_sum = 0;
  bool prefix = true;
  for (int k = 0; k < steps; ++k) {
    const int32_t tok = greedy(le);
    const double kl = logits_kl(le.data(), lo.data(), V);
    kl_sum += kl;
    d.forced_max_kl = std::max(d.forced_max_kl, kl);
    agree += greedy(lo) == tok;
    d.greedy_equal += text[size_t(k)] == tok;
    prefix = prefix && text[size_t(k)] == tok;
    d.greedy_prefix += prefix;
    if (k + 1 < steps) {
      le = model.forward(exact, {tok}, fo, pool);
      lo = model.forward(other, {tok}, fo, pool);
    }
  }
  if (steps > 0) {
    d.forced_mean_kl = kl_sum / steps;
    d.forced_top1 = double(agree) / steps;
  }
  return d;
}

// A session file in the temp directory, removed when the object dies.
class TempSessionFile {
 public:
  TempSessionFile() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ds41-session-XXXXXX").string();
    const int fd = mkstemp(tmpl.data());
    if (fd < 0) throw Error("prefill comparison: cannot create a temporary session file");
    ::close(fd);
    path_ = tmpl;
  }
  ~TempSessionFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

double logits_kl(const float* p_logits, const float* q_logits, int64_t n) {
  const std::vector<double> lp = log_softmax(p_logits, n), lq = log_softmax(q_logits, n);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);  // rounding can leave a tiny negative for identical rows
}

std::vector<PrefillCompareRow> compare_prefill(const Model& model, const PrefillCompareOptions& opt, ThreadPool* pool,
                                               const std::function<void(const PrefillCompareRow&)>& progress) {
  const ModelConfig& c = model.config();
  if (opt.lengths.empty()) throw Error("prefill comparison: no prompt lengths given");
  if (opt.continuation < 0) throw Error("prefill comparison: the continuation length must be >= 0");
  if (opt.repeats < 1) throw Error("prefill comparison: repeats must be >= 1");
  const int64_t longest = *std::max_element(opt.lengths.begin(), opt.lengths.end());
  for (int64_t n : opt.lengths)
    if (n < 1 || n + opt.continuation > c.max_seq_len)
      throw Error("prefill comparison: a prompt of " + std::to_string(n) + " tokens plus " +
                  std::to_string(opt.continuation) + " generated does not fit the model (max_seq_len " +
                  std::to_string(c.max_seq_len) + ")");
  std::vector<int32_t> tokens = opt.tokens;
  if (tokens.empty()) {
    std::mt19937_64 g(opt.seed);
    for (int64_t i = 0; i < longest; ++i) tokens.push_back(int32_t(g() % uint64_t(c.vocab_size)));
  } else if (int64_t(tokens.size()) < longest) {
    throw Error("prefill comparison: the prompt tokens (" + std::to_string(tokens.size()) +
                ") are fewer than the longest length " + std::to_string(longest));
  }

  ForwardOptions full_opt;
  full_opt.corrected_index_keys = opt.corrected_index_keys;
  ForwardOptions ced_opt = full_opt;
  ced_opt.prefill = PrefillMode::Ced;

  std::vector<PrefillCompareRow> rows;
  for (int64_t n : opt.lengths) {
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + n);
    PrefillCompareRow r;
    r.length = n;
    r.continuation = opt.continuation;
    auto timed_prefill = [&](const ForwardOptions& fo, double& best, double& best_cpu, std::vector<float>& logits) {
      SequenceState st = model.new_sequence();
      for (int k = 0; k < opt.repeats; ++k) {
        st = model.new_sequence();
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = process_cpu_s();
        logits = model.forward(st, prompt, fo, pool);
        const double cpu = process_cpu_s() - c0, s = seconds_since(t0);
        best = k == 0 ? s : std::min(best, s);
        best_cpu = k == 0 ? cpu : std::min(best_cpu, cpu);
      }
      return st;
    };
    std::vector<float> lf;
    const SequenceState full = timed_prefill(full_opt, r.full_s, r.full_cpu_s, lf);
    if (opt.ced) {
      std::vector<float> lc;
      SequenceState ced = timed_prefill(ced_opt, r.ced_s, r.ced_cpu_s, lc);
      r.speedup = r.full_s / r.ced_s;
      r.cpu_speedup = r.full_cpu_s / r.ced_cpu_s;
      r.ced = compare_continuations(model, full, lf, std::move(ced), std::move(lc), opt.continuation, full_opt, pool);
    }
    if (opt.session_replay) {
      TempSessionFile file;
      save_session(file.path(), model, full, SessionKind::Compact);
      r.session_bytes = int64_t(std::filesystem::file_size(file.path()));
      std::vector<float> lr;
      const auto t0 = std::chrono::steady_clock::now();
      SequenceState restored = load_session(file.path(), model, pool, full_opt, &lr);
      r.restore_s = seconds_since(t0);
      r.replay = compare_continuations(model, full, lf, std::move(restored), std::move(lr), opt.continuation, full_opt, pool);
    }
    rows.push_back(r);
    if (progress) progress(r);
  }
  return rows;
}

}  // namespace ds41
