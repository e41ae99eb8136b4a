// `ds41 engram`: the Engram hash rows of a sequence, for debugging against other implementations.
// Prints, for every Engram layer (keys = layer ids as strings), one list of
// (max_ngram_size - 1) * n_heads row ids per position.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "model/config.h"
#include "model/engram_hash.h"
#include "model/model.h"
#include "base/thread_pool.h"
#include "devtools/engram_bench.h"

namespace ds41::cli {

namespace {

int engram_bench(const Args& args) {
  const std::string dir = model_dir_arg(args);
  if (dir.empty()) throw Error("ds41 engram --bench: -m DIR is required");
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  auto model = Model::load(dir);
  const EngramBenchResult r = engram_lookup_benchmark(*model, dir, args.get_int("positions", 256), &pool, 1);
  nlohmann::json j = {{"engram_layers", r.engram_layers},
                      {"rows_per_token", r.rows_per_token},
                      {"row_bytes", r.row_bytes},
                      {"bytes_read_per_token", r.rows_per_token * r.row_bytes},
                      {"table_bytes", r.table_bytes},
                      {"positions", r.positions},
                      {"hash_us_per_token", r.hash_us_per_token},
                      {"gather_cold_us_per_token", r.gather_cold_us_per_token},
                      {"gather_warm_us_per_token", r.gather_warm_us_per_token},
                      {"engram_step_us_per_token", r.engram_step_us_per_token},
                      {"decode_step_us", r.decode_step_us},
                      {"engram_share_of_decode", r.engram_step_us_per_token / r.decode_step_us},
                      {"cold_cache_dropped", r.cold_cache_dropped},
                      {"threads", pool.size()}};
  if (args.flag("json")) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("Engram: %d layers, %lld rows/token x %lld B = %lld B read per token, tables %.1f MiB\n", r.engram_layers,
              (long long)r.rows_per_token, (long long)r.row_bytes, (long long)(r.rows_per_token * r.row_bytes),
              double(r.table_bytes) / 1048576.0);
  std::printf("per token over %lld positions (%d threads):\n", (long long)r.positions, pool.size());
  std::printf("  hashing            %9.2f us\n", r.hash_us_per_token);
  std::printf("  row reads, cold    %9.2f us%s\n", r.gather_cold_us_per_token,
              r.cold_cache_dropped ? "" : "  (page cache could not be dropped: may be warm)");
  std::printf("  row reads, warm    %9.2f us\n", r.gather_warm_us_per_token);
  std::printf("  whole Engram step  %9.2f us (rows + wkv + gates, warm)\n", r.engram_step_us_per_token);
  std::printf("  decode step        %9.2f us (whole model, for scale: Engram = %.1f %%)\n", r.decode_step_us,
              100.0 * r.engram_step_us_per_token / r.decode_step_us);
  return 0;
}

}  // namespace

int cmd_engram(int argc, char** argv) {
  Args args("engram", "print the Engram hash rows of a sequence",
            "ds41 engram --config FILE --compressed-ids 5231,887,... [--pad-id N] [--json]\n"
            "       ds41 engram -m DIR --tokens 0,5,9,... [--json]\n"
            "       ds41 engram -m DIR --bench [--positions N] [--threads N] [--json]",
            {{"config", "FILE", "model config (HF or flat); with --compressed-ids", ""},
             {"compressed-ids", "IDS", "compressed token ids, -1 marks an image position", ""},
             {"pad-id", "N", "compressed id of the pad token (with --config)", "2"},
             {"model", "DIR", "checkpoint directory (its compressed token map turns --tokens into ids)", ""},
             {"tokens", "IDS", "raw token ids (with -m)", ""},
             {"bench", "", "time the Engram lookup per token (hash, cold/warm row reads, whole step)", ""},
             {"positions", "N", "tokens the benchmark times", "256"},
             {"json", "", "JSON output (row ids: the only format)", ""},
             {"threads", "N", "worker threads for --bench (0 = all cores)", "0"}});
  if (!args.parse(argc, argv)) return 0;
  if (args.flag("bench")) return engram_bench(args);
  ModelConfig c;
  std::vector<int64_t> history;
  int64_t pad = args.get_int("pad-id", 2);
  const std::string dir = model_dir_arg(args);
  if (!dir.empty()) {
    auto model = Model::load(dir);
    c = model->config();
    if (c.engram_layer_ids.empty()) throw Error(dir + ": this model has no Engram layers");
    const auto& map = model->compressed_vocab();
    pad = map[size_t(c.engram_pad_id)];
    for (int32_t t : parse_token_ids(args.get_or("tokens", ""), int64_t(map.size()))) history.push_back(map[size_t(t)]);
  } else {
    auto cfg = args.get("config");
    if (!cfg) throw Error("ds41 engram: give --config FILE with --compressed-ids, or -m DIR with --tokens");
    c = load_config_file(*cfg);
    validate_config(c);
    if (c.engram_layer_ids.empty()) throw Error(*cfg + ": this config has no Engram layers");
    const std::string ids = args.get_or("compressed-ids", "");
    if (ids.empty()) throw Error("--compressed-ids: no ids given");
    history = parse_int_list(ids, "--compressed-ids");
    for (auto& h : history)
      if (h == -1) h = kEngramDead;
  }
  EngramHashParams p = make_engram_hash_params(c, pad);
  std::vector<int64_t> out(history.size() * size_t(p.n_layers) * size_t(p.columns));
  engram_hash_positions(p, history.data(), 0, int(history.size()), out.data());
  nlohmann::json j = nlohmann::json::object();
  for (int l = 0; l < p.n_layers; ++l) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t s = 0; s < history.size(); ++s) {
      const int64_t* r = out.data() + (s * size_t(p.n_layers) + size_t(l)) * size_t(p.columns);
      rows.push_back(std::vector<int64_t>(r, r + p.columns));
    }
    j[std::to_string(c.engram_layer_ids[size_t(l)])] = rows;
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace ds41::cli
