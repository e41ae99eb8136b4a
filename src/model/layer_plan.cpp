#include "model/layer_plan.h"

#include <algorithm>
#include <set>

namespace ds41 {

const char* attn_mode_name(AttnMode m) {
  switch (m) {
    case AttnMode::WindowOnly: return "window";
    case AttnMode::Full: return "full";
    case AttnMode::Reindex: return "reindex";
    case AttnMode::Reuse: return "reuse";
  }
  return "?";
}

ModelPlan build_model_plan(const ModelConfig& c) {
  validate_config(c);
  ModelPlan plan;
  plan.n_layers = c.n_layers;
  std::set<int> kv(c.kv_source_layers.begin(), c.kv_source_layers.end());
  std::set<int> idx(c.index_source_layers.begin(), c.index_source_layers.end());
  std::set<int> targets(c.dspark_target_layer_ids.begin(), c.dspark_target_layer_ids.end());
  // The decoder starts at the last kv source: its compressor reads the encoder's output, and
  // every later layer's global KV comes from it (tech report: CED, L20 of 40).
  plan.decoder_start = c.kv_source_layers.empty() ? c.n_layers : c.kv_source_layers.back();

  int last_kv = -1, last_idx = -1;
  for (int l = 0; l < c.total_layers(); ++l) {
    LayerPlan p;
    p.id = l;
    p.is_dspark = l >= c.n_layers;
    p.dspark_stage = p.is_dspark ? l - c.n_layers : -1;
    p.prefix = p.is_dspark ? "mtp." + std::to_string(p.dspark_stage) + "."
                           : "layers." + std::to_string(l) + ".";
    p.ratio = c.compress_ratios[l];
    p.rope.dim = int(c.rope_head_dim);
    p.rope.factor = c.rope_factor;
    p.rope.beta_fast = c.beta_fast;
    p.rope.beta_slow = c.beta_slow;
    if (p.ratio > 0) {
      p.rope.theta = c.compress_rope_theta;
      p.rope.original_seq_len = c.original_seq_len;
      p.rope.yarn = c.original_seq_len > 0;
    } else {
      // Pitfall 3: window-only layers use plain theta 10000 without YaRN.
      p.rope.theta = c.rope_theta;
    }
    if (!p.is_dspark) {
      p.kv_source = kv.count(l) > 0;
      p.index_source = idx.count(l) > 0;
      p.owns_index_k = p.kv_source;
      p.candidate_source = l == c.candidate_source_layer;
      p.uses_candidates = p.index_source && c.candidate_source_layer >= 0 && c.candidate_source_layer < l;
      if (p.kv_source) last_kv = l;
      if (p.index_source) last_idx = l;
      if (p.ratio > 0) {
        p.kv_source_layer = last_kv;
        p.index_source_layer = last_idx;
        p.mode = p.kv_source ? AttnMode::Full : p.index_source ? AttnMode::Reindex : AttnMode::Reuse;
      }
      p.decoder = l >= plan.decoder_start;
      auto e = std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), l);
      p.engram = e != c.engram_layer_ids.end();
      p.engram_index = p.engram ? int(e - c.engram_layer_ids.begin()) : -1;
      p.dspark_target = c.dspark_enabled() && targets.count(l) > 0;
    }
    p.routed_experts = c.routed_experts(l);
    p.activated_experts = c.activated_experts(l);
    plan.layers.push_back(p);
  }

  const double main_entry = double(c.head_dim) / 2 + double(c.head_dim) / 16;        // FP4 + E4M3 per 16
  const double index_entry = double(c.index_head_dim) / 2 + double(c.index_head_dim) / 32;  // FP4 + E8M0 per 32
  for (int s : c.kv_source_layers) {
    int m = c.compress_ratios[s];
    plan.kv_bytes_per_token += (main_entry + index_entry) / m;
    if (m > 1) plan.compressor_state_bytes += int64_t(2) * m * c.head_dim * 4;
  }
  plan.swa_bytes_per_sequence =
      int64_t(c.total_layers()) * c.window_size * (c.head_dim + c.head_dim / 32);
  return plan;
}

}  // namespace ds41
