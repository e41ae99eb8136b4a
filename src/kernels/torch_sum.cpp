#include "kernels/torch_sum.h"

#include <algorithm>
#include <array>

#include "kernels/numeric_formats.h"

// Every addition must round on its own in fp32, in the order written.
#include "base/fp_contract_off.h"

namespace ds41 {

namespace {

constexpr int kLanes = 8;    // fp32 lanes of the vector type the reduction runs on
constexpr int kIlp = 4;      // interleaved accumulators
constexpr int kLevels = 4;   // cascade levels

using Vec = std::array<float, kLanes>;

inline void add_into(Vec& acc, const Vec& v) {
  for (int l = 0; l < kLanes; ++l) acc[size_t(l)] += v[size_t(l)];
}

int64_t ceil_log2(int64_t x) {
  int64_t r = 0;
  while ((int64_t(1) << r) < x) ++r;
  return r;
}

// load(i) returns element i of the row as fp32.
template <class Load>
float cascade_sum(int64_t n, Load load) {
  if (n < kLanes) {  // too short for one vector: the same 4-accumulator row sum over scalars
    std::array<float, kIlp> part{};
    const int64_t rows = n / kIlp;
    for (int64_t r = 0; r < rows; ++r)
      for (int k = 0; k < kIlp; ++k) part[size_t(k)] += load(r * kIlp + k);
    for (int64_t t = rows * kIlp; t < n; ++t) part[0] += load(t);
    for (int k = 1; k < kIlp; ++k) part[0] += part[size_t(k)];
    return part[0];
  }
  const int64_t nvec = n / kLanes;
  auto vec_at = [&](int64_t v) {
    Vec out;
    for (int l = 0; l < kLanes; ++l) out[size_t(l)] = load(v * kLanes + l);
    return out;
  };
  const int64_t rows = nvec / kIlp;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(rows) / kLevels);
  const int64_t level_step = int64_t(1) << level_power;
  const int64_t level_mask = level_step - 1;
  Vec zero{};
  std::array<std::array<Vec, kIlp>, kLevels> acc;
  for (auto& lv : acc) lv.fill(zero);

  int64_t i = 0;
  while (i + level_step <= rows) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < kIlp; ++k) add_into(acc[0][size_t(k)], vec_at(i * kIlp + k));
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kIlp; ++k) {
        add_into(acc[size_t(j)][size_t(k)], acc[size_t(j - 1)][size_t(k)]);
        acc[size_t(j - 1)][size_t(k)] = zero;
      }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < rows; ++i)
    for (int k = 0; k < kIlp; ++k) add_into(acc[0][size_t(k)], vec_at(i * kIlp + k));
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < kIlp; ++k) add_into(acc[0][size_t(k)], acc[size_t(j)][size_t(k)]);

  std::array<Vec, kIlp>& part = acc[0];
  for (int64_t v = rows * kIlp; v < nvec; ++v) add_into(part[0], vec_at(v));
  for (int k = 1; k < kIlp; ++k) add_into(part[0], part[size_t(k)]);

  float total = 0.0f;
  for (int64_t t = nvec * kLanes; t < n; ++t) total += load(t);
  for (int l = 0; l < kLanes; ++l) total += part[0][size_t(l)];
  return total;
}

}  // namespace

float torch_sum_f32(const float* x, int64_t n) {
  return cascade_sum(n, [x](int64_t i) { return x[i]; });
}

float torch_sum_squares_bf16(const uint16_t* x, int64_t n) {
  return cascade_sum(n, [x](int64_t i) {
    const float v = bf16_to_f32(x[i]);
    return v * v;
  });
}

float torch_sum_squares_f32(const float* x, int64_t n) {
  return cascade_sum(n, [x](int64_t i) { return x[i] * x[i]; });
}

}  // namespace ds41
