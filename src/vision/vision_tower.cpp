#include "vision/vision_tower.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/numeric_formats.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

namespace ds41 {

namespace {

// y [m][n] = bf16(fp32(x W^T) + fp32(bias)); bias may be null.
void linear_bias_bf16(const uint16_t* x, int64_t m, const uint16_t* W, const uint16_t* bias, int64_t n, int64_t k,
                      uint16_t* y, ThreadPool* pool) {
  std::vector<float> acc(size_t(m * n));
  linear_bf16_f32out(x, m, W, n, k, acc.data(), pool);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      float v = acc[size_t(r * n + j)];
      if (bias) v += bf16_to_f32(bias[j]);
      y[r * n + j] = f32_to_bf16(v);
    }
}

// a += b, elementwise in bf16 (torch computes the sum in fp32 and rounds it).
void add_bf16(uint16_t* a, const uint16_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

// Half-split rotation of one head vector (hd values) in place with one row of angles.
void rotate_half_split(uint16_t* x, const float* cos, const float* sin, int half) {
  for (int d = 0; d < half; ++d) {
    const float x1 = bf16_to_f32(x[d]), x2 = bf16_to_f32(x[d + half]);
    const float y1 = x1 * cos[d] - x2 * sin[d];
    const float y2 = x2 * cos[d] + x1 * sin[d];
    x[d] = f32_to_bf16(y1);
    x[d + half] = f32_to_bf16(y2);
  }
}

// Bidirectional attention of all n patches, per head, on rotated q/k and v taken from qkv
// [n][3 * vd]; output o [n][vd] bf16. Every sum runs over the patches in increasing order.
void attention(const uint16_t* qkv, int64_t n, int heads, int64_t hd, uint16_t* o, ThreadPool* pool) {
  const int64_t vd = int64_t(heads) * hd;
  // sqrt(softmax scale) in double, applied to q and to k as an fp32 scalar.
  const float half_scale = float(std::sqrt(1.0 / std::sqrt(double(hd))));
  // fp32 copies per head: q [heads][n][hd] and v [heads][n][hd], k transposed [heads][hd][n] so
  // that one query's scores accumulate over d for all keys at once (each score is still the sum
  // over d in increasing order; the loop over keys is what vectorises).
  std::vector<float> q(size_t(n * vd)), kt(size_t(n * vd)), v(size_t(n * vd));
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h)
      for (int64_t d = 0; d < hd; ++d) {
        const size_t at = size_t((h * n + i) * hd + d);
        q[at] = bf16_to_f32(qkv[i * 3 * vd + h * hd + d]) * half_scale;
        kt[size_t((h * hd + d) * n + i)] = bf16_to_f32(qkv[i * 3 * vd + vd + h * hd + d]) * half_scale;
        v[at] = bf16_to_f32(qkv[i * 3 * vd + 2 * vd + h * hd + d]);
      }
  parallel_for(pool, int64_t(heads) * n, [&](int64_t r0, int64_t r1) {
    std::vector<double> score(static_cast<size_t>(n));
    std::vector<float> p(static_cast<size_t>(n));
    std::vector<double> acc(static_cast<size_t>(hd));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t h = r / n, i = r % n;
      const float* qi = q.data() + (h * n + i) * hd;
      const float* kh = kt.data() + h * hd * n;
      const float* vh = v.data() + h * n * hd;
      std::fill(score.begin(), score.end(), 0.0);
      for (int64_t d = 0; d < hd; ++d) {
        const double qd = qi[d];
        const float* kd = kh + d * n;
        for (int64_t j = 0; j < n; ++j) score[size_t(j)] += qd * double(kd[j]);
      }
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        p[size_t(j)] = float(score[size_t(j)]);
        mx = std::max(mx, p[size_t(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        p[size_t(j)] = std::exp(p[size_t(j)] - mx);
        sum += p[size_t(j)];
      }
      const float inv = 1.0f / float(sum);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double pj = double(p[size_t(j)] * inv);
        const float* vj = vh + j * hd;
        for (int64_t d = 0; d < hd; ++d) acc[size_t(d)] += pj * double(vj[d]);
      }
      for (int64_t d = 0; d < hd; ++d) o[i * vd + h * hd + d] = f32_to_bf16(float(acc[size_t(d)]));
    }
  });
}

}  // namespace

