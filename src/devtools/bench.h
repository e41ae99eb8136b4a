// `ds41 bench` measurements (issue #10): the machine's memory bandwidth and FMA peak, the
// model's prefill and decode speed, the bytes a decoded token touches, and the efficiencies
// that relate them:
//   decode efficiency  = bytes per decoded token * decode tok/s / triad bandwidth
//   prefill efficiency = quantized-GEMM flops per token * prefill tok/s / FMA peak
// (the second is a lower bound: the prefill time also holds everything that is not a quantized
// GEMM; bench_quantized_gemms measures the GEMMs alone at the model's shapes).
#pragma once

#include "kernels/simd_level.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace ds41 {

class ThreadPool;

// STREAM triad a[i] = b[i] + s * c[i] over three arrays of `array_bytes` each, split over the
// pool's threads; best of `repeats`, in bytes/s counted the STREAM way (24 bytes per element:
// the write-allocate read of a[] is not counted).
double measure_triad_bandwidth(ThreadPool* pool, int64_t array_bytes, int repeats);

// The same triad over arrays allocated and first touched once (by the pool's threads, on huge
// pages like the weights), for passes taken one at a time between other work: pass() times one
// and returns its bytes/s.
class TriadProbe {
 public:
  TriadProbe(ThreadPool* pool, int64_t array_bytes);
  ~TriadProbe();
  TriadProbe(const TriadProbe&) = delete;
  TriadProbe& operator=(const TriadProbe&) = delete;
  double pass();

 private:
  struct Arrays;
  ThreadPool* pool_;
  std::unique_ptr<Arrays> arrays_;
  int passes_ = 0;
};

// Peak fp32 FMA rate in flop/s at a SIMD level: every thread of the pool runs independent FMA
// chains at that level's widest vectors (the scalar level has no FMA to measure: `level` Scalar
// measures at the widest level the CPU supports).
double measure_fma_peak(ThreadPool* pool, double seconds, SimdLevel level);

// Bytes one decoded token reads, from the layer plan and the weights: every weight the token
// multiplies (attention, compressor, indexer, router, shared expert, the routed experts it
// actually used, Engram rows, the head), plus the KV it reads (window ring, the compressed
// entries it attends, the index keys it scores).
struct DecodeBytes {
  int64_t weights = 0;  // dense and quantized weights, scales, norms, hc projections, head
  int64_t kv = 0;       // window ring + compressed KV + index keys
  int64_t total() const { return weights + kv; }
};
// `experts_used[layer]` = distinct routed experts the token used at that layer; `pos` = the
// position of the decoded token (its context length).
DecodeBytes decode_bytes_per_token(const Model& m, const std::vector<int>& experts_used, int64_t pos);
// The part of it a kv source's compressor reads (its bf16 projections and norm); 0 for other layers.
int64_t compressor_bytes_per_token(const ModelConfig& c, const LayerPlan& lp);

// Multiply-adds of the FP8/FP4 GEMMs per token of a prefill (activated experts included).
int64_t quantized_macs_per_token(const Model& m);

// seconds = wall time; cpu_seconds = CPU time of the process over the same span (all threads).
// cpu_seconds / (seconds * threads) is the share of its cores the run actually got: 1 on a quiet
// machine, lower when other work competes for the cores.
struct PrefillFigure {
  int64_t tokens = 0;
  double seconds = 0, cpu_seconds = 0;
  // With several runs of the same length (bench --prefill-repeats): every run's seconds in order;
  // seconds and cpu_seconds above are then the median run's (the lower one of an even count).
  std::vector<double> run_seconds;
  double tokens_per_s() const { return seconds > 0 ? double(tokens) / seconds : 0; }
};
struct DecodeFigure {
  int64_t context = 0;  // tokens before the first timed step
  int64_t steps = 0;
  double seconds = 0, cpu_seconds = 0;
  // The median step: what the machine sustains when other work on it does not intervene (the
  // triad bandwidth is a best-of-five figure for the same reason); the mean above counts every
  // interruption.
  double median_step_seconds = 0;
  // The STREAM triad measured right after the steps (0 = not measured): on a shared machine the
  // bandwidth left to this process moves with its neighbours' load within seconds, so a decode's
  // efficiency is also given against the bandwidth of its own moment, not only the run's start.
  double triad_beside = 0;
  DecodeBytes bytes;    // mean per step
  // Mean seconds of one Sampler::sample at temperature 1 without filters (every token drawn
  // from: the sampler's most expensive case, and the OpenAI API's default) on each step's logits,
  // timed apart from the step. Sampling runs on the calling thread while the others wait, so it
  // adds to a sampled step; 0 with the head screen (greedy steps have no full logits).
  double sampling_seconds = 0;
  // Steps run with the greedy head screen (model/head_screen.h: ForwardOptions::head_top_k = 1):
  // the head's bytes are then the screen's plus the candidates' rows (plus the whole head on a
  // step the screen could not decide, counted in head_fallbacks; only the whole head on a step
  // that skipped the screen after fallbacks in a row, counted in head_skipped: HeadScreenBackoff).
  double head_candidates = 0;  // mean rows per step whose exact logit was computed
  int64_t head_fallbacks = 0;
  int64_t head_skipped = 0;
  // Routed experts streamed from disk (the model is larger than its memory budget): the expert
  // cache's counts over the timed steps.
  bool experts_streamed = false;
  ExpertCacheStats experts;
  // From bench_decode_paired, run after this figure's steps: as many steps again, each between
  // two triad passes, so that each is measured against the bandwidth of its own moment (on a
  // shared VM the triad swung 30-60 GB/s within a run, faster than the triad beside a context
  // follows). Per step its seconds, bytes and the passes before and after it.
  struct PairedStep {
    double seconds = 0;
    int64_t bytes = 0;
    double triad_before = 0, triad_after = 0;
    double efficiency() const { return seconds > 0 ? double(bytes) / seconds / (0.5 * (triad_before + triad_after)) : 0; }
  };
  std::vector<PairedStep> paired;
  double paired_median_efficiency() const;
  double tokens_per_s() const { return seconds > 0 ? double(steps) / seconds : 0; }
  double median_tokens_per_s() const { return median_step_seconds > 0 ? 1.0 / median_step_seconds : 0; }
};

