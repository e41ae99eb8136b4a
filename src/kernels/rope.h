// Rotary position embedding with YaRN (spec backbone.md §6, §5.1, §12.3).
//
// Frequencies (model.py precompute_freqs_cis), all fp32 unless noted:
//   f_i = 1 / base^(2i/dim)              i = 0..dim/2-1; the exponent 2i/dim is an fp32 division,
//                                         base^e an fp32 pow, then an fp32 reciprocal.
//   YaRN, only when original_seq_len > 0 (compressed layers; ratio-0 layers pass 0):
//     c(r) = dim * ln(L0 / (r * 2 * pi)) / (2 * ln base)        in double
//     low  = max(floor(c(beta_fast)), 0),  high = min(ceil(c(beta_slow)), dim - 1)
//     ramp_i = clamp((i - low) / max(high - low, 0.001), 0, 1),  smooth_i = 1 - ramp_i
//     f_i  = (f_i / factor) * (1 - smooth_i) + f_i * smooth_i    (this association, fp32)
// Angles: theta(p, i) = fp32(fp32(p) * f_i) (torch.outer of arange(seqlen) and the fp32 freqs).
// cos/sin: torch.polar evaluates std::cos / std::sin on the fp32 angle, i.e. libm's cosf/sinf.
//   We call the same float overloads: on glibc (where the reference goldens were produced) this is
//   bit-identical to the reference; a double evaluation rounded to fp32 would be correctly rounded
//   but can differ from cosf/sinf in the last bit. No attention mscale anywhere (spec §6).
// Rotation: interleaved ("GPT-J") pairs of the LAST `dim` elements of a head vector, (x[2i],
//   x[2i+1]) = a + i*b, times (c + i*s) in fp32 (conjugate for the inverse), both results
//   rounded to bf16. torch's complex64 multiply (AVX2 vec path) rounds each product on its own:
//     forward: re = fl(fl(a*c) - fl(b*s)),  im = fl(fl(a*s) + fl(b*c))
//     inverse: re = fl(fl(a*c) + fl(b*s)),  im = fl(fl(b*c) - fl(a*s))
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ds41 {

struct YarnRange {
  int64_t low = 0, high = 0;
};

// The YaRN correction range (low, high) for the given rope dims (exposed for tests and logs).
YarnRange yarn_correction_range(int dim, double base, int64_t original_seq_len, double beta_fast,
                                double beta_slow);

// dim/2 fp32 inverse frequencies. original_seq_len <= 0 disables YaRN (factor and betas unused).
// Released: ratio-0 layers (64, 10000, 0, ...); compressed layers (64, 160000, 65536, 16, 32, 1).
std::vector<float> rope_inv_freq(int dim, double base, int64_t original_seq_len, double factor,
                                 double beta_fast, double beta_slow);

// fp32 angle of position p for one frequency: fp32(p) * f, one fp32 rounding.
float rope_angle(int64_t p, float inv_freq);

// cos/sin of the angle of (p, i), computed on demand (positions beyond a table).
std::pair<float, float> rope_cos_sin(const std::vector<float>& inv_freq, int64_t p, int i);
// A whole row: cos[i], sin[i] for i = 0..inv_freq.size()-1.
void rope_cos_sin_row(const float* inv_freq, int half, int64_t p, float* cos, float* sin);

// Precomputed cos/sin, [n_positions][dim/2] row-major (the reference's freqs_cis buffer has
// max_seq_len rows).
struct RopeTable {
  int dim = 0;
  int64_t n_positions = 0;
  std::vector<float> inv_freq;  // dim/2
  std::vector<float> cos, sin;  // n_positions * dim/2
  const float* cos_row(int64_t p) const { return cos.data() + p * (dim / 2); }
  const float* sin_row(int64_t p) const { return sin.data() + p * (dim / 2); }
};

RopeTable make_rope_table(const std::vector<float>& inv_freq, int64_t n_positions);

// Rotate the `dim` elements at x (the rope tail of one head vector) in place with one row of
// cos/sin (dim/2 each); inverse = conjugate rotation (attention-output de-rotation, spec §5.7).
void rope_apply(uint16_t* x, const float* cos, const float* sin, int dim, bool inverse);

// Same, at position p: table row when p < n_positions, otherwise computed on demand (identical
// values, since the table is filled by the same function).
void rope_apply_at(uint16_t* x, const RopeTable& table, int64_t p, bool inverse);

}  // namespace ds41
