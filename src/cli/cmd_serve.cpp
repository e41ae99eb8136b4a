// `ds41 serve`: an OpenAI- and Anthropic-compatible HTTP server over one model.
#include <atomic>
#include <chrono>
#include <csignal>
#include <pthread.h>
#include <thread>
#include <cstdio>
#include <filesystem>

#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/progress.h"
#include "cli/sampling_args.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "server/server.h"
#include "server/text_side.h"
#include "text/tokenizer.h"
#include "text/prompt_encoder.h"

namespace ds41::cli {

namespace {

// SIGINT/SIGTERM are taken by a thread of their own (sigwait), so what they start is ordinary
// code: the first drains (answers in progress finish or end with an error the client reads), a
// second stops at once.
class SignalWatcher {
 public:
  SignalWatcher(Server& server, std::chrono::milliseconds grace) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);  // our own wake-up when serving ends by itself
    thread_ = std::thread([this, &server, grace] {
      for (int n = 0;; ++n) {
        int sig = 0;
        if (sigwait(&set_, &sig) != 0 || sig == SIGUSR1 || done_) return;
        if (n == 0) {
          std::fprintf(stderr, "ds41 serve: %s: draining (answers in progress have %.0f s; again to stop now)\n",
                       sig == SIGINT ? "SIGINT" : "SIGTERM", double(grace.count()) / 1000);
          server.drain(grace);
        } else {
          std::fprintf(stderr, "ds41 serve: stopping now\n");
          server.stop();
          return;
        }
      }
    });
  }
  ~SignalWatcher() {
    done_ = true;
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  // Before any thread starts: every thread inherits the mask, so only sigwait sees the signals.
  static void block() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }

