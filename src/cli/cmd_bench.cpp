// `ds41 bench`: machine bandwidth and FMA peak, prefill and decode speed of a checkpoint, bytes
// per decoded token, and the efficiencies relating them (runtime/bench.h), for the active SIMD
// level and, for the speed-up, the scalar kernels (DS41_SIMD or --no-scalar to change that).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_files.h"

#include <optional>
#include "kernels/simd_level.h"
#include "model/head_screen.h"
#include "model/weights.h"
#include "devtools/bench.h"
#include "dist/mpi_job.h"

namespace ds41::cli {

using json = nlohmann::json;

namespace {

std::vector<double> load_average() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return {};
  return {l[0], l[1], l[2]};
}

// Bytes of this process's file mappings that the kernel maps with 2 MiB entries (FilePmdMapped in
// /proc/self/smaps_rollup), or -1 where it does not say. Decode runs 10-14 % slower on the Xeon VM
// when the checkpoint's pages are 4 KiB-mapped (model/weights.h), so a run reports it.
int64_t file_pmd_mapped_bytes() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("FilePmdMapped:", 0) != 0) continue;
    const char* digits = line.c_str() + 14;
    char* end = nullptr;
    const long long kib = std::strtoll(digits, &end, 10);
    return end != digits && kib >= 0 ? int64_t(kib) * 1024 : -1;  // an unexpected line: not reported
  }
  return -1;
}

struct RunFigures {
  std::vector<PrefillFigure> prefill;
  std::vector<DecodeFigure> decode;
  // With `head_screen`: after each decode, as many steps again with the greedy head screen
  // (model/head_screen.h), in the same order as `decode`.
  std::vector<DecodeFigure> screened;
  GemmFigure gemm;
  DecodeKernelFigure decode_kernels;  // with the GEMMs (gemm_rows > 0)
};

// Prefills at every length and decodes at every context, reusing a prefill's sequence when its
// length is one of the decode contexts.
RunFigures run_figures(const Model& m, const std::vector<int64_t>& prefill_lengths, int64_t prefill_repeats,
                       const std::vector<int64_t>& decode_contexts, int64_t decode_steps, int64_t gemm_rows,
                       int64_t triad_bytes, ThreadPool* pool, bool verbose, bool head_screen) {
  RunFigures r;
  std::map<int64_t, bool> decoded;
  // Passes between paired decode steps: arrays of at most 64 MiB each (past the last-level caches
  // of current CPUs, a few ms a pass), allocated once.
  TriadProbe probe(pool, std::min<int64_t>(triad_bytes, int64_t(64) << 20));
  auto decode_from = [&](SequenceState& st) {
    if (verbose) std::fprintf(stderr, "bench: [%s] decode %lld steps at context %lld\n", simd_level_name(simd_level()),
                              (long long)decode_steps, (long long)st.pos);
    r.decode.push_back(bench_decode(m, st, decode_steps, pool));
    decoded[r.decode.back().context] = true;
    if (head_screen) {
      if (verbose)
        std::fprintf(stderr, "bench: [%s] decode %lld steps at context %lld, greedy head screen\n",
                     simd_level_name(simd_level()), (long long)decode_steps, (long long)st.pos);
      r.screened.push_back(bench_decode(m, st, decode_steps, pool, true));
    }
    const double beside = measure_triad_bandwidth(pool, triad_bytes, 3);
    r.decode.back().triad_beside = beside;
    if (head_screen) r.screened.back().triad_beside = beside;
    if (verbose)
      std::fprintf(stderr, "bench: [%s] decode %lld steps at context %lld, each between two triad passes\n",
                   simd_level_name(simd_level()), (long long)decode_steps, (long long)st.pos);
    r.decode.back().paired = bench_decode_paired(m, st, decode_steps, pool, probe);
  };
  for (int64_t len : prefill_lengths) {
    if (verbose) std::fprintf(stderr, "bench: [%s] prefill %lld tokens\n", simd_level_name(simd_level()), (long long)len);
    SequenceState st;
    std::vector<PrefillFigure> runs;
    for (int64_t i = 0; i < prefill_repeats; ++i) runs.push_back(bench_prefill(m, len, pool, st, uint64_t(len)));
    r.prefill.push_back(median_prefill(runs));
    if (std::find(decode_contexts.begin(), decode_contexts.end(), len) != decode_contexts.end()) decode_from(st);
  }
  for (int64_t ctx : decode_contexts) {
    if (decoded.count(ctx)) continue;
    SequenceState st = m.new_sequence();
    if (ctx > 0) {
      if (verbose) std::fprintf(stderr, "bench: [%s] prefill %lld tokens (context for decode)\n",
                                simd_level_name(simd_level()), (long long)ctx);
      bench_prefill(m, ctx, pool, st, uint64_t(ctx));
    }
    decode_from(st);
  }
  const auto by_context = [](const DecodeFigure& a, const DecodeFigure& b) { return a.context < b.context; };
  std::sort(r.decode.begin(), r.decode.end(), by_context);
  std::sort(r.screened.begin(), r.screened.end(), by_context);  // each at its decode's context + steps
  if (gemm_rows > 0) {
    r.gemm = bench_quantized_gemms(m, gemm_rows, pool);
    if (verbose) std::fprintf(stderr, "bench: [%s] decode kernels alone, one thread\n", simd_level_name(simd_level()));
    r.decode_kernels = bench_decode_kernels(m);
  }
  return r;
}

