#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "base/hash.h"

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

void Sampler::distribution_into(std::vector<float>& p, const float* logits, int64_t vocab,
                                std::span<const int32_t> history, SamplerScratch& s) const {
  p.assign(size_t(std::max<int64_t>(vocab, 0)), 0.f);
  if (vocab <= 0) return;
  const float* l = penalised(logits, vocab, history, s);
  if (opt_.greedy()) {
    p[size_t(argmax_token(l, vocab))] = 1.f;
    return;
  }
  const float inv_t = float(1.0 / std::max(opt_.temperature, 1e-5));
  float mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, l[i] * inv_t);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += (p[size_t(i)] = std::exp(l[i] * inv_t - mx));
  for (auto& v : p) v = float(v / sum);

  const bool need_order = opt_.top_k > 0 || opt_.top_p < 1.0;
  if (need_order) {
    // Tokens by descending probability, ties by lower id; only as many as the filters can keep.
    auto before = [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b); };
    std::vector<int32_t>& order = s.order;
    order.resize(size_t(vocab));
    std::iota(order.begin(), order.end(), 0);
    size_t keep = order.size();
    if (opt_.top_k > 0) keep = std::min(keep, size_t(opt_.top_k));
    // Sort a prefix large enough to reach top_p; widen it when the mass is spread thin.
    size_t sorted = std::min(keep, size_t(1024));
    for (;;) {
      std::partial_sort(order.begin(), order.begin() + long(sorted), order.end(), before);
      if (opt_.top_p >= 1.0) break;
      double acc = 0;
      size_t n = 0;
      while (n < sorted && acc < opt_.top_p) acc += p[size_t(order[n++])];
      if (acc >= opt_.top_p || sorted == keep) {
        keep = std::min(keep, n);
        break;
      }
      sorted = std::min(keep, sorted * 8);
    }
    s.kept.assign(size_t(vocab), 0);
    for (size_t i = 0; i < keep; ++i) s.kept[size_t(order[i])] = 1;
    for (int64_t i = 0; i < vocab; ++i)
      if (!s.kept[size_t(i)]) p[size_t(i)] = 0.f;
  }
  if (opt_.min_p > 0) {
    const float top = *std::max_element(p.begin(), p.end());
    const float floor_p = float(opt_.min_p) * top;
    for (auto& v : p)
      if (v < floor_p) v = 0.f;
  }
  double kept_sum = 0;
  for (float v : p) kept_sum += v;
  for (auto& v : p) v = float(v / kept_sum);
}

namespace {

uint64_t draw_key(uint64_t seed, uint64_t step, uint64_t stream) {
  return splitmix64(seed ^ splitmix64(step) ^ (stream ? splitmix64(~stream) : 0));
}

}  // namespace

int32_t Sampler::draw(const std::vector<float>& probs, uint64_t step, uint64_t stream) const {
  const uint64_t key = draw_key(opt_.seed, step, stream);
  int64_t best = -1;
  float best_v = -1.f;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.f) continue;
    const double u = (double(splitmix64(key ^ uint64_t(i)) >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
    const float e = float(-std::log(u));  // Exponential(1)
    const float v = probs[i] / e;
    if (v > best_v) {
      best_v = v;
      best = int64_t(i);
    }
  }
  if (best < 0) throw Error("sampler: cannot draw from an all-zero distribution");
  return int32_t(best);
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
