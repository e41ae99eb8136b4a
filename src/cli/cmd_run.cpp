// `ds41 run`: generate from token ids (text prompts arrive with the tokenizer), and `ds41 dump`:
// every block's hyper-connection stream and every position's logits after a prefill, for
// comparison with any oracle. Without -m, run uses the built-in demo model (a random-weight
// checkpoint written to the cache folder on first use).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/run_images.h"
#include "io/safetensors_writer.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace ds41::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Peak resident set size of this process (VmHWM), 0 where /proc is unavailable. File-backed pages
// of the mmap'd checkpoint count only once touched, so this shows what a run really pulls in.
int64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return int64_t(kb) * 1024;
}

// The demo model: the `tiny` preset (every mechanism, Engram included) with random weights, in the
// cache folder.
std::string demo_model_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path cache = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  fs::path dir = cache / "ds41" / "tiny";
  if (!fs::exists(dir / "model.safetensors.index.json")) {
    std::fprintf(stderr, "run: no model given (-m DIR); writing the built-in demo model (random weights) to %s\n",
                 dir.string().c_str());
    ModelConfig c = preset_config("tiny");
    RandomCheckpointOptions opt;
    opt.seed = 0;
    write_random_checkpoint(c, dir.string(), opt);
  }
  return dir.string();
}

}  // namespace

int cmd_run(int argc, char** argv) {
  Args args("run", "generate tokens from a prompt of token ids",
            "ds41 run [-m DIR] [--tokens 0,5,9,...] [--image FILE ...] [--max-tokens N] [--temp T] [--json] [--load-session FILE] [--save-session FILE]",
            {{"model", "DIR", "checkpoint directory (default: the built-in random-weight demo model)", ""},
             {"m", "DIR", "same as --model", ""},
             {"tokens", "IDS", "comma-separated prompt token ids", "0,128803,63006,44388,305,4575"},
             {"image", "FILE", "a PNG/JPEG/WebP image for the next image placeholder id in --tokens (repeatable, in order)", ""},
             {"max-tokens", "N", "tokens to generate", "16"},
             {"temp", "T", "sampling temperature (0 = greedy)", "0"},
             {"top-p", "P", "nucleus sampling threshold (1 = off)", "1"},
             {"seed", "N", "sampling seed", "0"},
             {"chunk", "N", "prefill chunk size (0 = the whole prompt in one call)", "0"},
             {"corrected-index-keys", "", "use the corrected index-key reading instead of the reference's", ""},
             {"load-session", "FILE", "continue a saved sequence: --tokens are appended to it", ""},
             {"save-session", "FILE", "after generating, save the sequence (prompt + generated tokens) for --load-session", ""},
             {"json", "", "print generated ids, the top-5 logits of each step and timings as JSON", ""},
             {"threads", "N", "worker threads (0 = all cores)", "0"}});
  if (!args.parse(argc, argv)) return 0;
  std::string dir = args.get_or("model", args.get_or("m", ""));
  if (dir.empty()) dir = demo_model_dir();
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  auto t_load = std::chrono::steady_clock::now();
  auto model = Model::load(dir);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const ModelConfig& c = model->config();
  // Image placeholders in the ids become image spans (their rows from the vision tower).
  const RunImages images = prepare_run_images(*model, parse_token_ids(*args.get("tokens"), c.vocab_size),
                                              args.get_all("image"), &pool);
  const std::vector<int32_t>& prompt = images.prompt.tokens;
  const int64_t max_tokens = args.get_int("max-tokens", 16);
  if (max_tokens < 0) throw Error("--max-tokens must be >= 0");
  SamplerOptions so;
  so.temperature = args.get_double("temp", 0.0);
  so.top_p = args.get_double("top-p", 1.0);
  so.seed = uint64_t(args.get_int("seed", 0));
  if (so.temperature < 0 || so.top_p <= 0 || so.top_p > 1) throw Error("--temp must be >= 0 and --top-p in (0, 1]");
  Sampler sampler(so);
  ForwardOptions fo;
  fo.corrected_index_keys = args.flag("corrected-index-keys");
  const int64_t chunk = args.get_int("chunk", 0);
  if (chunk < 0) throw Error("--chunk must be >= 0");

  // A loaded session must be checked before any work: a wrong file is an error, not a new sequence.
  const std::string load_path = args.get_or("load-session", "");
  const std::string save_path = args.get_or("save-session", "");
  SequenceState st = load_path.empty() ? model->new_sequence() : load_session(load_path, *model);
  if (st.pos + int64_t(prompt.size()) > c.max_seq_len)
    throw Error("--tokens: the sequence would be " + std::to_string(st.pos + int64_t(prompt.size())) +
                " tokens long, more than the model's max_seq_len " + std::to_string(c.max_seq_len));
  const int64_t start_pos = st.pos;
  json steps = json::array();
  std::vector<int32_t> generated;
  auto record_step = [&](const std::vector<float>& logits) {
    std::vector<int32_t> idx(static_cast<size_t>(c.vocab_size));
    for (int32_t i = 0; i < c.vocab_size; ++i) idx[size_t(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    });
    json top = json::array();
    for (int i = 0; i < 5; ++i) top.push_back({{"id", idx[size_t(i)]}, {"logit", logits[size_t(idx[size_t(i)])]}});
    steps.push_back({{"top5", top}});
  };

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  for (size_t i = 0; i < prompt.size(); i += size_t(chunk ? chunk : int64_t(prompt.size()))) {
    size_t end = chunk ? std::min(prompt.size(), i + size_t(chunk)) : prompt.size();
    InputEmbeddings chunk_inputs;
    logits = model->forward(st, std::vector<int32_t>(prompt.begin() + long(i), prompt.begin() + long(end)), fo, &pool,
                            nullptr, images.inputs_for(int64_t(i), int64_t(end), c.dim, chunk_inputs));
  }
  auto t1 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < max_tokens; ++n) {
    if (st.pos >= c.max_seq_len) break;
    int32_t tok = sampler.sample(logits.data(), c.vocab_size, uint64_t(n));
    record_step(logits);
    steps.back()["token"] = tok;
    generated.push_back(tok);
    if (!args.flag("json")) {
      std::printf("%s%d", n ? "," : "", tok);
      std::fflush(stdout);
    }
    if (tok == c.eos_token_id || n + 1 == max_tokens) break;
    logits = model->forward(st, {tok}, fo, &pool);
  }
  auto t2 = std::chrono::steady_clock::now();
  if (!save_path.empty()) {
    // The loop stops before feeding the last sampled token; feed it so the saved sequence holds
    // everything printed and a later --load-session continues after it.
    if (!generated.empty() && st.pos < c.max_seq_len &&
        st.pos < start_pos + int64_t(prompt.size() + generated.size()))
      model->forward(st, {generated.back()}, fo, &pool);
    save_session(save_path, *model, st);
  }
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  const double decode_tps = generated.size() > 1 ? double(generated.size() - 1) / decode_s : 0.0;
  if (args.flag("json")) {
    json j;
    j["model"] = dir;
    j["prompt"] = prompt;
    if (images.any()) j["images"] = images.describe();
    if (!load_path.empty()) j["session_start_pos"] = start_pos;
    j["generated"] = generated;
    j["steps"] = steps;
    j["timing"] = {{"load_s", load_s}, {"prefill_s", prefill_s}, {"prefill_tokens_per_s", double(prompt.size()) / prefill_s},
                   {"decode_s", decode_s}, {"decode_tokens_per_s", decode_tps}, {"threads", pool.size()},
                   {"peak_rss_bytes", peak_rss_bytes()}};
    if (images.any()) j["timing"]["vision_s"] = images.seconds;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "load %.2f s | prefill %zu tokens in %.3f s (%.1f tok/s) | decode %zu tokens in %.3f s (%.1f tok/s) | %d threads\n",
                 load_s, prompt.size(), prefill_s, double(prompt.size()) / prefill_s, generated.size(), decode_s,
                 decode_tps, pool.size());
  }
  return 0;
}