// The figures of a decode whose routed experts came from disk (DecodeFigure::experts): what the
// cache did, the disk traffic, and this configuration's roofline: per token, the disk bytes at the
// disk's speed for reads of an expert's size (`disk_bytes_per_s`, measured in the same run) plus the
// bytes read from memory (everything, the experts once they are in their slots) at the triad.
json experts_json(const DecodeFigure& d, double triad, double disk_bytes_per_s) {
  const ExpertCacheStats& e = d.experts;
  const double steps = double(std::max<int64_t>(d.steps, 1));
  const double disk_per_token = double(e.bytes_read) / steps;
  const double roofline_seconds = (disk_bytes_per_s > 0 ? disk_per_token / disk_bytes_per_s : 0.0) +
                                  (triad > 0 ? double(d.bytes.total()) / triad : 0.0);
  const double roofline = roofline_seconds > 0 ? 1.0 / roofline_seconds : 0.0;
  return {{"requests", e.requests},
          {"hit_rate", e.hit_rate()},
          {"expert_reads_per_token", double(e.reads) / steps},
          {"disk_bytes_per_token", disk_per_token},
          {"disk_bytes_per_s", d.seconds > 0 ? double(e.bytes_read) / d.seconds : 0.0},
          {"disk_read_bytes_per_s_measured", disk_bytes_per_s},
          {"wait_share_of_steps", d.seconds > 0 ? e.wait_seconds / d.seconds : 0.0},
          {"prefetched_per_token", double(e.prefetched) / steps},
          {"prefetch_precision", e.prefetch_precision()},
          {"roofline_tokens_per_s", roofline},
          {"efficiency_vs_roofline", roofline > 0 ? d.tokens_per_s() / roofline : 0.0}};
}

