#include "devtools/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <sys/resource.h>
#include <type_traits>

#include "base/byte_buffer.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "io/direct_reader.h"
#include "kernels/gemm.h"
#include "kernels/numeric_formats.h"
#include "kernels/simd_kernels.h"
#include "runtime/sampler.h"

namespace ds41 {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// A forward hook keeping, per layer, how many distinct routed experts the last token used (the
// expert bytes it read).
auto distinct_experts_into(std::vector<int>& used) {
  return [&used](int layer, int, const int32_t* ids, int k) {
    int distinct = 0;
    for (int i = 0; i < k; ++i) distinct += std::find(ids, ids + i, ids[i]) == ids + i;
    used[size_t(layer)] = distinct;
  };
}

int64_t fp8_bytes(const Fp8Matrix& w) { return w.N * w.K + ((w.N + 31) / 32) * ((w.K + 31) / 32); }
int64_t fp4_bytes(const Fp4Matrix& w) { return w.N * w.K / 2 + w.N * (w.K / 32); }
int64_t fp8_macs(const Fp8Matrix& w) { return w.N * w.K; }
int64_t fp4_macs(const Fp4Matrix& w) { return w.N * w.K; }

}  // namespace

struct TriadProbe::Arrays {
  int64_t n;
  // On huge pages like the weights materialised at load (base/byte_buffer.h): on 4 KiB pages the
  // triad measured 25-35 % less here, a roofline the packed head would have beaten.
  ByteBuffer a, b, c;
  explicit Arrays(int64_t elements) : n(elements), a(size_t(n) * 8), b(size_t(n) * 8), c(size_t(n) * 8) {}
};

TriadProbe::TriadProbe(ThreadPool* pool, int64_t array_bytes)
    : pool_(pool), arrays_(std::make_unique<Arrays>(std::max<int64_t>(array_bytes / 8, 1024))) {
  double* a = reinterpret_cast<double*>(arrays_->a.data());
  double* b = reinterpret_cast<double*>(arrays_->b.data());
  double* c = reinterpret_cast<double*>(arrays_->c.data());
  // First touch by the threads that will use each part (page placement on NUMA machines).
  parallel_for(pool, arrays_->n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      a[size_t(i)] = 0.0;
      b[size_t(i)] = 1.0;
      c[size_t(i)] = 2.0;
    }
  });
}

TriadProbe::~TriadProbe() = default;  // here, where Arrays is complete

double TriadProbe::pass() {
  const int64_t n = arrays_->n;
  double* a = reinterpret_cast<double*>(arrays_->a.data());
  const double* b = reinterpret_cast<const double*>(arrays_->b.data());
  const double* c = reinterpret_cast<const double*>(arrays_->c.data());
  const int chunks = pool_ ? pool_->size() : 1;
  const double s = 3.0 + passes_++ % 8;
  const auto t0 = Clock::now();
  parallel_for(pool_, chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const int64_t i0 = chunk_begin(n, chunks, ch), i1 = chunk_begin(n, chunks, ch + 1);
      for (int64_t i = i0; i < i1; ++i) a[i] = b[i] + s * c[i];
    }
  });
  const double t = seconds_since(t0);
  if (a[size_t(n / 2)] != 1.0 + s * 2.0) throw Error("bench: triad produced a wrong value");
  return 24.0 * double(n) / t;
}

double measure_triad_bandwidth(ThreadPool* pool, int64_t array_bytes, int repeats) {
  TriadProbe probe(pool, array_bytes);
  double best = 0.0;
  for (int r = 0; r < std::max(repeats, 1); ++r) best = std::max(best, probe.pass());
  return best;
}

double DecodeFigure::paired_median_efficiency() const {
  if (paired.empty()) return 0;
  std::vector<double> e;
  for (const PairedStep& s : paired) e.push_back(s.efficiency());
  std::sort(e.begin(), e.end());
  const size_t mid = e.size() / 2;
  return e.size() % 2 ? e[mid] : 0.5 * (e[mid - 1] + e[mid]);
}

