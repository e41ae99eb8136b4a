// Exact top logits of the LM head without the whole head product: greedy decoding (and any caller
// that needs only the k largest logits) reads an int8 copy of the head instead of its bf16 values.
//
// The head is a decode step's largest read on small models (vocab x dim bf16: 265 of the 430 MB a
// token reads on the small preset) and ~10 % of it on the released model. A greedy step needs
// only the argmax, and that can be found exactly from a cheaper pass with error bounds:
//
//   1. Screen: each head row w_v is stored as int8 q_v with a scale s_v (s_v = max|w_v| / 127,
//      q = round(w / s)); the hidden vector x as int8 h with scale s_x. One exact int32 dot
//      product per row (kernels/int8_dot.h) gives approx_v = s_x s_v (h . q_v).
//   2. Bound: with x = s_x h + d and w_v = s_v q_v + e_v (|d| <= d_max, |e_v| <= e_max_v, both
//      measured), exact_v - approx_v = s_x sum h e_v + s_v sum d q_v + sum d e_v, so
//        |exact_v - approx_v| <= s_x e_max_v sum|h| + d_max s_v sum|q_v| + K d_max e_max_v,
//      and the twin's fp32 rounding (linear_f32_wbf16: sequential sum of rounded products) moves
//      its value from exact_v by at most gamma_{K+2} ||x||_2 ||w_v||_2 (Higham's bound for
//      recursive summation, with Cauchy-Schwarz) plus the underflow slack. B_v is the sum,
//      inflated for the double arithmetic that computes it.
//   3. Candidates: L = the k-th largest lower bound approx_v - B_v. Every token whose logit is
//      among the k largest (ties included) has approx_v + B_v >= logit_v >= L, so the tokens with
//      approx_v + B_v >= L contain them all; only those get their exact logit, from their bf16
//      rows gathered side by side through linear_f32_wbf16 (bit-identical to its scalar twin and
//      to the full product at every SIMD level). All other logits are -inf.
//
// So the k largest logits, their order and their ties (lowest id first) are exactly those of the
// full product; greedy decoding picks the same token. The screen reads dim + 28 bytes per row
// (half the bf16 head) plus each candidate's bf16 row. When it cannot narrow the vocabulary
// enough (a flat distribution: more than max_candidates() tokens survive) or x is not finite, it
// says so and the caller runs the full product.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/byte_buffer.h"
#include "base/thread_pool.h"

namespace ds41 {

class HeadScreen {
 public:
  // The largest k and the most vectors one top_logits call serves.
  static constexpr int kMaxTopK = 64;
  static constexpr int64_t kMaxVectors = 16;

  // Quantizes head [vocab][dim] bf16. nullptr when the screen cannot be sound for this head: a
  // non-finite weight, or dim above the int8 kernel's limit.
  static std::unique_ptr<HeadScreen> build(const uint16_t* head, int64_t vocab, int64_t dim, ThreadPool* pool);

  struct Result {
    bool decided = false;    // logits hold the exact top k (else the caller runs the full product)
    int64_t candidates = 0;  // exact logits computed (all vectors)
  };
  // For each of n_vectors hidden vectors x [n][dim]: logits [n][vocab] hold the exact logit
  // (linear_f32_wbf16's value) of every token that may be among that vector's k largest, -inf for
  // the others. decided only if every vector's were (else the contents are unspecified);
  // candidates counts them all. The int8 head is read once for up to four vectors. `head` is
  // the bf16 head the screen was built from.
  // With `allowed` ([vocab], optional), rows v with allowed[v] == 0 are never candidates (their
  // logits stay -inf): k counts the allowed rows only.
  Result top_logits(const float* x, int64_t n_vectors, int k, const uint16_t* head, float* logits,
                    ThreadPool* pool, const uint8_t* allowed = nullptr) const;

  int64_t vocab() const { return V_; }
  int64_t dim() const { return K_; }
  // More candidates than this: not decided (their exact rows would cost more than the saving).
  int64_t max_candidates() const { return std::max<int64_t>(256, V_ / 64); }
  // Bytes the screen keeps, and the bytes one top_logits call reads (its copy of the head, the
  // per-row constants, and the candidates' bf16 rows).
  int64_t bytes() const;
  int64_t bytes_read(int64_t candidates) const;

 private:
  HeadScreen() = default;

  int64_t V_ = 0, K_ = 0, Kp_ = 0;  // Kp_: dim padded to the kernel's multiple of 64
  ByteBuffer q_;                    // int8 [V][Kp]
  std::vector<float> scale_;        // s_v
  std::vector<double> err_;         // e_max_v = max_k |w_vk - s_v q_vk| (exact)
  std::vector<int32_t> row_sum_;    // sum_k q_vk
  std::vector<int32_t> abs_sum_;    // sum_k |q_vk|
  std::vector<double> norm_;        // ||w_v||_2, rounded up
  double max_abs_ = 0;              // largest |w| of the head
};

// Whether a call tries the screen. Where the screen keeps falling back (logits it cannot narrow),
// its pass is wasted on every step: on random weights at the released width (dim 5120) 19 % of
// the vocabulary survived every step and greedy steps ran 8 % slower than with the plain head
// product. So after f >= 2 fallbacks in a row the next 2^(f-1) - 1 calls (at most kMaxSkips) run
// the full product without trying, then the screen is tried again; a decided call ends the
// backoff, and a lone fallback costs nothing more. Kept apart for each k (a flat top-40 must not
// stop greedy steps from screening). Only speed depends on it: both paths give the same top
// logits. Thread-safe: concurrent calls share it.
class HeadScreenBackoff {
 public:
  static constexpr int64_t kMaxSkips = 63;
  // Whether this call (top k logits) should try the screen; false uses up one skipped call.
  bool try_screen(int k);
  // What the screen did on a call that tried it.
  void record(int k, bool decided);

 private:
  struct State {
    std::atomic<int> fallbacks{0};    // in a row
    std::atomic<int64_t> skips{0};    // calls left to skip
  };
  State state_[HeadScreen::kMaxTopK];
};

}  // namespace ds41
