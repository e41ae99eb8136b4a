// `ds41 run --dspark`: generation with DSpark speculative decoding (runtime/speculative.h),
// called by cmd_run in place of its Generation loop; cmd_run prints the tokens and timings.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "model/model.h"
#include "runtime/generation.h"
#include "runtime/sampler.h"

namespace ds41 {
class ThreadPool;
}

namespace ds41::cli {

struct RunSettings {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplerOptions sampling;
  ForwardOptions forward;
  int64_t chunk = 0;
  const InputEmbeddings* inputs = nullptr;  // token types and image rows of the prompt (optional)
  bool commit_last = false;  // feed the last generated token too (before saving a session)
};

struct DsparkRunResult {
  GenerationStats stats;   // as Generation reports them (prefill, first token, decode, finish)
  nlohmann::json dspark;   // draft settings, cycles, acceptance, phase times; --compare results
};

// The options it reads from `args`: draft-tokens, dspark-confidence, compare.
extern const std::vector<OptionSpec> kDsparkRunOptions;

// Whether --dspark was given; its sub-options without it are an error rather than ignored.
bool dspark_requested(const Args& args);

// Feeds the prompt to `st` and generates up to s.max_tokens tokens (stopping after EOS), calling
// on_token(id, logits) for each with the target logits it was chosen from (plain decoding's row);
// on_token may return false to stop. Draws are keyed by position like Generation's, so the first
// token, and with greedy decoding every token, is what `ds41 run` without --dspark gives.
DsparkRunResult run_dspark(const Args& args, const Model& model, SequenceState& st, const RunSettings& s, ThreadPool& pool,
                           const std::function<bool(int32_t, const float*)>& on_token);

// The human-readable lines of a DsparkRunResult::dspark report, on stderr.
void print_dspark_summary(const nlohmann::json& dspark);

}  // namespace ds41::cli