 private:
  sigset_t set_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

int cmd_serve(int argc, char** argv) {
  std::vector<OptionSpec> specs = {
      {"model", "DIR", "checkpoint directory (with tokenizer.json)", ""},
      {"tokenizer", "FILE", "tokenizer.json to use instead of the model directory's", ""},
      {"host", "ADDR", "address to listen on", "127.0.0.1"},
      {"port", "N", "port to listen on (0: any free port, the banner says which)", "8080"},
      {"api-key", "KEY", "require 'Authorization: Bearer KEY' (or x-api-key) on /v1 endpoints", ""},
      {"model-name", "NAME", "the model id clients use (default: the directory name)", ""},
      {"max-batch", "N", "requests processed concurrently; more wait in a queue", "8"},
      {"ctx", "N", "context length per request (default and maximum: the model's)", "0"},
      {"max-tokens", "N", "default answer length when a request gives none (0 = up to the context)", "0"},
      {"prefill-chunk", "N", "prompt tokens per scheduling step of one request", "256"},
      {"prefix-cache-mb", "N", "memory for cached prompt prefixes (0 = off)", "1024"},
      {"prefix-cache-dir", "DIR", "spill prefixes evicted from memory to DIR (exact session files; reused after a restart)", ""},
      {"prefix-cache-disk-mb", "N", "disk space for spilled prefixes", "8192"},
      {"max-images", "N", "images accepted per request", "8"},
      {"dspark", "", "speculative decoding with the checkpoint's DSpark drafter (greedy answers unchanged)", ""},
      {"draft-tokens", "N", "DSpark drafts per cycle (0 = the model's block size)", "0"},
      {"dspark-confidence", "C", "cut a draft below this cumulative confidence (0 = never)", "0"},
      {"think", "", "answer in thinking mode unless a request says otherwise", ""},
      {"effort", "N", "default reasoning effort (low, high, max or 1-100)", "high"},
      {"max-body-mb", "N", "largest request body accepted, in MiB (images come inside it)", "64"},
      {"max-connections", "N", "open connections at most (the one waiting longest for its request makes room)", "1024"},
      {"request-timeout", "S", "seconds a client has to send a whole request", "30"},
      {"drain-timeout", "S", "on SIGTERM/SIGINT: seconds answers in progress may take to finish", "30"},
      {"cors-origin", "ORIGIN", "let browser pages from ORIGIN call the API (CORS; * = any; repeatable; default: none)", ""},
      {"threads", "N", "worker threads (0 = all cores)", "0"}};
  for (auto& s : sampling_option_specs()) specs.push_back(s);
  for (auto& s : memory_option_specs()) specs.push_back(s);
  Args args("serve", "serve the model over an OpenAI- and Anthropic-compatible HTTP API",
            "ds41 serve -m DIR [--host 127.0.0.1] [--port 8080] [--max-batch N] [--ctx N] [--api-key K]", specs);
  if (!args.parse(argc, argv)) return 0;
  const std::string dir = model_dir_arg(args);
  if (dir.empty()) throw Error("ds41 serve: -m DIR is required");
  ServerOptions so;
  so.host = args.get_or("host", "127.0.0.1");
  so.port = int(args.get_int("port", 8080));
  if (so.port < 0 || so.port > 65535) throw Error("--port must be in 0..65535");
  so.api_key = args.get_or("api-key", "");
  so.model_name = args.get_or("model-name", std::filesystem::path(dir).lexically_normal().filename().string());
  if (so.model_name.empty()) so.model_name = std::filesystem::absolute(dir).parent_path().filename().string();
  so.defaults.sampling = sampler_options_from(args);
  so.defaults.thinking = args.flag("think");
  so.defaults.reasoning_effort = parse_reasoning_effort(args.get_or("effort", "high"));
  so.defaults.max_tokens = args.get_int("max-tokens", 0) > 0 ? args.get_int("max-tokens", 0) : -1;
  so.defaults.max_images = int(args.get_int("max-images", 8));
  EngineOptions eo;
  eo.max_batch = int(args.get_int("max-batch", 8));
  eo.prefill_chunk = args.get_int("prefill-chunk", 256);
  eo.prefix_cache_bytes = args.get_int("prefix-cache-mb", 1024) << 20;
  eo.prefix_cache_dir = args.get_or("prefix-cache-dir", "");
  eo.dspark = args.flag("dspark");
  eo.draft_tokens = int(args.get_int("draft-tokens", 0));
  eo.dspark_confidence = args.get_double("dspark-confidence", 0.0);
  eo.prefix_cache_disk_bytes = args.get_int("prefix-cache-disk-mb", 8192) << 20;
  if (eo.prefix_cache_bytes < 0 || eo.prefix_cache_disk_bytes < 0) throw Error("prefix cache sizes must be >= 0");
  so.max_body_bytes = args.get_int("max-body-mb", 64) << 20;
  if (so.max_body_bytes < 1) throw Error("--max-body-mb must be >= 1");
  so.http.max_connections = int(args.get_int("max-connections", 1024));
  so.http.request_timeout_s = int(args.get_int("request-timeout", 30));
  for (const std::string& o : args.get_all("cors-origin")) {
    // An origin is scheme://host[:port], no path: what browsers send in the Origin header.
    const size_t scheme = o.find("://");
    if (o != "*" && (scheme == std::string::npos || o.find('/', scheme + 3) != std::string::npos || o.size() == scheme + 3))
      throw Error("--cors-origin " + o + ": expected * or an origin such as http://localhost:3000 (scheme://host[:port])");
    so.http.cors_origins.push_back(o);
  }
  const double drain_s = args.get_double("drain-timeout", 30);
  if (so.http.max_connections < 1) throw Error("--max-connections must be >= 1");
  if (so.http.request_timeout_s < 1) throw Error("--request-timeout must be >= 1");
  if (!(drain_s >= 0)) throw Error("--drain-timeout must be >= 0");

  TextSide text(dir, args.get_or("tokenizer", ""));
  const Model::LoadOptions load_options = load_options_arg(args);
  std::unique_ptr<Model> model;
  {
    ProgressBar bar("loading " + dir);
    model = Model::load(dir, [&](const char* stage, int64_t done, int64_t total) { bar.update(stage, done, total); },
                        load_options);
  }
  report_memory_plan(*model);
  // The model's padding rows (ids the tokenizer has no token for) are never generated.
  model->restrict_output_ids(text.tokenizer().ids_with_a_token(model->config().vocab_size));
  eo.max_context = context_length_arg(args, model->config().max_seq_len);
  // From here on signals are handled by the watcher (loading above stays interruptible).
  SignalWatcher::block();
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  Engine engine(*model, &pool, eo);
  Server server(engine, text, so);
  std::string error;
  if (!server.bind(error)) throw Error("ds41 serve: " + error);  // before the banner: it says where we listen
  std::fprintf(stderr, "ds41 serve: model \"%s\" (context %lld, batch %d, %d threads) on http://%s:%d%s\n",
               so.model_name.c_str(), (long long)eo.max_context, eo.max_batch, pool.size(), so.host.c_str(), server.port(),
               so.api_key.empty() ? "" : " (API key required)");
  {
    SignalWatcher signals(server, std::chrono::milliseconds(int64_t(drain_s * 1000)));
    server.listen_after_bind();
  }
  std::fprintf(stderr, "ds41 serve: stopped\n");
  return 0;
}

}  // namespace ds41::cli
