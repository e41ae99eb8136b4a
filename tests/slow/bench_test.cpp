// `ds41 bench` (runtime/bench.h): the bytes-per-token arithmetic against the checkpoint's own
// tensor sizes, and the command end to end on the tiny model (JSON fields, errors).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "base/error.h"
#include "io/safetensors.h"
#include "kernels/gemm.h"
#include "kernels/simd_level.h"
#include "devtools/bench.h"
#include "test_paths.h"
#include "../tiny_model.h"
#include "test_command.h"
#include "proc_maps.h"

namespace ds41 {
namespace {

// Each routed expert a token uses adds exactly the file bytes of that expert's three FP4 weights
// and their scales, at every MoE layer.
TEST(Bench, RoutedExpertBytesAreTheCheckpointsTensorBytes) {
  const std::string dir = test::tiny_model_dir(false);
  auto model = Model::load(dir);
  const TensorStore store = TensorStore::open(dir);
  std::vector<int> none(model->plan().layers.size(), 0), one(model->plan().layers.size(), 1);
  int64_t expected = 0;
  for (const LayerPlan& lp : model->plan().layers) {
    if (lp.is_dspark || lp.routed_experts == 0) continue;
    for (const char* w : {"w1", "w2", "w3"})
      for (const char* part : {"weight", "scale"})
        expected += int64_t(store.get(lp.prefix + "ffn.experts.0." + w + "." + part).nbytes);
  }
  ASSERT_GT(expected, 0);
  EXPECT_EQ(decode_bytes_per_token(*model, one, 5).weights - decode_bytes_per_token(*model, none, 5).weights, expected);
  // The head is read whole for every token.
  EXPECT_GT(decode_bytes_per_token(*model, none, 0).weights, int64_t(store.get("head.weight").nbytes));
  // KV read grows with the context, weights do not (same emit phase of every compressor).
  const int64_t period = 2 * 2 * 3 * 4;
  EXPECT_LT(decode_bytes_per_token(*model, one, period - 1).kv, decode_bytes_per_token(*model, one, 4 * period - 1).kv);
  EXPECT_EQ(decode_bytes_per_token(*model, one, period - 1).weights, decode_bytes_per_token(*model, one, 4 * period - 1).weights);
}

// A kv source's compressor reads its checkpoint tensors as stored (bf16): wkv, the gate at
// ratio > 1, the norm; no other layer has one.
TEST(Bench, CompressorBytesAreTheCheckpointsTensorBytes) {
  for (const bool engram : {false, true}) {
    const std::string dir = test::tiny_model_dir(engram);
    auto model = Model::load(dir);
    const TensorStore store = TensorStore::open(dir);
    int sources = 0;
    for (const LayerPlan& lp : model->plan().layers) {
      if (lp.is_dspark) continue;
      int64_t expected = 0;
      for (const char* w : {"wkv", "wgate", "norm"}) {
        const std::string name = lp.prefix + "attn.compressor." + w + ".weight";
        if (store.find(name)) expected += int64_t(store.get(name).nbytes);
      }
      EXPECT_EQ(compressor_bytes_per_token(model->config(), lp), expected) << "layer " << lp.id;
      sources += expected > 0;
    }
    EXPECT_GT(sources, 0);
  }
}

// The median run of a prefill length, every run's seconds kept in order.
TEST(Bench, PrefillRepeatsReportTheMedianRun) {
  auto run = [](double seconds, double cpu) {
    PrefillFigure f;
    f.tokens = 64;
    f.seconds = seconds;
    f.cpu_seconds = cpu;
    return f;
  };
  PrefillFigure m = median_prefill({run(0.5, 1.0), run(0.2, 0.4), run(0.9, 1.5)});
  EXPECT_EQ(m.seconds, 0.5);
  EXPECT_EQ(m.cpu_seconds, 1.0);  // the median run's own
  EXPECT_EQ(m.tokens, 64);
  EXPECT_EQ(m.run_seconds, (std::vector<double>{0.5, 0.2, 0.9}));
  m = median_prefill({run(0.3, 0.6), run(0.1, 0.2), run(0.4, 0.8), run(0.2, 0.3)});
  EXPECT_EQ(m.seconds, 0.2);  // the lower of the two middle runs
  EXPECT_EQ(m.cpu_seconds, 0.3);
  m = median_prefill({run(0.7, 1.2)});
  EXPECT_EQ(m.seconds, 0.7);
  EXPECT_EQ(m.run_seconds, std::vector<double>{0.7});
  EXPECT_THROW(median_prefill({}), Error);
}

// The warm-up runs what it says (clamped to the model's length), on a sequence of its own.
TEST(Bench, WarmUpRunsAPrefillAndDecodeStepsWithinTheModelsLength) {
  const std::string dir = test::tiny_model_dir(false);
  auto model = Model::load(dir);
  ThreadPool pool(2);
  const WarmUp w = bench_warm_up(*model, 12, 3, &pool);
  EXPECT_EQ(w.prefill_tokens, 12);
  EXPECT_EQ(w.decode_steps, 3);
  EXPECT_GT(w.seconds, 0.0);
  // Nothing when no token is asked for, or when the decode steps alone fill the model's length.
  for (const WarmUp none : {bench_warm_up(*model, 0, 2, &pool), bench_warm_up(*model, 5, model->config().max_seq_len, &pool)}) {
    EXPECT_EQ(none.prefill_tokens, 0);
    EXPECT_EQ(none.decode_steps, 0);
    EXPECT_EQ(none.seconds, 0.0);
  }
}

using test::CommandResult;
using test::run_ds41;

TEST(Bench, CommandReportsEveryFigureAsJson) {
  const std::string dir = test::tiny_model_dir(false);
  auto r = run_ds41("bench -m " + dir +
                    " --json --threads 2 --prefill-lengths 16,40 --decode-contexts 0,40 --decode-tokens 2 --gemm-rows 8"
                    " --triad-mb 8 --scalar-prefill 8 --scalar-decode-tokens 1 --warm-up 8 --prefill-repeats 3");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["threads"], 2);
  EXPECT_EQ(j["warm_up"]["prefill_tokens"], 8);
  EXPECT_EQ(j["warm_up"]["decode_steps"], 4);
  EXPECT_GT(j["warm_up"]["seconds"].get<double>(), 0.0);
  EXPECT_GT(j["machine"]["triad_bytes_per_s"].get<double>(), 1e8);
  EXPECT_GT(j["machine"]["fma_peak_flops"].get<double>(), 1e8);
  // The peak is the active level's (the efficiencies' denominator); the CPU's best beside it.
  if (j["simd_level"] != "scalar") {
    EXPECT_EQ(j["machine"]["fma_peak_level"], j["simd_level"]);
  }
  EXPECT_GT(j["machine"]["cpu_fma_peak_flops"].get<double>(), 1e8);
  EXPECT_EQ(j["subnormal_inputs_slow"], subnormal_inputs_slow());  // this process's answer is the command's
  EXPECT_GT(j["load_seconds"].get<double>(), 0.0);
  EXPECT_GT(j["head_screen_build_seconds"].get<double>(), 0.0);  // the tiny head has a screen
  ASSERT_EQ(j["figures"]["prefill"].size(), 2u);
  EXPECT_EQ(j["figures"]["prefill"][1]["tokens"], 40);
  EXPECT_GT(j["figures"]["prefill"][1]["tokens_per_s"].get<double>(), 0.0);
  for (const auto& p : j["figures"]["prefill"]) {  // three runs each, the median reported
    const auto runs = p["run_seconds"].get<std::vector<double>>();
    ASSERT_EQ(runs.size(), 3u);
    std::vector<double> sorted = runs;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(p["seconds"].get<double>(), sorted[1]);
    EXPECT_NEAR(p["tokens_per_s"].get<double>() * sorted[1], double(p["tokens"].get<int64_t>()), 1e-9);
  }
  ASSERT_EQ(j["scalar"]["prefill"].size(), 1u);  // the scalar comparison runs once
  EXPECT_EQ(j["scalar"]["prefill"][0]["run_seconds"].size(), 1u);
  ASSERT_EQ(j["figures"]["decode"].size(), 2u);
  EXPECT_EQ(j["figures"]["decode"][0]["context"], 0);
  EXPECT_EQ(j["figures"]["decode"][1]["context"], 40);  // decoded from the 40-token prefill
  EXPECT_EQ(j["figures"]["decode"][1]["steps"], 2);
  EXPECT_GT(j["figures"]["decode"][1]["kv_bytes_per_token"].get<int64_t>(),
            j["figures"]["decode"][0]["kv_bytes_per_token"].get<int64_t>());
  EXPECT_GT(j["figures"]["decode"][0]["efficiency_vs_bandwidth"].get<double>(), 0.0);
  for (const auto& d : j["figures"]["decode"]) {  // two steps: the median is their mean
    EXPECT_NEAR(d["median_tokens_per_s"].get<double>(), d["tokens_per_s"].get<double>(),
                1e-9 * d["tokens_per_s"].get<double>());
    EXPECT_NEAR(d["median_step_seconds"].get<double>() * 2, d["seconds"].get<double>(), 1e-12);
    // The same bytes per second against the triad measured beside the steps.
    const double beside = d["triad_beside_bytes_per_s"].get<double>();
    EXPECT_GT(beside, 1e8);
    EXPECT_NEAR(d["efficiency_vs_bandwidth_beside"].get<double>() * beside, d["bytes_per_s"].get<double>(),
                1e-9 * d["bytes_per_s"].get<double>());
    // As many steps again, each between two triad passes (a pass is shared by the steps on its
    // two sides), each against the mean of its two; the median of the two steps is their mean.
    ASSERT_TRUE(d.contains("paired_with_triads"));
    const auto& paired = d["paired_with_triads"];
    ASSERT_EQ(paired["steps"].size(), 2u);
    std::vector<double> efficiencies;
    for (size_t i = 0; i < paired["steps"].size(); ++i) {
      const auto& s = paired["steps"][i];
      const double before = s["triad_before_bytes_per_s"].get<double>(), after = s["triad_after_bytes_per_s"].get<double>();
      EXPECT_GT(before, 1e8);
      EXPECT_GE(before, paired["triad_min_bytes_per_s"].get<double>());
      EXPECT_LE(after, paired["triad_max_bytes_per_s"].get<double>());
      if (i > 0) {
        EXPECT_EQ(before, paired["steps"][i - 1]["triad_after_bytes_per_s"].get<double>());
      }
      EXPECT_GT(s["bytes"].get<int64_t>(), 0);
      EXPECT_NEAR(s["efficiency"].get<double>(),
                  double(s["bytes"].get<int64_t>()) / s["seconds"].get<double>() / (0.5 * (before + after)),
                  1e-9 * s["efficiency"].get<double>());
      efficiencies.push_back(s["efficiency"].get<double>());
    }
    EXPECT_NEAR(paired["median_efficiency"].get<double>(), 0.5 * (efficiencies[0] + efficiencies[1]),
                1e-12 * efficiencies[0]);
    // The sampler's time on the steps' logits, apart from the steps' own.
    EXPECT_GT(d["sampling_seconds_per_token"].get<double>(), 0.0);
    EXPECT_NEAR(d["sampling_share_of_step"].get<double>() * d["seconds"].get<double>(),
                d["sampling_seconds_per_token"].get<double>() * 2, 1e-12);
    // The same number of greedy steps right after, with the head screen: it decided every step,
    // and read less than the whole bf16 head would have.
    ASSERT_TRUE(d.contains("greedy_head_screen"));
    const auto& g = d["greedy_head_screen"];
    EXPECT_EQ(g["context"].get<int64_t>(), d["context"].get<int64_t>() + 2);
    EXPECT_EQ(g["steps"], 2);
    EXPECT_EQ(g["fallbacks"], 0);
    EXPECT_EQ(g["skipped"], 0);
    EXPECT_GT(g["candidates_per_token"].get<double>(), 0.0);
    EXPECT_LT(g["bytes_per_token"].get<int64_t>(), d["bytes_per_token"].get<int64_t>());
    EXPECT_NEAR(g["speedup_vs_full_head"].get<double>() * d["tokens_per_s"].get<double>(), g["tokens_per_s"].get<double>(),
                1e-9 * g["tokens_per_s"].get<double>());
  }
  if (j.contains("scalar")) {
    for (const auto& d : j["scalar"]["decode"]) EXPECT_FALSE(d.contains("greedy_head_screen"));
  }
  {
    // The FP8 and FP4 figures split the same pass: their flops and seconds add up to the totals.
    const auto& g = j["figures"]["quantized_gemms"];
    EXPECT_GT(g["flops_per_s"].get<double>(), 0.0);
    for (const char* family : {"fp8", "fp4"}) {
      EXPECT_GT(g[family]["flops"].get<double>(), 0.0) << family;
      EXPECT_NEAR(g[family]["flops_per_s"].get<double>() * g[family]["seconds"].get<double>(),
                  g[family]["flops"].get<double>(), 1e-9 * g[family]["flops"].get<double>());
    }
    EXPECT_NEAR(g["fp8"]["flops"].get<double>() + g["fp4"]["flops"].get<double>(), g["flops"].get<double>(),
                1e-9 * g["flops"].get<double>());
    EXPECT_NEAR(g["fp8"]["seconds"].get<double>() + g["fp4"]["seconds"].get<double>(), g["seconds"].get<double>(),
                1e-12);
  }
  {
    // The decode kernels alone: matrices of the model's width and ~512 KiB in whole groups of 16
    // rows, one thread's bytes per second, and that times the threads against the triad.
    const auto& k = j["figures"]["decode_kernels"];
    EXPECT_EQ(k["threads"], 2);
    for (const char* family : {"fp8", "fp4"}) {
      const auto& f = k[family];
      const double bytes_per_row = std::string(family) == "fp8" ? 1.0 : 0.5;
      EXPECT_EQ(f["k"], j["figures"]["decode_kernels"]["fp8"]["k"]) << family;
      EXPECT_EQ(f["rows"].get<int64_t>() % 16, 0) << family;
      EXPECT_EQ(f["weight_bytes"].get<double>(), double(f["rows"].get<int64_t>() * f["k"].get<int64_t>()) * bytes_per_row)
          << family;
      EXPECT_NEAR(f["weight_bytes"].get<double>(), 512.0 * 1024, 0.1 * 512 * 1024) << family;
      EXPECT_NEAR(f["bytes_per_s_one_thread"].get<double>() * f["seconds"].get<double>(), f["weight_bytes"].get<double>(),
                  1e-9 * f["weight_bytes"].get<double>())
          << family;
      EXPECT_NEAR(f["threads_vs_triad"].get<double>() * j["machine"]["triad_bytes_per_s"].get<double>(),
                  2 * f["bytes_per_s_one_thread"].get<double>(), 1e-9 * f["bytes_per_s_one_thread"].get<double>())
          << family;
    }
  }
  {
    // Huge-page diagnostics: the bytes of the tensors read whole, from the checkpoint itself.
    const TensorStore store = TensorStore::open(dir);
    int64_t streamed = 0;
    for (const TensorInfo& t : store.tensors())
      if (weight_use(t.name) == WeightUse::Always || weight_use(t.name) == WeightUse::RoutedExpert)
        streamed += int64_t(t.nbytes);
    EXPECT_EQ(j["weights_on_2mib_pages"]["streamed_tensor_bytes"].get<int64_t>(), streamed);
    const auto& mapped = j["weights_on_2mib_pages"]["mapped_bytes"];
    if (!mapped.is_null()) {
      EXPECT_EQ(mapped.get<int64_t>() % (int64_t(2) << 20), 0);  // whole 2 MiB pages
    }
  }
  {
    // The copies' sizes: those the loader hands to the matrices (the same model loaded here).
    auto model = Model::load(dir);
    int64_t fp8 = 0, fp4 = 0;
    for (const BlockWeights& b : model->weights().blocks) {
      for (const Fp8Matrix* m : {&b.wq_a, &b.wq_b, &b.wkv, &b.wo_b, &b.shared.w1, &b.shared.w2, &b.shared.w3,
                                 &b.idx_wq_b, &b.engram_wkv})
        if (m->rows16) fp8 += fp8_rows16_bytes(*m);
      for (const ExpertWeights& e : b.experts)
        for (const Fp4Matrix* m : {&e.w1, &e.w2, &e.w3})
          if (m->rows16) fp4 += fp4_rows16_bytes(*m);
    }
    const Fp8Matrix& main_proj = model->weights().dspark.main_proj;
    if (main_proj.rows16) fp8 += fp8_rows16_bytes(main_proj);
    EXPECT_EQ(model->weights().fp8_copy_bytes, fp8);
    EXPECT_EQ(model->weights().fp4_copy_bytes, fp4);
    EXPECT_EQ(j["decode_copy_bytes"]["fp8"].get<int64_t>(), fp8);
    EXPECT_EQ(j["decode_copy_bytes"]["fp4"].get<int64_t>(), fp4);
    EXPECT_EQ(fp8 > 0, fp8_decode_reads_rows16());
    EXPECT_EQ(fp4 > 0, fp4_decode_reads_rows16());
  }
  EXPECT_TRUE(j["load_average"].contains("before"));
  if (j["simd_level"] != "scalar") {
    EXPECT_TRUE(j.contains("scalar"));
    EXPECT_GT(j["speedup_vs_scalar"]["decode"].get<double>(), 0.0);
  }
}

TEST(Bench, BadOptionsAreErrors) {
  const std::string dir = test::tiny_model_dir(false);
  auto r = run_ds41("bench -m " + dir + " --prefill-lengths 0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--prefill-lengths"), std::string::npos) << r.err;
  r = run_ds41("bench -m " + dir + " --prefill-repeats 0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--prefill-repeats"), std::string::npos) << r.err;
  r = run_ds41("bench -m " + dir + " --warm-up -1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--warm-up"), std::string::npos) << r.err;
  r = run_ds41("bench");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("-m DIR"), std::string::npos) << r.err;
}

