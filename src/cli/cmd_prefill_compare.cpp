// `ds41 bench-prefill`: full vs CED prefill on the same prompts — speedup, and the divergence of
// the next-token distributions and of the greedy continuation (runtime/prefill_compare.h).
// (To become `ds41 bench --prefill-compare`.)
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/model.h"
#include "runtime/prefill_compare.h"

namespace ds41::cli {

namespace {

// Token ids from a file: integers separated by commas and/or whitespace.
std::vector<int32_t> read_token_file(const std::string& path, int64_t vocab) {
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open the token file");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  for (char& ch : text)
    if (ch == '\n' || ch == '\r' || ch == '\t' || ch == ' ') ch = ',';
  std::string joined;  // runs of separators collapse to one comma
  for (char ch : text)
    if (ch != ',' || (!joined.empty() && joined.back() != ',')) joined += ch;
  if (!joined.empty() && joined.back() == ',') joined.pop_back();
  if (joined.empty()) throw Error(path + ": the token file holds no ids");
  return parse_token_ids(joined, vocab, path);
}

}  // namespace

int cmd_prefill_compare(int argc, char** argv) {
  Args args("bench-prefill", "compare full and CED prefill: speedup and divergence of the next tokens",
            "ds41 bench-prefill -m DIR [--lengths 256,1024,4096] [--tokens-file FILE] [--continuation N] [--repeats N] [--json]",
            {{"model", "DIR", "checkpoint directory", ""},
             {"m", "DIR", "same as --model", ""},
             {"lengths", "LIST", "prompt lengths", "256,1024,4096"},
             {"tokens-file", "FILE", "prompt token ids (comma/whitespace separated; the first N make a prompt of N)", ""},
             {"seed", "N", "seed of the random prompt (without --tokens-file)", "1"},
             {"continuation", "N", "generated tokens compared after each prompt", "32"},
             {"repeats", "N", "timed prefills per mode (the fastest counts)", "1"},
             {"corrected-index-keys", "", "use the corrected index-key reading instead of the reference's", ""},
             {"json", "", "machine-readable output", ""},
             {"threads", "N", "worker threads (0 = all cores)", "0"}});
  if (!args.parse(argc, argv)) return 0;
  const std::string dir = args.get_or("model", args.get_or("m", ""));
  if (dir.empty()) throw Error("ds41 bench-prefill: -m DIR is required");
  PrefillCompareOptions opt;
  opt.lengths = parse_int_list(args.get_or("lengths", "256,1024,4096"), "--lengths");
  opt.seed = uint64_t(args.get_int("seed", 1));
  opt.continuation = int(args.get_int("continuation", 32));
  opt.repeats = int(args.get_int("repeats", 1));
  opt.corrected_index_keys = args.flag("corrected-index-keys");
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  auto model = Model::load(dir);
  const ModelConfig& c = model->config();
  const ModelPlan& plan = model->plan();
  const std::string token_file = args.get_or("tokens-file", "");
  if (!token_file.empty()) opt.tokens = read_token_file(token_file, c.vocab_size);
  const bool json = args.flag("json");

  if (!json)
    std::printf("full vs CED prefill: %d layers, decoder from layer %d, window %lld, %d threads\n"
                "%8s %9s %9s %8s %9s %9s %8s %10s %5s %10s %10s %7s %11s\n",
                plan.n_layers, plan.decoder_start, (long long)c.window_size, pool.size(), "tokens", "full s",
                "ced s", "speedup", "full cpu", "ced cpu", "speedup", "KL first", "top1", "KL mean", "KL max", "top1 %",
                "greedy =");
  auto print_row = [&](const PrefillCompareRow& r) {
    if (json) return;
    std::printf("%8lld %9.3f %9.3f %7.2fx %9.3f %9.3f %7.2fx %10.3g %5s %10.3g %10.3g %6.1f%% %5d/%d(%d)\n",
                (long long)r.length, r.full_s, r.ced_s, r.speedup, r.full_cpu_s, r.ced_cpu_s, r.cpu_speedup, r.first_kl, r.first_top1 ? "yes" : "no", r.forced_mean_kl, r.forced_max_kl,
                100.0 * r.forced_top1, r.greedy_equal, r.continuation, r.greedy_prefix);
    std::fflush(stdout);
  };
  const std::vector<PrefillCompareRow> rows = compare_prefill(*model, opt, &pool, print_row);
  if (!json) {
    std::printf("times: wall and process CPU seconds of one prefill call; KL: nats, KL(full || ced) of the next-token distribution; mean/max/top1 over %d teacher-forced steps; "
                "greedy = equal tokens of the free-running continuations (common prefix)\n",
                opt.continuation);
    return 0;
  }
  nlohmann::json j;
  j["model"] = dir;
  j["layers"] = plan.n_layers;
  j["decoder_start"] = plan.decoder_start;
  j["window"] = c.window_size;
  j["threads"] = pool.size();
  j["prompt"] = token_file.empty() ? "random" : token_file;
  j["results"] = nlohmann::json::array();
  for (const PrefillCompareRow& r : rows)
    j["results"].push_back({{"tokens", r.length},
                            {"full_s", r.full_s},
                            {"ced_s", r.ced_s},
                            {"speedup", r.speedup},
                            {"full_cpu_s", r.full_cpu_s},
                            {"ced_cpu_s", r.ced_cpu_s},
                            {"cpu_speedup", r.cpu_speedup},
                            {"first_kl", r.first_kl},
                            {"first_top1_agree", r.first_top1},
                            {"first_max_logit_diff", r.first_max_logit_diff},
                            {"forced_mean_kl", r.forced_mean_kl},
                            {"forced_max_kl", r.forced_max_kl},
                            {"forced_top1_agree", r.forced_top1},
                            {"greedy_equal", r.greedy_equal},
                            {"greedy_common_prefix", r.greedy_prefix},
                            {"continuation", r.continuation}});
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace ds41::cli
