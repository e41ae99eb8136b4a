// The backbone forward pass (spec backbone.md §4, §7, §9): embedding -> hc copies -> blocks
// (Engram, attention and MoE between hc_pre / hc_post, single-pass coefficients) -> collapse with
// the last FFN pre-mix -> final norm -> fp32 head.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <new>

#include "base/error.h"
#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/hyper_connection.h"
#include "kernels/numeric_formats.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "model/forward_context.h"
#include "model/split_checkpoint.h"
#include "model/weight_catalogue.h"
#include "text/compressed_vocab.h"

namespace ds41 {

namespace {

// Whether a call reads index keys row by row as decode does (ForwardContext::publisher_before_row):
// only journaled calls (speculative verification) at start_pos > 0 with the reference's reading.
// Other calls read at call level, so a chunked prefill reads as a one-call prefill does.
bool rowwise_key_reading(const ForwardOptions& opt, const SequenceState& state) {
  return state.journal && state.pos > 0 && !opt.corrected_index_keys;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadProgress& progress) {
  return load(dir, progress, LoadOptions{});
}

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadProgress& progress, const LoadOptions& options) {
  if (!std::filesystem::is_directory(dir)) throw Error(dir + ": not a directory (expected a checkpoint directory)");
  std::unique_ptr<Model> m(new Model());
  m->config_ = load_model_dir_config(dir);
  validate_config(m->config_);
  m->plan_ = build_model_plan(m->config_);
  const ExpertShare& share = options.share;
  if (share.ranks < 1 || share.rank < 0 || share.rank >= share.ranks) throw Error("expert parallelism: bad rank");
  // The followers load their experts while this rank loads the rest.
  if (options.expert_parallel)
    options.expert_parallel->begin_load({dir, options.mem_budget, options.expert_slots, options.io_threads});
  auto store = std::make_shared<TensorStore>(TensorStore::open(dir));
  const int64_t n_tensors = int64_t(store->size());
  if (progress) progress("validating", 0, n_tensors);
  // A copy made by `ds41 split` for one rank holds only what that rank reads.
  const std::optional<SplitMarker> split = read_split_marker(dir);
  if (split && (split->ranks != share.ranks || split->rank != share.rank))
    throw Error(dir + ": this copy was split for rank " + std::to_string(split->rank) + " of " +
                std::to_string(split->ranks) + (share.ranks > 1 ? ", but it was given to rank " + std::to_string(share.rank) +
                                                                      " of " + std::to_string(share.ranks)
                                                                : ": run it under mpirun -np " + std::to_string(split->ranks)));
  const ForeignExperts foreign(m->plan_, share);
  std::vector<TensorSpec> catalogue = build_weight_catalogue(m->config_);
  if (split)
    for (TensorSpec& t : catalogue) t.required = t.required && foreign.needed(t.name);
  check_checkpoint_against_catalogue(*store, catalogue);
  if (progress) progress("validating", n_tensors, n_tensors);

  // The memory plan: the routed experts are streamed when every tensor read whole does not fit.
  MemoryPlan& mp = m->memory_plan_;
  mp.budget = options.mem_budget > 0 ? options.mem_budget : default_memory_budget(&mp.budget_source);
  if (options.mem_budget > 0) mp.budget_source = "--mem-budget";
  int64_t mapped_resident = 0;
  for (const TensorInfo& t : store->tensors()) {
    const WeightUse use = weight_use(t.name);
    if (use == WeightUse::RoutedExpert) mp.expert_bytes += foreign.foreign(t.name) ? 0 : int64_t(t.nbytes);
    else if (share.experts_only) continue;  // a follower reads its experts only
    else if (use == WeightUse::EngramTable) mp.engram_bytes += int64_t(t.nbytes);
    else mapped_resident += int64_t(t.nbytes);
  }
  const int64_t buffers = share.experts_only ? 0 : load_buffer_bytes_estimate(*store);
  mp.stream_experts = options.expert_slots > 0 || mapped_resident + buffers + mp.expert_bytes > mp.budget;
  m->checkpoint_fingerprint_ = split ? split->source_fingerprint : ds41::checkpoint_fingerprint(dir, *store);
  WeightLoadOptions wo;
  wo.memory_bytes = std::min(mp.budget, physical_ram_bytes());
  wo.experts_streamed = mp.stream_experts;
  wo.share = share;
  m->weights_ = load_model_weights(store, m->config_, m->plan_, [&](int64_t done, int64_t total) {
    if (progress) progress("preparing", done, total);
  }, wo);
  int64_t owned = -m->weights_.owned_unused_bytes;
  for (const ByteBuffer& b : m->weights_.owned) owned += int64_t(b.size());
  mp.resident_bytes = mapped_resident + owned;
  if (mp.stream_experts) {
    auto cache = std::make_shared<ExpertCache>(*store, m->plan_, std::max(1, options.io_threads), share);
    mp.slot_bytes = cache->slot_bytes();
    int most_active = 1;  // the experts one token uses in a layer: what a slot count below cannot hold
    for (const LayerPlan& lp : m->plan_.layers) most_active = std::max(most_active, lp.activated_experts);
    mp.minimum_budget = mp.resident_bytes + int64_t(most_active) * mp.slot_bytes;
    mp.slots = options.expert_slots > 0 ? options.expert_slots : (mp.budget - mp.resident_bytes) / std::max<int64_t>(1, mp.slot_bytes);
    if (options.expert_slots <= 0 && mp.slots < most_active)
      throw Error(dir + ": a memory budget of " + format_gib(mp.budget) + " (" + mp.budget_source +
                  ") is too small for this model: it needs at least " + format_gib(mp.minimum_budget) + " (" +
                  std::to_string(mp.minimum_budget) + " bytes: " + format_gib(mp.resident_bytes) +
                  " of weights every token reads, plus " + std::to_string(most_active) + " routed experts of " +
                  format_gib(mp.slot_bytes) + " streamed from disk); give --mem-budget " +
                  std::to_string((mp.minimum_budget + (1 << 20) - 1) >> 20) + "M or more");
    int64_t total_experts = 0;
    for (const LayerPlan& lp : m->plan_.layers)
      for (int e = 0; e < lp.routed_experts; ++e) total_experts += share.owns(e, lp.routed_experts);
    mp.slots = std::min(mp.slots, std::max<int64_t>(total_experts, 1));
    cache->allocate_slots(mp.slots);
    m->weights_.expert_cache = std::move(cache);
    if (const char* p = std::getenv("DS41_EXPERT_PREFETCH"); p && *p) {
      if (std::string(p) == "off") m->weights_.expert_cache->prefetch_enabled = false;
      else if (std::string(p) != "on") throw Error(std::string("DS41_EXPERT_PREFETCH=") + p + ": unknown (use on or off)");
    }
    if (const char* p = std::getenv("DS41_EXPERT_POLICY"); p && *p) {
      if (std::string(p) == "lru") m->weights_.expert_cache->policy = ExpertCache::Policy::LeastRecent;
      else if (std::string(p) != "frequency") throw Error(std::string("DS41_EXPERT_POLICY=") + p + ": unknown (use frequency or lru)");
    }
  }
  if (progress) progress("preparing", int64_t(m->plan_.layers.size()), int64_t(m->plan_.layers.size()));
  if (share.experts_only) return m;  // a follower: no embedding, attention, Engram or head
  if (options.expert_parallel) {
    options.expert_parallel->end_load(m->checkpoint_fingerprint_);
    m->weights_.expert_parallel = options.expert_parallel;
  }
  const ModelConfig& c = m->config_;
  m->inv_freq_plain_ = rope_inv_freq(int(c.rope_head_dim), c.rope_theta, 0, c.rope_factor, c.beta_fast, c.beta_slow);
  m->inv_freq_compressed_ = rope_inv_freq(int(c.rope_head_dim), c.compress_rope_theta, c.original_seq_len,
                                          c.rope_factor, c.beta_fast, c.beta_slow);
  if (!c.engram_layer_ids.empty()) {
    // The compressed token map is not part of the checkpoint (spec §A.2): a precomputed map file
    // beside the weights wins, else it is derived from the model's tokenizer.json.
    const std::filesystem::path map_file = std::filesystem::path(dir) / kEngramMapFileName;
    const std::filesystem::path tokenizer = std::filesystem::path(dir) / "tokenizer.json";
    std::string source;
    if (std::filesystem::exists(map_file)) source = map_file.string();
    else if (std::filesystem::exists(tokenizer)) source = tokenizer.string();
    else
      throw Error(dir + ": this model uses Engram, which needs the tokenizer's compressed token map: put the model's "
                        "tokenizer.json (or a precomputed " + std::string(kEngramMapFileName) + ") in the checkpoint directory");
    CompressedVocab cv = load_compressed_vocab(source, c.engram_compressed_vocab_size);
    if (cv.size() < c.vocab_size)
      throw Error(source + ": the compressed token map covers " + std::to_string(cv.size()) + " token ids but the model's vocabulary has " +
                  std::to_string(c.vocab_size));
    m->compressed_vocab_ = std::move(cv.map);
    if (c.engram_pad_id < 0 || c.engram_pad_id >= int64_t(m->compressed_vocab_.size()))
      throw Error(dir + ": engram_pad_id " + std::to_string(c.engram_pad_id) + " is not a token id");
    m->engram_hash_ = std::make_unique<EngramHashParams>(
        make_engram_hash_params(c, m->compressed_vocab_[size_t(c.engram_pad_id)]));
  }
  return m;
}

InputEmbeddings InputEmbeddings::slice(int64_t begin, int64_t end, int64_t dim) const {
  if (begin < 0 || end < begin || end > int64_t(token_types.size())) throw Error("input embeddings: slice out of range");
  InputEmbeddings out;
  out.token_types.assign(token_types.begin() + begin, token_types.begin() + end);
  int64_t first = 0, count = 0;
  for (int64_t s = 0; s < end; ++s)
    if (token_types[size_t(s)] >= 0) (s < begin ? first : count) += 1;
  if (int64_t(rows.size()) < (first + count) * dim) throw Error("input embeddings: fewer rows than non-text positions");
  out.rows.assign(rows.begin() + first * dim, rows.begin() + (first + count) * dim);
  return out;
}

bool InputEmbeddings::all_text() const {
  for (int8_t t : token_types)
    if (t >= 0) return false;
  return true;
}

std::vector<float> Model::forward(SequenceState& state, const std::vector<int32_t>& tokens, const ForwardOptions& opt,
                                  ThreadPool* pool, const ForwardHooks* hooks, const InputEmbeddings* inputs) const {
  std::vector<float> logits;
  forward_into(logits, state, tokens, opt, pool, hooks, inputs);
  return logits;
}

void Model::forward_into(std::vector<float>& logits, SequenceState& state, const std::vector<int32_t>& tokens,
                         const ForwardOptions& opt, ThreadPool* pool, const ForwardHooks* hooks,
                         const InputEmbeddings* inputs) const {
  const ModelConfig& c = config_;
  const int S = int(tokens.size());
  if (S == 0) throw Error("forward: no tokens given");
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(c.vocab_size - 1) + ")");
  // Image-span positions (type >= 0): their embedding rows, the VL routing mask, Engram's DEAD.
  std::vector<uint8_t> image_mask_storage;
  const std::vector<uint8_t>* image_mask = nullptr;
  if (inputs) {
    if (int(inputs->token_types.size()) != S) throw Error("forward: token types given for a different number of tokens");
    int64_t non_text = 0;
    for (int8_t t : inputs->token_types) {
      if (t < -1 || t > 3) throw Error("forward: token type " + std::to_string(int(t)) + " is not one of -1 (text) .. 3");
      non_text += t >= 0;
    }
    if (int64_t(inputs->rows.size()) != non_text * c.dim)
      throw Error("forward: " + std::to_string(non_text) + " image-span positions need as many embedding rows of width " +
                  std::to_string(c.dim) + " (" + std::to_string(inputs->rows.size()) + " values given)");
    if (non_text > 0) {
      for (int8_t t : inputs->token_types) image_mask_storage.push_back(t >= 0 ? 1 : 0);
      image_mask = &image_mask_storage;
    }
  }
  if (int64_t(state.engram_history.size()) != (engram_hash_ ? state.pos - state.history_start : 0))
    throw Error("forward: sequence state does not belong to this model (Engram history out of step)");
  // Checks that change nothing come before anything is written to the state.
  if (opt.bounded_replay) check_bounded_replay(plan_, state, state.pos + S);
  if (state.journal && (opt.bounded_replay || ced_narrows(c, plan_, opt, S, hooks)))
    throw Error("forward: a journaled call (speculative verification) cannot be a bounded replay or a narrowing CED "
                "prefill (the rollback undoes ring and compressor writes row by row)");
  if (state.journal && state.journal->start < 0) {  // what a rollback restores (rollback())
    state.journal->start = state.pos;
    state.journal->publisher_before = state.index_k_publisher;
  }