TEST(WeightResidency, ClassifiesTensorsByUse) {
  EXPECT_EQ(weight_use("layers.3.ffn.experts.17.w2.weight"), WeightUse::RoutedExpert);
  EXPECT_EQ(weight_use("layers.3.ffn.shared_experts.w2.weight"), WeightUse::Always);
  EXPECT_EQ(weight_use("layers.1.engram.embed.weight"), WeightUse::EngramTable);
  EXPECT_EQ(weight_use("layers.1.engram.wkv.weight"), WeightUse::Always);
  EXPECT_EQ(weight_use("embed.weight"), WeightUse::Embedding);
  EXPECT_EQ(weight_use("head.weight"), WeightUse::Always);
}

// The weights read front to back (every token's, the routed experts) are in MADV_HUGEPAGE
// mappings; the ones read at hash-random rows (embedding, Engram tables) are MADV_RANDOM and
// not huge. Checked in the middle of the largest tensor of each kind, away from pages shared
// with a neighbour.
TEST(WeightResidency, HugePagesForStreamedWeightsOnly) {
  if (!test::kernel_has_transparent_huge_pages()) GTEST_SKIP() << "no transparent huge pages in this kernel";
  auto model = Model::load(test::tiny_model_dir(true));
  std::map<WeightUse, const TensorInfo*> largest;
  for (const TensorInfo& t : model->weights().store->tensors()) {
    const TensorInfo*& l = largest[weight_use(t.name)];
    if (!l || t.nbytes > l->nbytes) l = &t;
  }
  ASSERT_EQ(largest.size(), 4u);
  for (const auto& [use, t] : largest) {
    SCOPED_TRACE(t->name);
    const auto region = test::region_containing(t->data + t->nbytes / 2);
    ASSERT_TRUE(region.has_value());
    const bool streamed = use == WeightUse::Always || use == WeightUse::RoutedExpert;
    EXPECT_EQ(region->has_flag("hg"), streamed) << region->flags;
    EXPECT_EQ(region->has_flag("rr"), !streamed) << region->flags;
  }
}

