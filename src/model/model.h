// The DeepSeek-V4.1 text backbone on CPU: load a checkpoint, run forward calls over sequences.
//
// One call shape serves everything: `forward(state, tokens)` runs the S tokens at positions
// state.pos .. state.pos+S-1 — prefill at 0, single-token decode, and the general chunk at
// start_pos > 0 with S > 1 that chunked prefill and speculative verification need (the reference
// has no such call). Every per-row computation is the same whatever the call shape, so prefill,
// token-by-token decode and any chunking give bit-identical logits (with the default numerics; see
// ForwardOptions::corrected_index_keys and reference_call_shapes).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/dspark.h"
#include "model/engram_hash.h"
#include "model/head_screen.h"
#include "model/layer_plan.h"
#include "model/sequence_state.h"
#include "model/expert_cache.h"
#include "model/weights.h"

namespace ds41 {

class ThreadPool;

// File name of a precomputed Engram compressed token map inside a checkpoint directory (format in
// text/compressed_vocab.h); `ds41 mkmodel` writes one when no tokenizer is given.
inline constexpr const char* kEngramMapFileName = "engram_compressed_vocab.bin";

// How a forward call runs the decoder layers (CED: tech report §2.2 and §3.2.2, seed §3).
enum class PrefillMode {
  Full,  // every layer over every token: exact
  // A call longer than the window runs the encoder layers (before ModelPlan::decoder_start) over
  // every token and the decoder layers over its last `window_size` tokens only, their windows
  // starting at the first of them (bounded replay). The decoder's global KV is still built for
  // every token (exact); the decoder's window rings are approximate. Calls no longer than the
  // window are identical to Full.
  Ced,
};

struct ForwardOptions {
  // true (default) = every indexer reads its own kv source's index keys: the reference's prefill
  // reading, carried into every call, so a sequence's tokens do not depend on how it was cut
  // into calls (prefill, decode, chunks, sessions, prefix-cache hits).
  // false = the reference's decode reading: an index source reads the index keys most recently
  // *published*, and a kv source publishes only in a call where its compressor emitted a latent,
  // so at a decode step that leaves a ratio-2 group incomplete the ratio-2 indexers score against
  // stale keys of another layer (spec §5.5 pitfall; discussed publicly on the model's HF page).
  // `ds41 conform` uses it for the golden cases' decode calls; `--reference-index-keys` elsewhere.
  bool corrected_index_keys = true;
  // false (default) = numerics that depend on the position alone, so prefill, decode and any
  // chunking give the same values. true = the reference's, which depend on the call shape (used
  // by `ds41 conform`; the last bits of values move, never a rule of the model):
  //  - the attention list's window segment (model/attention.cpp): min(S, W) slots in a call at
  //    position 0, unfilled ring slots first in later calls, which moves its 64-entry
  //    online-softmax blocks (values at positions below W - 1 only);
  //  - PyTorch's scalar tail: the last (n mod 16) elements of the call's [S][n / S] tensors take
  //    libm's exp (and log1p) instead of SLEEF's, in the hyper-connection pre/post sigmoids, the
  //    router's softplus and Engram's gate sigmoid (kernels/vector_exp.h torch_scalar_tail_from).
  bool reference_call_shapes = false;
  bool all_logits = false;  // logits for every position of the call, not just the last
  // When set, receives the DSpark drafter's input for every position of the call (spec §B.3):
  // [S][n_targets * dim] bf16, the hc-mean of each target layer's input stream in layer order.
  // A CED prefill that narrows the call fills decoder-layer targets for its last window_size rows
  // only (zeros before): the rows Model::dspark_commit reads.
  std::vector<uint16_t>* main_hidden_out = nullptr;
  PrefillMode prefill = PrefillMode::Full;
  // Bounded replay (tech report §3.2.2): the call re-runs the last tokens of a sequence whose global
  // caches (compressed KV, index keys, compressor partial groups) already hold them, to rebuild the
  // window rings. Compressors do not run, and every layer's window starts at the call's first
  // position. The caches must end exactly where the call ends. See Model::replay_window.
  bool bounded_replay = false;
  // Logits the caller needs from the LM head, per returned position (model/head_screen.h): 0 =
  // all of them; k in 1..HeadScreen::kMaxTopK = only the k largest: every other logit may come
  // back -inf, while the k largest, their order and their ties are exactly the full product's
  // (greedy decoding needs k = 1). Up to HeadScreen::kMaxVectors returned positions (all_logits
  // calls, batched steps); more get all logits. Negative: all of them, and Generation does not
  // choose a k itself (runtime/generation.h).
  int head_top_k = 0;
  // Observation only (progress displays): called after each main-model layer of the call with the
  // layers done and their count.
  std::function<void(int done, int total)> on_layer;
};

// What the head screen did for a call that asked for the top logits: decided them; ran and fell
// back to the full product (it could not narrow the vocabulary); or was skipped because recent
// calls fell back (HeadScreenBackoff), the full product running directly.
enum class HeadScreenOutcome { Decided, FellBack, Skipped };

// Observation and intervention points, used by `ds41 dump` and `ds41 conform` (teacher forcing,
// replayed decisions). All optional; arrays are [S][...] row-major for the current call.
struct ForwardHooks {
  // Before block L runs (after its Engram): may overwrite the stream X [S][hc][dim] bf16 and the
  // incoming pre-mix a_in [S][hc] fp32.
  std::function<void(int layer, int S, uint16_t* X, float* a_in)> before_block;
  // After block L: its output stream and the FFN pre-mix it hands to block L+1.
  std::function<void(int layer, int S, const uint16_t* X, const float* pre_mix)> after_block;
  // Replace the indexer's choice for query s of index-source layer L: entry ids, ascending (its
  // scores, and at the candidate source the candidate pool, are still the engine's own).
  std::function<std::optional<std::vector<int32_t>>(int layer, int s)> pin_topk;
  // Replace the router's choice for token s of layer L (`k` ids in the reference's order).
  std::function<bool(int layer, int s, int32_t* ids)> pin_experts;
  // Decisions as made (after any pinning).
  std::function<void(int layer, int s, const std::vector<int32_t>& entries)> on_topk;
  std::function<void(int layer, int s, const int32_t* ids, int k)> on_experts;
  // The compressed entries query s of layer L attended to (any compressed layer, Reuse included).
  std::function<void(int layer, int s, const std::vector<int32_t>& entries)> on_attention_entries;
  // The candidate pool built for query s at the candidate-source layer (keep flag per entry).
  std::function<void(int layer, int s, const std::vector<uint8_t>& keep)> on_candidates;
  // A call with ForwardOptions::head_top_k > 0 and a head screen: what the screen did, and how
  // many rows' exact logits it computed.
  std::function<void(HeadScreenOutcome outcome, int64_t candidates)> on_head_screen;
};

// Token type of a position (spec engram_dspark_vision.md §C.3): text, or one of the four kinds of
// image-span position. All span positions carry the image token id; only the type tells them
// apart (and selects the learned delimiter rows and the VL routing bias).
enum class TokenType : int8_t { Text = -1, ImageStart = 0, Image = 1, ImageNewline = 2, ImageEnd = 3 };

// Inputs of a forward call besides the token ids (spec §C.6): the token type of every position,
// and for every position whose type is not Text, in position order, the bf16 row that replaces
// its token embedding (image_start / image_newline / image_end, or the aligner row of an IMAGE
// slot). Those positions also route with gate.bias_vl instead of gate.bias and are dead for
// Engram (no n-gram through them, gate 0). Every position is independent, so a span may be split
// across calls: prefill, decode and chunked prefill stay bit-identical (slice() cuts a call).
struct InputEmbeddings {
  std::vector<int8_t> token_types;  // one TokenType per token of the call
  std::vector<uint16_t> rows;       // [count of non-text positions][dim] bf16