double measure_fma_peak(ThreadPool* pool, double seconds, SimdLevel level) {
  const simd::KernelTable* kt = simd::kernel_table(level == SimdLevel::Scalar ? simd_level_supported() : level);
  const int threads = pool ? pool->size() : 1;
  std::vector<float> sinks(size_t(threads) * 16);
  auto run = [&](int64_t iterations) {
    std::vector<double> flops(size_t(threads), 0.0);
    const auto t0 = Clock::now();
    parallel_for(pool, threads, [&](int64_t t0_, int64_t t1_) {
      for (int64_t t = t0_; t < t1_; ++t) {
        float* sink = &sinks[size_t(t) * 16];
        if (kt) {
          flops[size_t(t)] = kt->fma_peak(iterations, sink);
        } else {  // portable loop: 8 independent multiply-add chains
          float acc[8] = {0, 1e-3f, 2e-3f, 3e-3f, 4e-3f, 5e-3f, 6e-3f, 7e-3f};
          for (int64_t it = 0; it < iterations; ++it)
            for (float& v : acc) v = v * 0.999999f + 1e-7f;
          *sink = acc[0] + acc[7];
          flops[size_t(t)] = 16.0 * double(iterations);
        }
      }
    });
    const double t = seconds_since(t0);
    double total = 0;
    for (double f : flops) total += f;
    return std::pair<double, double>(total, t);
  };
  // Calibrate to about seconds / 3 per run, then best of three.
  int64_t iterations = 1 << 16;
  for (;;) {
    auto [f, t] = run(iterations);
    if (t > 0.02 || iterations > (int64_t(1) << 34)) {
      iterations = std::max<int64_t>(1 << 16, int64_t(double(iterations) * (seconds / 3.0) / std::max(t, 1e-6)));
      break;
    }
    iterations *= 4;
  }
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    auto [f, t] = run(iterations);
    best = std::max(best, f / t);
  }
  return best;
}

int64_t compressor_bytes_per_token(const ModelConfig& c, const LayerPlan& lp) {
  if (!lp.kv_source) return 0;
  // Read as the checkpoint stores them, bf16 (kernels/gemm.h): kv, plus the gate at ratio > 1.
  const int64_t D = c.dim, Dh = c.head_dim;
  return (lp.ratio > 1 ? 2 : 1) * Dh * D * 2 + Dh * 2;
}

