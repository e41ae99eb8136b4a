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
        Int8RowQuant rq;
        if (!int8_quantize_bf16_row(head + v * dim, dim, reinterpret_cast<int8_t*>(s->q_.data()) + v * Kp, &rq)) {
          finite = false;
          return;
        }
        // The measured error and norm are exact but for rare roundings of the double arithmetic,
        // which the margins cover.
        s->scale_[size_t(v)] = rq.scale;
        s->err_[size_t(v)] = rq.max_error * kInflate + double(rq.max_abs) * 0x1p-50;
        s->row_sum_[size_t(v)] = rq.sum;
        s->abs_sum_[size_t(v)] = rq.abs_sum;
        s->norm_[size_t(v)] = std::sqrt(rq.sum_squares) * kInflate;
        largest = std::max(largest, double(rq.max_abs));
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

HeadScreen::Result HeadScreen::top_logits(const float* x, int64_t n_vectors, int k, const uint16_t* head,
                                          float* logits, ThreadPool* pool, const uint8_t* allowed) const {
  Result res;
  if (k < 1 || k > kMaxTopK || n_vectors < 1 || n_vectors > kMaxVectors) return res;
  k = int(std::min<int64_t>(k, V_));
  const int64_t K = K_, M = n_vectors;

  // Each x as int8 h with scale s_x, and what the bounds need of it.
  struct VectorTerms {
    double sx_habs, dmax, twin_scale;
  };
  DS41_SCRATCH(int8_t, h, M * Kp_);  // zero padding past K
  DS41_SCRATCH_UNINIT(VectorTerms, terms, M, 0);
  DS41_SCRATCH_UNINIT(double, scales, M, 0);
  // Higham's gamma_{K+2} for the twin's recursive fp32 sum of rounded products, u = 2^-24.
  const double u = 0x1p-24, gamma = double(K + 2) * u / (1.0 - double(K + 2) * u);
  const double underflow = double(K) * 0x1p-140;
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    double xmax = 0, sq = 0;
    for (int64_t i = 0; i < K; ++i) {
      const double a = std::fabs(double(xm[i]));
      if (!(a <= std::numeric_limits<float>::max())) return res;  // inf or NaN: the full product decides
      xmax = std::max(xmax, a);
      sq += a * a;
    }
    // An fp32 product or sum of the twin could overflow: leave such heads to the full product.
    if (xmax * max_abs_ * double(K) > 0x1p120) return res;
    const double sx = xmax / 127.0;
    double dmax = 0;
    int64_t h_abs = 0;
    for (int64_t i = 0; i < K; ++i) {
      // The nearest code (int8_dot.h; any code would keep the screen sound, its errors are
      // measured - this one keeps them smallest).
      const int hi = sx > 0 ? int8_code(double(xm[i]) / sx) : 0;
      h[size_t(m * Kp_ + i)] = int8_t(hi);
      h_abs += hi < 0 ? -hi : hi;
      dmax = std::max(dmax, std::fabs(double(xm[i]) - sx * hi));
    }
    scales[size_t(m)] = sx;
    terms[size_t(m)] = {sx * double(h_abs), dmax * kInflate + xmax * 0x1p-50,
                        gamma * std::sqrt(sq) * kInflate * kInflate};
  }

  const int64_t chunks = screen_chunks(V_);
  // Per chunk c (rows r0..r1): dots [M][r1 - r0] at M * r0; per vector m: its k largest lower
  // bounds at (c * M + m) * k, and its candidate list (ids, upper bounds) at m * V + r0.
  DS41_SCRATCH_UNINIT(int32_t, dots, M * V_, 0);
  DS41_SCRATCH_UNINIT(double, lows, chunks * M * k, 0);
  DS41_SCRATCH_UNINIT(int64_t, counts, chunks * M, 0);
  DS41_SCRATCH_UNINIT(int64_t, ids, M * V_, 0);
  DS41_SCRATCH_UNINIT(double, uppers, M * V_, 0);
  const int8_t* q = reinterpret_cast<const int8_t*>(q_.data());
  const float minus_inf = -std::numeric_limits<float>::infinity();

  // Pass 1, per chunk of rows: the screen (each row read once for all vectors), the bounds, the
  // chunk's k largest lower bounds, and its own candidates against the k-th of them, L_c <= L (a
  // superset of the final ones, listed with their upper bounds while the chunk is in cache).
  parallel_for(pool, chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = chunk_begin(V_, chunks, c), r1 = chunk_begin(V_, chunks, c + 1), n = r1 - r0;
      int32_t* cd = dots.data() + M * r0;
      int8_row_dots(h.data(), M, q + r0 * Kp_, row_sum_.data() + r0, n, Kp_, cd);
      DS41_SCRATCH_UNINIT(double, upper, n, 0);
      DS41_SCRATCH_UNINIT(double, lower, n, 0);
      for (int64_t m = 0; m < M; ++m) {
        const VectorTerms t = terms[size_t(m)];
        const double sx = scales[size_t(m)];
        // The bounds first (a branch-free loop), then the selections.
        for (int64_t i = 0; i < n; ++i) {
          const int64_t v = r0 + i;
          const double sv = scale_[size_t(v)], ev = err_[size_t(v)];
          const double approx = sx * sv * double(cd[m * n + i]);
          const double quantization = t.sx_habs * ev + t.dmax * (sv * double(abs_sum_[size_t(v)]) + double(K) * ev);
          const double bound =
              quantization * kInflate + t.twin_scale * norm_[size_t(v)] + underflow + std::fabs(approx) * 0x1p-45;
          const bool excluded = allowed && !allowed[v];  // an id that may not be produced: never a candidate
          upper[size_t(i)] = excluded ? -std::numeric_limits<double>::infinity() : approx + bound;
          lower[size_t(i)] = excluded ? -std::numeric_limits<double>::infinity() : approx - bound;
          logits[m * V_ + v] = minus_inf;
        }
        double* best = lows.data() + (c * M + m) * k;  // descending
        for (int j = 0; j < k; ++j) best[j] = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < n; ++i) {
          const double low = lower[size_t(i)];
          if (low > best[k - 1]) {
            int j = k - 1;
            for (; j > 0 && best[j - 1] < low; --j) best[j] = best[j - 1];
            best[j] = low;
          }
        }
        int64_t listed = 0;
        int64_t* cids = ids.data() + m * V_ + r0;
        double* cup = uppers.data() + m * V_ + r0;
        for (int64_t i = 0; i < n; ++i)
          if (upper[size_t(i)] >= best[k - 1]) {
            cids[listed] = r0 + i;
            cup[listed++] = upper[size_t(i)];
          }
        counts[size_t(c * M + m)] = listed;
      }
    }
  });

  // Per vector: L = its k-th largest lower bound over all rows; its candidates: upper bound >= L,
  // compacted to the front of its ids.
  DS41_SCRATCH_UNINIT(double, merged, chunks * k, 0);
  DS41_SCRATCH_UNINIT(int64_t, found, M, 0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t c = 0; c < chunks; ++c)
      std::copy_n(lows.data() + (c * M + m) * k, k, merged.data() + c * k);
    std::nth_element(merged.begin(), merged.begin() + (k - 1), merged.begin() + chunks * k, std::greater<double>());
    const double L = merged[size_t(k - 1)];
    int64_t* mids = ids.data() + m * V_;
    const double* mup = uppers.data() + m * V_;
    int64_t n = 0;
    for (int64_t c = 0; c < chunks && n <= max_candidates(); ++c) {
      const int64_t r0 = chunk_begin(V_, chunks, c);
      for (int64_t i = 0; i < counts[size_t(c * M + m)]; ++i)
        if (mup[r0 + i] >= L) mids[n++] = mids[r0 + i];  // r0 + i >= the write position
    }
    if (n > max_candidates()) return res;
    found[size_t(m)] = n;
    res.candidates += n;
  }

  // The candidates' bf16 rows side by side, then one dense product per vector: the kernels' lanes
  // run several rows' sequential sums at once, each exactly the twin's (linear_f32_wbf16 is
  // bit-identical to its reference at every SIMD level). Sized for the most candidates a decided
  // call can have: a later step with more allocates nothing.
  DS41_SCRATCH_UNINIT(uint16_t, rows, max_candidates() * K, max_candidates() * K);
  DS41_SCRATCH_UNINIT(float, values, max_candidates(), max_candidates());
  for (int64_t m = 0; m < M; ++m) {
    const int64_t n = found[size_t(m)];
    const int64_t* mids = ids.data() + m * V_;
    parallel_for(pool, n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        std::memcpy(rows.data() + i * K, head + mids[i] * K, size_t(K) * sizeof(uint16_t));
    });
    linear_f32_wbf16(x + m * K, 1, rows.data(), n, K, values.data(), pool);
    for (int64_t i = 0; i < n; ++i) logits[m * V_ + mids[i]] = values[size_t(i)];
  }
  res.decided = true;
  return res;
}

bool HeadScreenBackoff::try_screen(int k) {
  if (k < 1 || k > HeadScreen::kMaxTopK) return true;
  std::atomic<int64_t>& skips = state_[k - 1].skips;
  int64_t left = skips.load(std::memory_order_relaxed);
  while (left > 0)
    if (skips.compare_exchange_weak(left, left - 1, std::memory_order_relaxed)) return false;
  return true;
}

void HeadScreenBackoff::record(int k, bool decided) {
  if (k < 1 || k > HeadScreen::kMaxTopK) return;
  State& s = state_[k - 1];
  if (decided) {  // the screen narrows these logits again: no more skipping
    s.fallbacks.store(0, std::memory_order_relaxed);
    s.skips.store(0, std::memory_order_relaxed);
    return;
  }
  const int f = s.fallbacks.fetch_add(1, std::memory_order_relaxed) + 1;
  s.skips.store(std::min<int64_t>(kMaxSkips, (int64_t(1) << std::min(f - 1, 20)) - 1), std::memory_order_relaxed);
}

}  // namespace ds41
