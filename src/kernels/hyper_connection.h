// Hyper-connections, Single-Pass mHC (spec backbone.md §7, §12.8, §12.9).
//
// The residual stream of one token is X[hc][D] bf16 (copy-major). For each sublayer:
//   mixes  = hc_mixes(X, fn)                       (2+hc)*hc fp32 values
//   (pre, post, comb) = hc_split_sinkhorn(mixes, base, scale)
//   y      = hc_pre(X, a)        with a = the *previous* sublayer's pre (single pass, §7)
//   X'     = hc_post(sublayer(y), X, post, comb)
// hc (hc_mult) is a config value, at most kMaxHc here; D is the model dim.
// All functions are allocation-free and write into caller buffers.
#pragma once

#include <cstdint>

namespace ds41 {

inline constexpr int kMaxHc = 16;

// Number of mixes per token: hc pre + hc post + hc*hc comb.
constexpr int hc_mix_count(int hc) { return (2 + hc) * hc; }

// mixes[k] = (sum_t fn[k][t] * fp32(X)[t]) * r,  t over the hc*D flattened copy-major stream,
// r = 1/sqrt(mean(fp32(X)^2) + norm_eps) over all hc*D values (one statistic per token, the sum
// of squares in PyTorch's reduction order, torch_sum.h). Each dot product is the golden
// generator's F.linear: an fp32 running sum over t ascending from +0, each product rounded
// before it is added (no FMA). An exact (double) dot product disagreed with the golden
// pre-mixes in half of all values, a sequential fp32 sum in none where the inputs agree; then
// multiplied by r (model.py Block.hc_mixes: projection first, then the scalar). fn is
// [(2+hc)*hc][hc*D] fp32 row-major.
void hc_mixes(const uint16_t* X, int hc, int64_t D, const float* fn, float norm_eps, float* mixes);
// The dot products of hc_mixes before the factor r, for mixes k in [k0, k1) only: dots[k - k0].
// Each mix is its own chain, so splitting the range across threads changes no value. fn_t, if
// given, is fn transposed in blocks of mixes (transpose_hc_projection), which the SIMD kernels
// read; without it the scalar loop over fn runs.
void hc_mix_dots(const uint16_t* X, int hc, int64_t D, const float* fn, const float* fn_t, int k0, int k1,
                 float* dots);
// fn transposed in blocks of kHcMixBlock mixes: fn_t[b][t][j] = fn[b * kHcMixBlock + j][t] for fn
// [nmix][n], zero past the last mix. Each block is one forward stream, a position's weights of
// its mixes one contiguous run: the threads that split a step's mixes read (nearly) disjoint
// blocks, where with all mixes of a position in one run each of them read every line.
inline constexpr int kHcMixBlock = 8;
inline int64_t transposed_hc_projection_size(int nmix, int64_t n) {
  return (nmix + kHcMixBlock - 1) / kHcMixBlock * kHcMixBlock * n;
}
void transpose_hc_projection(const float* fn, int nmix, int64_t n, float* fn_t);
// hc_mixes from all hc_mix_count(hc) dot products: mixes[k] = dots[k] * r.
void hc_mixes_from_dots(const uint16_t* X, int hc, int64_t D, const float* dots, float norm_eps, float* mixes);

// The port's hc_split_sinkhorn (kernel.py K41:406-458), all fp32, each op rounded on its own:
//   pre[c]  = sigmoid(mixes[c]*scale[0] + base[c]) + hc_eps
//   post[c] = 2 * sigmoid(mixes[hc+c]*scale[1] + base[hc+c])
//   C[i][j] = mixes[2hc + hc*i + j]*scale[2] + base[2hc + hc*i + j]
//   C[i][:] = exp(C[i][:] - max_j C[i][j]) / sum_j(exp(...)) + hc_eps    (row softmax, divide)
//   C[:][j] = C[:][j] / (sum_i C[i][j] + hc_eps)                         (column normalization)
//   (sinkhorn_iters - 1) times: rows C[i][:] /= (row sum + hc_eps); then columns as above.
// sigmoid(x) = 1 / (1 + exp(0 - x)) and every exp above is PyTorch's vectorized exp
// (vector_exp.h); sums run over ascending index from +0.
// comb is row-major C[i][j]: i = source copy, j = destination copy (hc_post applies C^T).
// libm_from: pre[c] and post[c] with c >= libm_from take libm's expf instead: the scalar tail of
// PyTorch's elementwise loop over the reference's [S][hc] pre / post tensors of a call
// (torch_scalar_tail_from, vector_exp.h). hc or more = never, the call-shape-free default.
void hc_split_sinkhorn(const float* mixes, int hc, const float* base, const float* scale,
                       int sinkhorn_iters, float hc_eps, float* pre, float* post, float* comb, int libm_from = kMaxHc);

// hc_mixes followed by hc_split_sinkhorn. base is [(2+hc)*hc], scale [3].
// Released values: hc 4, D 5120, sinkhorn_iters 20, hc_eps 1e-6, norm_eps 1e-20.
void hc_coefficients(const uint16_t* X, int hc, int64_t D, const float* fn, const float* base,
                     const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps,
                     float* pre, float* post, float* comb);

// y[d] = bf16( sum_{c=0..hc-1} a[c] * fp32(X[c][d]) ): each product rounded to fp32, summed in
// ascending c starting from +0 (torch.sum over the copy dim), one bf16 rounding.
void hc_pre(const uint16_t* X, const float* a, int hc, int64_t D, uint16_t* y);

// y[d] = bf16( (sum_{c ascending} fp32(X[c][d])) * (1/hc) ): the mean over the copies as torch
// takes it on a bf16 tensor (fp32 accumulation from +0, the 1/hc factor, one bf16 rounding). With
// hc a power of two the factor is exact. DSpark's capture of its target layers (spec §B.3).
void hc_mean(const uint16_t* X, int hc, int64_t D, uint16_t* y);
// Xout[j][d] = bf16( post[j]*fp32(y[d]) + S[j][d] ),
//   S[j][d] = sum_{i=0..hc-1} C[i][j]*fp32(Xres[i][d])   (C^T: source i -> destination j).
// Order (model.py Block.hc_post): the residual mix S is summed over i ascending from +0 (each
// product rounded), post[j]*y is rounded on its own, then the two are added and rounded to bf16.
// Xout may alias Xres (all hc inputs of a column d are read before any output of d is written).
void hc_post(const uint16_t* y, const uint16_t* Xres, const float* post, const float* comb, int hc,
             int64_t D, uint16_t* Xout);
// The same for the columns d in [d0, d1) only (columns are independent: threads may share a row).
void hc_post_columns(const uint16_t* y, const uint16_t* Xres, const float* post, const float* comb, int hc,
                     int64_t D, int64_t d0, int64_t d1, uint16_t* Xout);

}  // namespace ds41