  // With the reference's index-key reading, a journaled call at start_pos > 0 (speculative
  // verification) reproduces decode row by row; a row that would need index keys a later layer
  // has not written yet in this call starts a new call (only early in a sequence: see
  // reference_rowwise_rows).
  const int64_t fits = rowwise_key_reading(opt, state)
                           ? reference_rowwise_rows(plan_, state.index_k_publisher, state.pos, S)
                           : int64_t(S);
  if (fits < S) {
    ForwardOptions part_opt = opt;
    std::vector<uint16_t> hidden_a, hidden_b;
    std::vector<float> first;
    InputEmbeddings in_a, in_b;
    if (inputs) {
      in_a = inputs->slice(0, fits, c.dim);
      in_b = inputs->slice(fits, S, c.dim);
    }
    part_opt.main_hidden_out = opt.main_hidden_out ? &hidden_a : nullptr;
    forward_into(first, state, std::vector<int32_t>(tokens.begin(), tokens.begin() + fits), part_opt, pool, hooks,
                 inputs ? &in_a : nullptr);
    part_opt.main_hidden_out = opt.main_hidden_out ? &hidden_b : nullptr;
    forward_into(logits, state, std::vector<int32_t>(tokens.begin() + fits, tokens.end()), part_opt, pool, hooks,
                 inputs ? &in_b : nullptr);
    if (opt.main_hidden_out) {
      *opt.main_hidden_out = std::move(hidden_a);
      opt.main_hidden_out->insert(opt.main_hidden_out->end(), hidden_b.begin(), hidden_b.end());
    }
    if (opt.all_logits) logits.insert(logits.begin(), first.begin(), first.end());
    return;
  }
  forward_call(logits, state, tokens, opt, pool, hooks, inputs, image_mask);
}

