// Scalar reference hyper-connection kernels; see hyper_connection.h for the operation order.
#include "kernels/hyper_connection.h"

#include <array>
#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/numeric_formats.h"
#include "kernels/rmsnorm.h"
#include "kernels/vector_exp.h"
#include "kernels/simd_kernels.h"

// Every fp32 op must round on its own like the reference's separate tensor ops (e.g. m*scale then
// + base): forbid FMA contraction, which -march=native would otherwise allow.
#include "base/fp_contract_off.h"

namespace ds41 {
namespace {

void check_hc(int hc) {
  if (hc < 1 || hc > kMaxHc)
    throw Error("hyper-connections: hc_mult must be in [1, " + std::to_string(kMaxHc) + "], got " +
                std::to_string(hc));
}

// C[i][:] /= (sum_j C[i][j] + eps), sum ascending from +0.
void normalize_rows(float* C, int hc, float eps) {
  for (int i = 0; i < hc; ++i) {
    float s = 0.0f;
    for (int j = 0; j < hc; ++j) s += C[i * hc + j];
    const float d = s + eps;
    for (int j = 0; j < hc; ++j) C[i * hc + j] = C[i * hc + j] / d;
  }
}

// C[:][j] /= (sum_i C[i][j] + eps), sum ascending from +0.
void normalize_cols(float* C, int hc, float eps) {
  for (int j = 0; j < hc; ++j) {
    float s = 0.0f;
    for (int i = 0; i < hc; ++i) s += C[i * hc + j];
    const float d = s + eps;
    for (int i = 0; i < hc; ++i) C[i * hc + j] = C[i * hc + j] / d;
  }
}

}  // namespace

void transpose_hc_projection(const float* fn, int nmix, int64_t n, float* fn_t) {
  const int blocks = (nmix + kHcMixBlock - 1) / kHcMixBlock;
  for (int b = 0; b < blocks; ++b)
    for (int64_t t = 0; t < n; ++t)
      for (int j = 0; j < kHcMixBlock; ++j) {
        const int k = b * kHcMixBlock + j;
        fn_t[(int64_t(b) * n + t) * kHcMixBlock + j] = k < nmix ? fn[int64_t(k) * n + t] : 0.0f;
      }
}

void hc_mix_dots(const uint16_t* X, int hc, int64_t D, const float* fn, const float* fn_t, int k0, int k1,
                 float* dots) {
  check_hc(hc);
  const int64_t n = hc * D;
  if (k1 <= k0) return;
  const simd::KernelTable* kt = simd::active_kernels();
  if (kt && fn_t) {  // same dot products, mixes in lanes
    kt->hc_mix_dots(X, n, fn_t, k0, k1, dots);
    return;
  }
  for (int k = k0; k < k1; ++k) {
    const float* row = fn + static_cast<int64_t>(k) * n;
    float acc = 0.0f;
    for (int64_t t = 0; t < n; ++t) acc += row[t] * bf16_to_f32(X[t]);
    dots[k - k0] = acc;
  }
}

void hc_mixes_from_dots(const uint16_t* X, int hc, int64_t D, const float* dots, float norm_eps, float* mixes) {
  check_hc(hc);
  // The same statistic as RMSNorm over all hc*D values (spec §7 step 2).
  const float r = rms_rsqrt_bf16(X, hc * D, norm_eps);
  for (int k = 0; k < hc_mix_count(hc); ++k) mixes[k] = dots[k] * r;  // F.linear(x, fn) * rsqrt
}

void hc_mixes(const uint16_t* X, int hc, int64_t D, const float* fn, float norm_eps, float* mixes) {
  check_hc(hc);
  std::array<float, hc_mix_count(kMaxHc)> dots;
  hc_mix_dots(X, hc, D, fn, nullptr, 0, hc_mix_count(hc), dots.data());
  hc_mixes_from_dots(X, hc, D, dots.data(), norm_eps, mixes);
}

void hc_split_sinkhorn(const float* mixes, int hc, const float* base, const float* scale,
                       int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb, int libm_from) {
  check_hc(hc);
  auto sigmoid = [&](int c, float x) { return c < libm_from ? torch_vec_sigmoid(x) : torch_scalar_sigmoid(x); };
  for (int c = 0; c < hc; ++c) {
    const float zp = mixes[c] * scale[0];
    pre[c] = sigmoid(c, zp + base[c]) + hc_eps;
    const float zq = mixes[hc + c] * scale[1];
    post[c] = 2.0f * sigmoid(c, zq + base[hc + c]);
  }
  float* C = comb;
  for (int k = 0; k < hc * hc; ++k) {
    const float z = mixes[2 * hc + k] * scale[2];
    C[k] = z + base[2 * hc + k];
  }
  // Row softmax (the port's exp(x - amax) / sum, a true division), then + eps.
  for (int i = 0; i < hc; ++i) {
    float* row = C + i * hc;
    float mx = row[0];
    for (int j = 1; j < hc; ++j) mx = std::fmax(mx, row[j]);
    float s = 0.0f;
    for (int j = 0; j < hc; ++j) {
      row[j] = torch_vec_expf(row[j] - mx);
      s += row[j];
    }
    for (int j = 0; j < hc; ++j) row[j] = row[j] / s + hc_eps;
  }
  normalize_cols(C, hc, hc_eps);  // first pass is a column normalization (spec §12.9)
  for (int it = 1; it < sinkhorn_iters; ++it) {
    normalize_rows(C, hc, hc_eps);
    normalize_cols(C, hc, hc_eps);
  }
}

void hc_coefficients(const uint16_t* X, int hc, int64_t D, const float* fn, const float* base,
                     const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps,
                     float* pre, float* post, float* comb) {
  check_hc(hc);
  std::array<float, hc_mix_count(kMaxHc)> mixes;
  hc_mixes(X, hc, D, fn, norm_eps, mixes.data());
  hc_split_sinkhorn(mixes.data(), hc, base, scale, sinkhorn_iters, hc_eps, pre, post, comb);
}

void hc_pre(const uint16_t* X, const float* a, int hc, int64_t D, uint16_t* y) {
  check_hc(hc);
  int64_t d0 = 0;
  if (const simd::KernelTable* kt = simd::active_kernels()) d0 = kt->hc_pre_columns(X, a, hc, D, y);  // columns in lanes
  for (int64_t d = d0; d < D; ++d) {
    float acc = 0.0f;  // +0 start: an all -0 column gives +0 as in torch.sum
    for (int c = 0; c < hc; ++c) {
      const float prod = a[c] * bf16_to_f32(X[c * D + d]);
      acc += prod;
    }
    y[d] = f32_to_bf16(acc);
  }
}

void hc_mean(const uint16_t* X, int hc, int64_t D, uint16_t* y) {
  check_hc(hc);
  const float factor = 1.0f / float(hc);
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (int c = 0; c < hc; ++c) acc += bf16_to_f32(X[c * D + d]);
    y[d] = f32_to_bf16(acc * factor);
  }
}

