#include "cli/model_files.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/error.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"

namespace ds41::cli {

namespace fs = std::filesystem;

std::string demo_model_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path cache = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  fs::path dir = cache / "ds41" / "tiny";
  if (!fs::exists(dir / "model.safetensors.index.json")) {
    std::fprintf(stderr, "no model given (-m DIR); writing the built-in demo model (random weights) to %s\n",
                 dir.string().c_str());
    RandomCheckpointOptions opt;
    opt.seed = 0;
    write_random_checkpoint(preset_config("tiny"), dir.string(), opt);
  }
  return dir.string();
}

std::string model_dir_or_demo(const Args& args) {
  std::string dir = args.get_or("model", args.get_or("m", ""));
  return dir.empty() ? demo_model_dir() : dir;
}

Tokenizer load_model_tokenizer(const std::string& dir, const std::string& override_file) {
  if (!override_file.empty()) return Tokenizer::load(override_file);
  const fs::path file = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(file))
    throw Error(file.string() + ": not found. Text input needs the model's tokenizer.json in the checkpoint directory " +
                dir + " (copy it there, give --tokenizer FILE, or write a test model with `ds41 mkmodel --tokenizer FILE`)");
  return Tokenizer::load(file.string());
}

}  // namespace ds41::cli
