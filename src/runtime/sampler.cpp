#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/hash.h"

namespace ds41 {

int32_t argmax_token(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

int32_t Sampler::sample(const float* logits, int64_t vocab, uint64_t step) const {
  if (opt_.temperature <= 0.0) return argmax_token(logits, vocab);
  const std::vector<float> p = probabilities(logits, vocab);
  const uint64_t key = splitmix64(opt_.seed ^ splitmix64(step));
  int64_t best = -1;
  float best_v = -1.f;
  for (int64_t i = 0; i < vocab; ++i) {
    if (p[size_t(i)] <= 0.f) continue;
    const double u = (double(splitmix64(key ^ uint64_t(i)) >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
    const float e = float(-std::log(u));  // Exponential(1)
    const float v = p[size_t(i)] / e;
    if (v > best_v) { best_v = v; best = i; }
  }
  return int32_t(best < 0 ? argmax_token(logits, vocab) : best);
}

std::vector<float> Sampler::probabilities(const float* logits, int64_t vocab) const {
  const float inv_t = float(1.0 / std::max(opt_.temperature, 1e-5));
  std::vector<float> p(static_cast<size_t>(vocab));
  float mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i] * inv_t);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += (p[size_t(i)] = std::exp(logits[i] * inv_t - mx));
  for (auto& v : p) v = float(v / sum);
  if (opt_.top_p < 1.0) {
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double acc = 0;
    size_t keep = 0;
    while (keep < order.size() && acc < opt_.top_p) acc += p[size_t(order[keep++])];
    for (size_t i = keep; i < order.size(); ++i) p[size_t(order[i])] = 0.f;
  }
  return p;
}

}  // namespace ds41
