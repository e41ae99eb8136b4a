// `ds41 chat`: an interactive multi-turn conversation in the terminal (line editing and history
// via libedit). Ctrl-C stops the answer being written, not the program; Ctrl-D or /quit exits.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <editline/readline.h>

#include "base/error.h"
#include "base/thread_pool.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/progress.h"
#include "cli/reply_printer.h"
#include "cli/sampling_args.h"
#include "model/model.h"
#include "runtime/conversation.h"
#include "text/tokenizer.h"

namespace ds41::cli {

namespace {

std::atomic<bool> g_interrupt{false};
void on_sigint(int) { g_interrupt = true; }

const char* kChatHelp =
    "commands:\n"
    "  /help            this list\n"
    "  /reset           forget the conversation\n"
    "  /system TEXT     set the system prompt (applies from the next message; empty clears it)\n"
    "  /think, /nothink thinking mode on / off\n"
    "  /effort N        reasoning effort: low, high, max or 1-100 (thinking mode)\n"
    "  /save FILE       save the conversation (FILE and FILE.chat.json)\n"
    "  /load FILE       continue a saved conversation\n"
    "  /stats           speed of the last answer\n"
    "  /quit            exit (also Ctrl-D); Ctrl-C stops the current answer\n";

}  // namespace

int cmd_chat(int argc, char** argv) {
  std::vector<OptionSpec> specs = {
      {"model", "DIR", "checkpoint directory with tokenizer.json (default: the built-in demo model)", ""},
      {"tokenizer", "FILE", "tokenizer.json to use instead of the model directory's", ""},
      {"system", "TEXT", "system prompt", ""},
      {"think", "", "start in thinking mode", ""},
      {"effort", "N", "reasoning effort: low, high, max or 1-100", "high"},
      {"max-tokens", "N", "longest answer", "2048"},
      {"chunk", "N", "prefill chunk size (0 = whole prompt in one call)", "0"},
      {"threads", "N", "worker threads (0 = all cores)", "0"}};
  for (auto& s : sampling_option_specs()) specs.push_back(s);
  for (auto& s : memory_option_specs()) specs.push_back(s);
  Args args("chat", "talk with the model in the terminal", "ds41 chat [-m DIR] [--think] [--system TEXT]", specs);
  if (!args.parse(argc, argv)) return 0;
  const std::string dir = model_dir_or_demo(args);
  Tokenizer tok = load_model_tokenizer(dir, args.get_or("tokenizer", ""));
  const SamplerOptions so = sampler_options_from(args);
  const Model::LoadOptions load_options = load_options_arg(args);
  ThreadPool pool(resolve_threads(args.get_int("threads", 0)));
  std::unique_ptr<Model> model;
  {
    ProgressBar bar("loading");
    model = Model::load(dir, [&](const char* stage, int64_t d, int64_t t) { bar.update(stage, d, t); }, load_options);
  }
  report_memory_plan(*model);
  model->restrict_output_ids(tok.ids_with_a_token(model->config().vocab_size));  // never an id without a token
  Conversation conv(*model, tok, so, &pool);
  conv.set_system(args.get_or("system", ""));
  conv.prompt_options().thinking_mode = args.flag("think") ? ThinkingMode::thinking : ThinkingMode::chat;
  conv.prompt_options().reasoning_effort = parse_reasoning_effort(args.get_or("effort", "high"));
  const int64_t chunk = args.get_int("chunk", 0);
  GenerationLimits limits;
  limits.max_tokens = args.get_int("max-tokens", 2048);
  if (limits.max_tokens < 1) throw Error("--max-tokens must be >= 1");
  limits.cancel = &g_interrupt;

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  std::fprintf(stderr, "ds41 chat: %s (%s mode, %d threads). /help for commands, Ctrl-D to quit.\n", dir.c_str(),
               conv.prompt_options().thinking_mode == ThinkingMode::thinking ? "thinking" : "chat", pool.size());
  TurnResult last;
  bool have_last = false;
  for (;;) {
    g_interrupt = false;
    char* line_c = readline(">>> ");
    if (!line_c) {
      std::fprintf(stderr, "\n");
      break;
    }
    std::string line(line_c);
    std::free(line_c);
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    add_history(line.c_str());
    try {
      if (line[0] == '/') {
        const size_t sp = line.find(' ');
        const std::string cmd = line.substr(0, sp);
        const std::string arg = sp == std::string::npos ? "" : line.substr(line.find_first_not_of(' ', sp) == std::string::npos ? line.size() : line.find_first_not_of(' ', sp));
        if (cmd == "/quit" || cmd == "/exit") break;
        if (cmd == "/help") std::fputs(kChatHelp, stdout);
        else if (cmd == "/reset") {
          conv.reset();
          std::printf("(conversation cleared)\n");
        } else if (cmd == "/system") {
          conv.set_system(arg);
          std::printf(arg.empty() ? "(system prompt cleared)\n" : "(system prompt set)\n");
        } else if (cmd == "/think" || cmd == "/nothink") {
          conv.prompt_options().thinking_mode = cmd == "/think" ? ThinkingMode::thinking : ThinkingMode::chat;
          std::printf("(%s mode)\n", cmd == "/think" ? "thinking" : "chat");
        } else if (cmd == "/effort") {
          conv.prompt_options().reasoning_effort = parse_reasoning_effort(arg);
          std::printf("(reasoning effort %d)\n", conv.prompt_options().reasoning_effort);
        } else if (cmd == "/save") {
          if (arg.empty()) throw Error("/save FILE: give a file name");
          conv.save(arg);
          std::printf("(saved to %s and %s.chat.json)\n", arg.c_str(), arg.c_str());
        } else if (cmd == "/load") {
          if (arg.empty()) throw Error("/load FILE: give a file name");
          conv.load(arg);
          std::printf("(loaded %zu messages, %lld tokens)\n", conv.messages().size(), (long long)conv.state().pos);
        } else if (cmd == "/stats") {
          if (!have_last) std::printf("(no answer yet)\n");
          else
            std::printf("prompt %lld tokens (%lld reused) | prefill %.2f s | first token %.2f s | %lld tokens at %.1f tok/s | %s\n",
                        (long long)last.prompt_tokens, (long long)last.reused_tokens, last.stats.prefill_s,
                        last.stats.time_to_first_token_s, (long long)last.stats.generated_tokens,
                        last.stats.decode_tokens_per_s(), finish_reason_name(last.stats.finish));
        } else {
          std::printf("unknown command %s (/help lists them)\n", cmd.c_str());
        }
        continue;
      }
      ReplyPrinter printer;
      PrefillProgress prefill_progress(0);
      conv.set_prefill_progress([&prefill_progress](int64_t done, int64_t total) { prefill_progress(done, total); });
      last = conv.ask(line, limits, [&](const ReplyEvent& e) { printer.print(e); }, chunk);
      have_last = true;
      printer.finish();
      if (last.stats.finish == FinishReason::Cancelled) std::printf("(stopped)\n");
      else if (last.stats.finish != FinishReason::Stop) std::printf("(answer cut: %s)\n", finish_reason_name(last.stats.finish));
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace ds41::cli
