#include "model/head_screen.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/scratch.h"
#include "kernels/gemm.h"
#include "kernels/int8_dot.h"
#include "kernels/numeric_formats.h"

namespace ds41 {

namespace {

// Rows per parallel piece of the screen: enough pieces for any thread count, each a few hundred
// rows (one int8 kernel call and one run of the bound loop).
int64_t screen_chunks(int64_t V) { return std::min<int64_t>(V, 256); }

// The double arithmetic of the bounds rounds a few times; every bound is inflated by this
// relative margin (far above the ~10 * 2^-53 it can lose) so that it stays an upper bound.
constexpr double kInflate = 1.0 + 0x1p-40;

}  // namespace

std::unique_ptr<HeadScreen> HeadScreen::build(const uint16_t* head, int64_t vocab, int64_t dim, ThreadPool* pool) {
  if (!head || vocab <= 0 || dim <= 0) return nullptr;
  const int64_t Kp = (dim + 63) / 64 * 64;
  if (Kp > kInt8DotMaxK) return nullptr;
  std::unique_ptr<HeadScreen> s(new HeadScreen());
  s->V_ = vocab;
  s->K_ = dim;
  s->Kp_ = Kp;
  s->q_ = ByteBuffer(size_t(vocab * Kp));  // zero-filled: the padding contributes nothing
  s->scale_.assign(size_t(vocab), 0.f);
  s->err_.assign(size_t(vocab), 0.0);
  s->row_sum_.assign(size_t(vocab), 0);
  s->abs_sum_.assign(size_t(vocab), 0);
  s->norm_.assign(size_t(vocab), 0.0);
  std::atomic<bool> finite{true};
  const int64_t chunks = screen_chunks(vocab);
  std::vector<double> chunk_max(size_t(chunks), 0.0);
  parallel_for(pool, chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double largest = 0;
      for (int64_t v = chunk_begin(vocab, chunks, c); v < chunk_begin(vocab, chunks, c + 1); ++v) {
        const uint16_t* w = head + v * dim;
        float m = 0.f;
        for (int64_t k = 0; k < dim; ++k) {
          const float a = std::fabs(bf16_to_f32(w[k]));
          if (!(a <= std::numeric_limits<float>::max())) {  // inf or NaN
            finite = false;
            return;
          }
          m = std::max(m, a);
        }
        int8_t* q = reinterpret_cast<int8_t*>(s->q_.data()) + v * Kp;
        const float sv = m / 127.0f;
        double err = 0, sq = 0;
        int64_t sum = 0, abs_sum = 0;
        for (int64_t k = 0; k < dim; ++k) {
          const double wk = bf16_to_f32(w[k]);
          int qk = 0;
          if (sv > 0) qk = int(std::clamp(std::nearbyint(double(bf16_to_f32(w[k]) / sv)), -127.0, 127.0));
          q[k] = int8_t(qk);
          // wk and sv * qk (<= 32 significant bits) are exact doubles of similar size: the
          // difference is exact too; the margin below covers the rare exception.
          err = std::max(err, std::fabs(wk - double(sv) * qk));
          sq += wk * wk;
          sum += qk;
          abs_sum += qk < 0 ? -qk : qk;
        }
        s->scale_[size_t(v)] = sv;
        s->err_[size_t(v)] = err * kInflate + double(m) * 0x1p-50;
        s->row_sum_[size_t(v)] = int32_t(sum);
        s->abs_sum_[size_t(v)] = int32_t(abs_sum);
        s->norm_[size_t(v)] = std::sqrt(sq) * kInflate;
        largest = std::max(largest, double(m));
      }
      chunk_max[size_t(c)] = largest;
    }
  });
  if (!finite) return nullptr;
  for (double m : chunk_max) s->max_abs_ = std::max(s->max_abs_, m);
  return s;
}

int64_t HeadScreen::bytes() const {
  return V_ * Kp_ + V_ * int64_t(sizeof(float) + 2 * sizeof(double) + 2 * sizeof(int32_t));
}

int64_t HeadScreen::bytes_read(int64_t candidates) const { return bytes() + candidates * K_ * 2; }

