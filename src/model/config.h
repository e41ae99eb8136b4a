// The model configuration: one struct, whose fields are the reference's flat `inference/config.json`
// keys (ModelArgs), filled from either that file or the HF root `config.json` (nested
// `text_config` / `vision_config` / `quantization_config`). Nothing in the engine may assume the
// released sizes; everything reads this struct (and the layer plan derived from it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ds41 {

struct ModelConfig {
  // ---- shape ------------------------------------------------------------------------------
  int64_t vocab_size = 129280;
  int64_t dim = 1024;
  int64_t moe_inter_dim = 1024;
  int n_layers = 5;
  int n_mtp_layers = 1;  // DSpark stages, layer ids n_layers .. n_layers + n_mtp_layers - 1
  int n_heads = 16;
  // ---- MoE ---------------------------------------------------------------------------------
  int n_routed_experts = 8;
  int n_shared_experts = 1;
  int n_activated_experts = 2;
  std::string score_func = "sqrtsoftplus";  // softmax | sigmoid | sqrtsoftplus
  double gate_temp = 1.0;
  bool norm_topk_prob = true;
  double route_scale = 1.0;
  double swiglu_limit = 0.0;
  // ---- attention ---------------------------------------------------------------------------
  int64_t q_lora_rank = 256;
  int64_t head_dim = 128;
  int64_t rope_head_dim = 32;
  double norm_eps = 1e-20;
  int o_groups = 8;
  int64_t o_lora_rank = 256;
  int window_size = 128;
  std::vector<int> compress_ratios;       // n_layers + n_mtp_layers entries
  std::vector<int> kv_source_layers;
  std::vector<int> index_source_layers;
  // ---- RoPE / YaRN -------------------------------------------------------------------------
  double compress_rope_theta = 40000.0;
  int64_t original_seq_len = 0;  // > 0 enables YaRN on compressed layers
  double rope_theta = 10000.0;
  double rope_factor = 40;
  double beta_fast = 32;
  double beta_slow = 1;
  // ---- indexer / candidate pool ------------------------------------------------------------
  int index_n_heads = 16;
  int64_t index_head_dim = 64;
  int index_topk = 64;
  int candidate_source_layer = -1;  // < 0: no candidate pool
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  // ---- hyper-connections -------------------------------------------------------------------
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  // ---- Engram ------------------------------------------------------------------------------
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int engram_max_ngram_size = 1;
  int64_t engram_vocab_size = 0;
  int engram_n_heads = 0;
  int64_t engram_head_dim = 0;
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 0;
  // ---- vision (vision_n_layers == 0 disables it) -------------------------------------------
  int vision_n_layers = 0;
  int64_t vision_dim = 1024;
  int vision_n_heads = 16;
  int64_t vision_inter_dim = 2816;
  int vision_patch_size = 14;
  double vision_rope_theta = 10000.0;
  int vision_downsample_ratio = 3;
  int vision_max_n_token = 1024;
  int64_t vision_min_pixels = 544 * 544;
  std::optional<double> vision_max_wh_ratio;
  int64_t image_token_id = 129264;
  // ---- DSpark ------------------------------------------------------------------------------
  int dspark_block_size = 0;
  int64_t dspark_noise_token_id = 0;
  std::vector<int> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 256;
  int dspark_n_routed_experts = 0;
  int dspark_n_activated_experts = 0;
  // ---- storage -----------------------------------------------------------------------------
  std::string dtype = "fp8";         // linear weights: fp8 (E4M3 + 32x32 E8M0 scales)
  std::string expert_dtype = "fp4";  // routed experts: fp4 (packed E2M1 + per-32 E8M0 scales)
  // ---- runtime limits and token ids (not model shape) --------------------------------------
  int64_t max_seq_len = 4096;
  int max_batch_size = 4;
  double temperature = 1.0;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  int64_t pad_token_id = 2;

  bool vision_enabled() const { return vision_n_layers > 0; }
  bool dspark_enabled() const { return n_mtp_layers > 0 && dspark_block_size > 0; }
  int total_layers() const { return n_layers + (dspark_enabled() ? n_mtp_layers : 0); }
  // Routed / activated experts of a layer (DSpark stages may use their own counts).
  int routed_experts(int layer) const;
  int activated_experts(int layer) const;

  // Fields that define the model's numbers (everything except runtime limits and token ids).
  // Used to check that the two config files of a checkpoint agree.
  std::vector<std::string> differences_in_model_fields(const ModelConfig& other) const;
};

// Parse either form from JSON text / a parsed object. `label` names the source in errors.
ModelConfig parse_flat_config(const nlohmann::json& j, const std::string& label);
ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& label);
// Sets the fields named in `fields` (flat keys, as in inference/config.json) and leaves the others;
// an unknown key is an error. Presets are written this way (model/presets.cpp).
void apply_flat_fields(ModelConfig& c, const nlohmann::json& fields, const std::string& label);
// Detects the form: an object with `text_config` is HF, otherwise flat.
ModelConfig parse_config_json(const nlohmann::json& j, const std::string& label);
ModelConfig load_config_file(const std::string& path);
// A checkpoint directory: reads config.json (HF) and inference/config.json (flat); when both are
// present their model fields must agree. Either alone is enough.
ModelConfig load_model_dir_config(const std::string& dir);

// Throws ds41::Error listing every problem found (one per line), in words a user understands.
void validate_config(const ModelConfig& c);
std::vector<std::string> config_problems(const ModelConfig& c);

nlohmann::json config_to_flat_json(const ModelConfig& c);
nlohmann::json config_to_hf_json(const ModelConfig& c);

}  // namespace ds41
