// DSpark draft head (spec engram_dspark_vision.md §B): the `mtp.*` stages that propose the next
// tokens from the target model's hidden states. Types shared by Model's drafting methods
// (defined in model/dspark.cpp) and the speculative loop (runtime/speculative.h).
//
// Data flow (§B.3-§B.5): every committed position p contributes one main-KV row per stage,
// derived from the target's `main_hidden` at p (main_proj -> main_norm -> the stage's own
// wkv/kv_norm/RoPE/FP8 QDQ), stored in the stage's window ring. A draft is a block of
// `dspark_block_size` slots [token, noise, ..., noise] at positions t+1 .. t+block (t = the last
// committed position): the stages run the backbone block recipe over it with DSpark attention
// (the whole ring plus the whole block, bidirectional inside the block, plain RoPE), then the
// shared head gives base logits, a Markov head adds a bias from the previous token of the chain
// (so the drafts are picked one after another), and a confidence head scores each slot.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ds41 {

// One draft: drafts[k] was picked from logits row k (slot k, which predicts position t+2+k).
struct DSparkDraft {
  int32_t token = 0;               // slot 0: the target's last sampled token
  std::vector<int32_t> drafts;     // d1 .. dn
  std::vector<float> logits;       // [n][vocab] fp32, Markov bias included
  std::vector<float> confidence;   // [n] raw confidence logits; sigmoid = P(draft k accepted | k-1 were)
};

// Picks draft k+1 from slot k's (Markov-corrected) logits. Must return a token id; an empty
// function means argmax (the reference at temperature 0).
using DraftPicker = std::function<int32_t(int k, const float* logits, int64_t vocab)>;

}  // namespace ds41
