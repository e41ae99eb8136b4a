#include "devtools/engram_bench.h"

#include <chrono>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

#include "base/error.h"
#include "base/hash.h"
#include "kernels/numeric_formats.h"
#include "model/forward_context.h"

namespace ds41 {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Drops the shards' clean pages from the page cache (pages mapped by this process stay), as if the
// machine had just booted. Returns false if any shard refused.
bool drop_from_page_cache(const std::string& dir) {
  bool ok = true;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) {
      ok = false;
      continue;
    }
    ok &= ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    ::close(fd);
  }
  return ok;
}

}  // namespace

EngramBenchResult engram_lookup_benchmark(const Model& model, const std::string& dir, int64_t positions,
                                          ThreadPool* pool, uint64_t seed) {
  const EngramHashParams* hp = model.engram_hash();
  if (!hp) throw Error(dir + ": this model has no Engram layers");
  if (positions < 1) throw Error("engram benchmark: positions must be >= 1");
  const ModelConfig& c = model.config();
  const ModelPlan& plan = model.plan();
  const ModelWeights& w = model.weights();
  EngramBenchResult r;
  r.engram_layers = hp->n_layers;
  r.rows_per_token = int64_t(hp->n_layers) * hp->columns;
  r.row_bytes = c.engram_head_dim + c.engram_head_dim / 32;
  r.positions = positions;
  std::vector<const LayerPlan*> layers;
  for (const LayerPlan& lp : plan.layers)
    if (lp.engram) {
      layers.push_back(&lp);
      r.table_bytes += w.blocks[size_t(lp.id)].engram_rows * r.row_bytes;
    }

  // A random text history of compressed ids (the hash does not care where they came from).
  std::vector<int64_t> history(static_cast<size_t>(positions));
  for (int64_t i = 0; i < positions; ++i)
    history[size_t(i)] = int64_t(splitmix64(seed + uint64_t(i)) % uint64_t(hp->compressed_vocab));
  std::vector<int64_t> ids(static_cast<size_t>(positions * r.rows_per_token));
  double t = now_s();
  engram_hash_positions(*hp, history.data(), 0, int(positions), ids.data());
  r.hash_us_per_token = (now_s() - t) * 1e6 / double(positions);

  // Row reads, one token at a time as decode does them: cold, then warm.
  const int cols = hp->columns;
  std::vector<uint16_t> rows(static_cast<size_t>(cols) * size_t(c.engram_head_dim));
  auto gather_all = [&] {
    const double t0 = now_s();
    for (int64_t s = 0; s < positions; ++s)
      for (size_t li = 0; li < layers.size(); ++li) {
        const int64_t* row_ids = ids.data() + (s * hp->n_layers + layers[li]->engram_index) * cols;
        engram_gather_rows(w.blocks[size_t(layers[li]->id)], c.engram_head_dim, row_ids, cols, rows.data(), pool);
      }
    return (now_s() - t0) * 1e6 / double(positions);
  };
  r.cold_cache_dropped = drop_from_page_cache(dir);
  r.gather_cold_us_per_token = gather_all();
  r.gather_warm_us_per_token = gather_all();

  // The whole Engram step per token on a random stream (warm).
  SequenceState state = model.new_sequence();
  ForwardOptions fo;
  const std::vector<float> no_freq;
  std::vector<uint16_t> X(static_cast<size_t>(c.hc_mult) * size_t(c.dim));
  for (size_t i = 0; i < X.size(); ++i)
    X[i] = f32_to_bf16(float(int64_t(splitmix64(seed ^ i) % 2001) - 1000) / 1000.f);
  t = now_s();
  for (int64_t s = 0; s < positions; ++s) {
    ForwardContext ctx{c, plan, w, state, fo, pool, nullptr, nullptr, nullptr, no_freq, no_freq, s, 1, {}, {}};
    for (const LayerPlan* lp : layers)
      engram_forward(ctx, *lp, w.blocks[size_t(lp->id)],
                     ids.data() + (s * hp->n_layers + lp->engram_index) * cols, cols, X.data());
  }
  r.engram_step_us_per_token = (now_s() - t) * 1e6 / double(positions);

  // A whole decode step for scale: prefill a few tokens, then time single-token calls.
  const int64_t steps = std::min<int64_t>(positions, 16);
  std::vector<int32_t> prompt(8);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(splitmix64(seed * 31 + i) % uint64_t(c.vocab_size));
  SequenceState seq = model.new_sequence();
  model.forward(seq, prompt, fo, pool);
  t = now_s();
  for (int64_t i = 0; i < steps; ++i) model.forward(seq, {int32_t((i * 7919) % c.vocab_size)}, fo, pool);
  r.decode_step_us = (now_s() - t) * 1e6 / double(steps);
  return r;
}

}  // namespace ds41