const HeadScreen* Model::head_screen(ThreadPool* pool) const {
  std::call_once(head_screen_once_, [&] {
    // The screen only saves time: without memory for it, the full product serves every call.
    try {
      head_screen_ = HeadScreen::build(weights_.head, config_.vocab_size, config_.dim, pool);
    } catch (const Error&) {
    } catch (const std::bad_alloc&) {
    }
  });
  return head_screen_.get();
}

void Model::head_logits(const float* hf, int64_t rows, const ForwardOptions& opt, ThreadPool* pool,
                        const ForwardHooks* hooks, float* logits) const {
  if (opt.head_top_k > 0 && rows <= HeadScreen::kMaxVectors)
    if (const HeadScreen* screen = head_screen(pool)) {
      if (!head_screen_backoff_.try_screen(opt.head_top_k)) {
        if (hooks && hooks->on_head_screen) hooks->on_head_screen(HeadScreenOutcome::Skipped, 0);
      } else {
        const HeadScreen::Result r =
            screen->top_logits(hf, rows, opt.head_top_k, weights_.head, logits, pool,
                               output_allowed_.empty() ? nullptr : output_allowed_.data());
        head_screen_backoff_.record(opt.head_top_k, r.decided);
        if (hooks && hooks->on_head_screen)
          hooks->on_head_screen(r.decided ? HeadScreenOutcome::Decided : HeadScreenOutcome::FellBack, r.candidates);
        if (r.decided) return;
      }
    }
  linear_f32_wbf16_packed(hf, rows, weights_.head_packed, logits, pool);
  mask_disallowed_output(logits, rows);
}