DecodeBytes decode_bytes_per_token(const Model& m, const std::vector<int>& experts_used, int64_t pos) {
  const ModelConfig& c = m.config();
  const ModelWeights& W = m.weights();
  const int64_t D = c.dim, Dh = c.head_dim, IH = c.index_head_dim, hc = c.hc_mult;
  const int64_t nmix = (2 + hc) * hc;
  DecodeBytes b;
  b.weights += D * 2 + D * 2 + c.vocab_size * D * 2;  // embedding row, final norm, head
  for (const LayerPlan& lp : m.plan().layers) {
    if (lp.is_dspark) continue;
    const BlockWeights& w = W.blocks[size_t(lp.id)];
    b.weights += 2 * D * 2 + 2 * (nmix * hc * D * 4 + (nmix + 3) * 4);  // norms, hc projections
    b.weights += fp8_bytes(w.wq_a) + fp8_bytes(w.wq_b) + fp8_bytes(w.wkv) + fp8_bytes(w.wo_b);
    b.weights += c.q_lora_rank * 2 + Dh * 2 + int64_t(c.n_heads) * 4;
    // wo_a: its packed FP8 codes and scales, or its bf16 values
    const int64_t wo_a_values = int64_t(c.o_groups) * c.o_lora_rank * (int64_t(c.n_heads) * Dh / c.o_groups);
    b.weights += w.wo_a_fp8_packed.blocks ? wo_a_values + wo_a_values / (32 * 32) : wo_a_values * 2;
    if (lp.kv_source) {
      b.weights += compressor_bytes_per_token(c, lp);
      const bool emits = lp.ratio > 0 && (pos + 1) % lp.ratio == 0;
      if (lp.owns_index_k && emits) b.weights += IH * Dh * 2 + IH * 2;
    }
    if (lp.index_source) b.weights += fp8_bytes(w.idx_wq_b) + int64_t(c.index_n_heads) * D * 2;
    b.weights += int64_t(lp.routed_experts) * D * 2 + int64_t(lp.routed_experts) * 4;  // router
    b.weights += fp8_bytes(w.shared.w1) + fp8_bytes(w.shared.w2) + fp8_bytes(w.shared.w3);
    if (!w.experts.empty()) {
      const ExpertWeights& e = w.experts[0];
      const int used = size_t(lp.id) < experts_used.size() ? experts_used[size_t(lp.id)] : lp.activated_experts;
      b.weights += int64_t(used) * (fp4_bytes(e.w1) + fp4_bytes(e.w2) + fp4_bytes(e.w3));
    }
    if (lp.engram) {
      const int64_t HD = c.engram_head_dim, cols = HD > 0 ? w.engram_wkv.K / HD : 0;
      b.weights += fp8_bytes(w.engram_wkv) + 2 * hc * D * 2 + cols * (HD + HD / 32);
    }
    // KV read by this token.
    b.kv += std::min<int64_t>(pos + 1, c.window_size) * (Dh + Dh / 32);
    if (lp.ratio > 0) {
      const int64_t visible = (pos + 1) / lp.ratio;
      b.kv += std::min<int64_t>(visible, c.index_topk) * (Dh / 2 + Dh / 16);
      if (lp.index_source) b.kv += visible * (IH / 2 + IH / 32);
    }
  }
  return b;
}

int64_t quantized_macs_per_token(const Model& m) {
  const ModelWeights& W = m.weights();
  int64_t macs = 0;
  for (const LayerPlan& lp : m.plan().layers) {
    if (lp.is_dspark) continue;
    const BlockWeights& w = W.blocks[size_t(lp.id)];
    macs += fp8_macs(w.wq_a) + fp8_macs(w.wq_b) + fp8_macs(w.wkv) + fp8_macs(w.wo_b);
    if (lp.index_source) macs += fp8_macs(w.idx_wq_b);
    macs += fp8_macs(w.shared.w1) + fp8_macs(w.shared.w2) + fp8_macs(w.shared.w3);
    if (!w.experts.empty())
      macs += int64_t(lp.activated_experts) * (fp4_macs(w.experts[0].w1) + fp4_macs(w.experts[0].w2) + fp4_macs(w.experts[0].w3));
    if (lp.engram) macs += fp8_macs(w.engram_wkv);
  }
  return macs;
}

PrefillFigure bench_prefill(const Model& m, int64_t tokens, ThreadPool* pool, SequenceState& state, uint64_t seed) {
  const ModelConfig& c = m.config();
  if (tokens < 1) throw Error("bench: a prefill needs at least one token");
  if (tokens > c.max_seq_len) throw Error("bench: prefill length " + std::to_string(tokens) + " exceeds the model's max_seq_len");
  std::mt19937_64 rng(seed);
  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (auto& t : prompt) t = int32_t(rng() % uint64_t(c.vocab_size));
  prompt[0] = int32_t(c.bos_token_id);
  state = m.new_sequence();
  reserve_sequence(state, c, m.plan(), std::min<int64_t>(c.max_seq_len, tokens + 256));
  std::vector<float> logits;
  const double cpu0 = process_cpu_seconds();
  const auto t0 = Clock::now();
  m.forward_into(logits, state, prompt, ForwardOptions{}, pool);
  PrefillFigure f;
  f.tokens = tokens;
  f.seconds = seconds_since(t0);
  f.cpu_seconds = process_cpu_seconds() - cpu0;
  f.run_seconds = {f.seconds};
  return f;
}