HeadScreen::Result HeadScreen::top_logits(const float* x, int k, const uint16_t* head, float* logits,
                                          ThreadPool* pool) const {
  Result res;
  if (k < 1 || k > kMaxTopK) return res;
  k = int(std::min<int64_t>(k, V_));
  const int64_t K = K_;

  // x as int8 h with scale s_x, and what the bound needs of it.
  double xmax = 0, sq = 0;
  for (int64_t i = 0; i < K; ++i) {
    const double a = std::fabs(double(x[i]));
    if (!(a <= std::numeric_limits<float>::max())) return res;  // inf or NaN: the full product decides
    xmax = std::max(xmax, a);
    sq += a * a;
  }
  // An fp32 product or sum of the twin could overflow: leave such heads to the full product.
  if (xmax * max_abs_ * double(K) > 0x1p120) return res;
  DS41_SCRATCH(int8_t, h, Kp_);  // zero padding past K
  const double sx = xmax / 127.0;
  double dmax = 0;
  int64_t h_abs = 0;
  for (int64_t i = 0; i < K; ++i) {
    const int hi = sx > 0 ? int(std::clamp(std::nearbyint(double(x[i]) / sx), -127.0, 127.0)) : 0;
    h[size_t(i)] = int8_t(hi);
    h_abs += hi < 0 ? -hi : hi;
    dmax = std::max(dmax, std::fabs(double(x[i]) - sx * hi));
  }
  dmax = dmax * kInflate + xmax * 0x1p-50;
  const double xnorm = std::sqrt(sq) * kInflate;
  // Higham's gamma_{K+2} for the twin's recursive fp32 sum of rounded products, u = 2^-24.
  const double u = 0x1p-24, gamma = double(K + 2) * u / (1.0 - double(K + 2) * u);
  const double underflow = double(K) * 0x1p-140;
  const double sx_habs = sx * double(h_abs);
  const double twin_scale = gamma * xnorm * kInflate;

  const int64_t chunks = screen_chunks(V_);
  DS41_SCRATCH_UNINIT(int32_t, dots, V_, 0);
  DS41_SCRATCH_UNINIT(double, lows, chunks * k, 0);
  DS41_SCRATCH_UNINIT(int64_t, counts, chunks, 0);
  DS41_SCRATCH_UNINIT(int64_t, ids, V_, 0);
  DS41_SCRATCH_UNINIT(double, uppers, V_, 0);
  const int8_t* q = reinterpret_cast<const int8_t*>(q_.data());
  const float minus_inf = -std::numeric_limits<float>::infinity();

  // Pass 1, per chunk of rows: the screen, the bounds, the chunk's k largest lower bounds, and
  // its own candidates against the k-th of them, L_c <= L (a superset of the final ones, listed
  // with their upper bounds at the chunk's place in ids / uppers while the chunk is in cache).
  parallel_for(pool, chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = chunk_begin(V_, chunks, c), r1 = chunk_begin(V_, chunks, c + 1);
      int8_row_dots(h.data(), q + r0 * Kp_, row_sum_.data() + r0, r1 - r0, Kp_, dots.data() + r0);
      DS41_SCRATCH_UNINIT(double, upper, r1 - r0, 0);
      DS41_SCRATCH_UNINIT(double, lower, r1 - r0, 0);
      // A branch-free loop (vectorised), then the selections.
      for (int64_t v = r0; v < r1; ++v) {
        const double sv = scale_[size_t(v)], ev = err_[size_t(v)];
        const double approx = sx * sv * double(dots[size_t(v)]);
        const double bound = (sx_habs * ev + dmax * (sv * double(abs_sum_[size_t(v)]) + double(K) * ev)) * kInflate +
                             twin_scale * norm_[size_t(v)] + underflow + std::fabs(approx) * 0x1p-45;
        upper[size_t(v - r0)] = approx + bound;
        lower[size_t(v - r0)] = approx - bound;
        logits[v] = minus_inf;
      }
      double* best = lows.data() + c * k;  // descending
      for (int i = 0; i < k; ++i) best[i] = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < r1 - r0; ++i) {
        const double low = lower[size_t(i)];
        if (low > best[k - 1]) {
          int j = k - 1;
          for (; j > 0 && best[j - 1] < low; --j) best[j] = best[j - 1];
          best[j] = low;
        }
      }
      int64_t n = 0;
      for (int64_t i = 0; i < r1 - r0; ++i)
        if (upper[size_t(i)] >= best[k - 1]) {
          ids[size_t(r0 + n)] = r0 + i;
          uppers[size_t(r0 + n++)] = upper[size_t(i)];
        }
      counts[size_t(c)] = n;
    }
  });
  // L: the k-th largest lower bound over all rows; the candidates: upper bound >= L.
  std::nth_element(lows.begin(), lows.begin() + (k - 1), lows.begin() + chunks * k, std::greater<double>());
  const double L = lows[size_t(k - 1)];
  for (int64_t c = 0; c < chunks && res.candidates <= max_candidates(); ++c) {
    const int64_t r0 = chunk_begin(V_, chunks, c);
    for (int64_t i = 0; i < counts[size_t(c)]; ++i)
      if (uppers[size_t(r0 + i)] >= L) ids[size_t(res.candidates++)] = ids[size_t(r0 + i)];  // r0 + i >= the write position
  }
  if (res.candidates > max_candidates()) return res;
  // Pass 3: the candidates' bf16 rows side by side, then one dense product over them: the
  // kernels' lanes run several rows' sequential sums at once, each exactly the twin's
  // (linear_f32_wbf16 is bit-identical to its reference at every SIMD level).
  // Sized for the most candidates a decided call can have: a later step with more allocates nothing.
  DS41_SCRATCH_UNINIT(uint16_t, rows, res.candidates * K, max_candidates() * K);
  DS41_SCRATCH_UNINIT(float, values, res.candidates, max_candidates());
  parallel_for(pool, res.candidates, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(rows.data() + i * K, head + ids[size_t(i)] * K, size_t(K) * sizeof(uint16_t));
  });
  linear_f32_wbf16(x, 1, rows.data(), res.candidates, K, values.data(), pool);
  for (int64_t i = 0; i < res.candidates; ++i) logits[ids[size_t(i)]] = values[size_t(i)];
  res.decided = true;
  return res;
}

}  // namespace ds41
