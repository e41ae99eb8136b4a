// PyTorch's fp32 reduction order (kernels/torch_sum.h) and vectorized exp (kernels/vector_exp.h)
// against torch itself: tests/data/torch_numerics.bin is what torch computed on the same inputs
// (tools/make_torch_numerics_reference.py). Every value must match bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric_formats.h"
#include "kernels/torch_sum.h"
#include "kernels/vector_exp.h"
#include "simd_levels.h"

namespace ds41 {
namespace {

class Reader {
 public:
  explicit Reader(const std::string& path) : in_(path, std::ios::binary) {}
  bool ok() const { return bool(in_); }
  template <class T>
  T get() {
    T v{};
    in_.read(reinterpret_cast<char*>(&v), sizeof(T));
    if (!in_) throw std::runtime_error("torch_numerics.bin: truncated");
    return v;
  }
  template <class T>
  std::vector<T> get_n(size_t n) {
    std::vector<T> v(n);
    in_.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(T)));
    if (!in_) throw std::runtime_error("torch_numerics.bin: truncated");
    return v;
  }

 private:
  std::ifstream in_;
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

struct TorchData {
  struct Row {
    std::vector<float> x;
    float sum, sum_squares;
  };
  struct Bf16Row {
    std::vector<uint16_t> x;
    float sum_squares;
  };
  std::vector<Row> rows;
  std::vector<Bf16Row> bf16_rows;
  std::vector<float> sigmoid_in, sigmoid_out;
};

const TorchData& data() {
  static const TorchData d = [] {
    TorchData t;
    Reader r(std::string(DS41_SOURCE_DIR) + "/tests/data/torch_numerics.bin");
    if (!r.ok()) throw std::runtime_error("tests/data/torch_numerics.bin missing");
    const auto magic = r.get_n<char>(8);
    if (std::string(magic.begin(), magic.end()) != "DS41TNUM" || r.get<uint32_t>() != 1)
      throw std::runtime_error("torch_numerics.bin: bad header");
    for (uint32_t c = r.get<uint32_t>(); c > 0; --c) {
      TorchData::Row row;
      row.x = r.get_n<float>(r.get<uint32_t>());
      row.sum = r.get<float>();
      row.sum_squares = r.get<float>();
      t.rows.push_back(std::move(row));
    }
    for (uint32_t c = r.get<uint32_t>(); c > 0; --c) {
      TorchData::Bf16Row row;
      row.x = r.get_n<uint16_t>(r.get<uint32_t>());
      row.sum_squares = r.get<float>();
      t.bf16_rows.push_back(std::move(row));
    }
    const uint32_t m = r.get<uint32_t>();
    t.sigmoid_in = r.get_n<float>(m);
    t.sigmoid_out = r.get_n<float>(m);
    return t;
  }();
  return d;
}

TEST(TorchSum, Fp32RowsMatchTorchBitForBit) {
  ASSERT_GE(data().rows.size(), 100u);
  int exact_differs = 0;
  for (const auto& row : data().rows) {
    const int64_t n = int64_t(row.x.size());
    EXPECT_PRED2(same_bits, torch_sum_f32(row.x.data(), n), row.sum) << "n " << n;
    EXPECT_PRED2(same_bits, torch_sum_squares_f32(row.x.data(), n), row.sum_squares) << "n " << n;
    double exact = 0;
    for (float v : row.x) exact += v;
    exact_differs += float(exact) != row.sum;
  }
  // The order matters: a correctly rounded sum disagrees with torch on many of these rows.
  EXPECT_GT(exact_differs, 10);
}

TEST(TorchSum, Bf16SquareSumsMatchTorchBitForBit) {
  ASSERT_GE(data().bf16_rows.size(), 100u);
  for (const auto& row : data().bf16_rows)
    EXPECT_PRED2(same_bits, torch_sum_squares_bf16(row.x.data(), int64_t(row.x.size())), row.sum_squares)
        << "n " << row.x.size();
}

TEST(TorchSum, ClosedForms) {
  EXPECT_EQ(torch_sum_f32(nullptr, 0), 0.0f);
  const float one = 1.0f;
  EXPECT_EQ(torch_sum_f32(&one, 1), 1.0f);
  // 2^24 then sixteen 1s (n = 17): lanes 1..7 of the only vector hold 1s and lane 0 2^24; the
  // tail element 16 is added first from +0, then the lanes in order: ((1 + 2^24) ...) loses
  // every 1 that meets 2^24 alone, but lanes were already summed per position: exact check of
  // the documented order.
  std::vector<float> x(17, 1.0f);
  x[0] = 16777216.0f;
  // Vector part: one vector of 8 lanes (elements 0..7) + one (8..15) -> rows = 0 (need 4 vectors
  // per ILP row), so both vectors go into accumulator 0: lane l = x[l] + x[8 + l]. Lane 0 =
  // 2^24 + 1 = 2^24 (tie to even), lanes 1..7 = 2. Then total = 0 + x[16] = 1; + lane 0 ->
  // 2^24 + 1 -> 2^24; + 2 seven times -> 2^24 + 14.
  EXPECT_EQ(torch_sum_f32(x.data(), 17), 16777216.0f + 14.0f);
}

TEST(VectorExp, SigmoidMatchesTorchBitForBit) {
  const auto& d = data();
  ASSERT_EQ(d.sigmoid_in.size(), d.sigmoid_out.size());
  ASSERT_GE(d.sigmoid_in.size(), 16384u);
  int libm_differs = 0;
  for (size_t i = 0; i < d.sigmoid_in.size(); ++i) {
    const float x = d.sigmoid_in[i];
    ASSERT_PRED2(same_bits, torch_vec_sigmoid(x), d.sigmoid_out[i]) << "x = " << x;
    libm_differs += !same_bits(1.0f / (1.0f + std::exp(0.0f - x)), d.sigmoid_out[i]);
  }
  // libm's expf is a different function in the last bit: the reason vector_exp.h exists.
  EXPECT_GT(libm_differs, 0);
}

// The vector form (8 lanes, then the rest one by one) gives the scalar form's bits, at every
// SIMD level and every length.
TEST(VectorExp, InPlaceEqualsTheScalarFormAtEveryLevelAndLength) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-90.0f, 10.0f);
  std::vector<SimdLevel> levels = supported_simd_levels();
  levels.insert(levels.begin(), SimdLevel::Scalar);
  for (SimdLevel l : levels) {
    ScopedSimdLevel level(l);
    for (int n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 64, 1000}) {
      std::vector<float> x(size_t(n) + 1);
      for (float& v : x) v = u(rng);
      const float guard = x[size_t(n)];
      std::vector<float> y = x;
      torch_vec_expf_in_place(y.data(), n);
      for (int i = 0; i < n; ++i)
        ASSERT_PRED2(same_bits, y[size_t(i)], torch_vec_expf(x[size_t(i)])) << simd_level_name(l) << " " << n << " " << i;
      EXPECT_PRED2(same_bits, y[size_t(n)], guard) << simd_level_name(l) << ": wrote past n = " << n;
    }
  }
}