  // Positions [begin, end) of these inputs, for a call over that part of the tokens.
  InputEmbeddings slice(int64_t begin, int64_t end, int64_t dim) const;
  bool all_text() const;
};

class Model {
 public:
  // Opens a checkpoint directory, validates config and tensors (every problem in one error),
  // and prepares the weights (zero-copy where the layout allows). `progress(stage, done, total)`
  // reports the steps for a progress display: "validating" (tensors), "preparing" (layers).
  using LoadProgress = std::function<void(const char* stage, int64_t done, int64_t total)>;
  // Within a memory budget (model/expert_cache.h, MemoryPlan): where the weights a token reads
  // whole do not fit, the routed experts are streamed from disk through an ExpertCache; a budget
  // too small even for that is refused (Error) with the smallest one that runs.
  struct LoadOptions {
    int64_t mem_budget = 0;    // bytes; 0: default_memory_budget()
    int64_t expert_slots = 0;  // > 0: stream the routed experts through this many slots whatever the budget
    int io_threads = 8;        // reads in flight for the expert cache
    // Expert parallelism (model/expert_parallel.h): the routed experts this process holds, and on
    // rank 0 the transport to the other ranks (which load theirs as this one loads).
    ExpertShare share;
    std::shared_ptr<ExpertParallel> expert_parallel;
  };
  static std::unique_ptr<Model> load(const std::string& dir, const LoadProgress& progress = {});
  static std::unique_ptr<Model> load(const std::string& dir, const LoadProgress& progress, const LoadOptions& options);
  const MemoryPlan& memory_plan() const { return memory_plan_; }
  // A hash of the config and every tensor's name, type, shape and size: equal on every rank of an
  // expert-parallel job, whatever each loads.
  uint64_t checkpoint_fingerprint() const { return checkpoint_fingerprint_; }

