#include "model/presets.h"

#include "base/error.h"
#include "model/engram_layout.h"

namespace ds41 {

namespace {

// Fields shared by every preset: the released vocabulary, token ids and numerics constants.
ModelConfig released_constants() {
  ModelConfig c;
  c.vocab_size = 129280;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.pad_token_id = 2;
  c.image_token_id = 129264;
  c.dspark_noise_token_id = 128799;
  c.score_func = "sqrtsoftplus";
  c.route_scale = 1.5;
  c.swiglu_limit = 10.0;
  c.norm_eps = 1e-20;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.engram_pad_id = 2;
  c.engram_compressed_vocab_size = 99092;
  c.engram_max_ngram_size = 4;
  c.vision_patch_size = 14;
  c.vision_downsample_ratio = 3;
  c.vision_max_n_token = 1024;
  c.vision_min_pixels = 295936;
  c.vision_rope_theta = 10000;
  c.n_shared_experts = 1;
  c.dtype = "fp8";
  c.expert_dtype = "fp4";
  return c;
}

void fill_engram_rows(ModelConfig& c) {
  c.engram_num_embeddings = compute_engram_layout(c).rows;
}

}  // namespace

ModelConfig released_config() {
  ModelConfig c = released_constants();
  c.dim = 5120;
  c.moe_inter_dim = 2304;
  c.n_layers = 40;
  c.n_mtp_layers = 3;
  c.n_heads = 64;
  c.n_routed_experts = 384;
  c.n_activated_experts = 6;
  c.q_lora_rank = 1280;
  c.head_dim = 512;
  c.rope_head_dim = 64;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.window_size = 128;
  c.compress_ratios = {0, 0};
  for (int i = 2; i < 20; ++i) c.compress_ratios.push_back(2);
  for (int i = 20; i < 40; ++i) c.compress_ratios.push_back(1);
  c.compress_ratios.insert(c.compress_ratios.end(), {0, 0, 0});
  c.kv_source_layers = {2, 8, 14, 20};
  c.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
  c.original_seq_len = 65536;
  c.rope_factor = 16;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.candidate_source_layer = 20;
  c.candidate_topk_blocks = 2048;
  c.candidate_block_size = 8;
  c.engram_layer_ids = {1, 14};
  c.engram_vocab_size = 16000000;
  c.engram_n_heads = 8;
  c.engram_head_dim = 256;
  c.engram_num_embeddings = {384006168, 384016682};
  c.dspark_block_size = 5;
  c.dspark_target_layer_ids = {37, 38, 39};
  c.dspark_markov_rank = 256;
  c.dspark_n_routed_experts = 128;
  c.dspark_n_activated_experts = 3;
  c.vision_n_layers = 32;
  c.vision_dim = 1024;
  c.vision_n_heads = 16;
  c.vision_inter_dim = 2816;
  c.max_seq_len = 1048576;
  return c;
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c = released_constants();
  if (name == "tiny") {
    // 8 backbone layers laid out like the release in miniature:
    //   0-1 window only; 2 Full m=2 (kv+index source), 3 Reuse m=2;
    //   4 Full m=1 + candidate source (decoder start), 5 Reuse, 6 Reindex (pool), 7 Reuse;
    //   Engram at 1 and 3; 3 DSpark stages reading layers 5-7; a 2-block ViT.
    c.dim = 128;
    c.moe_inter_dim = 64;
    c.n_layers = 8;
    c.n_mtp_layers = 3;
    c.n_heads = 4;
    c.n_routed_experts = 8;
    c.n_activated_experts = 2;
    c.q_lora_rank = 64;
    c.head_dim = 64;
    c.rope_head_dim = 16;
    c.o_groups = 2;
    c.o_lora_rank = 32;
    c.window_size = 128;  // the real ring size, so long prompts wrap it as in the release
    c.compress_ratios = {0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0};
    c.kv_source_layers = {2, 4};
    c.index_source_layers = {2, 4, 6};
    c.original_seq_len = 64;  // YaRN active well inside a 600-token test prompt
    c.rope_factor = 4;
    c.index_n_heads = 4;
    c.index_head_dim = 32;
    c.index_topk = 16;
    c.candidate_source_layer = 4;
    c.candidate_topk_blocks = 8;  // a pool of up to 32 entries: larger than top-16, as in the release
    c.candidate_block_size = 4;
    c.engram_layer_ids = {1, 3};
    c.engram_vocab_size = 1000;
    c.engram_n_heads = 2;
    c.engram_head_dim = 32;
    c.dspark_block_size = 4;
    c.dspark_target_layer_ids = {5, 6, 7};
    c.dspark_markov_rank = 32;
    c.dspark_n_routed_experts = 4;
    c.dspark_n_activated_experts = 2;
    c.vision_n_layers = 2;
    c.vision_dim = 64;
    c.vision_n_heads = 4;
    c.vision_inter_dim = 64;
    c.max_seq_len = 4096;
    fill_engram_rows(c);
    return c;
  }
  if (name == "small") {
    // Released head/latent widths (512-d latent, 64 rope dims, 128-slot window) at a width and
    // depth a laptop can stream: about 1.5 GB on disk.
    c.dim = 1024;
    c.moe_inter_dim = 512;
    c.n_layers = 12;
    c.n_mtp_layers = 1;
    c.n_heads = 8;
    c.n_routed_experts = 32;
    c.n_activated_experts = 4;
    c.q_lora_rank = 256;
    c.head_dim = 512;
    c.rope_head_dim = 64;
    c.o_groups = 4;
    c.o_lora_rank = 256;
    c.window_size = 128;
    c.compress_ratios = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0};
    c.kv_source_layers = {2, 6};
    c.index_source_layers = {2, 6, 8, 10};
    c.original_seq_len = 4096;
    c.rope_factor = 16;
    c.index_n_heads = 8;
    c.index_head_dim = 128;
    c.index_topk = 128;
    c.candidate_source_layer = 6;
    c.candidate_topk_blocks = 64;
    c.candidate_block_size = 8;
    c.engram_layer_ids = {1, 4};
    c.engram_vocab_size = 50000;
    c.engram_n_heads = 4;
    c.engram_head_dim = 256;
    c.dspark_block_size = 5;
    c.dspark_target_layer_ids = {9, 10, 11};
    c.dspark_markov_rank = 128;
    c.dspark_n_routed_experts = 16;
    c.dspark_n_activated_experts = 2;
    c.vision_n_layers = 4;
    c.vision_dim = 256;
    c.vision_n_heads = 4;
    c.vision_inter_dim = 512;
    c.max_seq_len = 65536;
    fill_engram_rows(c);
    return c;
  }
  if (name == "wide") {
    // The released widths (dim 5120, 64 heads of 512, q / o ranks 1280 / 1024 in 8 groups, FP4
    // experts 2304 wide with 6 active, 32 index heads, top-512, a 2048-block candidate pool) at 6
    // layers and 24 routed experts, about 7.6 GB: what a layer of the released model costs.
    //   0 window only; 1 Full m=2 (kv + index source), 2 Reuse m=2; 3 Full m=1 + candidate source
    //   (decoder start), 4 Reuse, 5 Reindex (pool); Engram at 1 and 2; DSpark reading 3-5.
    c = released_config();
    c.n_layers = 6;
    c.n_mtp_layers = 1;
    c.n_routed_experts = 24;
    c.compress_ratios = {0, 2, 2, 1, 1, 1, 0};
    c.kv_source_layers = {1, 3};
    c.index_source_layers = {1, 3, 5};
    c.candidate_source_layer = 3;
    c.engram_layer_ids = {1, 2};
    c.engram_vocab_size = 50000;
    c.dspark_target_layer_ids = {3, 4, 5};
    c.dspark_n_routed_experts = 16;
    c.vision_n_layers = 2;
    c.vision_dim = 256;
    c.vision_n_heads = 4;
    c.vision_inter_dim = 512;
    c.max_seq_len = 65536;
    fill_engram_rows(c);
    return c;
  }
  std::string known;
  for (auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown preset '" + name + "' (known presets: " + known + ")");
}

std::vector<std::string> preset_names() { return {"tiny", "small", "wide"}; }

}  // namespace ds41
