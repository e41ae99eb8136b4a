// A multi-turn conversation over one sequence: messages in, the official prompt encoding of the
// whole conversation each turn, and only the tokens that are new fed to the model.
//
// Re-encoding the whole conversation is what keeps the prompt exact (in thinking mode an earlier
// turn loses its reasoning and its "<think>" header becomes "</think>", spec D.4), and it is
// cheap because the sequence is reused: when the tokens already in the sequence are a prefix of
// the new prompt only the rest is fed; otherwise the state saved before the previous turn's
// assistant header (which every later prompt shares) is restored and the rest fed from there.
// Either way the logits equal those of a fresh prefill of the whole prompt (prefill in pieces is
// bit-exact, tests/slow/forward_consistency_test.cpp).
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "runtime/generation.h"
#include "runtime/sampler.h"
#include "text/prompt_encoder.h"
#include "text/reply_parser.h"

namespace ds41 {

class Tokenizer;
class ThreadPool;

struct TurnResult {
  ParsedReply reply;
  GenerationStats stats;
  std::vector<int32_t> generated;  // token ids of the answer
  int64_t prompt_tokens = 0;       // tokens of the whole encoded conversation
  int64_t reused_tokens = 0;       // of those, already in the sequence (not prefilled again)
};

class Conversation {
 public:
  Conversation(const Model& model, const Tokenizer& tokenizer, const SamplerOptions& sampling, ThreadPool* pool,
               ForwardOptions forward = {});

  PromptOptions& prompt_options() { return prompt_; }
  void set_system(const std::string& text);  // empty = none; applies from the next turn
  void reset();                              // forget every message and the sequence
  const nlohmann::ordered_json& messages() const { return messages_; }

  // Adds the user message, prefills what is new, generates (events streamed to `on_event` as
  // they are parsed) and records the answer as an assistant message. A cancelled answer is kept
  // as far as it got.
  TurnResult ask(const std::string& user_text, const GenerationLimits& limits,
                 const std::function<void(const ReplyEvent&)>& on_event = {}, int64_t prefill_chunk = 0);
  // Called while ask() prefills: (done, total) over what the turn prefills, in token-layers.
  void set_prefill_progress(std::function<void(int64_t, int64_t)> f) { prefill_progress_ = std::move(f); }

  // Saves the conversation: `path` holds the sequence (an exact session) and `path + ".chat.json"`
  // the messages and options; both written atomically. load() checks that the two agree.
  void save(const std::string& path);
  void load(const std::string& path);

  const SequenceState& state() const { return gen_->state(); }

 private:
  std::function<void(int64_t, int64_t)> prefill_progress_;
  std::vector<int32_t> encode_conversation(bool for_generation) const;
  void start_sequence(const std::vector<int32_t>& ids, TurnResult& r, int64_t chunk);

  const Model& model_;
  const Tokenizer& tok_;
  SamplerOptions sampling_;
  ThreadPool* pool_;
  ForwardOptions forward_;
  PromptOptions prompt_;
  std::string system_;
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  std::unique_ptr<Generation> gen_;
  std::vector<int32_t> seq_ids_;  // tokens in the sequence, the pending one included
  // State before the last assistant header of the previous prompt, and its tokens.
  std::optional<SequenceState> snapshot_;
  std::vector<int32_t> snapshot_ids_;
  int32_t eos_ = 1, assistant_ = -1;
};

}  // namespace ds41
