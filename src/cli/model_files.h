// Finding a model's files for the CLI: the checkpoint directory (or the built-in demo model) and
// its tokenizer, with errors that say which file is missing and where.
#pragma once

#include <cstdint>
#include <string>

#include "cli/args.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace ds41::cli {

// Throws ds41::Error naming `what` when `path` cannot be opened for writing (checked before long
// work whose result would go there; a file created by the check is removed again).
void check_writable(const std::string& path, const std::string& what);

// The model directory: --model / -m DIR, or the command's one positional argument (ds41 run DIR);
// empty when neither is given. Any other positional argument is an error.
std::string model_dir_arg(const Args& args);

// -m/--model DIR, or the demo model (written to the cache folder on first use).
std::string model_dir_or_demo(const Args& args);
std::string demo_model_dir();
// --ctx / -c: the context length in tokens, 0 or above the model's max_seq_len meaning
// max_seq_len (the latter with a warning on stderr); negative is an error.
int64_t context_length_arg(const Args& args, int64_t max_seq_len);

// --mem-budget SIZE and --io-threads N of the commands that load a model (run, chat, serve,
// bench): their option specs, and the Model::LoadOptions they give (model/expert_cache.h).
std::vector<OptionSpec> memory_option_specs();
Model::LoadOptions load_options_arg(const Args& args);
// The memory plan chosen at load, one line on stderr ("ds41: memory budget ...").
void report_memory_plan(const Model& model);

// `override_file` if given, else DIR/tokenizer.json; throws ds41::Error naming what is missing.
Tokenizer load_model_tokenizer(const std::string& dir, const std::string& override_file);

}  // namespace ds41::cli
