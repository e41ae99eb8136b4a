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
#include "cli/model_files.h"
#include "model/model.h"
#include "devtools/prefill_compare.h"

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
  Args args("bench-prefill", "compare full and CED prefill (and compact-session restores): speed and next-token divergence",
            "ds41 bench-prefill -m DIR [--lengths 256,1024,4096] [--compare ced,replay] [--tokens-file FILE] [--continuation N] [--repeats N] [--json]",
            {{"model", "DIR", "checkpoint directory", ""},
             {"lengths", "LIST", "prompt lengths", "256,1024,4096"},
             {"compare", "LIST", "what to compare with the full prefill: ced (CED prefill), replay (compact session saved and restored by bounded replay)", "ced"},
             {"tokens-file", "FILE", "prompt token ids (comma/whitespace separated; the first N make a prompt of N)", ""},
             {"seed", "N", "seed of the random prompt (without --tokens-file)", "1"},
             {"continuation", "N", "generated tokens compared after each prompt", "32"},
             {"repeats", "N", "timed prefills per mode (the fastest counts)", "1"},
             {"reference-index-keys", "", "the reference's decode-path index-key reading instead of the default", ""},
             {"json", "", "machine-readable output", ""},
             {"threads", "N", "worker threads (0 = all cores)", "0"}});
  if (!args.parse(argc, argv)) return 0;
  const std::string dir = model_dir_arg(args);
  if (dir.empty()) throw Error("ds41 bench-prefill: -m DIR is required");
  PrefillCompareOptions opt;
  opt.lengths = parse_int_list(args.get_or("lengths", "256,1024,4096"), "--lengths");
  opt.seed = uint64_t(args.get_int("seed", 1));
  opt.continuation = int(args.get_int("continuation", 32));
  opt.repeats = int(args.get_int("repeats", 1));
  opt.corrected_index_keys = !args.flag("reference-index-keys");
  opt.ced = false;
  std::stringstream compare(args.get_or("compare", "ced"));
  for (std::string item; std::getline(compare, item, ',');) {
    if (item == "ced") opt.ced = true;
    else if (item == "replay") opt.session_replay = true;
    else throw Error("--compare: unknown item '" + item + "' (expected ced and/or replay)");
  }
  if (!opt.ced && !opt.session_replay) throw Error("--compare: nothing to compare (give ced and/or replay)");
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  auto model = Model::load(dir);
  const ModelConfig& c = model->config();
  const ModelPlan& plan = model->plan();
  const std::string token_file = args.get_or("tokens-file", "");
  if (!token_file.empty()) opt.tokens = read_token_file(token_file, c.vocab_size);
  const bool json = args.flag("json");

  auto div_text = [](const Divergence& d, int n) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%10.3g %5s %10.3g %10.3g %6.1f%% %5d/%d(%d)", d.first_kl, d.first_top1 ? "yes" : "no",
                  d.forced_mean_kl, d.forced_max_kl, 100.0 * d.forced_top1, d.greedy_equal, n, d.greedy_prefix);
    return std::string(buf);
  };
  if (!json)
    std::printf("full vs %s: %d layers, decoder from layer %d, window %lld, %d threads\n"
                "%8s %-7s %9s %9s %8s %9s %9s %8s %10s %5s %10s %10s %7s %11s\n",
                opt.ced && opt.session_replay ? "CED prefill / compact-session restore"
                : opt.ced                     ? "CED prefill"
                                              : "compact-session restore",
                plan.n_layers, plan.decoder_start, (long long)c.window_size, pool.size(), "tokens", "what", "full s",
                "other s", "speedup", "full cpu", "ced cpu", "speedup", "KL first", "top1", "KL mean", "KL max", "top1 %",
                "greedy =");
  auto print_row = [&](const PrefillCompareRow& r) {
    if (json) return;
    if (opt.ced)
      std::printf("%8lld %-7s %9.3f %9.3f %7.2fx %9.3f %9.3f %7.2fx %s\n", (long long)r.length, "ced", r.full_s, r.ced_s,
                  r.speedup, r.full_cpu_s, r.ced_cpu_s, r.cpu_speedup, div_text(r.ced, r.continuation).c_str());
    if (opt.session_replay)
      std::printf("%8lld %-7s %9.3f %9.3f %8s %9s %9s %8s %s\n", (long long)r.length, "replay", r.full_s, r.restore_s, "",
                  "", "", "", div_text(r.replay, r.continuation).c_str());
    std::fflush(stdout);
  };
  const std::vector<PrefillCompareRow> rows = compare_prefill(*model, opt, &pool, print_row);
  if (!json) {
    std::printf("times: wall and process CPU seconds of one prefill call (replay: reading the session + bounded "
                "replay); KL: nats, KL(full || other) of the next-token distribution; mean/max/top1 over %d "
                "teacher-forced steps; greedy = equal tokens of the free-running continuations (common prefix)\n",
                opt.continuation);
    return 0;
  }
  auto div_json = [](const Divergence& d) {
    return nlohmann::json{{"first_kl", d.first_kl},
                          {"first_top1_agree", d.first_top1},
                          {"first_max_logit_diff", d.first_max_logit_diff},
                          {"forced_mean_kl", d.forced_mean_kl},
                          {"forced_max_kl", d.forced_max_kl},
                          {"forced_top1_agree", d.forced_top1},
                          {"greedy_equal", d.greedy_equal},
                          {"greedy_common_prefix", d.greedy_prefix}};
  };
  nlohmann::json j;
  j["model"] = dir;
  j["layers"] = plan.n_layers;
  j["decoder_start"] = plan.decoder_start;
  j["window"] = c.window_size;
  j["threads"] = pool.size();
  j["prompt"] = token_file.empty() ? "random" : token_file;
  j["continuation"] = opt.continuation;
  j["results"] = nlohmann::json::array();
  for (const PrefillCompareRow& r : rows) {
    nlohmann::json row = {{"tokens", r.length}, {"full_s", r.full_s}, {"full_cpu_s", r.full_cpu_s}};
    if (opt.ced) {
      nlohmann::json ced = div_json(r.ced);
      ced["s"] = r.ced_s;
      ced["cpu_s"] = r.ced_cpu_s;
      ced["speedup"] = r.speedup;
      ced["cpu_speedup"] = r.cpu_speedup;
      row["ced"] = ced;
    }
    if (opt.session_replay) {
      nlohmann::json rep = div_json(r.replay);
      rep["restore_s"] = r.restore_s;
      rep["session_bytes"] = r.session_bytes;
      row["replay"] = rep;
    }
    j["results"].push_back(row);
  }
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace ds41::cli
