// `ds41 run --dspark`: generation with DSpark speculative decoding (runtime/speculative.h),
// called from cmd_run with what it parsed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.h"
#include "model/model.h"
#include "runtime/sampler.h"

namespace ds41 {
class ThreadPool;
}

namespace ds41::cli {

struct RunSettings {
  std::string model_dir;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplerOptions sampling;
  ForwardOptions forward;
  int64_t chunk = 0;
  bool json = false;
  std::string load_path, save_path;
  double load_s = 0;
  int64_t start_pos = 0;  // sequence length before the prompt (a loaded session)
};

// The options it reads from `args`: draft-tokens, dspark-confidence, compare.
extern const std::vector<OptionSpec> kDsparkRunOptions;

// Whether --dspark was given; its sub-options without it are an error rather than ignored.
bool dspark_requested(const Args& args);

int run_dspark(const Args& args, const Model& model, SequenceState& st, const RunSettings& s, ThreadPool& pool);

}  // namespace ds41::cli