void hc_post(const uint16_t* y, const uint16_t* Xres, const float* post, const float* comb, int hc,
             int64_t D, uint16_t* Xout) {
  hc_post_columns(y, Xres, post, comb, hc, D, 0, D, Xout);
}

void hc_post_columns(const uint16_t* y, const uint16_t* Xres, const float* post, const float* comb, int hc,
                     int64_t D, int64_t d0, int64_t d1, uint16_t* Xout) {
  check_hc(hc);
  if (const simd::KernelTable* kt = simd::active_kernels())  // the same sequence, columns in lanes
    d0 = kt->hc_post_columns(y, Xres, post, comb, hc, D, d0, d1, Xout);
  std::array<float, kMaxHc> col;
  for (int64_t d = d0; d < d1; ++d) {
    for (int i = 0; i < hc; ++i) col[i] = bf16_to_f32(Xres[i * D + d]);  // read before writing
    const float yd = bf16_to_f32(y[d]);
    for (int j = 0; j < hc; ++j) {
      float mix = 0.0f;
      for (int i = 0; i < hc; ++i) {
        const float prod = comb[i * hc + j] * col[i];
        mix += prod;
      }
      const float scaled = post[j] * yd;
      Xout[j * D + d] = f32_to_bf16(scaled + mix);
    }
  }
}

}  // namespace ds41