  // Expert parallelism, on a follower rank: routed experts ids[0 .. n) of plan layer `layer` (all
  // this rank's, ascending) over rows grouped by expert (first[i] .. first[i + 1] of xin
  // [rows][dim] are ids[i]'s, with their routing weights): out [rows][dim], as rank 0's MoE would
  // compute them. Throws ds41::Error on a layer or expert this process does not hold.
  void expert_products(int layer, const int32_t* ids, int n, const int64_t* first, const uint16_t* xin,
                       const float* route_w, uint16_t* out, ThreadPool* pool) const;

  const ModelConfig& config() const { return config_; }
  const ModelPlan& plan() const { return plan_; }
  const ModelWeights& weights() const { return weights_; }
  const std::vector<int32_t>& compressed_vocab() const { return compressed_vocab_; }
  // Engram hashing constants; null for a model without Engram layers.
  const EngramHashParams* engram_hash() const { return engram_hash_.get(); }
  SequenceState new_sequence() const { return make_sequence_state(config_, plan_); }

  // Runs `tokens` at state.pos and advances the state. Returns fp32 logits: [1][vocab] for the
  // last position, or [S][vocab] with opt.all_logits. `inputs` (optional) gives the token types
  // and the embedding rows of image-span positions (see InputEmbeddings); without it every
  // position is text.
  std::vector<float> forward(SequenceState& state, const std::vector<int32_t>& tokens, const ForwardOptions& opt,
                             ThreadPool* pool, const ForwardHooks* hooks = nullptr,
                             const InputEmbeddings* inputs = nullptr) const;
  // Same, into `logits` (resized; its capacity is reused). With the sequence's caches reserved
  // (reserve_sequence) and after a first call of the same shape, a call allocates nothing.
  void forward_into(std::vector<float>& logits, SequenceState& state, const std::vector<int32_t>& tokens,
                    const ForwardOptions& opt, ThreadPool* pool, const ForwardHooks* hooks = nullptr,
                    const InputEmbeddings* inputs = nullptr) const;

  // One decode step of several sequences in one pass: tokens[b] at states[b]->pos, for each b;
  // logits [B][vocab]. The linears, MoE experts and Engram run once over all rows, attention per
  // sequence; each row's logits and state equal a one-token forward_into of its sequence bit for
  // bit (tests/slow/batch_forward_test.cpp). Text tokens only; no hooks, replay, CED, drafter
  // capture or journaled (speculative) sequences; each sequence at most once.
  void forward_batch(std::vector<float>& logits, const std::vector<SequenceState*>& states,
                     const std::vector<int32_t>& tokens, const ForwardOptions& opt, ThreadPool* pool) const;

  // Rebuilds every layer's window ring of a sequence whose global caches are complete but whose
  // rings are not (a compact session): re-runs its last min(window_size, pos) tokens — which the
  // state's history must hold — as a bounded replay (model/replay.cpp). When pos <= window the
  // replay recomputes the rings exactly (with the reference's index-key reading only if the
  // sequence was fed in one call: that reading depends on the call pattern); beyond, the first
  // replayed positions see a truncated window. Returns the last position's logits. `opt` supplies
  // the numerics options (corrected_index_keys).
  // Refuses (ds41::Error) a window holding image-span positions: see replay_window_has_images.
  std::vector<float> replay_window(SequenceState& state, const ForwardOptions& opt, ThreadPool* pool) const;
  // Whether the last min(window_size, pos) positions include image-span positions (the image
  // token id with vision on, or an Engram-dead position). A replay re-embeds tokens, and those
  // positions' rows came from the vision tower, so such a window cannot be replayed.
  bool replay_window_has_images(const SequenceState& state) const;