VisionRope make_vision_rope(const ModelConfig& c, int64_t n_h, int64_t n_w) {
  const int64_t hd = c.vision_dim / c.vision_n_heads;
  VisionRope r;
  r.rope_dim = int(hd / 2);
  const int quarter = r.rope_dim / 2;
  // Same fp32 frequency formula as the LLM's (rope.h), over rope_dim, without YaRN.
  const std::vector<float> inv_freq = rope_inv_freq(r.rope_dim, c.vision_rope_theta, 0, 1.0, 0, 0);
  r.cos.resize(size_t(n_h * n_w * r.rope_dim));
  r.sin.resize(r.cos.size());
  for (int64_t y = 0; y < n_h; ++y)
    for (int64_t x = 0; x < n_w; ++x) {
      float* cs = r.cos.data() + (y * n_w + x) * r.rope_dim;
      float* sn = r.sin.data() + (y * n_w + x) * r.rope_dim;
      for (int j = 0; j < quarter; ++j) {
        const float ay = rope_angle(y, inv_freq[size_t(j)]), ax = rope_angle(x, inv_freq[size_t(j)]);
        cs[j] = std::cos(ay);
        sn[j] = std::sin(ay);
        cs[quarter + j] = std::cos(ax);
        sn[quarter + j] = std::sin(ax);
      }
    }
  return r;
}

std::vector<uint16_t> vit_patch_embed(const VisionWeights& w, const ModelConfig& c, const uint16_t* patches,
                                      int64_t n_patches, ThreadPool* pool) {
  const int64_t K = 3 * int64_t(c.vision_patch_size) * c.vision_patch_size;
  std::vector<uint16_t> x(size_t(n_patches * c.vision_dim));
  linear_bias_bf16(patches, n_patches, w.patch_w, w.patch_b, c.vision_dim, K, x.data(), pool);
  return x;
}

void vit_block(const VisionBlockWeights& w, const ModelConfig& c, const VisionRope& rope, uint16_t* x, int64_t n,
               ThreadPool* pool) {
  const int64_t vd = c.vision_dim, hd = vd / c.vision_n_heads, inter = c.vision_inter_dim;
  if (int64_t(rope.cos.size()) != n * rope.rope_dim || rope.rope_dim * 2 != hd)
    throw Error("vision block: the rope table does not match the patch count / head size");
  std::vector<uint16_t> h(size_t(n * vd)), y(size_t(n * vd));
  // Attention sublayer.
  for (int64_t i = 0; i < n; ++i) rmsnorm_row_f32w(x + i * vd, w.norm1, vd, kVisionNormEps, h.data() + i * vd);
  std::vector<uint16_t> qkv(size_t(n * 3 * vd));
  linear_bias_bf16(h.data(), n, w.wqkv, w.wqkv_bias, 3 * vd, vd, qkv.data(), pool);
  for (int64_t i = 0; i < n; ++i)
    for (int head = 0; head < c.vision_n_heads; ++head) {
      const float* cs = rope.cos.data() + i * rope.rope_dim;
      const float* sn = rope.sin.data() + i * rope.rope_dim;
      rotate_half_split(qkv.data() + i * 3 * vd + head * hd, cs, sn, rope.rope_dim);       // q
      rotate_half_split(qkv.data() + i * 3 * vd + vd + head * hd, cs, sn, rope.rope_dim);  // k
    }
  attention(qkv.data(), n, c.vision_n_heads, hd, h.data(), pool);
  linear_bias_bf16(h.data(), n, w.wo, w.wo_bias, vd, vd, y.data(), pool);
  add_bf16(x, y.data(), n * vd);
  // MLP sublayer (SwiGLU without biases). silu on a bf16 tensor as the golden's torch (1.13)
  // evaluates it: exp(-g), 1 + that, and g / that each rounded to bf16 (torch >= 2 computes it in
  // fp32 with one rounding, up to one bf16 ulp away; with this the golden's blocks are reproduced
  // exactly). Then the product with `up`, rounded to bf16.
  for (int64_t i = 0; i < n; ++i) rmsnorm_row_f32w(x + i * vd, w.norm2, vd, kVisionNormEps, h.data() + i * vd);
  std::vector<uint16_t> gu(size_t(n * 2 * inter)), act(size_t(n * inter));
  linear_bias_bf16(h.data(), n, w.w1, nullptr, 2 * inter, vd, gu.data(), pool);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inter; ++j) {
      const float g = bf16_to_f32(gu[size_t(i * 2 * inter + j)]);
      const float silu = round_bf16(g / round_bf16(1.0f + round_bf16(std::exp(-g))));
      act[size_t(i * inter + j)] = f32_to_bf16(silu * bf16_to_f32(gu[size_t(i * 2 * inter + inter + j)]));
    }
  linear_bias_bf16(act.data(), n, w.w2, nullptr, vd, inter, y.data(), pool);
  add_bf16(x, y.data(), n * vd);
}

