#include "model/presets.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/engram_layout.h"

namespace ds41 {

namespace {

using json = nlohmann::json;

// Every configuration below is a list of inference/config.json fields laid over the one before
// it (`base`), read through the config's field table (config.cpp): a field is named once, in the
// file format's own spelling, and a misspelt key fails at the first use.
struct PresetSpec {
  const char* name;
  const char* base;  // nullptr: ModelConfig's defaults
  const char* fields;
};

constexpr PresetSpec kPresets[] = {
    // The released vocabulary, token ids and numerics constants: every preset keeps them, so a
    // real tokenizer works with any of them.
    {"constants", nullptr, R"({
      "vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
      "image_token_id": 129264, "dspark_noise_token_id": 128799,
      "score_func": "sqrtsoftplus", "route_scale": 1.5, "swiglu_limit": 10.0, "norm_eps": 1e-20,
      "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
      "rope_theta": 10000, "compress_rope_theta": 160000, "beta_fast": 32, "beta_slow": 1,
      "engram_pad_id": 2, "engram_compressed_vocab_size": 99092, "engram_max_ngram_size": 4,
      "vision_patch_size": 14, "vision_downsample_ratio": 3, "vision_max_n_token": 1024,
      "vision_min_pixels": 295936, "vision_rope_theta": 10000,
      "n_shared_experts": 1, "dtype": "fp8", "expert_dtype": "fp4"})"},

    // DeepSeek-V4.1-Flash as released (the HF config.json).
    {"released", "constants", R"({
      "dim": 5120, "moe_inter_dim": 2304, "n_layers": 40, "n_mtp_layers": 3, "n_heads": 64,
      "n_routed_experts": 384, "n_activated_experts": 6, "q_lora_rank": 1280, "head_dim": 512,
      "rope_head_dim": 64, "o_groups": 8, "o_lora_rank": 1024, "window_size": 128,
      "compress_ratios": [0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
                          1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
      "kv_source_layers": [2, 8, 14, 20], "index_source_layers": [2, 8, 14, 20, 24, 28, 32, 36],
      "original_seq_len": 65536, "rope_factor": 16,
      "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512,
      "candidate_source_layer": 20, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
      "engram_layer_ids": [1, 14], "engram_vocab_size": 16000000, "engram_n_heads": 8,
      "engram_head_dim": 256, "engram_num_embeddings": [384006168, 384016682],
      "dspark_block_size": 5, "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256,
      "dspark_n_routed_experts": 128, "dspark_n_activated_experts": 3,
      "vision_n_layers": 32, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816,
      "max_seq_len": 1048576})"},

    // 8 backbone layers laid out like the release in miniature:
    //   0-1 window only; 2 Full m=2 (kv+index source), 3 Reuse m=2;
    //   4 Full m=1 + candidate source (decoder start), 5 Reuse, 6 Reindex (pool), 7 Reuse;
    //   Engram at 1 and 3; 3 DSpark stages reading layers 5-7; a 2-block ViT.
    // window_size is the real ring size, so long prompts wrap it as in the release;
    // original_seq_len 64 puts YaRN to work well inside a 600-token test prompt; a candidate pool
    // of up to 8 blocks of 4 is larger than top-16, as in the release.
    {"tiny", "constants", R"({
      "dim": 128, "moe_inter_dim": 64, "n_layers": 8, "n_mtp_layers": 3, "n_heads": 4,
      "n_routed_experts": 8, "n_activated_experts": 2, "q_lora_rank": 64, "head_dim": 64,
      "rope_head_dim": 16, "o_groups": 2, "o_lora_rank": 32, "window_size": 128,
      "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0],
      "kv_source_layers": [2, 4], "index_source_layers": [2, 4, 6],
      "original_seq_len": 64, "rope_factor": 4,
      "index_n_heads": 4, "index_head_dim": 32, "index_topk": 16,
      "candidate_source_layer": 4, "candidate_topk_blocks": 8, "candidate_block_size": 4,
      "engram_layer_ids": [1, 3], "engram_vocab_size": 1000, "engram_n_heads": 2, "engram_head_dim": 32,
      "dspark_block_size": 4, "dspark_target_layer_ids": [5, 6, 7], "dspark_markov_rank": 32,
      "dspark_n_routed_experts": 4, "dspark_n_activated_experts": 2,
      "vision_n_layers": 2, "vision_dim": 64, "vision_n_heads": 4, "vision_inter_dim": 64,
      "max_seq_len": 4096})"},