// PyTorch's elementwise loop: 16 elements a step, the last n mod 16 of a tensor of n in its scalar
// loop. Rows of hc = 4: a call of 6 rows (24 elements) has its last 8 elements, rows 4 and 5, in
// the tail; 8 rows have none; a decode row of 4 is all tail; rows of 6 split inside a row.
TEST(VectorExp, ScalarTailOfARowMajorTensor) {
  EXPECT_EQ(torch_scalar_tail_from(3, 6, 4), 4);  // row 3: elements 12-15, vectorized
  EXPECT_EQ(torch_scalar_tail_from(4, 6, 4), 0);  // row 4: elements 16-19, tail
  EXPECT_EQ(torch_scalar_tail_from(5, 6, 4), 0);
  for (int s = 0; s < 8; ++s) EXPECT_EQ(torch_scalar_tail_from(s, 8, 4), 4);
  EXPECT_EQ(torch_scalar_tail_from(0, 1, 4), 0);
  EXPECT_EQ(torch_scalar_tail_from(2, 3, 6), 4);  // elements 12-17: 12-15 vectorized, 16-17 tail
  EXPECT_EQ(torch_scalar_tail_from(0, 1, 384), 384);  // the released router: 384 = 24 x 16
  // log1p: SLEEF's, a faithful log1p (closed forms at exact points).
  EXPECT_EQ(torch_vec_log1pf(0.0f), 0.0f);
  EXPECT_NEAR(torch_vec_log1pf(1.0f), std::log1p(1.0), 1e-7);
  EXPECT_NEAR(torch_vec_log1pf(1e-7f), 1e-7, 1e-14);
}

TEST(VectorExp, SpecialValues) {
  EXPECT_EQ(torch_vec_expf(0.0f), 1.0f);
  EXPECT_EQ(torch_vec_expf(-200.0f), 0.0f);
  EXPECT_TRUE(std::isinf(torch_vec_expf(200.0f)));
  EXPECT_EQ(torch_vec_sigmoid(0.0f), 0.5f);
  EXPECT_EQ(torch_vec_sigmoid(-200.0f), 0.0f);
  EXPECT_EQ(torch_vec_sigmoid(200.0f), 1.0f);
}

}  // namespace
}  // namespace ds41