int cmd_dump(int argc, char** argv) {
  Args args("dump", "write every block's stream and every position's logits after a prefill",
            "ds41 dump -m DIR --tokens 0,5,9,... --out FILE.safetensors",
            {{"model", "DIR", "checkpoint directory", ""},
             {"m", "DIR", "same as --model", ""},
             {"tokens", "IDS", "comma-separated prompt token ids", ""},
             {"out", "FILE", "output .safetensors file", ""},
             {"threads", "N", "worker threads (0 = all cores)", "0"}});
  if (!args.parse(argc, argv)) return 0;
  std::string dir = args.get_or("model", args.get_or("m", ""));
  if (dir.empty()) throw Error("ds41 dump: -m DIR is required");
  auto out = args.get("out");
  if (!out) throw Error("ds41 dump: --out FILE is required");
  auto toks = args.get("tokens");
  if (!toks) throw Error("ds41 dump: --tokens is required");
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  auto model = Model::load(dir);
  const ModelConfig& c = model->config();
  const std::vector<int32_t> prompt = parse_token_ids(*toks, c.vocab_size);
  const int64_t S = int64_t(prompt.size());
  std::vector<TensorBuffer> tensors;
  ForwardHooks hooks;
  hooks.after_block = [&](int layer, int n, const uint16_t* X, const float* pm) {
    TensorBuffer b{"stream.layer" + std::to_string(layer), DType::BF16, {n, c.hc_mult, c.dim}, {}};
    b.bytes.resize(size_t(n) * c.hc_mult * c.dim * 2);
    std::memcpy(b.bytes.data(), X, b.bytes.size());
    tensors.push_back(std::move(b));
    TensorBuffer p{"pre_mix.layer" + std::to_string(layer), DType::F32, {n, c.hc_mult}, {}};
    p.bytes.resize(size_t(n) * c.hc_mult * 4);
    std::memcpy(p.bytes.data(), pm, p.bytes.size());
    tensors.push_back(std::move(p));
  };
  ForwardOptions fo;
  fo.all_logits = true;
  SequenceState st = model->new_sequence();
  auto logits = model->forward(st, prompt, fo, &pool, &hooks);
  TensorBuffer l{"logits", DType::F32, {S, c.vocab_size}, {}};
  l.bytes.resize(logits.size() * 4);
  std::memcpy(l.bytes.data(), logits.data(), l.bytes.size());
  tensors.push_back(std::move(l));
  write_safetensors_buffers(*out, tensors);
  std::fprintf(stderr, "dump: %zu tensors for %lld tokens written to %s\n", tensors.size(), (long long)S, out->c_str());
  return 0;
}

}  // namespace ds41::cli
