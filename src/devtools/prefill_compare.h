// Full vs CED prefill on the same prompts (issue 7, "measure the approximation"): how much faster
// the CED prefill is, and how far its next-token distributions are from the exact ones — at the
// first generated token, over a teacher-forced continuation (both sequences fed the exact run's
// greedy tokens), and as free-running greedy text. The same comparison measures a compact
// session's restore (bounded replay of the last window) against the uninterrupted sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ds41 {

class Model;
class ThreadPool;

struct PrefillCompareOptions {
  std::vector<int64_t> lengths;        // prompt lengths, each > 0
  // Prompt tokens: the first `length` of these, or (empty) random ids from `seed`.
  std::vector<int32_t> tokens;
  uint64_t seed = 1;
  int continuation = 32;               // generated tokens compared after the prompt
  int repeats = 1;                     // timed prefills per mode; the fastest counts
  bool corrected_index_keys = true;
  bool ced = true;                     // compare a CED prefill with the full one
  bool session_replay = false;         // compare a compact save + restore with the full prefill
};

// How far a sequence's next-token distributions are from the exact sequence's.
struct Divergence {
  // First generated token: KL(exact || other) of the next-token distributions (softmax of the
  // logits, nats), whether their argmax agrees, and the largest logit difference.
  double first_kl = 0;
  bool first_top1 = false;
  double first_max_logit_diff = 0;
  // Teacher-forced over the continuation (both fed the exact run's greedy tokens): mean and
  // largest KL per step, and the share of steps whose argmax agrees.
  double forced_mean_kl = 0, forced_max_kl = 0;
  double forced_top1 = 0;
  // Free-running greedy continuations: tokens equal position by position, and the length of the
  // common prefix.
  int greedy_equal = 0, greedy_prefix = 0;
};

struct PrefillCompareRow {
  int64_t length = 0;
  int continuation = 0;
  double full_s = 0, full_cpu_s = 0;   // exact prefill: wall and process CPU time (all threads)
  // CED prefill (opt.ced): times, speedups over the full prefill (wall; CPU time — the work done,
  // less sensitive than wall time to other processes sharing the machine) and divergence.
  double ced_s = 0, ced_cpu_s = 0, speedup = 0, cpu_speedup = 0;
  Divergence ced;
  // Compact session saved after the full prefill and restored (opt.session_replay): the restore's
  // wall time (read + bounded replay) and its divergence from the uninterrupted sequence.
  double restore_s = 0;
  int64_t session_bytes = 0;
  Divergence replay;
};

// Runs every length; `progress(row)` is called after each. Throws ds41::Error for a length that
// does not fit the model (max_seq_len) or a token list shorter than the longest length.
std::vector<PrefillCompareRow> compare_prefill(const Model& model, const PrefillCompareOptions& opt, ThreadPool* pool,
                                               const std::function<void(const PrefillCompareRow&)>& progress = {});

// KL(p || q) in nats of the softmax distributions of two logit rows (double precision).
double logits_kl(const float* p_logits, const float* q_logits, int64_t n);

}  // namespace ds41