PrefillFigure median_prefill(const std::vector<PrefillFigure>& runs) {
  if (runs.empty()) throw Error("bench: no prefill run to take the median of");
  std::vector<size_t> order(runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return runs[a].seconds < runs[b].seconds; });
  PrefillFigure f = runs[order[(order.size() - 1) / 2]];
  f.run_seconds.clear();
  for (const PrefillFigure& r : runs) f.run_seconds.push_back(r.seconds);
  return f;
}

DecodeFigure bench_decode(const Model& m, SequenceState& state, int64_t steps, ThreadPool* pool, bool head_screen) {
  const ModelConfig& c = m.config();
  DecodeFigure f;
  ForwardOptions fo;
  fo.head_top_k = head_screen ? 1 : 0;
  const HeadScreen* screen = head_screen ? m.head_screen(pool) : nullptr;  // built before the timing
  const int64_t head_bytes = c.vocab_size * c.dim * 2;
  f.context = state.pos;
  steps = std::min<int64_t>(steps, c.max_seq_len - state.pos);
  if (steps <= 0) return f;
  reserve_sequence(state, c, m.plan(), state.pos + steps);
  std::vector<int> used(m.plan().layers.size(), 0);
  ForwardHooks hooks;
  HeadScreenOutcome screen_outcome = HeadScreenOutcome::FellBack;
  int64_t screen_candidates = 0, candidates_sum = 0;
  hooks.on_head_screen = [&](HeadScreenOutcome outcome, int64_t candidates) {
    screen_outcome = outcome;
    screen_candidates = candidates;
  };
  hooks.on_experts = distinct_experts_into(used);
  std::vector<float> logits;
  std::vector<int32_t> token{int32_t(c.bos_token_id)};
  DecodeBytes sum;
  ExpertCache* cache = m.weights().expert_cache.get();
  if (cache) cache->reset_stats();
  std::vector<double> step_seconds;
  SamplerOptions sampled;
  sampled.temperature = 1.0;
  const Sampler sampler(sampled);
  SamplerScratch sampler_scratch;
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t pos = state.pos;
    const double cpu0 = process_cpu_seconds();
    const auto t0 = Clock::now();
    screen_outcome = HeadScreenOutcome::FellBack;
    screen_candidates = 0;
    m.forward_into(logits, state, token, fo, pool, &hooks);
    token[0] = argmax_token(logits.data(), c.vocab_size);
    step_seconds.push_back(seconds_since(t0));
    f.seconds += step_seconds.back();
    f.cpu_seconds += process_cpu_seconds() - cpu0;
    if (!head_screen) {
      // The first call sizes the scratch buffers (a decode loop keeps them): untimed.
      if (i == 0) sampler.sample(logits.data(), c.vocab_size, uint64_t(pos), {}, sampler_scratch);
      const auto s0 = Clock::now();
      sampler.sample(logits.data(), c.vocab_size, uint64_t(pos), {}, sampler_scratch);
      f.sampling_seconds += seconds_since(s0);
    }
    DecodeBytes b = decode_bytes_per_token(m, used, pos);
    if (screen) {  // the screen's reads instead of the head's (both when it fell back, the head's when skipped)
      if (screen_outcome != HeadScreenOutcome::Skipped) b.weights += screen->bytes_read(screen_candidates);
      if (screen_outcome == HeadScreenOutcome::Decided) b.weights -= head_bytes;
      candidates_sum += screen_candidates;
      f.head_fallbacks += screen_outcome == HeadScreenOutcome::FellBack;
      f.head_skipped += screen_outcome == HeadScreenOutcome::Skipped;
    }
    sum.weights += b.weights;
    sum.kv += b.kv;
  }
  f.steps = steps;
  f.sampling_seconds /= double(steps);
  std::sort(step_seconds.begin(), step_seconds.end());
  const size_t mid = step_seconds.size() / 2;
  f.median_step_seconds = step_seconds.size() % 2 ? step_seconds[mid] : 0.5 * (step_seconds[mid - 1] + step_seconds[mid]);
  f.head_candidates = double(candidates_sum) / double(steps);
  if (head_screen && !screen) f.head_fallbacks = steps;  // a head without a screen: the full product
  f.bytes.weights = sum.weights / steps;
  f.bytes.kv = sum.kv / steps;
  if (cache) {
    f.experts_streamed = true;
    f.experts = cache->stats();
  }
  return f;
}

