// Internal to src/model: what one forward call shares between its layers. The reference keeps
// this in a module-level `SharedAttentionRuntime` (published compressed KV, index keys, top-k,
// candidate pool); here it is an explicit per-call object plus the per-sequence state.
#pragma once

#include <cstdint>
#include <functional>
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

  // Per index-source layer (by layer id): the top-k entry lists of this call, one per query,
  // ascending; Reuse layers read their source's.
  std::vector<std::vector<std::vector<int32_t>>> topk{};
  // Candidate pool of this call (candidate source): per query, a keep flag per entry.
  std::vector<std::vector<uint8_t>> candidates{};
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
  BlockScratch(int S, int hc, int64_t D);
};
// One block (spec §7): attention sublayer (body `attention`: normalised input [S][dim] -> output
// [S][dim]) then the MoE sublayer, each between hc_pre / hc_post. X [S][hc][dim] is updated in
// place; a_in [S][hc] is the incoming pre-mix and becomes the FFN's pre-mix for the next block.
// The DSpark stages run the same recipe with their own attention.
using AttentionBody = std::function<void(const uint16_t* x, uint16_t* y)>;
void run_block(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, uint16_t* X, std::vector<float>& a_in,
               BlockScratch& s, const AttentionBody& attention);

// The latent KV of window attention (§5.3), for `S` rows at the given positions: kv_norm(wkv(x)),
// RoPE on the tail, FP8 QDQ. Writes the QDQ'd bf16 rows and their E4M3 codes + fp32 scales (what a
// ring slot stores). Row-independent.
void window_kv_rows(const ModelConfig& c, const BlockWeights& w, const uint16_t* x, int S, const int64_t* positions,
                    const std::vector<float>& inv_freq, ThreadPool* pool, uint16_t* kv, uint8_t* codes, float* scales);
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
// Top-k entry ids of a score row (ties: lower index first), ascending; entries >= count dropped.
std::vector<int32_t> select_topk_row(const float* scores, int64_t width, int64_t count, int k);
// Engram before an Engram block: row_ids [S][cols] (this layer's hash rows), X [S][hc][dim] updated
// in place.
void engram_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const int64_t* row_ids,
                    int cols, uint16_t* X);
// SwiGLU of one element with the training clamps (§8.2): up clamped to [-limit, limit], gate
// clamped from above only; limit <= 0 disables both.
float swiglu(float gate, float up, float limit);
// MoE sublayer: x [S][dim] -> y [S][dim].
void moe_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x, uint16_t* y);

}  // namespace ds41
