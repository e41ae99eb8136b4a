// Internal to src/model: what one forward call shares between its layers. The reference keeps
// this in a module-level `SharedAttentionRuntime` (published compressed KV, index keys, top-k,
// candidate pool); here it is an explicit per-call object plus the per-sequence state.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "model/model.h"

namespace ds41 {

struct ForwardContext {
  const ModelConfig& cfg;
  const ModelPlan& plan;
  const ModelWeights& weights;
  SequenceState& state;
  const ForwardOptions& opt;
  ThreadPool* pool;
  const ForwardHooks* hooks;
  const std::vector<uint8_t>* image_mask;
  const std::vector<uint8_t>* engram_text_mask;  // 1 = text position (gate on); nullptr = all text
  const std::vector<float>& inv_freq_plain;
  const std::vector<float>& inv_freq_compressed;
  int64_t start = 0;  // position of the first token of the call
  int S = 0;          // tokens in the call
  bool candidates_built = false;  // the candidate source has filled `candidates` in this call

  // Per index-source layer (by layer id): the top-k entry lists of this call, one per query,
  // ascending; Reuse layers read their source's.
  std::vector<std::vector<std::vector<int32_t>>> topk{};
  // Candidate pool of this call (candidate source): per query, a keep flag per entry; valid once
  // candidates_built is set (the vectors keep their capacity from call to call).
  std::vector<std::vector<uint8_t>> candidates{};
  // Set once the compressed entries of every position of the call are in the state before the
  // kv sources run (bounded replay; the decoder part of a CED prefill): kv sources only publish.
  bool global_cache_ready = false;
  std::vector<uint8_t> image_mask_rows{};  // image_mask points here once a CED prefill narrows the call
  // Reference index-key reading in a call at start_pos > 0: the publisher after the previous
  // position, per row (decode semantics row by row). Empty: the call-level reading of a prefill.
  std::vector<int> publisher_before_row{};

  const std::vector<float>& inv_freq(const LayerPlan& lp) const {
    return lp.ratio > 0 ? inv_freq_compressed : inv_freq_plain;
  }
  int64_t pos(int s) const { return start + s; }
};

// Buffers of one hyper-connected block over S tokens: the sublayer input (collapsed copies), its
// normalised form, the sublayer output, and each sublayer's coefficients (spec §7).
struct BlockScratch {
  struct Mix {
    std::vector<float> pre, post, comb;
  };
  std::vector<uint16_t> h, hn, y;
  Mix attn, ffn;
  BlockScratch() = default;
  BlockScratch(int S, int hc, int64_t D) { resize(S, hc, D); }
  // Sizes every buffer for S tokens, keeping the capacity it has (contents unspecified).
  void resize(int S, int hc, int64_t D);
};
// One block (spec §7): attention sublayer (body `attention`: normalised input [S][dim] -> output
// [S][dim]) then the MoE sublayer, each between hc_pre / hc_post. X [S][hc][dim] is updated in
// place; a_in [S][hc] is the incoming pre-mix and becomes the FFN's pre-mix for the next block.
// The DSpark stages run the same recipe with their own attention.
// A non-owning reference to the body (a std::function would allocate for a lambda capturing
// three references, on every layer of every decode step).
class AttentionBody {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, AttentionBody>>>
  AttentionBody(const F& f)  // NOLINT: implicit, so that a lambda can be passed directly
      : body_(&f), call_([](const void* b, const uint16_t* x, uint16_t* y) { (*static_cast<const F*>(b))(x, y); }) {}
  void operator()(const uint16_t* x, uint16_t* y) const { call_(body_, x, y); }