// The embedding and the Engram tables (the tiny model's fit anywhere) are read ahead at load:
// from a page cache without their pages, the hints alone (no tensor read) bring all of them in,
// in the background.
TEST(WeightResidency, RandomlyReadTablesAreReadAheadAtLoad) {
  const TensorStore store = TensorStore::open(test::tiny_model_dir(true));
  std::vector<const TensorInfo*> tables;
  for (const TensorInfo& t : store.tensors()) {
    const WeightUse use = weight_use(t.name);
    if (use == WeightUse::Embedding || use == WeightUse::EngramTable) tables.push_back(&t);
  }
  ASSERT_EQ(tables.size(), 5u);  // the embedding, two layers' Engram rows and scales
  for (const TensorInfo* t : tables) test::drop_page_cache(t->file);
  for (const TensorInfo* t : tables) {
    const double before = test::resident_fraction(t->data, t->nbytes);
    if (before < 0 || before > 0.5) GTEST_SKIP() << "the page cache kept " << t->name << " (resident fraction " << before << ")";
  }
  advise_model_weights(store, physical_ram_bytes());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);  // the reads are asynchronous
  for (const TensorInfo* t : tables) {
    double after = test::resident_fraction(t->data, t->nbytes);
    while (after < 1.0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      after = test::resident_fraction(t->data, t->nbytes);
    }
    EXPECT_EQ(after, 1.0) << t->name;
  }
}

