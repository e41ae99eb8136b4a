// Finding a model's files for the CLI: the checkpoint directory (or the built-in demo model) and
// its tokenizer, with errors that say which file is missing and where.
#pragma once

#include <string>

#include "cli/args.h"
#include "text/tokenizer.h"

namespace ds41::cli {

// -m/--model DIR, or the demo model (written to the cache folder on first use).
std::string model_dir_or_demo(const Args& args);
std::string demo_model_dir();
// `override_file` if given, else DIR/tokenizer.json; throws ds41::Error naming what is missing.
Tokenizer load_model_tokenizer(const std::string& dir, const std::string& override_file);

}  // namespace ds41::cli