    // Released head/latent widths (512-d latent, 64 rope dims, 128-slot window) at a width and
    // depth a laptop can stream: about 1.5 GB on disk.
    {"small", "constants", R"({
      "dim": 1024, "moe_inter_dim": 512, "n_layers": 12, "n_mtp_layers": 1, "n_heads": 8,
      "n_routed_experts": 32, "n_activated_experts": 4, "q_lora_rank": 256, "head_dim": 512,
      "rope_head_dim": 64, "o_groups": 4, "o_lora_rank": 256, "window_size": 128,
      "compress_ratios": [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0],
      "kv_source_layers": [2, 6], "index_source_layers": [2, 6, 8, 10],
      "original_seq_len": 4096, "rope_factor": 16,
      "index_n_heads": 8, "index_head_dim": 128, "index_topk": 128,
      "candidate_source_layer": 6, "candidate_topk_blocks": 64, "candidate_block_size": 8,
      "engram_layer_ids": [1, 4], "engram_vocab_size": 50000, "engram_n_heads": 4, "engram_head_dim": 256,
      "dspark_block_size": 5, "dspark_target_layer_ids": [9, 10, 11], "dspark_markov_rank": 128,
      "dspark_n_routed_experts": 16, "dspark_n_activated_experts": 2,
      "vision_n_layers": 4, "vision_dim": 256, "vision_n_heads": 4, "vision_inter_dim": 512,
      "max_seq_len": 65536})"},

    // The released widths (dim 5120, 64 heads of 512, q / o ranks 1280 / 1024 in 8 groups, FP4
    // experts 2304 wide with 6 active, 32 index heads, top-512, a 2048-block candidate pool) at 6
    // layers and 24 routed experts, about 7.6 GB: what a layer of the released model costs.
    //   0 window only; 1 Full m=2 (kv + index source), 2 Reuse m=2; 3 Full m=1 + candidate source
    //   (decoder start), 4 Reuse, 5 Reindex (pool); Engram at 1 and 2; DSpark reading 3-5.
    {"wide", "released", R"({
      "n_layers": 6, "n_mtp_layers": 1, "n_routed_experts": 24,
      "compress_ratios": [0, 2, 2, 1, 1, 1, 0],
      "kv_source_layers": [1, 3], "index_source_layers": [1, 3, 5], "candidate_source_layer": 3,
      "engram_layer_ids": [1, 2], "engram_vocab_size": 50000,
      "dspark_target_layer_ids": [3, 4, 5], "dspark_n_routed_experts": 16,
      "vision_n_layers": 2, "vision_dim": 256, "vision_n_heads": 4, "vision_inter_dim": 512,
      "max_seq_len": 65536})"},
};

const PresetSpec* find_spec(const std::string& name) {
  for (const PresetSpec& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

ModelConfig build(const PresetSpec& p) {
  ModelConfig c = p.base ? build(*find_spec(p.base)) : ModelConfig{};
  apply_flat_fields(c, json::parse(p.fields), std::string("preset '") + p.name + "'");
  return c;
}

// Whether a name is offered to users (the two building blocks are not models of their own).
bool is_user_preset(const PresetSpec& p) {
  return std::string(p.name) != "constants" && std::string(p.name) != "released";
}

}  // namespace

ModelConfig released_config() { return build(*find_spec("released")); }

ModelConfig preset_config(const std::string& name) {
  const PresetSpec* p = find_spec(name);
  if (!p || !is_user_preset(*p)) {
    std::string known;
    for (auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown preset '" + name + "' (known presets: " + known + ")");
  }
  ModelConfig c = build(*p);
  // The Engram table sizes follow from the other fields (the release states its own).
  c.engram_num_embeddings = compute_engram_layout(c).rows;
  return c;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const PresetSpec& p : kPresets)
    if (is_user_preset(p)) names.push_back(p.name);
  return names;
}

}  // namespace ds41