TEST(WeightResidency, EngramTablesReadAheadWhereTheyFit) {
  const int64_t GiB = int64_t(1) << 30, MiB = int64_t(1) << 20;
  EXPECT_TRUE(engram_tables_read_ahead(333 * MiB, 1 * GiB, 24 * GiB));  // the small preset
  EXPECT_TRUE(engram_tables_read_ahead(2 * GiB, 10 * GiB, 24 * GiB));   // exactly half
  EXPECT_FALSE(engram_tables_read_ahead(2 * GiB, 11 * GiB, 24 * GiB));
  EXPECT_FALSE(engram_tables_read_ahead(189 * GiB, 286 * GiB, 512 * GiB));  // the released model
  EXPECT_TRUE(engram_tables_read_ahead(189 * GiB, 286 * GiB, 1024 * GiB));
  EXPECT_FALSE(engram_tables_read_ahead(0, 1 * GiB, 24 * GiB));  // no Engram layers
}

TEST(WeightResidency, RoutedExpertsGetHugePagesWhenTheyStayOrAreLarge) {
  const int64_t GiB = int64_t(1) << 30, MiB = int64_t(1) << 20;
  EXPECT_TRUE(routed_expert_huge_pages(262144, 1 * GiB, 24 * GiB));      // fits: read once
  EXPECT_TRUE(routed_expert_huge_pages(262144, 12 * GiB, 24 * GiB));     // half of RAM still fits
  EXPECT_FALSE(routed_expert_huge_pages(262144, 31 * GiB, 24 * GiB));    // paged in and out: 4 KiB reads
  EXPECT_FALSE(routed_expert_huge_pages(4 * MiB - 1, 31 * GiB, 24 * GiB));
  EXPECT_TRUE(routed_expert_huge_pages(4 * MiB, 31 * GiB, 24 * GiB));    // large enough for 2 MiB reads
  EXPECT_TRUE(routed_expert_huge_pages(5898240, 300 * GiB, 128 * GiB));  // the released model's w1
}