  // ---- DSpark drafting (model/dspark.cpp, spec §B) ------------------------------------------
  bool has_dspark() const { return config_.dspark_enabled(); }
  // Appends `rows` committed positions to the draft rings: main_hidden [rows][n_targets * dim]
  // (ForwardOptions::main_hidden_out) for positions state.dspark_pos .. +rows-1, which the target
  // must already have consumed. Only the last `window` rows can matter, so only they are
  // projected. The reference's prefill call of forward_spec is exactly this.
  void dspark_commit(SequenceState& state, const uint16_t* main_hidden, int64_t rows, ThreadPool* pool) const;
  // Drafts `n_drafts` (1 .. dspark_block_size) tokens after `token`, the token at position
  // state.dspark_pos (not yet in the rings). Reads the rings only. `pick` chooses each draft from
  // its slot's logits (empty = argmax); hooks see the stages' routing like the backbone's.
  DSparkDraft dspark_draft(SequenceState& state, int32_t token, int n_drafts, const DraftPicker& pick,
                           ThreadPool* pool, const ForwardHooks* hooks = nullptr) const;
  // The same into `out`, whose vectors keep their capacity (a speculative loop allocates nothing
  // once they have grown).
  void dspark_draft_into(DSparkDraft& out, SequenceState& state, int32_t token, int n_drafts, const DraftPicker& pick,
                         ThreadPool* pool, const ForwardHooks* hooks = nullptr) const;

  // Cuts `state` back to its first keep_pos positions after forward calls made with
  // state.journal attached (speculative verification, spec §B.8): the journaled in-place writes
  // of later positions are undone newest first, the append-only caches and histories truncated,
  // the index-key publisher recomputed. The result equals the state of a sequence that consumed
  // only those positions, bit for bit. The DSpark rings must not hold positions beyond keep_pos.
  void rollback(SequenceState& state, int64_t keep_pos) const;

  // Only ids with allowed[id] != 0 are ever produced (ids at or beyond allowed.size() are not):
  // every head product (forward, batched steps, DSpark drafts) gives the others -inf, and the
  // head screen never picks them. For a tokenizer that has no token for some of the model's rows
  // (the released vocabulary is padded: 128,815 tokenizer ids in the V3 file, 129,280 rows), so
  // that no sampled, greedy or drafted id lacks a token. Empty: every id. Call before generating
  // (not while other threads run forward calls).
  void restrict_output_ids(std::vector<uint8_t> allowed);
  // Whether `id` may be produced.
  bool output_id_allowed(int64_t id) const {
    return output_allowed_.empty() || (id >= 0 && id < int64_t(output_allowed_.size()) && output_allowed_[size_t(id)]);
  }

  // The LM head's int8 screen for calls with ForwardOptions::head_top_k > 0, built on first use
  // (nullptr if the head cannot have one: model/head_screen.h). Thread-safe.
  const HeadScreen* head_screen(ThreadPool* pool) const;

 private:
  Model() = default;
  // One forward pass over every layer (forward_into checks the inputs and splits a call that
  // the reference's per-row index-key reading cannot run in one pass).
  void forward_call(std::vector<float>& logits, SequenceState& state, const std::vector<int32_t>& tokens,
                    const ForwardOptions& opt, ThreadPool* pool, const ForwardHooks* hooks, const InputEmbeddings* inputs,
                    const std::vector<uint8_t>* image_mask) const;
  // logits [rows][vocab] from the final hidden rows hf [rows][dim]: the head screen where
  // opt.head_top_k asks for it and it decides (reported to hooks->on_head_screen), else the whole
  // head product.
  void head_logits(const float* hf, int64_t rows, const ForwardOptions& opt, ThreadPool* pool,
                   const ForwardHooks* hooks, float* logits) const;
  // -inf at the ids that may not be produced, in `rows` rows of logits.
  void mask_disallowed_output(float* logits, int64_t rows) const;
  ModelConfig config_;
  std::vector<uint8_t> output_allowed_;     // [vocab_size] or empty (every id)
  std::vector<int32_t> output_disallowed_;  // the ids it excludes, ascending
  ModelPlan plan_;
  ModelWeights weights_;
  MemoryPlan memory_plan_;
  uint64_t checkpoint_fingerprint_ = 0;
  mutable std::once_flag head_screen_once_;
  mutable std::unique_ptr<HeadScreen> head_screen_;
  mutable HeadScreenBackoff head_screen_backoff_;
  std::vector<float> inv_freq_plain_, inv_freq_compressed_;
  // Engram: raw token id -> compressed id (spec §A.2), and the hashing constants (§A.3-§A.4).
  std::vector<int32_t> compressed_vocab_;
  std::unique_ptr<EngramHashParams> engram_hash_;
};

}  // namespace ds41
