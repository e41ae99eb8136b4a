// `ds41 mkmodel`: write a random-weight checkpoint in the released layout, from a preset or a
// config file. Used for tests, demos and benchmarks while real weights are not at hand.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/weight_catalogue.h"

namespace ds41::cli {

int cmd_mkmodel(int argc, char** argv) {
  Args args("mkmodel", "write a random-weight checkpoint in the released DeepSeek-V4.1 layout",
            "ds41 mkmodel --preset tiny|small|wide --out DIR [--seed N] [--tokenizer FILE]\n"
            "       ds41 mkmodel --config FILE --out DIR [--seed N]",
            {{"preset", "NAME", "built-in configuration: tiny (every mechanism, toy width), small (~1.5 GB) or wide (the released widths at 6 layers, ~7.6 GB)", ""},
             {"config", "FILE", "use this config.json (HF or flat inference/config.json form) instead of a preset", ""},
             {"out", "DIR", "output directory (created; existing model files are overwritten)", ""},
             {"seed", "N", "random seed; the same seed gives byte-identical files", "0"},
             {"shard-size", "BYTES", "maximum bytes per safetensors shard (0: three equal shards)", "0"},
             {"tokenizer", "FILE", "copy this tokenizer.json (and tokenizer_config.json beside it) into DIR", ""},
             {"threads", "N", "worker threads (0 = all cores)", "0"},
             {"quiet", "", "no progress output", ""}});
  if (!args.parse(argc, argv)) return 0;
  auto preset = args.get("preset");
  auto config = args.get("config");
  auto out = args.get("out");
  if (!out) throw Error("ds41 mkmodel: --out DIR is required (see --help)");
  if (preset.has_value() == config.has_value())
    throw Error("ds41 mkmodel: give exactly one of --preset NAME or --config FILE");
  if (!args.positional().empty())
    throw Error("ds41 mkmodel: unexpected argument '" + args.positional()[0] + "'");

  ModelConfig cfg = preset ? preset_config(*preset) : load_config_file(*config);
  validate_config(cfg);
  int64_t seed = args.get_int("seed", 0);
  if (seed < 0) throw Error("ds41 mkmodel: --seed must be >= 0");
  int64_t shard = args.get_int("shard-size", 0);
  if (shard < 0) throw Error("ds41 mkmodel: --shard-size must be >= 0");

  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  RandomCheckpointOptions opt;
  opt.seed = uint64_t(seed);
  opt.max_shard_bytes = uint64_t(shard);
  opt.tokenizer_path = args.get_or("tokenizer", "");
  opt.pool = &pool;
  const bool quiet = args.flag("quiet");
  auto t0 = std::chrono::steady_clock::now();
  {
    // A bar on a terminal, plain lines in a log (no carriage returns there).
    ProgressBar bar("mkmodel");
    opt.progress = [&](const std::string&, uint64_t done, uint64_t total) {
      if (quiet || total < (64u << 20)) return;  // only worth reporting for big models
      bar.update("writing weights (MiB)", int64_t(done >> 20), int64_t(total >> 20));
    };
    write_random_checkpoint(cfg, *out, opt);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!quiet) {
    uint64_t bytes = 0, n = 0;
    for (const TensorSpec& s : build_weight_catalogue(cfg)) { bytes += uint64_t(s.nbytes()); ++n; }
    std::fprintf(stderr, "mkmodel: wrote %llu tensors, %.1f MiB to %s in %.2f s (seed %lld)\n",
                 (unsigned long long)n, double(bytes) / 1048576.0, out->c_str(), secs, (long long)seed);
  }
  return 0;
}

}  // namespace ds41::cli
