// `ds41 run`: one answer to a text prompt (encoded with the official prompt format, streamed as
// it is generated) or a raw continuation of token ids; and `ds41 dump`: every block's
// hyper-connection stream and every position's logits after a prefill, for comparison with any
// oracle. Without -m, run uses the built-in demo model (a random-weight checkpoint written to the
// cache folder on first use).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/run_dspark.h"
#include "cli/run_images.h"
#include "io/safetensors_writer.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "runtime/generation.h"
#include "runtime/sampler.h"
#include "cli/model_files.h"
#include "cli/progress.h"
#include "cli/reply_printer.h"
#include "cli/sampling_args.h"
#include "text/prompt_encoder.h"
#include "text/reply_parser.h"
#include "text/stream_decoder.h"
#include "text/tokenizer.h"
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

}  // namespace

// What `ds41 run` asks the demo model when given no prompt.
constexpr const char* kDemoPrompt = "Tell me a story about the sea.";

int cmd_run(int argc, char** argv) {
  std::vector<OptionSpec> specs = {
      {"model", "DIR", "checkpoint directory (default: the built-in random-weight demo model)", ""},
      {"prompt", "TEXT", "the user message (encoded with the model's prompt format); - reads it from standard input", ""},
      {"file", "FILE", "read the user message from FILE (as --prompt)", ""},
      {"system", "TEXT", "system prompt (with -p)", ""},
      {"think", "", "thinking mode: the model reasons first (with -p)", ""},
      {"no-think", "", "chat mode, the default (with -p)", ""},
      {"effort", "N", "reasoning effort in thinking mode: low, medium, high, max or 1-100", "high"},
      {"raw", "", "with -p: tokenize the text as it is, no prompt format", ""},
      {"tokenizer", "FILE", "tokenizer.json to use instead of the model directory's", ""},
      {"tokens", "IDS", "comma-separated prompt token ids instead of -p (prints ids)", ""},
      {"image", "FILE", "a PNG/JPEG/WebP image (repeatable, in order): with -p it goes before the text of the message; "
                        "with --tokens or --raw it fills the next image placeholder id (129264)", ""},
      {"max-tokens", "N", "tokens to generate", "256"},
      {"ctx", "N", "context length: prompt and answer tokens at most N (0 = the model's max_seq_len)", "0"},
      {"chunk", "N", "prefill chunk size (0 = the whole prompt in one call)", "0"},
      {"prefill", "MODE", "full (exact) or ced: a call longer than the window runs the decoder layers over its last window only", "full"},
      {"reference-index-keys", "", "the reference's decode-path index-key reading (tokens then depend on how the sequence was cut into calls)", ""},
      {"load-session", "FILE", "continue a saved sequence: the prompt is appended to it (none: the answer goes on)", ""},
      {"save-session", "FILE", "after generating, save the sequence (prompt + generated tokens) for --load-session", ""},
      {"exact", "", "with --save-session: store the window rings too (restore continues bit-identically; default: compact, rings rebuilt by bounded replay)", ""},
      {"mlock", "", "lock the weights in RAM (mlock) after loading", ""},
      {"json", "", "print the result (text parts or ids, per-step top-5 logits for --tokens, timings) as JSON", ""},
      {"threads", "N", "worker threads (0 = all cores)", "0"}};
  for (auto& s : sampling_option_specs(0.0, 1.0)) specs.push_back(s);
  specs.insert(specs.end(), kDsparkRunOptions.begin(), kDsparkRunOptions.end());
  for (auto& s : memory_option_specs()) specs.push_back(s);
  Args args("run", "generate an answer to a prompt (text with -p, or token ids with --tokens)",
            "ds41 run [DIR | -m DIR] -p TEXT|- | -f FILE [--image FILE ...] [--system S] [--think|--no-think] [--effort N] [-n N] [--temp T] [--json]\n"
            "       ds41 run [DIR | -m DIR] --tokens 0,5,9,... [--image FILE ...] [-n N] [--json]\n"
            "       ds41 run ... --dspark [--draft-tokens N] [--dspark-confidence C] [--compare]",
            specs);
  if (!args.parse(argc, argv)) return 0;
  const std::string dir = model_dir_or_demo(args);
  if (args.get("prompt") && args.get("file")) throw Error("give either -p TEXT or -f FILE, not both");
  // The demo model with nothing to say: a text prompt of its own (it has a tokenizer).
  const bool demo_prompt = model_dir_arg(args).empty() && !args.get("prompt") && !args.get("file") &&
                           !args.get("tokens") && !args.get("load-session") && args.get_all("image").empty();
  const bool text_mode = args.get("prompt") || args.get("file") || demo_prompt;
  std::string text = demo_prompt ? std::string(kDemoPrompt) : args.get_or("prompt", "");
  if (args.get("file") || text == "-") {  // -f FILE, or -p - (standard input)
    const std::string path = args.get_or("file", "");
    std::ifstream file;
    if (!path.empty()) {
      file.open(path, std::ios::binary);
      if (!file) throw Error(path + ": cannot open the prompt file");
    }
    std::istream& in = path.empty() ? std::cin : file;
    text.assign(std::istreambuf_iterator<char>(in), {});
    if (!path.empty() && file.bad()) throw Error(path + ": cannot read the prompt file");
    if (!text.empty() && text.back() == '\n') text.pop_back();  // the line's end, as llama.cpp's -f
  }
  if (text_mode && args.get("tokens")) throw Error("give either -p TEXT or --tokens IDS, not both");
  if (args.flag("think") && args.flag("no-think")) throw Error("--think and --no-think contradict each other");
  const bool json_out = args.flag("json");
  const bool dspark = dspark_requested(args);
  const SamplerOptions so = sampler_options_from(args, 0.0, 1.0);
  int64_t max_tokens = args.get_int("max-tokens", 256);
  if (max_tokens < 0) throw Error("--max-tokens must be >= 0");
  if (args.get_int("ctx", 0) < 0) throw Error("--ctx must be >= 0");  // before the model loads (applied below)
  const int64_t chunk = args.get_int("chunk", 0);
  if (chunk < 0) throw Error("--chunk must be >= 0");
  std::optional<Tokenizer> tok;
  if (text_mode) tok.emplace(load_model_tokenizer(dir, args.get_or("tokenizer", "")));

  const Model::LoadOptions load_options = load_options_arg(args);  // checked before the load
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  auto t_load = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model;
  {
    ProgressBar bar("loading");
    model = Model::load(dir, [&](const char* stage, int64_t d, int64_t t) { bar.update(stage, d, t); }, load_options);
    if (args.flag("mlock")) lock_model_weights(model->weights());
  }
  report_memory_plan(*model);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  // Text out: ids the tokenizer has no token for (the model's padding rows) are never generated.
  if (tok) model->restrict_output_ids(tok->ids_with_a_token(model->config().vocab_size));
  const ModelConfig& c = model->config();
  ForwardOptions fo;
  fo.corrected_index_keys = !args.flag("reference-index-keys");
  fo.prefill = parse_prefill_mode(args.get_or("prefill", "full"));
  // Greedy decoding needs only the largest logits: the JSON steps list each token's five (exact,
  // model/head_screen.h). Generation and the speculative decoder keep every logit when sampling.
  fo.head_top_k = 5;

  // A loaded session must be checked before any work: a wrong file is an error, not a new sequence.
  const std::string load_path = args.get_or("load-session", "");
  const std::string save_path = args.get_or("save-session", "");
  if (args.flag("exact") && save_path.empty()) throw Error("--exact: it chooses how --save-session saves; give --save-session FILE");
  if (!save_path.empty()) check_writable(save_path + ".tmp", "--save-session");  // before any work
  // A compact session's replay gives the logits of its last position: with no new tokens the
  // answer continues from them. (All logits: the sampler may need every one.)
  std::vector<float> replay_logits;
  ForwardOptions replay_fo = fo;
  replay_fo.head_top_k = -1;
  SequenceState st =
      load_path.empty() ? model->new_sequence() : load_session(load_path, *model, &pool, replay_fo, &replay_logits);
  const int64_t start_pos = st.pos;

  // The prompt ids.
  std::vector<int32_t> prompt;
  const bool thinking = args.flag("think");
  if (text_mode && !args.get_all("image").empty()) check_tokenizer_image_token(*tok, c);
  if (text_mode) {
    if (args.flag("raw")) {
      prompt = tok->encode(text);
    } else {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      const std::string system = args.get_or("system", "");
      if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
      messages.push_back({{"role", "user"}, {"content", user_content_with_images(text, args.get_all("image"))}});
      PromptOptions po;
      po.thinking_mode = thinking ? ThinkingMode::thinking : ThinkingMode::chat;
      po.reasoning_effort = parse_reasoning_effort(args.get_or("effort", "high"));
      po.add_bos = start_pos == 0;  // a continued session already has its BOS
      const EncodedPrompt ep = encode_prompt(messages, po);
      prompt = tok->encode(ep.text, ep.text_spans);  // the message stays text
    }
  } else if (args.get("tokens") || load_path.empty()) {
    prompt = parse_token_ids(args.get_or("tokens", "0,128803,63006,44388,305,4575"), c.vocab_size);
  }
  // --load-session without new tokens: continue from the saved state.
  const bool continue_only = prompt.empty() && !load_path.empty() && !text_mode;
  if (continue_only && replay_logits.empty())
    throw Error(load_path + ": an exact session holds no next-token logits; give the tokens to continue with "
                "(--tokens or -p), or save a compact session");
  if (continue_only && dspark) throw Error("--dspark: give the tokens to continue the session with (--tokens or -p)");
  if (prompt.empty() && !continue_only) throw Error("the prompt is empty");
  // Image placeholders in the ids become image spans (their rows from the vision tower).
  const RunImages images = prepare_run_images(*model, prompt, args.get_all("image"), &pool);
  prompt = images.prompt.tokens;
  const int64_t ctx = context_length_arg(args, c.max_seq_len);
  if (ctx < c.max_seq_len) {
    const int64_t used = st.pos + int64_t(prompt.size());
    if (used >= ctx)
      throw Error("the prompt" + std::string(st.pos > 0 ? " with the loaded session" : "") + " is " + std::to_string(used) +
                  " tokens; --ctx is " + std::to_string(ctx));
    max_tokens = std::min(max_tokens, ctx - used);
  }
  // Caches sized once for the whole answer: no reallocation inside the decode loop (a speculative
  // verify call runs up to a draft block past the last kept token).
  reserve_sequence(st, c, model->plan(),
                   std::min<int64_t>(c.max_seq_len, st.pos + int64_t(prompt.size()) + max_tokens + c.dspark_block_size));

  json steps = json::array();
  std::vector<int32_t> generated;
  GenerationLimits lim;
  lim.max_tokens = max_tokens;
  lim.stop_ids = {int32_t(c.eos_token_id)};
  std::optional<StreamDecoder> decoder;
  std::optional<ReplyParser> parser;
  std::optional<ReplyPrinter> printer;
  ParsedReply reply;
  if (text_mode) {
    decoder.emplace(*tok);
    parser.emplace(ReplyParserOptions{args.flag("raw") ? ThinkingMode::chat : (thinking ? ThinkingMode::thinking : ThinkingMode::chat), "call_"});
    if (!json_out) printer.emplace();
  }
  auto deliver = [&](const std::vector<ReplyEvent>& events) {
    collect_reply_events(reply, events);
    if (printer)
      for (const auto& e : events) printer->print(e);
  };
  // Each token with the logits it was chosen from (plain decoding's row, with --dspark too).
  auto on_token = [&](int32_t t, const float* logits) {
    if (!text_mode && json_out) {
      std::vector<int32_t> idx(static_cast<size_t>(c.vocab_size));
      for (int32_t i = 0; i < c.vocab_size; ++i) idx[size_t(i)] = i;
      std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
      });
      json top = json::array();
      for (int i = 0; i < 5; ++i) top.push_back({{"id", idx[size_t(i)]}, {"logit", logits[size_t(idx[size_t(i)])]}});
      steps.push_back({{"top5", top}, {"token", t}});
    }
    if (text_mode) {
      if (t != c.eos_token_id || args.flag("raw")) deliver(parser->feed(decoder->push(t)));
    } else if (!json_out) {
      std::printf("%s%d", generated.empty() ? "" : ",", t);
      std::fflush(stdout);
    }
    generated.push_back(t);
    return true;
  };
  GenerationStats stats;
  nlohmann::json dspark_report;
  std::optional<Generation> gen;
  if (dspark) {
    DsparkRunResult r = run_dspark(args, *model, st, {prompt, max_tokens, so, fo, chunk, images.inputs(), !save_path.empty()},
                                   pool, on_token);
    stats = r.stats;
    dspark_report = std::move(r.dspark);
  } else {
    gen.emplace(*model, std::move(st), Sampler(so), &pool, fo);
    if (continue_only) gen->resume(std::move(replay_logits));
    else gen->feed(prompt, chunk, PrefillProgress(int64_t(prompt.size())), images.inputs());  // checks the context length first
    stats = gen->generate(lim, [&](int32_t t) { return on_token(t, gen->last_logits().data()); });
  }
  if (text_mode) {
    std::vector<ReplyEvent> tail = parser->feed(decoder->flush());
    auto fin = parser->finish(/*cut_off=*/stats.finish != FinishReason::Stop);
    tail.insert(tail.end(), fin.begin(), fin.end());
    deliver(tail);
    if (printer) printer->finish();
  }
  if (!save_path.empty()) {
    // Everything printed goes into the saved sequence, so --load-session continues after it.
    if (gen) gen->commit_pending();  // run_dspark has fed its last token already
    save_session(save_path, *model, gen ? gen->state() : st, args.flag("exact") ? SessionKind::Exact : SessionKind::Compact);
  }
  json timing = {{"load_s", load_s},
                 {"prompt_tokens", int64_t(prompt.size())},
                 {"prefill_s", stats.prefill_s},
                 {"prefill_tokens_per_s", stats.prefill_tokens_per_s()},
                 {"time_to_first_token_s", stats.time_to_first_token_s},
                 {"generated_tokens", stats.generated_tokens},
                 {"decode_s", stats.decode_s},
                 {"decode_tokens_per_s", stats.decode_tokens_per_s()},
                 {"threads", pool.size()},
                 {"peak_rss_bytes", peak_rss_bytes()}};
  if (images.any()) timing["vision_s"] = images.seconds;
  if (json_out) {
    json j;
    j["model"] = dir;
    j["ranks"] = model->weights().share.ranks;  // > 1 under mpirun (expert parallelism)
    j["prompt"] = prompt;
    if (images.any()) j["images"] = images.describe();
    if (!load_path.empty()) j["session_start_pos"] = start_pos;
    j["generated"] = generated;
    j["finish_reason"] = finish_reason_name(stats.finish);
    if (text_mode) {
      j["reasoning"] = reply.reasoning;
      j["content"] = reply.content;
      json calls = json::array();
      for (const auto& tc : reply.tool_calls) calls.push_back({{"id", tc.id}, {"name", tc.name}, {"arguments", tc.arguments}});
      j["tool_calls"] = calls;
      j["warnings"] = reply.warnings;
    } else {
      j["steps"] = steps;
    }
    j["timing"] = timing;
    if (dspark) j["dspark"] = dspark_report;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    if (!text_mode) std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr,
                 "load %.2f s | prompt %zu tokens, prefill %.2f s (%.1f tok/s) | first token %.2f s | %lld tokens at %.1f tok/s | %s | %d threads\n",
                 load_s, prompt.size(), stats.prefill_s, stats.prefill_tokens_per_s(), stats.time_to_first_token_s,
                 (long long)stats.generated_tokens, stats.decode_tokens_per_s(), finish_reason_name(stats.finish), pool.size());
    if (dspark) print_dspark_summary(dspark_report);
  }
  return 0;
}

int cmd_dump(int argc, char** argv) {
  Args args("dump", "write every block's stream and every position's logits after a prefill",
            "ds41 dump -m DIR --tokens 0,5,9,... --out FILE.safetensors",
            {{"model", "DIR", "checkpoint directory", ""},
             {"tokens", "IDS", "comma-separated prompt token ids", ""},
             {"out", "FILE", "output .safetensors file", ""},
             {"threads", "N", "worker threads (0 = all cores)", "0"}});
  if (!args.parse(argc, argv)) return 0;
  std::string dir = model_dir_arg(args);
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