std::vector<DecodeFigure::PairedStep> bench_decode_paired(const Model& m, SequenceState& state, int64_t steps,
                                                          ThreadPool* pool, TriadProbe& probe) {
  const ModelConfig& c = m.config();
  std::vector<DecodeFigure::PairedStep> out;
  steps = std::min<int64_t>(steps, c.max_seq_len - state.pos);
  if (steps <= 0) return out;
  reserve_sequence(state, c, m.plan(), state.pos + steps);
  std::vector<int> used(m.plan().layers.size(), 0);
  ForwardHooks hooks;
  hooks.on_experts = distinct_experts_into(used);
  std::vector<float> logits;
  std::vector<int32_t> token{int32_t(c.bos_token_id)};
  double before = probe.pass();
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t pos = state.pos;
    const auto t0 = Clock::now();
    m.forward_into(logits, state, token, ForwardOptions{}, pool, &hooks);
    token[0] = argmax_token(logits.data(), c.vocab_size);
    DecodeFigure::PairedStep s;
    s.seconds = seconds_since(t0);
    s.bytes = decode_bytes_per_token(m, used, pos).total();
    s.triad_before = before;
    s.triad_after = before = probe.pass();
    out.push_back(s);
  }
  return out;
}

DiskFigures measure_disk(const std::string& file, const std::vector<int64_t>& random_sizes, int threads, double seconds) {
  DiskFigures d;
  DirectReader reader(threads);
  const int f = reader.open(file);
  d.direct = reader.direct(f);
  std::error_code ec;
  const uint64_t size = uint64_t(std::filesystem::file_size(file, ec));
  if (ec || size < (uint64_t(8) << 20)) return d;
  int64_t largest = int64_t(4) << 20;
  for (int64_t s : random_sizes) largest = std::max(largest, s);
  const int depth = std::max(1, threads);
  ByteBuffer buffers(size_t(std::max<int64_t>(largest * depth, int64_t(ByteBuffer::kHugePageBytes))));
  // Keeps `depth` reads of `bytes` in flight for about `seconds`; next(i) gives the i-th offset.
  const auto run = [&](int64_t bytes, const std::function<uint64_t(int64_t)>& next) {
    std::mutex mu;
    std::condition_variable cv;
    int in_flight = 0;
    int64_t issued = 0, done_bytes = 0;
    std::string error;
    const auto t0 = Clock::now();
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      const bool time_left = seconds_since(t0) < seconds;
      while (time_left && in_flight < depth) {
        const uint64_t at = next(issued) % (size - uint64_t(bytes)) / DirectReader::kAlign * DirectReader::kAlign;
        uint8_t* dest = buffers.data() + (issued % depth) * largest;
        ++in_flight;
        ++issued;
        reader.submit(f, at, uint64_t(bytes), dest, [&, bytes](const std::string* e) {
          std::lock_guard<std::mutex> g(mu);
          if (e && error.empty()) error = *e;
          done_bytes += bytes;
          --in_flight;
          cv.notify_all();
        });
      }
      if (!time_left && in_flight == 0) break;
      cv.wait(lock);
    }
    if (!error.empty()) throw Error("bench: disk measurement: " + error);
    return double(done_bytes) / seconds_since(t0);
  };
  const int64_t chunk = int64_t(4) << 20;
  d.sequential_bytes_per_s = run(chunk, [&](int64_t i) { return uint64_t(i * chunk) % (size - uint64_t(chunk)); });
  std::mt19937_64 rng(7);
  for (int64_t bytes : random_sizes) {
    const int64_t aligned = (bytes + int64_t(DirectReader::kAlign) - 1) / int64_t(DirectReader::kAlign) * int64_t(DirectReader::kAlign);
    if (uint64_t(aligned) >= size) continue;
    d.random_bytes_per_s.push_back({aligned, run(aligned, [&](int64_t) { return rng(); })});
  }
  return d;
}

