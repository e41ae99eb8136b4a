// Finding a model's files for the CLI: the checkpoint directory (or the built-in demo model) and
// its tokenizer, with errors that say which file is missing and where.
#pragma once

#include <string>

#include "cli/args.h"
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
// `override_file` if given, else DIR/tokenizer.json; throws ds41::Error naming what is missing.
Tokenizer load_model_tokenizer(const std::string& dir, const std::string& override_file);

}  // namespace ds41::cli