TEST(WeightResidency, DecodeCopiesOnlyWhereTheyFit) {
  const int64_t GiB = int64_t(1) << 30, MiB = int64_t(1) << 20;
  EXPECT_TRUE(decode_copies_fit(94 * MiB, 1 * GiB, 24 * GiB));           // the small preset's FP8 copies
  EXPECT_TRUE(decode_copies_fit(94 * MiB + 315 * MiB, 1 * GiB, 24 * GiB));  // and its experts'
  EXPECT_TRUE(decode_copies_fit(2 * GiB, 10 * GiB, 24 * GiB));           // exactly half
  EXPECT_FALSE(decode_copies_fit(2 * GiB, 11 * GiB, 24 * GiB));          // the experts' page cache needs it
  EXPECT_FALSE(decode_copies_fit(7 * GiB, 286 * GiB, 512 * GiB));        // the released model on 512 GiB
  EXPECT_TRUE(decode_copies_fit(7 * GiB, 286 * GiB, 768 * GiB));
}

TEST(WeightResidency, DecodeCopiesPlanFollowsTheModeAndTheRoom) {
  const int64_t GiB = int64_t(1) << 30, MiB = int64_t(1) << 20;
  for (const std::string mode : {"", "auto"}) {
    const DecodeCopies both = plan_decode_copies(mode, 94 * MiB, 315 * MiB, 1 * GiB, 24 * GiB);
    EXPECT_TRUE(both.fp8 && both.fp4) << mode;
    // the released widths' 6 layers on 24 GiB: both fit; on 16 GiB only the FP8 ones
    const DecodeCopies wide = plan_decode_copies(mode, 1300 * MiB, 2500 * MiB, 7 * GiB, 24 * GiB);
    EXPECT_TRUE(wide.fp8 && wide.fp4) << mode;
    const DecodeCopies smaller = plan_decode_copies(mode, 1300 * MiB, 2500 * MiB, 7 * GiB, 17 * GiB);
    EXPECT_TRUE(smaller.fp8 && !smaller.fp4) << mode;
    const DecodeCopies neither = plan_decode_copies(mode, 1300 * MiB, 2500 * MiB, 7 * GiB, 14 * GiB);
    EXPECT_FALSE(neither.fp8 || neither.fp4) << mode;
    // experts alone fit when no FP8 copy is read (a kernel level without the VBMI decode)
    const DecodeCopies fp4_only = plan_decode_copies(mode, 0, 2500 * MiB, 7 * GiB, 20 * GiB);
    EXPECT_TRUE(!fp4_only.fp8 && fp4_only.fp4) << mode;
  }
  const DecodeCopies fp8 = plan_decode_copies("fp8", 94 * MiB, 315 * MiB, 1 * GiB, 24 * GiB);
  EXPECT_TRUE(fp8.fp8 && !fp8.fp4);
  const DecodeCopies none = plan_decode_copies("none", 94 * MiB, 315 * MiB, 1 * GiB, 24 * GiB);
  EXPECT_FALSE(none.fp8 || none.fp4);
  EXPECT_THROW(plan_decode_copies("fp4", 94 * MiB, 315 * MiB, 1 * GiB, 24 * GiB), Error);
}