WarmUp bench_warm_up(const Model& m, int64_t tokens, int64_t steps, ThreadPool* pool) {
  const ModelConfig& c = m.config();
  WarmUp w;
  const auto t0 = Clock::now();
  const int64_t prefill_tokens = std::min(tokens, c.max_seq_len - std::max<int64_t>(steps, 0));
  if (prefill_tokens < 1) return w;
  w.prefill_tokens = prefill_tokens;
  SequenceState state;
  bench_prefill(m, w.prefill_tokens, pool, state, /*seed=*/0);
  if (steps > 0) w.decode_steps = bench_decode(m, state, steps, pool).steps;
  w.seconds = seconds_since(t0);
  return w;
}

GemmFigure bench_quantized_gemms(const Model& m, int64_t rows, ThreadPool* pool) {
  GemmFigure g;
  g.rows = rows;
  const LayerPlan* lp = nullptr;
  for (const LayerPlan& l : m.plan().layers)
    if (!l.is_dspark && !m.weights().blocks[size_t(l.id)].experts.empty()) {
      lp = &l;
      break;
    }
  if (!lp || rows < 1) return g;
  const BlockWeights& w = m.weights().blocks[size_t(lp->id)];
  std::vector<const Fp8Matrix*> fp8 = {&w.wq_a, &w.wq_b, &w.wkv, &w.wo_b, &w.shared.w1, &w.shared.w2, &w.shared.w3};
  std::vector<const Fp4Matrix*> fp4 = {&w.experts[0].w1, &w.experts[0].w2, &w.experts[0].w3};
  int64_t max_k = 0, max_n = 0;
  for (auto* x : fp8) max_k = std::max(max_k, x->K), max_n = std::max(max_n, x->N);
  for (auto* x : fp4) max_k = std::max(max_k, x->K), max_n = std::max(max_n, x->N);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(rows * max_k)), y(static_cast<size_t>(rows * max_n));
  for (auto& v : x) v = f32_to_bf16(normal(rng));
  // One untimed pass (scratch buffers, first touch of the weights), then the fastest of three
  // timed ones (on a shared machine one pass now and then loses a third to a neighbour); the
  // routed experts count k times per token, as in a prefill.
  for (int pass = 0; pass < 4; ++pass) {
    GemmFigure run;
    run.rows = rows;
    for (auto* mat : fp8) {
      const auto t0 = Clock::now();
      linear_fp8(x.data(), rows, *mat, y.data(), pool);
      run.fp8.seconds += seconds_since(t0);
      run.fp8.flops += 2.0 * double(rows) * double(mat->N) * double(mat->K);
    }
    for (int e = 0; e < lp->activated_experts; ++e)
      for (auto* mat : fp4) {
        const auto t0 = Clock::now();
        linear_fp4(x.data(), rows, *mat, y.data(), pool);
        run.fp4.seconds += seconds_since(t0);
        run.fp4.flops += 2.0 * double(rows) * double(mat->N) * double(mat->K);
      }
    if (pass > 0 && (g.seconds() == 0 || run.seconds() < g.seconds())) g = run;
  }
  return g;
}