json figures_json(const RunFigures& r, double triad, double peak, int64_t macs_per_token, int threads,
                  double disk_bytes_per_s = 0) {
  json j;
  j["prefill"] = json::array();
  for (const PrefillFigure& p : r.prefill)
    j["prefill"].push_back({{"tokens", p.tokens},
                            {"seconds", p.seconds},
                            {"cpu_share", p.cpu_seconds / std::max(p.seconds * threads, 1e-9)},
                            {"tokens_per_s", p.tokens_per_s()},
                            {"quantized_gemm_flops_per_s", 2.0 * double(macs_per_token) * p.tokens_per_s()},
                            {"efficiency_vs_fma_peak", 2.0 * double(macs_per_token) * p.tokens_per_s() / peak},
                            {"run_seconds", p.run_seconds}});
  j["decode"] = json::array();
  for (size_t i = 0; i < r.decode.size(); ++i) {
    const DecodeFigure& d = r.decode[i];
    j["decode"].push_back({{"context", d.context},
                           {"steps", d.steps},
                           {"seconds", d.seconds},
                           {"cpu_share", d.cpu_seconds / std::max(d.seconds * threads, 1e-9)},
                           {"tokens_per_s", d.tokens_per_s()},
                           {"bytes_per_token", d.bytes.total()},
                           {"weight_bytes_per_token", d.bytes.weights},
                           {"kv_bytes_per_token", d.bytes.kv},
                           {"bytes_per_s", double(d.bytes.total()) * d.tokens_per_s()},
                           {"efficiency_vs_bandwidth", double(d.bytes.total()) * d.tokens_per_s() / triad},
                           {"median_step_seconds", d.median_step_seconds},
                           {"median_tokens_per_s", d.median_tokens_per_s()},
                           {"median_efficiency_vs_bandwidth", double(d.bytes.total()) * d.median_tokens_per_s() / triad},
                           {"triad_beside_bytes_per_s", d.triad_beside},
                           {"efficiency_vs_bandwidth_beside", double(d.bytes.total()) * d.tokens_per_s() / d.triad_beside},
                           {"median_efficiency_vs_bandwidth_beside",
                            double(d.bytes.total()) * d.median_tokens_per_s() / d.triad_beside},
                           {"sampling_seconds_per_token", d.sampling_seconds},
                           {"sampling_share_of_step", d.steps > 0 ? d.sampling_seconds * double(d.steps) / d.seconds : 0.0}});
    if (d.experts_streamed)
      j["decode"].back()["experts_from_disk"] = experts_json(d, d.triad_beside > 0 ? d.triad_beside : triad, disk_bytes_per_s);
    if (!d.paired.empty()) {
      json steps = json::array();
      double lo = d.paired[0].triad_before, hi = lo;
      for (const DecodeFigure::PairedStep& s : d.paired) {
        steps.push_back({{"seconds", s.seconds},
                         {"bytes", s.bytes},
                         {"triad_before_bytes_per_s", s.triad_before},
                         {"triad_after_bytes_per_s", s.triad_after},
                         {"efficiency", s.efficiency()}});
        lo = std::min({lo, s.triad_before, s.triad_after});
        hi = std::max({hi, s.triad_before, s.triad_after});
      }
      j["decode"].back()["paired_with_triads"] = {{"steps", steps},
                                                  {"median_efficiency", d.paired_median_efficiency()},
                                                  {"triad_min_bytes_per_s", lo},
                                                  {"triad_max_bytes_per_s", hi}};
    }
    if (i < r.screened.size()) {
      const DecodeFigure& g = r.screened[i];
      j["decode"].back()["greedy_head_screen"] = {
          {"context", g.context},
          {"steps", g.steps},
          {"seconds", g.seconds},
          {"tokens_per_s", g.tokens_per_s()},
          {"median_tokens_per_s", g.median_tokens_per_s()},
          {"speedup_vs_full_head", d.tokens_per_s() > 0 ? g.tokens_per_s() / d.tokens_per_s() : 0.0},
          {"bytes_per_token", g.bytes.total()},
          {"candidates_per_token", g.head_candidates},
          {"fallbacks", g.head_fallbacks},
          {"skipped", g.head_skipped},
          {"bytes_per_s", double(g.bytes.total()) * g.tokens_per_s()},
          {"efficiency_vs_bandwidth", double(g.bytes.total()) * g.tokens_per_s() / triad},
          {"efficiency_vs_bandwidth_beside", double(g.bytes.total()) * g.tokens_per_s() / g.triad_beside}};
    }
  }
  if (r.gemm.rows > 0) {
    const auto figure = [&](double flops, double seconds, double flops_per_s) {
      return json{{"flops", flops}, {"seconds", seconds}, {"flops_per_s", flops_per_s},
                  {"efficiency_vs_fma_peak", flops_per_s / peak}};
    };
    j["quantized_gemms"] = figure(r.gemm.flops(), r.gemm.seconds(), r.gemm.flops_per_s());
    j["quantized_gemms"]["rows"] = r.gemm.rows;
    for (const auto& [name, family] : {std::pair{"fp8", &r.gemm.fp8}, std::pair{"fp4", &r.gemm.fp4}})
      j["quantized_gemms"][name] = figure(family->flops, family->seconds, family->flops_per_s());
  }
  if (r.decode_kernels.fp8.seconds > 0 && r.decode_kernels.fp4.seconds > 0) {
    // One thread's rate times the threads: what the decode's quantized layers could stream if
    // nothing else limited them, against the triad (below 1: bound by operations here).
    j["decode_kernels"] = {{"threads", threads}};
    for (const auto& [name, f] :
         {std::pair{"fp8", &r.decode_kernels.fp8}, std::pair{"fp4", &r.decode_kernels.fp4}})
      j["decode_kernels"][name] = {{"rows", f->rows},
                                   {"k", f->k},
                                   {"weight_bytes", f->bytes},
                                   {"seconds", f->seconds},
                                   {"bytes_per_s_one_thread", f->bytes_per_s()},
                                   {"threads_vs_triad", double(threads) * f->bytes_per_s() / triad}};
  }
  return j;
}

