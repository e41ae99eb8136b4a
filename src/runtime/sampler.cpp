#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "base/error.h"
#include "base/hash.h"
#include "kernels/gumbel_draw.h"
#include "kernels/softmax_exp.h"

namespace ds41 {

int32_t argmax_token(const float* logits, int64_t vocab) {
  // The answer of a sequential scan that moves only to a strictly larger value: the first index
  // holding the largest value, NaN never larger. Found in two passes over 4-float vectors without
  // a loop-carried index (the scan's chain of dependent loads and compares cost ~0.1 ms per
  // decoded token at a 129K vocabulary): the largest value over independent lanes, then the
  // first index that compares equal to it (-0 == +0, as the scan's `>` treats them alike).
  if (vocab <= 0) return 0;
  using F4 = float __attribute__((vector_size(16)));
  using I4 = int32_t __attribute__((vector_size(16)));
  constexpr int64_t kStep = 16;
  auto load = [&](int64_t i) {
    F4 v;
    std::memcpy(&v, logits + i, sizeof v);
    return v;
  };
  const float first = logits[0];
  F4 m[4];
  for (F4& v : m) v = F4{first, first, first, first};
  int64_t i = 0;
  for (; i + kStep <= vocab; i += kStep)
    for (int j = 0; j < 4; ++j) {
      const F4 x = load(i + 4 * j);
      m[j] = x > m[j] ? x : m[j];  // lane-wise; a NaN x leaves the lane
    }
  float top = first;
  for (int j = 0; j < 4; ++j)
    for (int k = 0; k < 4; ++k) top = m[j][k] > top ? m[j][k] : top;
  for (; i < vocab; ++i) top = logits[i] > top ? logits[i] : top;
  const F4 t4 = {top, top, top, top};
  for (i = 0; i + kStep <= vocab; i += kStep) {
    I4 any = (load(i) == t4) | (load(i + 4) == t4) | (load(i + 8) == t4) | (load(i + 12) == t4);
    if (any[0] | any[1] | any[2] | any[3]) break;
  }
  for (; i < vocab; ++i)
    if (logits[i] == top) return int32_t(i);
  return 0;  // logits[0] is NaN: every comparison with it failed, and the scan keeps index 0
}

std::vector<std::string> sampler_option_problems(const SamplerOptions& o) {
  std::vector<std::string> p;
  auto finite = [](double v) { return std::isfinite(v); };
  if (!finite(o.temperature) || o.temperature < 0) p.push_back("temperature must be >= 0");
  if (o.top_k < 0) p.push_back("top_k must be >= 0 (0 = off)");
  if (!finite(o.top_p) || o.top_p <= 0 || o.top_p > 1) p.push_back("top_p must be in (0, 1]");
  if (!finite(o.min_p) || o.min_p < 0 || o.min_p > 1) p.push_back("min_p must be in [0, 1]");
  if (!finite(o.repetition_penalty) || o.repetition_penalty <= 0) p.push_back("repetition_penalty must be > 0");
  if (!finite(o.presence_penalty) || o.presence_penalty < -2 || o.presence_penalty > 2)
    p.push_back("presence_penalty must be in [-2, 2]");
  if (!finite(o.frequency_penalty) || o.frequency_penalty < -2 || o.frequency_penalty > 2)
    p.push_back("frequency_penalty must be in [-2, 2]");
  if (o.penalty_last_n < 0) p.push_back("penalty_last_n must be >= 0 (0 = whole history)");
  return p;
}

Sampler::Sampler(const SamplerOptions& o) : opt_(o) {
  auto problems = sampler_option_problems(o);
  if (!problems.empty()) {
    std::string msg = "invalid sampling options:";
    for (auto& s : problems) msg += "\n  " + s;
    throw Error(msg);
  }
}

const float* Sampler::penalised(const float* logits, int64_t vocab, std::span<const int32_t> history,
                                SamplerScratch& s) const {
  if (!opt_.has_penalties() || history.empty()) return logits;
  s.logits.assign(logits, logits + vocab);
  size_t first = 0;
  if (opt_.penalty_last_n > 0 && history.size() > size_t(opt_.penalty_last_n))
    first = history.size() - size_t(opt_.penalty_last_n);
  // Dense counts (a hash map allocates a node per distinct token); each counted id is penalised
  // once, and its count reset for the next call.
  if (s.counts.size() < size_t(vocab)) s.counts.resize(size_t(vocab), 0);
  s.seen.clear();
  for (size_t i = first; i < history.size(); ++i) {
    const int32_t t = history[i];
    if (t < 0 || t >= vocab) continue;
    if (s.counts[size_t(t)]++ == 0) s.seen.push_back(t);
  }
  const float rep = float(opt_.repetition_penalty);
  for (const int32_t t : s.seen) {
    float& l = s.logits[size_t(t)];
    const int64_t n = s.counts[size_t(t)];
    if (opt_.repetition_penalty != 1.0) l = l > 0 ? l / rep : l * rep;
    l -= float(opt_.presence_penalty) + float(opt_.frequency_penalty * double(n));
    s.counts[size_t(t)] = 0;
  }
  return s.logits.data();
}

std::vector<float> Sampler::penalised_logits(const float* logits, int64_t vocab,
                                             std::span<const int32_t> history) const {
  SamplerScratch s;
  const float* l = penalised(logits, vocab, history, s);
  return std::vector<float>(l, l + vocab);
}

std::vector<float> Sampler::distribution(const float* logits, int64_t vocab, std::span<const int32_t> history) const {
  SamplerScratch s;
  std::vector<float> p;
  distribution_into(p, logits, vocab, history, s);
  return p;
}

namespace {

// Float -> unsigned key of the same order, without branches: negative values get every bit
// flipped, the others the sign bit; -0 becomes +0 first (v + 0 = +0), as the comparisons count it.
inline uint32_t order_key(float v) {
  v += 0.f;
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits ^ (uint32_t(int32_t(bits) >> 31) | 0x80000000u);
}

// Histogram buckets: the keys' top 12 bits (sign, exponent, 3 mantissa bits: eight buckets per
// octave), 16 KB of counts that stay in L1.
constexpr int kBucketShift = 20;

constexpr int64_t kDirectSelection = 4096;

// The first m ids of v[0, n) by descending value, ties by lower id (a strict total order when no
// value is NaN), into s.order[0, m); sorted in that order when `sorted`, else in no particular
// order. Instead of a partial sort of the whole vocabulary (~1 ms at 129K tokens and m = 1024), a
// histogram of the values' keys finds the bucket the m-th one lies in; only the ids from that
// bucket up are ordered.
void first_in_order(const float* v, int64_t n, int64_t m, bool sorted, SamplerScratch& s) {
  auto before = [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  s.order.resize(size_t(n));
  int64_t count = n;
  if (m >= n) {
    std::iota(s.order.begin(), s.order.end(), 0);
  } else if (n <= kDirectSelection) {  // small vocabularies: zeroing the histogram costs more
    std::iota(s.order.begin(), s.order.end(), 0);
    std::nth_element(s.order.begin(), s.order.begin() + m, s.order.end(), before);
    count = m;
  } else {
    s.histogram.assign(size_t{1} << (32 - kBucketShift), 0);
    for (int64_t i = 0; i < n; ++i) ++s.histogram[order_key(v[i]) >> kBucketShift];
    uint32_t lowest = uint32_t(s.histogram.size());
    int64_t above = 0;
    while (above < m) above += s.histogram[--lowest];
    // The bucket's least value, for a plain float comparison (keys below -inf's are NaN patterns,
    // which no value here is: then every value qualifies).
    const uint32_t first_key = lowest << kBucketShift;
    const uint32_t bits = first_key & 0x80000000u ? first_key ^ 0x80000000u : ~first_key;
    float least;
    std::memcpy(&least, &bits, sizeof least);
    if (std::isnan(least)) least = -INFINITY;
    count = 0;
    for (int64_t i = 0; i < n; ++i)
      if (v[i] >= least) s.order[size_t(count++)] = int32_t(i);
    if (count > m) std::nth_element(s.order.begin(), s.order.begin() + m, s.order.begin() + count, before);
    count = m;
  }
  if (sorted) std::sort(s.order.begin(), s.order.begin() + count, before);
}

// Zeroes every probability but those of s.order[0, keep); returns whether a non-zero one was
// among them.
bool keep_only(std::vector<float>& p, int64_t keep, SamplerScratch& s) {
  if (s.kept.size() < p.size()) s.kept.resize(p.size());  // once: keep varies with top-p
  int64_t kept_nonzero = 0, nonzero = 0;
  for (int64_t i = 0; i < keep; ++i) kept_nonzero += (s.kept[size_t(i)] = p[size_t(s.order[size_t(i)])]) != 0.f;
  for (const float v : p) nonzero += v != 0.f;
  std::fill(p.begin(), p.end(), 0.f);
  for (int64_t i = 0; i < keep; ++i) p[size_t(s.order[size_t(i)])] = s.kept[size_t(i)];
  return nonzero != kept_nonzero;
}

}  // namespace

void Sampler::distribution_into(std::vector<float>& p, const float* logits, int64_t vocab,
                                std::span<const int32_t> history, SamplerScratch& s) const {
  p.resize(size_t(std::max<int64_t>(vocab, 0)));
  if (vocab <= 0) return;
  const float* l = penalised(logits, vocab, history, s);
  if (opt_.greedy()) {
    std::fill(p.begin(), p.end(), 0.f);
    p[size_t(argmax_token(l, vocab))] = 1.f;
    return;
  }
  const float inv_t = float(1.0 / std::max(opt_.temperature, 1e-5));
  int64_t keep = vocab;
  double sum = 0;
  if (opt_.top_k > 0 && opt_.top_k < vocab) {
    // Top-k on the logits, then the softmax over the k tokens alone: only their logits count, so
    // logits that came back -inf from the head screen (greedy-style top-k logits) give the same
    // probabilities as the full product.
    bool finite = true;  // a NaN or +inf logit anywhere: the NaN distribution the full softmax gives
    for (int64_t i = 0; i < vocab; ++i) finite &= l[i] < INFINITY;
    if (!finite) {
      std::fill(p.begin(), p.end(), std::numeric_limits<float>::quiet_NaN());
      return;
    }
    keep = opt_.top_k;
    first_in_order(l, vocab, keep, /*sorted=*/false, s);
    std::sort(s.order.begin(), s.order.begin() + keep);  // ids in order: the sum's lanes
    if (s.top_logits.size() < size_t(keep)) s.top_logits.resize(size_t(keep));
    if (s.top_exp.size() < size_t(keep)) s.top_exp.resize(size_t(keep));
    for (int64_t i = 0; i < keep; ++i) s.top_logits[size_t(i)] = l[s.order[size_t(i)]];
    const float mx = scaled_max(s.top_logits.data(), keep, inv_t);
    sum = scaled_exp_sum(s.top_logits.data(), keep, inv_t, mx, s.top_exp.data());
    std::fill(p.begin(), p.end(), 0.f);
    const double inv_sum = 1.0 / sum;
    for (int64_t i = 0; i < keep; ++i) p[size_t(s.order[size_t(i)])] = float(double(s.top_exp[size_t(i)]) * inv_sum);
  } else {
    const float mx = scaled_max(l, vocab, inv_t);
    sum = scaled_exp_sum(l, vocab, inv_t, mx, p.data());
    const double inv_sum = 1.0 / sum;
    for (auto& v : p) v = float(double(v) * inv_sum);
  }
  // A NaN or infinite logit (or none above -inf) makes the sum NaN: every probability NaN, which
  // draw() refuses; the filters below need values they can order.
  if (!std::isfinite(sum)) {
    std::fill(p.begin(), p.end(), std::numeric_limits<float>::quiet_NaN());
    return;
  }

  bool dropped = false;
  if (opt_.top_p < 1.0) {
    // Sort a prefix large enough to reach top_p; widen it when the mass is spread thin.
    int64_t sorted = std::min<int64_t>(keep, 1024);
    for (;;) {
      first_in_order(p.data(), vocab, sorted, /*sorted=*/true, s);
      double acc = 0;
      int64_t n = 0;
      while (n < sorted && acc < opt_.top_p) acc += p[size_t(s.order[size_t(n++)])];
      if (acc >= opt_.top_p || sorted == keep) {
        keep = std::min(keep, n);
        break;
      }
      sorted = std::min(keep, sorted * 8);
    }
    dropped = keep_only(p, keep, s);
  }
  if (opt_.min_p > 0) {
    const float floor_p = float(opt_.min_p) * scaled_max(p.data(), vocab, 1.0f);
    for (auto& v : p)
      if (v < floor_p) {
        dropped = dropped || v != 0.f;
        v = 0.f;
      }
  }
  if (dropped) {
    const double inv_kept_sum = 1.0 / lane_sum(p.data(), vocab);
    for (auto& v : p) v = float(double(v) * inv_kept_sum);
  }
}

namespace {

uint64_t draw_key(uint64_t seed, uint64_t step, uint64_t stream) {
  return splitmix64(seed ^ splitmix64(step) ^ (stream ? splitmix64(~stream) : 0));
}

}  // namespace

int32_t Sampler::draw(const std::vector<float>& probs, uint64_t step, uint64_t stream) const {
  const GumbelBest best = gumbel_argmax(probs.data(), int64_t(probs.size()), draw_key(opt_.seed, step, stream));
  if (best.index < 0)
    throw Error(best.nan ? "sampler: the distribution is NaN (a logit was NaN or infinite, or every logit -inf)"
                         : "sampler: cannot draw from an all-zero distribution");
  return int32_t(best.index);
}

double Sampler::uniform(uint64_t step, uint64_t stream) const {
  const uint64_t key = draw_key(opt_.seed, step, stream);
  return double(splitmix64(key ^ 0x9E3779B97F4A7C15ull) >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
}

int32_t Sampler::sample(const float* logits, int64_t vocab, uint64_t step, std::span<const int32_t> history) const {
  SamplerScratch s;
  return sample(logits, vocab, step, history, s);
}

int32_t Sampler::sample(const float* logits, int64_t vocab, uint64_t step, std::span<const int32_t> history,
                        SamplerScratch& s) const {
  if (opt_.greedy()) return argmax_token(penalised(logits, vocab, history, s), vocab);
  distribution_into(s.probs, logits, vocab, history, s);
  return draw(s.probs, step);
}

}  // namespace ds41