void Model::restrict_output_ids(std::vector<uint8_t> allowed) {
  output_disallowed_.clear();
  if (allowed.empty()) {
    output_allowed_.clear();
    return;
  }
  allowed.resize(size_t(config_.vocab_size), 0);
  for (int64_t v = 0; v < config_.vocab_size; ++v)
    if (!allowed[size_t(v)]) output_disallowed_.push_back(int32_t(v));
  output_allowed_ = output_disallowed_.empty() ? std::vector<uint8_t>{} : std::move(allowed);
}

void Model::mask_disallowed_output(float* logits, int64_t rows) const {
  const int64_t V = config_.vocab_size;
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t v : output_disallowed_) logits[r * V + v] = -std::numeric_limits<float>::infinity();
}

void Model::forward_call(std::vector<float>& logits, SequenceState& state, const std::vector<int32_t>& tokens,
                         const ForwardOptions& opt, ThreadPool* pool, const ForwardHooks* hooks,
                         const InputEmbeddings* inputs, const std::vector<uint8_t>* image_mask) const {
  const ModelConfig& c = config_;
  // Rows the call is running: all its tokens, until a CED prefill narrows them at the decoder.
  int S = int(tokens.size());
  const bool ced = ced_narrows(c, plan_, opt, S, hooks);

  // Engram hash rows of every position of the call, for every Engram layer (§A.5): the history
  // is written first, so the call's own earlier tokens are n-gram context.
  DS41_SCRATCH_EMPTY(int64_t, engram_ids);
  DS41_SCRATCH_EMPTY(uint8_t, text_mask);
  int engram_cols = 0;
  if (engram_hash_) {
    for (int s = 0; s < S; ++s)
      state.engram_history.push_back(image_mask && (*image_mask)[size_t(s)] ? kEngramDead
                                                                            : int64_t(compressed_vocab_[size_t(tokens[size_t(s)])]));
    engram_cols = engram_hash_->columns;
    engram_ids.resize(size_t(S) * engram_hash_->n_layers * engram_cols);
    try {
      engram_hash_positions(*engram_hash_, state.engram_history.data(), state.pos, S, engram_ids.data(),
                            state.history_start);
    } catch (...) {  // leave the state as it was
      state.engram_history.resize(size_t(state.pos - state.history_start));
      throw;
    }
    if (image_mask)
      for (uint8_t m : *image_mask) text_mask.push_back(m ? 0 : 1);
  }

  ForwardContext ctx{c, plan_, weights_, state, opt, pool, hooks, image_mask, text_mask.empty() ? nullptr : &text_mask,
                     inv_freq_plain_, inv_freq_compressed_};
  ctx.start = state.pos;
  ctx.S = S;
  // The per-call top-k lists and candidate pool keep their capacity from call to call (on this
  // thread); they are handed back below.
  static thread_local std::vector<std::vector<std::vector<int32_t>>> topk_store;
  static thread_local std::vector<std::vector<uint8_t>> candidates_store;
  ctx.topk.swap(topk_store);
  ctx.candidates.swap(candidates_store);
  ctx.topk.resize(plan_.layers.size());
  if (opt.bounded_replay) begin_bounded_replay(ctx);
  // The publisher after an ordinary call is whatever its layers published last (the reference's
  // prefill; single-token decode too). A journaled call at start_pos > 0 follows decode row by
  // row, so that it can be cut back to any prefix (rollback recomputes the publisher that way).
  const bool journaled = state.journal && state.pos > 0;
  int publisher_after_call = state.index_k_publisher;
  static thread_local std::vector<int> publisher_store;
  ctx.publisher_before_row.swap(publisher_store);
  ctx.publisher_before_row.clear();
  if (journaled) {
    const bool rowwise = rowwise_key_reading(opt, state);
    if (rowwise) ctx.publisher_before_row.resize(size_t(S));
    for (int s = 0; s < S; ++s) {
      if (rowwise) ctx.publisher_before_row[size_t(s)] = publisher_after_call;
      publisher_after_call = reference_publisher_after(plan_, publisher_after_call, state.pos + s);
    }
  }

  const int hc = c.hc_mult;
  const int64_t D = c.dim;
  const float norm_eps = float(c.norm_eps);
  // Stream X [S][hc][D]: every copy starts as the embedding (§7).
  DS41_SCRATCH(uint16_t, X, int64_t(S) * hc * D);
  for (int s = 0; s < S; ++s)
    for (int ci = 0; ci < hc; ++ci)
      std::memcpy(X.data() + (int64_t(s) * hc + ci) * D, weights_.embed + int64_t(tokens[s]) * D, size_t(D) * 2);
  if (image_mask) {  // image spans: their rows replace the token embedding (spec §C.6)
    const uint16_t* row = inputs->rows.data();
    for (int s = 0; s < S; ++s) {
      if (!(*image_mask)[size_t(s)]) continue;
      for (int ci = 0; ci < hc; ++ci) std::memcpy(X.data() + (int64_t(s) * hc + ci) * D, row, size_t(D) * 2);
      row += D;
    }
  }
  DS41_SCRATCH(float, a_in, int64_t(S) * hc);  // one-hot [1,0,..] for layer 0, exactly 1.0
  for (int s = 0; s < S; ++s) a_in[int64_t(s) * hc] = 1.f;

  // Block buffers keep their capacity from call to call (on this thread), like DS41_SCRATCH.
  static thread_local BlockScratch scratch;
  scratch.resize(S, hc, D);
  // DSpark capture (spec §B.3): the mean over the hc copies of each target layer's input stream
  // (after its Engram), concatenated in layer order -> main_hidden [S][n_targets * D] bf16. After
  // a CED prefill narrows the call, decoder-layer targets fill only its last window_size rows:
  // the only rows dspark_commit reads (the draft rings hold one window).
  std::vector<uint16_t>* main_hidden = opt.main_hidden_out;
  const int64_t n_targets = int64_t(c.dspark_target_layer_ids.size());
  const int64_t call_start = state.pos;
  if (main_hidden) main_hidden->assign(size_t(int64_t(S) * n_targets * D), 0);
  int target_index = 0;
  int layers_done = 0, n_main_layers = 0;
  if (opt.on_layer)
    for (const LayerPlan& lp : plan_.layers) n_main_layers += lp.is_dspark ? 0 : 1;

  for (const LayerPlan& lp : plan_.layers) {
    if (lp.is_dspark) continue;  // drafter stages run only in speculative decoding (model/dspark.h)
    const BlockWeights& w = weights_.blocks[lp.id];
    if (hooks && hooks->before_block) hooks->before_block(lp.id, S, X.data(), a_in.data());
    if (lp.engram) {  // Engram writes into the stream before the block (§A.10)
      DS41_SCRATCH(int64_t, rows, int64_t(S) * engram_cols);
      for (int s = 0; s < S; ++s)
        std::memcpy(rows.data() + int64_t(s) * engram_cols,
                    engram_ids.data() + (int64_t(s) * engram_hash_->n_layers + lp.engram_index) * engram_cols,
                    size_t(engram_cols) * sizeof(int64_t));
      engram_forward(ctx, lp, w, rows.data(), engram_cols, X.data());
    }
    if (ced && lp.id == plan_.decoder_start) S = ced_enter_decoder(ctx, lp, w, X, a_in, engram_ids, text_mask);
    if (lp.dspark_target && main_hidden) {
      const int64_t row0 = ctx.start - call_start;  // rows a CED prefill dropped come first
      for (int s = 0; s < S; ++s)
        hc_mean(X.data() + int64_t(s) * hc * D, hc, D,
                main_hidden->data() + ((row0 + s) * n_targets + target_index) * D);
      ++target_index;
    }
    run_block(ctx, lp, w, X.data(), a_in, scratch,
              [&](const uint16_t* in, uint16_t* out) { attention_forward(ctx, lp, w, in, out); });
    if (hooks && hooks->after_block) hooks->after_block(lp.id, S, X.data(), a_in.data());
    if (opt.on_layer) opt.on_layer(++layers_done, n_main_layers);
  }

  // Collapse with the last FFN pre-mix, final norm, fp32 head (§4, §7).
  DS41_SCRATCH(uint16_t, h, D);
  DS41_SCRATCH(uint16_t, hn, D);
  const int first_row = opt.all_logits ? 0 : S - 1;
  const int rows = S - first_row;
  DS41_SCRATCH(float, hf, int64_t(rows) * D);
  for (int r = 0; r < rows; ++r) {
    const int s = first_row + r;
    hc_pre(X.data() + int64_t(s) * hc * D, a_in.data() + s * hc, hc, D, h.data());
    rmsnorm_row(h.data(), weights_.norm, D, norm_eps, hn.data());
    for (int64_t d = 0; d < D; ++d) hf[r * D + d] = bf16_to_f32(hn[d]);
  }
  logits.resize(size_t(rows) * c.vocab_size);
  head_logits(hf.data(), rows, opt, pool, hooks, logits.data());

  if (journaled) state.index_k_publisher = publisher_after_call;
  state.pos += int64_t(tokens.size());
  state.token_history.insert(state.token_history.end(), tokens.begin(), tokens.end());
  topk_store.swap(ctx.topk);
  candidates_store.swap(ctx.candidates);
  publisher_store.swap(ctx.publisher_before_row);
}

}  // namespace ds41