// Where the decode kernels read rows16 copies (and the tiny model fits, as it does anywhere),
// every FP8 matrix of a block and every expert matrix has one, byte for byte pack_fp8_rows16 /
// pack_fp4_rows16 of its codes; elsewhere none.
TEST(WeightResidency, LoaderGivesCopiesWhereTheDecodeReadsThem) {
  auto model = Model::load(test::tiny_model_dir(true));
  const bool fp8_copies = fp8_decode_reads_rows16(), fp4_copies = fp4_decode_reads_rows16();
  int checked8 = 0, checked4 = 0;
  for (const BlockWeights& b : model->weights().blocks) {
    for (const Fp8Matrix* m : {&b.wq_a, &b.wq_b, &b.wkv, &b.wo_b, &b.shared.w1, &b.shared.w2, &b.shared.w3}) {
      if (!m->w) continue;
      ASSERT_EQ(m->rows16 != nullptr, fp8_copies && m->N >= 16) << "N=" << m->N << " K=" << m->K;
      if (!m->rows16) continue;
      std::vector<uint8_t> want(size_t(fp8_rows16_bytes(*m)));
      pack_fp8_rows16(*m, want.data());
      EXPECT_EQ(std::memcmp(want.data(), m->rows16, want.size()), 0) << "N=" << m->N << " K=" << m->K;
      ++checked8;
    }
    for (const ExpertWeights& e : b.experts)
      for (const Fp4Matrix* m : {&e.w1, &e.w2, &e.w3}) {
        ASSERT_EQ(m->rows16 != nullptr, fp4_copies && m->N >= 16) << "N=" << m->N << " K=" << m->K;
        if (!m->rows16) continue;
        std::vector<uint8_t> want(size_t(fp4_rows16_bytes(*m)));
        pack_fp4_rows16(*m, want.data());
        EXPECT_EQ(std::memcmp(want.data(), m->rows16, want.size()), 0) << "N=" << m->N << " K=" << m->K;
        ++checked4;
      }
  }
  if (fp8_copies) {
    EXPECT_GT(checked8, 0);
  }
  if (fp4_copies) {
    EXPECT_GT(checked4, 0);
  }
}

int64_t locked_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmLck:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

TEST(WeightResidency, MlockLocksEveryTokenWeight) {
  auto model = Model::load(test::tiny_model_dir(false));
  int64_t expected = 0;
  for (const TensorInfo& t : model->weights().store->tensors())
    if (weight_use(t.name) == WeightUse::Always || weight_use(t.name) == WeightUse::RoutedExpert)
      expected += int64_t(t.nbytes);
  const int64_t before = locked_kib();
  int64_t locked = 0;
  try {
    locked = lock_model_weights(model->weights());
  } catch (const Error& e) {
    GTEST_SKIP() << "mlock refused here (locked-memory limit): " << e.what();
  }
  EXPECT_GE(locked, expected);  // whole pages, plus the buffers materialised at load
  if (before >= 0) {
    EXPECT_GE(locked_kib() - before, expected / 1024);
  }
  auto r = run_ds41("run -m " + test::tiny_model_dir(false) + " --max-tokens 2 --mlock --json");
  EXPECT_EQ(r.status, 0) << r.err;
}

}  // namespace
}  // namespace ds41
