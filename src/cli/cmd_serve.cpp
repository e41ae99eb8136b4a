// `ds41 serve`: an OpenAI- and Anthropic-compatible HTTP server over one model.
#include <csignal>
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
#include "server/engine.h"
#include "server/server.h"
#include "server/text_side.h"
#include "text/tokenizer.h"
#include "text/prompt_encoder.h"

namespace ds41::cli {

namespace {
Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}
}  // namespace

int cmd_serve(int argc, char** argv) {
  std::vector<OptionSpec> specs = {
      {"model", "DIR", "checkpoint directory (with tokenizer.json)", ""},
      {"tokenizer", "FILE", "tokenizer.json to use instead of the model directory's", ""},
      {"host", "ADDR", "address to listen on", "127.0.0.1"},
      {"port", "N", "port to listen on", "8080"},
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
      {"threads", "N", "worker threads (0 = all cores)", "0"}};
  for (auto& s : sampling_option_specs()) specs.push_back(s);
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
  so.http_threads = std::max(64, eo.max_batch * 4);

  TextSide text(dir, args.get_or("tokenizer", ""));
  std::unique_ptr<Model> model;
  {
    ProgressBar bar("loading " + dir);
    model = Model::load(dir, [&](const char* stage, int64_t done, int64_t total) { bar.update(stage, done, total); });
  }
  // The model's padding rows (ids the tokenizer has no token for) are never generated.
  model->restrict_output_ids(text.tokenizer().ids_with_a_token(model->config().vocab_size));
  const int64_t ctx = args.get_int("ctx", 0);
  if (ctx < 0) throw Error("--ctx must be >= 0");
  eo.max_context = ctx > 0 ? std::min(ctx, model->config().max_seq_len) : model->config().max_seq_len;
  if (ctx > model->config().max_seq_len)
    std::fprintf(stderr, "warning: --ctx %lld is more than the model's max_seq_len: using %lld\n", (long long)ctx,
                 (long long)model->config().max_seq_len);
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  Engine engine(*model, &pool, eo);
  Server server(engine, text, so);
  g_server = &server;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::string error;
  if (!server.bind(error)) throw Error("ds41 serve: " + error);  // before the banner: it says where we listen
  std::fprintf(stderr, "ds41 serve: model \"%s\" (context %lld, batch %d, %d threads) on http://%s:%d%s\n",
               so.model_name.c_str(), (long long)eo.max_context, eo.max_batch, pool.size(), so.host.c_str(), so.port,
               so.api_key.empty() ? "" : " (API key required)");
  const bool ok = server.listen_after_bind();
  if (!ok) error = "the server stopped with an error";
  g_server = nullptr;
  if (!ok) throw Error("ds41 serve: " + error);
  std::fprintf(stderr, "ds41 serve: stopped\n");
  return 0;
}

}  // namespace ds41::cli
