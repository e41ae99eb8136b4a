// `ds41 prompt`: the prompt text the model reads for an OpenAI-style conversation, for debugging
// (spec D.4). The messages file is what the reference's generate.py reads: {"messages": [...],
// "tools": [...]} (optionally "context", "thinking_mode", "reasoning_effort"), a bare message
// array, or an array of such objects.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_files.h"
#include "text/prompt_encoder.h"

namespace ds41::cli {

namespace {

nlohmann::ordered_json read_messages_file(const std::string& path) {
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open the messages file");
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

int cmd_prompt(int argc, char** argv) {
  Args args("prompt", "print the prompt text of a conversation",
            "ds41 prompt --messages F.json [--think|--no-think] [--effort N] [--keep-thinking] [--no-bos] [--json]",
            {{"messages", "FILE", "conversation: {\"messages\": [...], \"tools\": [...]} or a message array (- = stdin)", ""},
             {"think", "", "thinking mode (default: the file's thinking_mode, else chat)", ""},
             {"no-think", "", "chat mode", ""},
             {"effort", "N", "reasoning effort: low (50), medium or high (75), max (100) or 1..100 (default: the file's, else high)", ""},
             {"keep-thinking", "", "keep the reasoning of earlier assistant turns (drop_thinking off)", ""},
             {"no-bos", "", "do not start with the begin-of-sentence text", ""},
             {"json", "", "print {\"prompt\": ..., \"images\": [...]} (an array for several cases); else each prompt and a newline", ""},
             {"model", "DIR", "not needed: the prompt text does not depend on the checkpoint (checked to exist)", ""}});
  if (!args.parse(argc, argv)) return 0;
  const auto path = args.get("messages");
  if (!path) throw Error("ds41 prompt: give --messages FILE (see ds41 prompt --help)");
  if (args.flag("think") && args.flag("no-think")) throw Error("ds41 prompt: --think and --no-think exclude each other");
  const std::string dir = model_dir_arg(args);
  if (!dir.empty() && !std::filesystem::is_directory(dir)) throw Error(dir + ": no such model directory");

  const std::vector<PromptCase> cases = load_prompt_cases(read_messages_file(*path));
  std::optional<int> effort;
  if (auto e = args.get("effort")) effort = parse_reasoning_effort(*e);

  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  std::string text;
  for (const PromptCase& c : cases) {
    PromptOptions o;
    o.thinking_mode = args.flag("think")      ? ThinkingMode::thinking
                      : args.flag("no-think") ? ThinkingMode::chat
                                              : c.thinking_mode.value_or(ThinkingMode::chat);
    o.reasoning_effort = effort.value_or(c.reasoning_effort.value_or(75));
    o.drop_thinking = !args.flag("keep-thinking");
    o.add_bos = !args.flag("no-bos");
    EncodedPrompt p = encode_prompt(c.messages, o, c.context);
    text += p.text + "\n";
    results.push_back({{"prompt", p.text}, {"images", p.images}});
  }
  if (args.flag("json")) {
    const auto& out = results.size() == 1 ? results[0] : results;
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  return 0;
}

}  // namespace ds41::cli
