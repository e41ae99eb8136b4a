#include "cli/model_files.h"
#include "dist/mpi_job.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "text/demo_tokenizer.h"

namespace ds41::cli {

namespace fs = std::filesystem;

std::string demo_model_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path cache = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  fs::path dir = cache / "ds41" / "tiny";
  // A demo written by an older ds41 has no tokenizer (and an Engram token map derived without
  // one): it is written again.
  if (!fs::exists(dir / "model.safetensors.index.json") || !fs::exists(dir / "tokenizer.json")) {
    std::fprintf(stderr, "no model given (-m DIR); writing the built-in demo model (random weights) to %s\n",
                 dir.string().c_str());
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir);
    const std::string tokenizer = (dir / "demo-tokenizer.json.tmp").string();
    write_demo_tokenizer(tokenizer);
    RandomCheckpointOptions opt;
    opt.seed = 0;
    opt.tokenizer_path = tokenizer;
    write_random_checkpoint(preset_config("tiny"), dir.string(), opt);
    fs::remove(tokenizer, ec);
  }
  return dir.string();
}

void check_writable(const std::string& path, const std::string& what) {
  const bool existed = fs::exists(path);
  {
    std::ofstream probe(path, std::ios::app);
    if (!probe) throw Error(what + ": cannot write " + path + " (" + std::strerror(errno) + ")");
  }
  std::error_code ec;
  if (!existed) fs::remove(path, ec);
}

std::string model_dir_arg(const Args& args) {
  const std::string option = args.get_or("model", "");
  const auto& pos = args.positional();
  if (pos.size() > 1 || (pos.size() == 1 && !option.empty()))
    throw Error("unexpected argument '" + pos.back() + "' (the model directory is given once: ds41 COMMAND DIR or -m DIR)");
  return pos.empty() ? option : pos[0];
}

std::string model_dir_or_demo(const Args& args) {
  const std::string dir = model_dir_arg(args);
  return dir.empty() ? demo_model_dir() : dir;
}

int64_t context_length_arg(const Args& args, int64_t max_seq_len) {
  const int64_t ctx = args.get_int("ctx", 0);
  if (ctx < 0) throw Error("--ctx must be >= 0");
  if (ctx > max_seq_len)
    std::fprintf(stderr, "warning: --ctx %lld is more than the model's max_seq_len: using %lld\n", (long long)ctx,
                 (long long)max_seq_len);
  return ctx > 0 ? std::min(ctx, max_seq_len) : max_seq_len;
}

Tokenizer load_model_tokenizer(const std::string& dir, const std::string& override_file) {
  if (!override_file.empty()) return Tokenizer::load(override_file);
  const fs::path file = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(file))
    throw Error(file.string() + ": not found. Text input needs the model's tokenizer.json in the checkpoint directory " +
                dir + " (copy it there, give --tokenizer FILE, or write a test model with `ds41 mkmodel --tokenizer FILE`)");
  return Tokenizer::load(file.string());
}

std::vector<OptionSpec> memory_option_specs() {
  return {{"mem-budget", "SIZE",
           "memory the model may use, in GiB or with a unit (512M, 24G); where the weights a token reads whole do "
           "not fit, the routed experts are read from disk through a cache (default: available memory minus a margin)",
           ""},
          {"io-threads", "N", "reads in flight when routed experts are read from disk", "8"},
          {"expert-slots", "N",
           "read the routed experts from disk through N slots whatever the budget (0 = only when they do not fit)",
           "0"}};
}

Model::LoadOptions load_options_arg(const Args& args) {
  Model::LoadOptions o;
  if (auto v = args.get("mem-budget")) o.mem_budget = parse_memory_size(*v);
  const int64_t io = args.get_int("io-threads", 8);
  if (io < 1 || io > 256) throw Error("--io-threads must be between 1 and 256");
  o.io_threads = int(io);
  const int64_t slots = args.get_int("expert-slots", 0);
  if (slots < 0) throw Error("--expert-slots must be 0 or more");
  o.expert_slots = slots;
  // Under mpirun: this is rank 0, the routed experts are split across the ranks.
  if (auto parallel = dist::expert_parallel()) {
    o.expert_parallel = parallel;
    o.share = ExpertShare{0, parallel->ranks(), false};
    dist::set_follower_threads(int(args.get_int("threads", 0)));
  }
  return o;
}

void report_memory_plan(const Model& model) {
  const int ranks = model.weights().share.ranks;
  if (ranks <= 1) {
    std::fprintf(stderr, "ds41: %s\n", model.memory_plan().summary().c_str());
    return;
  }
  std::fprintf(stderr, "ds41: expert parallelism over %d ranks (each holds its block of every layer's routed experts)\n",
               ranks);
  std::fprintf(stderr, "ds41: rank 0: %s\n", model.memory_plan().summary().c_str());
  for (const dist::RankStats& r : dist::job_stats())
    if (r.rank > 0) std::fprintf(stderr, "ds41: rank %d (%s): %s\n", r.rank, r.host.c_str(), r.memory_plan.c_str());
}

}  // namespace ds41::cli