 private:
  const void* body_;
  void (*call_)(const void*, const uint16_t*, uint16_t*);
};
void run_block(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, uint16_t* X, std::vector<float>& a_in,
               BlockScratch& s, const AttentionBody& attention);

// The latent KV of window attention (§5.3), for `S` rows at the given positions: kv_norm(wkv(x)),
// RoPE on the tail, FP8 QDQ. Writes the QDQ'd bf16 rows and their E4M3 codes + fp32 scales (what a
// ring slot stores). Row-independent.
void window_kv_rows(const ModelConfig& c, const BlockWeights& w, const uint16_t* x, int S, const int64_t* positions,
                    const std::vector<float>& inv_freq, ThreadPool* pool, uint16_t* kv, uint8_t* codes, float* scales);
// The same from the projection wkv(x) already computed (`raw`, S x head_dim).
void window_kv_from_projection(const ModelConfig& c, const BlockWeights& w, const uint16_t* raw, int S,
                               const int64_t* positions, const std::vector<float>& inv_freq, ThreadPool* pool,
                               uint16_t* kv, uint8_t* codes, float* scales);
// Ring slot `slot` as bf16 (E4M3 code times its E8M0 scale, exact).
void ring_row_bf16(const LayerState& ls, int64_t Dh, int64_t slot, uint16_t* out);
// Stores one row's codes and scales in ring slot `slot`, logging the old bytes in `journal` if set.
void ring_store(StateJournal* journal, LayerState& ls, int64_t Dh, int64_t pos, int64_t slot, const uint8_t* codes,
                const float* scales);
// Grouped low-rank output projection (§5.7 step 2): o [S][heads*head_dim] -> y [S][dim].
void grouped_output(const ModelConfig& c, const BlockWeights& w, int S, const uint16_t* o, uint16_t* y, ThreadPool* pool);

// The reference's index-key publisher (model/index_key_publisher.cpp): the kv source whose keys
// the indexer of `layer` reads in the decode call of position p, given the publisher after p-1
// (-1: none yet); the publisher after all of p's layers; and how many rows of a call at `start`
// can reproduce decode this way in one layer pass (a row may need keys a later layer has not
// yet written in this call; the call is then split).
int reference_publisher_at(const ModelPlan& plan, int before, int64_t p, int layer);
int reference_publisher_after(const ModelPlan& plan, int before, int64_t p);
int64_t reference_rowwise_rows(const ModelPlan& plan, int before, int64_t start, int64_t S);

// Bounded replay (ForwardOptions::bounded_replay, replay.cpp): the check, before the call changes
// anything (the global caches must end where the call, ending at `end`, ends; ds41::Error
// otherwise), then the start: every layer's window starts at the call's first position and the
// caches are marked ready.
void check_bounded_replay(const ModelPlan& plan, const SequenceState& state, int64_t end);
void begin_bounded_replay(ForwardContext& ctx);
// Whether a call of S tokens is a CED prefill that narrows to the window at the decoder (ced.cpp);
// throws ds41::Error for what a narrowed call cannot give (every position's logits, per-position
// hooks) or for CED combined with a bounded replay.
bool ced_narrows(const ModelConfig& c, const ModelPlan& plan, const ForwardOptions& opt, int S, const ForwardHooks* hooks);
// CED prefill (ced.cpp) at the first decoder layer `lp`, after its Engram: runs the layer's
// compressor over every row of the call, then narrows the call to its last window_size rows —
// X [S][hc][dim], a_in [S][hc], engram_ids [S][...] and text_mask [S] (both may be empty) keep
// their last rows, ctx.start/ctx.S/ctx.image_mask move with them — and starts the decoder layers'
// windows there. Returns the new row count.
int ced_enter_decoder(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, std::vector<uint16_t>& X,
                      std::vector<float>& a_in, std::vector<int64_t>& engram_ids, std::vector<uint8_t>& text_mask);

// Attention sublayer of one block for the whole call: x [S][dim] -> y [S][dim] (bf16).
void attention_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x,
                       uint16_t* y);
// Compressor of a kv-source layer: consumes the call's tokens, appends completed groups to the
// layer's caches (index keys first, from the pre-RoPE latent, then the main KV). Returns the
// number of entries emitted.
int compressor_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x);
// Indexer of an index-source layer: fills ctx.topk[lp.id] (and the candidate pool at the
// candidate source). qr is the normalised low-rank query [S][q_lora_rank].
void indexer_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x,
                     const uint16_t* qr);
// Candidate-block pool from one query's masked score row (bf16 scores as float, -inf masked).
// count = entries visible to the query. Returns a keep flag per entry.
std::vector<uint8_t> candidate_pool_row(const float* scores, int64_t width, int64_t count, int topk_blocks,
                                        int block_size);
// Into `keep`, reusing its capacity; capacity_hint = the widest row expected (planned context).
void candidate_pool_row(const float* scores, int64_t width, int64_t count, int topk_blocks, int block_size,
                        std::vector<uint8_t>& keep, int64_t capacity_hint = 0);
// Top-k entry ids of a score row (ties: lower index first), ascending; entries >= count dropped.
std::vector<int32_t> select_topk_row(const float* scores, int64_t width, int64_t count, int k);
// Engram table rows ids[0..n) (checked by the caller) dequantized to bf16 out [n][head_dim] (§A.7),
// read from the mmap'd table with a WILLNEED hint first.
void engram_gather_rows(const BlockWeights& w, int64_t head_dim, const int64_t* ids, int64_t n, uint16_t* out,
                        ThreadPool* pool);
void select_topk_row(const float* scores, int64_t width, int64_t count, int k, std::vector<int32_t>& out);
// Engram before an Engram block: row_ids [S][cols] (this layer's hash rows), X [S][hc][dim] updated
// in place.
void engram_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const int64_t* row_ids,
                    int cols, uint16_t* X);
// SwiGLU of one element with the training clamps (§8.2): up clamped to [-limit, limit], gate
// clamped from above only; limit <= 0 disables both.
float swiglu(float gate, float up, float limit);
// MoE sublayer: x [S][dim] -> y [S][dim].
void moe_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x, uint16_t* y);
// The routed experts ids[0 .. n) of one layer over rows grouped by expert (first[i] .. first[i + 1]
// of xin [rows][dim] are expert ids[i]'s, each with its routing weight): out [rows][dim], each row
// bit-identical to moe_forward's for the same expert and input (expert parallelism's follower side).
void routed_expert_products(const ModelConfig& c, const BlockWeights& w, ExpertCache* cache, int layer,
                            const int32_t* ids, int n, const int64_t* first, const uint16_t* xin, const float* route_w,
                            uint16_t* out, ThreadPool* pool);

}  // namespace ds41