void print_figures(const char* title, const json& j) {
  std::printf("%s\n", title);
  for (const auto& p : j["prefill"]) {
    std::printf("  prefill %6lld tokens  %9.2f tok/s   quantized GEMMs %8.2f GFLOP/s = %5.1f%% of FMA peak   (cpu share %.2f)",
                (long long)p["tokens"].get<int64_t>(), p["tokens_per_s"].get<double>(),
                p["quantized_gemm_flops_per_s"].get<double>() / 1e9, 100.0 * p["efficiency_vs_fma_peak"].get<double>(),
                p["cpu_share"].get<double>());
    const auto& runs = p["run_seconds"];
    if (runs.size() > 1) {
      double lo = runs[0].get<double>(), hi = lo;
      for (const auto& t : runs) lo = std::min(lo, t.get<double>()), hi = std::max(hi, t.get<double>());
      const double tokens = double(p["tokens"].get<int64_t>());
      std::printf("   median of %zu runs, %.2f-%.2f tok/s", runs.size(), tokens / hi, tokens / lo);
    }
    std::printf("\n");
  }
  for (const auto& d : j["decode"]) {
    std::printf("  decode at %6lld      %9.2f tok/s   %7.1f MB/token (KV %6.2f MB) -> %6.2f GB/s = %5.1f%% of bandwidth   (cpu share %.2f)\n"
                "                 median step: %9.2f tok/s = %5.1f%% of bandwidth\n"
                "                 against the triad measured right after (%.2f GB/s): %5.1f%%, median step %5.1f%%\n",
                (long long)d["context"].get<int64_t>(), d["tokens_per_s"].get<double>(),
                double(d["bytes_per_token"].get<int64_t>()) / 1e6, double(d["kv_bytes_per_token"].get<int64_t>()) / 1e6,
                d["bytes_per_s"].get<double>() / 1e9, 100.0 * d["efficiency_vs_bandwidth"].get<double>(),
                d["cpu_share"].get<double>(), d["median_tokens_per_s"].get<double>(),
                100.0 * d["median_efficiency_vs_bandwidth"].get<double>(), d["triad_beside_bytes_per_s"].get<double>() / 1e9,
                100.0 * d["efficiency_vs_bandwidth_beside"].get<double>(),
                100.0 * d["median_efficiency_vs_bandwidth_beside"].get<double>());
    if (d.contains("paired_with_triads")) {
      const auto& pt = d["paired_with_triads"];
      std::printf("                 %zu more steps, each between two triad passes (%.1f-%.1f GB/s): median step %5.1f%% of "
                  "the bandwidth around it\n",
                  pt["steps"].size(), pt["triad_min_bytes_per_s"].get<double>() / 1e9,
                  pt["triad_max_bytes_per_s"].get<double>() / 1e9, 100.0 * pt["median_efficiency"].get<double>());
    }
    std::printf("                 sampling (temperature 1, every token) on the step's logits: %.3f ms per token = %.1f%% "
                "of a step\n",
                1e3 * d["sampling_seconds_per_token"].get<double>(), 100.0 * d["sampling_share_of_step"].get<double>());
    if (d.contains("experts_from_disk")) {
      const auto& e = d["experts_from_disk"];
      std::printf("                 experts from disk: hit rate %.1f%%, %.2f reads + %.2f read ahead (%.0f%% then used) = %.1f MB "
                  "per token, %.2f GB/s from disk (%.0f%% of the steps waiting); roofline %.2f tok/s (disk %.2f GB/s + "
                  "triad) -> %.1f%% of it\n",
                  100.0 * e["hit_rate"].get<double>(), e["expert_reads_per_token"].get<double>(),
                  e["prefetched_per_token"].get<double>(), 100.0 * e["prefetch_precision"].get<double>(),
                  e["disk_bytes_per_token"].get<double>() / 1e6, e["disk_bytes_per_s"].get<double>() / 1e9,
                  100.0 * e["wait_share_of_steps"].get<double>(), e["roofline_tokens_per_s"].get<double>(),
                  e["disk_read_bytes_per_s_measured"].get<double>() / 1e9, 100.0 * e["efficiency_vs_roofline"].get<double>());
    }
    if (d.contains("greedy_head_screen")) {
      const auto& g = d["greedy_head_screen"];
      std::printf("                 greedy, head screen (context %lld): %9.2f tok/s = %.2fx   %7.1f MB/token (%.0f candidate rows, "
                  "%lld fallbacks, %lld skipped) -> %5.1f%% of bandwidth, %5.1f%% of the triad right after\n",
                  (long long)g["context"].get<int64_t>(), g["tokens_per_s"].get<double>(),
                  g["speedup_vs_full_head"].get<double>(), double(g["bytes_per_token"].get<int64_t>()) / 1e6,
                  g["candidates_per_token"].get<double>(), (long long)g["fallbacks"].get<int64_t>(),
                  (long long)g["skipped"].get<int64_t>(),
                  100.0 * g["efficiency_vs_bandwidth"].get<double>(), 100.0 * g["efficiency_vs_bandwidth_beside"].get<double>());
    }
  }
  if (j.contains("quantized_gemms")) {
    const auto& g = j["quantized_gemms"];
    std::printf("  FP8/FP4 GEMMs alone, %lld rows: %8.2f GFLOP/s = %5.1f%% of FMA peak   (FP8 %.2f, FP4 %.2f GFLOP/s)\n",
                (long long)g["rows"].get<int64_t>(), g["flops_per_s"].get<double>() / 1e9,
                100.0 * g["efficiency_vs_fma_peak"].get<double>(), g["fp8"]["flops_per_s"].get<double>() / 1e9,
                g["fp4"]["flops_per_s"].get<double>() / 1e9);
  }
  if (j.contains("decode_kernels")) {
    const auto& k = j["decode_kernels"];
    const auto& f8 = k["fp8"];
    const auto& f4 = k["fp4"];
    const int threads = k["threads"].get<int>();
    const bool bound = f8["threads_vs_triad"].get<double>() < 1.0 || f4["threads_vs_triad"].get<double>() < 1.0;
    std::printf("  decode kernels alone, one thread, weights in L2: FP8 %.2f GB/s (%lld x %lld), FP4 %.2f GB/s (%lld x %lld)"
                " -> x %d threads = %.0f%% / %.0f%% of the triad%s\n",
                f8["bytes_per_s_one_thread"].get<double>() / 1e9, (long long)f8["rows"].get<int64_t>(),
                (long long)f8["k"].get<int64_t>(), f4["bytes_per_s_one_thread"].get<double>() / 1e9,
                (long long)f4["rows"].get<int64_t>(), (long long)f4["k"].get<int64_t>(), threads,
                100.0 * f8["threads_vs_triad"].get<double>(), 100.0 * f4["threads_vs_triad"].get<double>(),
                bound ? ": decode is bound by operations there, not memory" : "");
  }
}

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::vector<OptionSpec> specs = {
             {"model", "DIR", "checkpoint directory", ""},
             {"prefill-lengths", "LIST", "prefill lengths in tokens", "128,512,2048,8192"},
             {"decode-contexts", "LIST", "contexts (tokens already in the sequence) to decode at", "0,2048,8192"},
             {"decode-tokens", "N", "decode steps timed at each context (run three times: whole head, greedy head screen, each step between triad passes)", "16"},
             {"gemm-rows", "N", "activation rows of the FP8/FP4 GEMM measurement (0 = skip)", "512"},
             {"triad-mb", "N", "size of each STREAM triad array in MiB", "256"},
             {"no-scalar", "", "skip the scalar-kernel comparison", ""},
             {"prefill-repeats", "N", "runs of each prefill length (the median is reported)", "1"},
             {"scalar-prefill", "N", "prefill length of the scalar comparison", "128"},
             {"scalar-decode-tokens", "N", "decode steps (at context 0) of the scalar comparison", "8"},
             {"warm-up", "N", "tokens of the untimed prefill (and 4 decode steps) run before the figures (0 = none)", "128"},
             {"mlock", "", "lock the weights in RAM (mlock) after loading", ""},
             {"json", "", "print the figures as JSON", ""},
             {"threads", "N", "worker threads (0 = all cores)", "0"}};
  for (auto& s : memory_option_specs()) specs.push_back(s);
  Args args("bench", "measure bandwidth, FMA peak, prefill and decode speed and their efficiencies",
            "ds41 bench -m DIR [--threads N] [--json] [--prefill-lengths 128,512,2048,8192] [--decode-contexts 0,2048,8192]",
            specs);
  if (!args.parse(argc, argv)) return 0;
  const std::string dir = model_dir_arg(args);
  if (dir.empty()) throw Error("ds41 bench: -m DIR is required");
  auto positive_list = [&](const char* name) {
    std::vector<int64_t> v = parse_int_list(*args.get(name), std::string("--") + name);
    for (int64_t x : v)
      if (x < 0) throw Error(std::string("--") + name + ": values must be >= 0");
    return v;
  };
  std::vector<int64_t> prefill_lengths = positive_list("prefill-lengths");
  const std::vector<int64_t> decode_contexts = positive_list("decode-contexts");
  for (int64_t l : prefill_lengths)
    if (l < 1) throw Error("--prefill-lengths: a prefill needs at least one token");
  const int64_t decode_steps = args.get_int("decode-tokens", 16);
  const int64_t gemm_rows = args.get_int("gemm-rows", 512);
  const int64_t triad_mb = args.get_int("triad-mb", 256);
  const int64_t scalar_prefill = args.get_int("scalar-prefill", 128);
  const int64_t scalar_steps = args.get_int("scalar-decode-tokens", 8);
  const int64_t warm_up_tokens = args.get_int("warm-up", 128);
  const int64_t prefill_repeats = args.get_int("prefill-repeats", 1);
  if (decode_steps < 1 || gemm_rows < 0 || triad_mb < 1 || scalar_prefill < 1 || scalar_steps < 1 || warm_up_tokens < 0 ||
      prefill_repeats < 1)
    throw Error("ds41 bench: --decode-tokens, --triad-mb, --prefill-repeats, --scalar-prefill and --scalar-decode-tokens "
                "must be >= 1, --gemm-rows and --warm-up >= 0");
  const bool as_json = args.flag("json");
  const Model::LoadOptions load_options = load_options_arg(args);
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));

  const std::vector<double> load_before = load_average();
  if (!as_json) std::fprintf(stderr, "bench: measuring memory bandwidth and FMA peak on %d threads\n", pool.size());
  const double triad = measure_triad_bandwidth(&pool, triad_mb << 20, 5);
  // The efficiencies are against the peak of the level the kernels run at (DS41_SIMD may force a
  // lower one than the CPU has); the CPU's own is measured beside it then.
  const SimdLevel peak_level = simd_level() == SimdLevel::Scalar ? simd_level_supported() : simd_level();
  const double peak = measure_fma_peak(&pool, 1.0, peak_level);
  const double cpu_peak = peak_level == simd_level_supported() ? peak : measure_fma_peak(&pool, 1.0, simd_level_supported());
  // What a user waits for before the first token besides the prefill: the load, and on the first
  // greedy call the head screen's build (built here, so the figures below do not include it).
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const Clock::time_point load_start = Clock::now();
  auto model = Model::load(dir, {}, load_options);
  const double load_seconds = since(load_start);
  const Clock::time_point screen_start = Clock::now();
  const bool has_screen = model->head_screen(&pool) != nullptr;
  const double screen_seconds = since(screen_start);
  const int64_t locked = args.flag("mlock") ? lock_model_weights(model->weights()) : 0;
  // Streamed experts: the disk's own speed, read as the cache reads it, for the roofline.
  std::optional<DiskFigures> disk;
  std::string disk_file;
  if (model->memory_plan().stream_experts) {
    for (const TensorInfo& t : model->weights().store->tensors())
      if (weight_use(t.name) == WeightUse::RoutedExpert) {
        disk_file = t.file;
        break;
      }
    if (!as_json) std::fprintf(stderr, "bench: measuring the disk (%s)\n", disk_file.c_str());
    std::vector<int64_t> sizes = {4096, int64_t(64) << 10, int64_t(4) << 20, model->memory_plan().slot_bytes};
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    disk = measure_disk(disk_file, sizes, load_options.io_threads, 1.0);
  }
  const int64_t macs = quantized_macs_per_token(*model);
  constexpr int64_t kWarmUpSteps = 4;
  WarmUp warm_up;
  if (warm_up_tokens > 0) {
    if (!as_json)
      std::fprintf(stderr, "bench: warm-up (untimed): prefill %lld tokens, decode %lld steps\n", (long long)warm_up_tokens,
                   (long long)kWarmUpSteps);
    warm_up = bench_warm_up(*model, warm_up_tokens, kWarmUpSteps, &pool);
  }

  const RunFigures simd =
      run_figures(*model, prefill_lengths, prefill_repeats, decode_contexts, decode_steps, gemm_rows, triad_mb << 20,
                  &pool, !as_json, true);
  // Under mpirun: one more decode at context 0 with every rank's time split and traffic counted.
  json parallel;
  if (dist::job_ranks() > 1) {
    if (!as_json)
      std::fprintf(stderr, "bench: decode %lld steps at context 0 across %d ranks, per-rank figures\n",
                   (long long)decode_steps, dist::job_ranks());
    SequenceState st = model->new_sequence();
    dist::reset_job_stats();
    const DecodeFigure d = bench_decode(*model, st, decode_steps, &pool);
    const double steps = double(std::max<int64_t>(d.steps, 1));
    parallel = {{"ranks", dist::job_ranks()}, {"decode_tokens_per_s", d.tokens_per_s()}, {"steps", d.steps},
                {"per_rank", json::array()}};
    for (const dist::RankStats& r : dist::job_stats()) {
      // Rank 0 computes whatever it is not sending or waiting for; a follower is idle when not
      // computing or sending.
      const double compute = r.rank == 0 ? std::max(0.0, d.seconds - r.send_seconds - r.wait_seconds) : r.compute_seconds;
      parallel["per_rank"].push_back({{"rank", r.rank},
                                      {"host", r.host},
                                      {"compute_seconds_per_token", compute / steps},
                                      {"communication_seconds_per_token", r.send_seconds / steps},
                                      {"waiting_seconds_per_token", r.wait_seconds / steps},
                                      {"bytes_sent_per_token", double(r.bytes_sent) / steps},
                                      {"bytes_received_per_token", double(r.bytes_received) / steps},
                                      {"messages_per_token", double(r.messages) / steps},
                                      {"expert_rows_per_token", double(r.expert_rows) / steps},
                                      {"expert_bytes_held", r.rank == 0 ? model->memory_plan().expert_bytes : r.expert_bytes}});
    }
  }
  const int64_t pmd_mapped = file_pmd_mapped_bytes();
  json out;
  out["model"] = dir;
  out["ranks"] = dist::job_ranks();
  if (!parallel.is_null()) out["expert_parallel"] = parallel;
  out["threads"] = pool.size();
  out["simd_level"] = simd_level_name(simd_level());
  out["subnormal_inputs_slow"] = subnormal_inputs_slow();
  out["machine"] = {{"triad_bytes_per_s", triad},
                    {"fma_peak_flops", peak},
                    {"fma_peak_level", simd_level_name(peak_level)},
                    {"cpu_fma_peak_flops", cpu_peak},
                    {"cpu_fma_peak_level", simd_level_name(simd_level_supported())}};
  out["quantized_macs_per_token"] = macs;
  out["locked_bytes"] = locked;
  out["load_seconds"] = load_seconds;
  out["decode_copy_bytes"] = {{"fp8", model->weights().fp8_copy_bytes}, {"fp4", model->weights().fp4_copy_bytes}};
  out["head_screen_build_seconds"] = has_screen ? json(screen_seconds) : json(nullptr);
  out["warm_up"] = {{"prefill_tokens", warm_up.prefill_tokens}, {"decode_steps", warm_up.decode_steps},
                    {"seconds", warm_up.seconds}};
  out["memory"] = {{"budget_bytes", model->memory_plan().budget},
                   {"budget_source", model->memory_plan().budget_source},
                   {"resident_bytes", model->memory_plan().resident_bytes},
                   {"expert_bytes", model->memory_plan().expert_bytes},
                   {"experts_streamed", model->memory_plan().stream_experts},
                   {"expert_slots", model->memory_plan().slots},
                   {"expert_slot_bytes", model->memory_plan().slot_bytes}};
  double expert_read_bytes_per_s = 0;
  if (disk) {
    json dj = {{"file", disk_file}, {"direct_io", disk->direct}, {"sequential_bytes_per_s", disk->sequential_bytes_per_s}};
    dj["random"] = json::array();
    for (const auto& [bytes, rate] : disk->random_bytes_per_s) {
      dj["random"].push_back({{"read_bytes", bytes}, {"bytes_per_s", rate}});
      // Reads of an expert's size (the cache's reads: one per expert where its tensors are adjacent).
      if (bytes >= model->memory_plan().slot_bytes && expert_read_bytes_per_s == 0) expert_read_bytes_per_s = rate;
    }
    out["disk"] = dj;
  }
  out["figures"] = figures_json(simd, triad, peak, macs, pool.size(), expert_read_bytes_per_s);
  out["weights_on_2mib_pages"] = {{"mapped_bytes", pmd_mapped >= 0 ? json(pmd_mapped) : json(nullptr)},
                                  {"streamed_tensor_bytes", streamed_tensor_bytes(*model->weights().store)}};
  if (!args.flag("no-scalar") && simd_level() != SimdLevel::Scalar) {
    const int64_t rows = gemm_rows > 0 ? std::min<int64_t>(gemm_rows, 64) : 0;
    RunFigures s;
    {
      ScopedSimdLevel scalar(SimdLevel::Scalar);
      s = run_figures(*model, {scalar_prefill}, 1, {0}, scalar_steps, rows, triad_mb << 20, &pool, !as_json, false);
    }
    out["scalar"] = figures_json(s, triad, peak, macs, pool.size());
    // Speed-ups at the scalar run's shapes, measured again at the active level.
    const RunFigures same =
        run_figures(*model, {scalar_prefill}, 1, {0}, scalar_steps, rows, triad_mb << 20, &pool, false, false);
    out["speedup_vs_scalar"] = {{"prefill", ratio(same.prefill[0].tokens_per_s(), s.prefill[0].tokens_per_s())},
                                {"decode", ratio(same.decode[0].tokens_per_s(), s.decode[0].tokens_per_s())},
                                {"quantized_gemms", ratio(same.gemm.flops_per_s(), s.gemm.flops_per_s())}};
  }
  out["load_average"] = {{"before", load_before}, {"after", load_average()}};

  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("ds41 bench: %s, %d threads, kernels %s%s\n", dir.c_str(), pool.size(), simd_level_name(simd_level()),
              (simd_level() == SimdLevel::Avx2 || simd_level() == SimdLevel::Avx2Vnni ||
               simd_level() == SimdLevel::Avx512) &&  // the levels whose FP8 decode is the copy kernel
                      subnormal_inputs_slow()
                  ? " (fp32 subnormal inputs slow here: FP8 decode blocks holding subnormal codes take the F16C path)"
                  : "");
  std::printf("  memory bandwidth (STREAM triad): %.2f GB/s    FMA peak (fp32, %s): %.1f GFLOP/s", triad / 1e9,
              simd_level_name(peak_level), peak / 1e9);
  if (peak_level != simd_level_supported())
    std::printf("   (the CPU's %s: %.1f)", simd_level_name(simd_level_supported()), cpu_peak / 1e9);
  std::printf("\n");
  std::printf("  quantized GEMM work per prefill token: %.1f M multiply-adds\n", double(macs) / 1e6);
  if (has_screen)
    std::printf("  model load: %.2f s    greedy head screen build (first greedy call): %.2f s\n", load_seconds,
                screen_seconds);
  else
    std::printf("  model load: %.2f s    (this head has no greedy screen)\n", load_seconds);
  std::printf("  decode copies made at load (rows16, DS41_DECODE_COPIES): FP8 %.0f MB, experts %.0f MB\n",
              double(model->weights().fp8_copy_bytes) / 1e6, double(model->weights().fp4_copy_bytes) / 1e6);
  std::printf("  %s\n", model->memory_plan().summary().c_str());
  if (out.contains("disk")) {
    const auto& dj = out["disk"];
    std::printf("  disk (%s, %s): sequential %.2f GB/s; random", dj["file"].get<std::string>().c_str(),
                dj["direct_io"].get<bool>() ? "O_DIRECT" : "through the page cache", dj["sequential_bytes_per_s"].get<double>() / 1e9);
    for (const auto& r : dj["random"])
      std::printf(" %lld KiB %.2f GB/s;", (long long)(r["read_bytes"].get<int64_t>() >> 10), r["bytes_per_s"].get<double>() / 1e9);
    std::printf("\n");
  }
  if (pmd_mapped >= 0)
    std::printf("  checkpoint mapped with 2 MiB pages after the runs: %.0f MB (tensors read whole: %.0f MB)\n",
                double(pmd_mapped) / 1e6, out["weights_on_2mib_pages"]["streamed_tensor_bytes"].get<double>() / 1e6);
  print_figures("kernels at the active level:", out["figures"]);
  if (out.contains("expert_parallel")) {
    const auto& p = out["expert_parallel"];
    std::printf("expert parallelism, %d ranks: decode at context 0 %.1f tok/s; per token and rank (ms: compute / "
                "communication / waiting; bytes sent / received):\n", p["ranks"].get<int>(),
                p["decode_tokens_per_s"].get<double>());
    for (const auto& r : p["per_rank"])
      std::printf("  rank %d (%s): %.3f / %.3f / %.3f ms; %.1f / %.1f KB; %.1f expert rows; holds %.1f MiB of experts\n",
                  r["rank"].get<int>(), r["host"].get<std::string>().c_str(),
                  r["compute_seconds_per_token"].get<double>() * 1e3, r["communication_seconds_per_token"].get<double>() * 1e3,
                  r["waiting_seconds_per_token"].get<double>() * 1e3, r["bytes_sent_per_token"].get<double>() / 1e3,
                  r["bytes_received_per_token"].get<double>() / 1e3, r["expert_rows_per_token"].get<double>(),
                  r["expert_bytes_held"].get<double>() / double(1 << 20));
  }
  if (out.contains("scalar")) {
    print_figures("scalar kernels:", out["scalar"]);
    const auto& sp = out["speedup_vs_scalar"];
    std::printf("speed-up over scalar: prefill %.1fx, decode %.1fx, quantized GEMMs %.1fx\n", sp["prefill"].get<double>(),
                sp["decode"].get<double>(), sp["quantized_gemms"].get<double>());
  }
  const auto& lb = out["load_average"]["before"];
  const auto& la = out["load_average"]["after"];
  if (lb.size() == 3 && la.size() == 3)
    std::printf("load average (1 min): %.2f before, %.2f after (other work on the machine lowers every figure)\n",
                lb[0].get<double>(), la[0].get<double>());
  return 0;
}

}  // namespace ds41::cli