namespace {
// FP8: normal draws quantized as a checkpoint's weights are (each 32 x 32 block divided by the
// power of two that brings its largest magnitude to at most 448, then rounded to E4M3), so that
// the codes' spread, subnormals included (~0.01 %), is a real matrix's: uniform random bytes would
// hold 5 % subnormal codes, which only the decode's slow path for them sees (simd_gemm_fp8.inc).
// FP4: any bytes (every E2M1 code is a weight's). With E8M0 scales near 1 (2^-7 .. 2^0) the sums
// are finite, so every row takes the kernels' vector path.
std::vector<uint8_t> random_weight_bytes(int64_t rows, int64_t row_bytes, bool e4m3, std::mt19937& rng) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  if (!e4m3) {
    for (auto& v : out) v = uint8_t(rng());
    return out;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> block(32 * 32);
  for (int64_t r0 = 0; r0 < rows; r0 += 32)
    for (int64_t k0 = 0; k0 < row_bytes; k0 += 32) {
      const int64_t nr = std::min<int64_t>(32, rows - r0), nk = std::min<int64_t>(32, row_bytes - k0);
      float largest = 0;
      for (int64_t i = 0; i < nr * nk; ++i) largest = std::max(largest, std::abs(block[size_t(i)] = normal(rng)));
      const float scale = std::exp2(std::ceil(std::log2(largest / 448.0f)));
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t k = 0; k < nk; ++k)
          out[size_t((r0 + r) * row_bytes + k0 + k)] = f32_to_e4m3(block[size_t(r * nk + k)] / scale);
    }
  return out;
}
std::vector<uint8_t> random_scales(int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> out(static_cast<size_t>(n));
  for (auto& v : out) v = uint8_t(120 + rng() % 8);
  return out;
}
// The fastest of three passes of at least 0.1 s each of `call` (one decode of `bytes` weight
// bytes), after one untimed call.
template <class Call>
void time_decode_kernel(const Call& call, double bytes, DecodeKernelFigure::Family& f) {
  call();
  for (int pass = 0; pass < 3; ++pass) {
    int64_t calls = 0;
    const auto t0 = Clock::now();
    double t = 0;
    do {
      call();
      ++calls;
    } while ((t = seconds_since(t0)) < 0.1);
    if (f.seconds == 0 || t / double(calls) < f.seconds) f.seconds = t / double(calls);
  }
  f.bytes = bytes;
}
// One family: a random matrix of about 512 KiB (random_weight_bytes), with the rows16 copy the
// active level's one-row decode reads, timed on one row.
template <class Matrix>
DecodeKernelFigure::Family time_decode_family(const std::vector<uint16_t>& x, int64_t K, std::mt19937& rng) {
  constexpr bool kFp8 = std::is_same_v<Matrix, Fp8Matrix>;
  const int64_t row_bytes = kFp8 ? K : K / 2;
  const int64_t N = std::max<int64_t>(16, (int64_t(512) << 10) / row_bytes / 16 * 16);
  const std::vector<uint8_t> w = random_weight_bytes(N, row_bytes, kFp8, rng);
  const std::vector<uint8_t> s = random_scales(kFp8 ? (N / 32 + 1) * (K / 32) : N * (K / 32), rng);
  Matrix W{w.data(), s.data(), N, K};
  std::vector<uint8_t> copy;
  if constexpr (kFp8) {
    if (fp8_decode_reads_rows16()) {
      copy.resize(size_t(fp8_rows16_bytes(W)));
      pack_fp8_rows16(W, copy.data());
    }
  } else if (fp4_decode_reads_rows16()) {
    copy.resize(size_t(fp4_rows16_bytes(W)));
    pack_fp4_rows16(W, copy.data());
  }
  if (!copy.empty()) W.rows16 = copy.data();
  std::vector<uint16_t> y(static_cast<size_t>(N));
  DecodeKernelFigure::Family f;
  f.rows = N;
  f.k = K;
  time_decode_kernel(
      [&] {
        if constexpr (kFp8) linear_fp8(x.data(), 1, W, y.data(), nullptr);
        else linear_fp4(x.data(), 1, W, y.data(), nullptr);
      },
      double(N * row_bytes), f);
  return f;
}
}  // namespace

DecodeKernelFigure bench_decode_kernels(const Model& m) {
  DecodeKernelFigure r;
  const int64_t K = m.config().dim;
  if (K % 32 != 0) return r;  // the quantized blocks
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(K));
  for (auto& v : x) v = f32_to_bf16(normal(rng));
  r.fp8 = time_decode_family<Fp8Matrix>(x, K, rng);
  r.fp4 = time_decode_family<Fp4Matrix>(x, K, rng);
  return r;
}

}  // namespace ds41