// Prefill of `tokens` random tokens into a fresh sequence (left in `state` for decoding).
PrefillFigure bench_prefill(const Model& m, int64_t tokens, ThreadPool* pool, SequenceState& state, uint64_t seed);
// `steps` greedy decode steps from `state` (its context is state.pos), with the bytes per step;
// with the whole head product (and then the sampler's time on each step's logits), or with the
// head screen (the path greedy generation takes).
DecodeFigure bench_decode(const Model& m, SequenceState& state, int64_t steps, ThreadPool* pool,
                          bool head_screen = false);
// `steps` more decode steps from `state` with the whole head, each between two passes of `probe`
// (DecodeFigure::paired).
std::vector<DecodeFigure::PairedStep> bench_decode_paired(const Model& m, SequenceState& state, int64_t steps,
                                                          ThreadPool* pool, TriadProbe& probe);

// The disk the checkpoint lies on, read the way the expert cache reads it (io/direct_reader.h:
// O_DIRECT where allowed, `threads` reads in flight): sequential 4 MiB reads, then random reads of
// each size in `random_sizes`, about `seconds` each, at random aligned places of `file`.
struct DiskFigures {
  bool direct = false;  // false: the file system refused O_DIRECT (reads went through the page cache)
  double sequential_bytes_per_s = 0;
  std::vector<std::pair<int64_t, double>> random_bytes_per_s;  // (read size, bytes/s)
};
DiskFigures measure_disk(const std::string& file, const std::vector<int64_t>& random_sizes, int threads, double seconds);

// The median of several runs of one length (each a PrefillFigure of one run), with every run's
// seconds kept; `runs` must not be empty.
PrefillFigure median_prefill(const std::vector<PrefillFigure>& runs);

// An untimed prefill of `tokens` random tokens (at most the model's length less `steps`) and
// `steps` decode steps on a sequence of its own, before any timed figure: the first pass over a
// model pays one-time costs no later pass does (routed experts' first page faults in the mapped
// checkpoint, the threads' scratch buffers growing, anonymous pages zeroed on first touch).
// Measured on the small preset, 2 threads: the first of six 128-token prefills ran at 69 tok/s,
// the next five at 93-108.
struct WarmUp {
  int64_t prefill_tokens = 0, decode_steps = 0;  // what ran
  double seconds = 0;
};
WarmUp bench_warm_up(const Model& m, int64_t tokens, int64_t steps, ThreadPool* pool);

// The model's FP8 and FP4 GEMMs alone at `rows` activation rows: flop/s of the whole set (each
// shape weighted by its use per token), for prefill efficiency against the FMA peak.
struct GemmFigure {
  // One kernel family's share of the pass: on AVX2 the exact FP8 products run as double FMAs,
  // the FP4 ones as 8-bit integer dot products.
  struct Family {
    double flops = 0, seconds = 0;
    double flops_per_s() const { return seconds > 0 ? flops / seconds : 0; }
  };
  int64_t rows = 0;
  Family fp8, fp4;
  double flops() const { return fp8.flops + fp4.flops; }
  double seconds() const { return fp8.seconds + fp4.seconds; }
  double flops_per_s() const { return seconds() > 0 ? flops() / seconds() : 0; }
};
GemmFigure bench_quantized_gemms(const Model& m, int64_t rows, ThreadPool* pool);

// The one-row (decode) FP8 and FP4 kernels alone on one thread, over a random matrix of the
// model's width K and about 512 KiB of weights (in L2 on current cores, with the rows16 copy the
// model's matrices have at this level): the weight bytes per second one core's arithmetic
// decodes, whatever the memory does. Times the threads and against the triad it says whether a
// decode's quantized layers can stream at memory speed on this machine or are bound by
// operations (the exact block sums of the AVX2 FP8 decode take ~6.5 vector operations per 8
// weight bytes).
struct DecodeKernelFigure {
  struct Family {
    int64_t rows = 0, k = 0;
    double bytes = 0, seconds = 0;  // weight bytes decoded in `seconds` (the fastest of three passes)
    double bytes_per_s() const { return seconds > 0 ? bytes / seconds : 0; }
  };
  Family fp8, fp4;
};
DecodeKernelFigure bench_decode_kernels(const Model& m);

}  // namespace ds41