std::vector<uint16_t> vit_final_norm(const VisionWeights& w, const ModelConfig& c, const uint16_t* x, int64_t n) {
  const int64_t vd = c.vision_dim;
  std::vector<uint16_t> out(size_t(n * vd));
  for (int64_t i = 0; i < n; ++i) rmsnorm_row_f32w(x + i * vd, w.norm, vd, kVisionNormEps, out.data() + i * vd);
  return out;
}

std::vector<uint16_t> aligner_forward(const VisionWeights& w, const ModelConfig& c, const uint16_t* vit_out,
                                      int64_t n_h, int64_t n_w, ThreadPool* pool) {
  const int64_t r = c.vision_downsample_ratio, vd = c.vision_dim, D = c.dim;
  const int64_t cells_h = (n_h + r - 1) / r, cells_w = (n_w + r - 1) / r, cells = cells_h * cells_w;
  const int64_t K = vd * r * r;
  // Unfold: cell (cy, cx) feature ch * r^2 + ky * r + kx = patch (cy r + ky, cx r + kx) channel ch,
  // zero beyond the grid (the bottom/right padding).
  std::vector<uint16_t> folded(size_t(cells * K), 0);
  for (int64_t cy = 0; cy < cells_h; ++cy)
    for (int64_t cx = 0; cx < cells_w; ++cx) {
      uint16_t* row = folded.data() + (cy * cells_w + cx) * K;
      for (int64_t ky = 0; ky < r; ++ky)
        for (int64_t kx = 0; kx < r; ++kx) {
          const int64_t py = cy * r + ky, px = cx * r + kx;
          if (py >= n_h || px >= n_w) continue;
          const uint16_t* src = vit_out + (py * n_w + px) * vd;
          for (int64_t ch = 0; ch < vd; ++ch) row[ch * r * r + ky * r + kx] = src[ch];
        }
    }
  std::vector<uint16_t> hidden(size_t(cells * D)), out(size_t(cells * D));
  linear_bias_bf16(folded.data(), cells, w.aligner_w1, w.aligner_b1, D, K, hidden.data(), pool);
  // Exact (erf) GELU in fp32 as torch evaluates it: (x * 0.5) * (1 + erf(x * sqrt(1/2))).
  const float sqrt_half = float(M_SQRT1_2);
  for (uint16_t& v : hidden) {
    const float x = bf16_to_f32(v);
    v = f32_to_bf16((x * 0.5f) * (1.0f + std::erf(x * sqrt_half)));
  }
  linear_bias_bf16(hidden.data(), cells, w.aligner_w2, w.aligner_b2, D, D, out.data(), pool);
  return out;
}

std::vector<uint16_t> encode_image_patches(const VisionWeights& w, const ModelConfig& c, const uint16_t* patches,
                                           int64_t n_h, int64_t n_w, ThreadPool* pool, const VitObserver* observe) {
  if (!w.patch_w) throw Error("this model has no vision tower (vision_n_layers is 0), so it cannot take images");
  const int64_t n = n_h * n_w;
  std::vector<uint16_t> x = vit_patch_embed(w, c, patches, n, pool);
  if (observe) (*observe)(0, x.data(), n);
  const VisionRope rope = make_vision_rope(c, n_h, n_w);
  for (size_t b = 0; b < w.blocks.size(); ++b) {
    vit_block(w.blocks[b], c, rope, x.data(), n, pool);
    if (observe) (*observe)(int(b) + 1, x.data(), n);
  }
  const std::vector<uint16_t> out = vit_final_norm(w, c, x.data(), n);
  if (observe) (*observe)(-1, out.data(), n);
  return aligner_forward(w, c, out.data(), n_h, n_w, pool);
}

}  // namespace ds41
