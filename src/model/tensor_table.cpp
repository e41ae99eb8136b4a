#include "model/tensor_table.h"

namespace ds41 {

namespace {

using C = const ModelConfig&;
using P = const LayerPlan&;
using F = TensorFormat;
using G = TensorGroup;
using W = TensorWhen;
using B = BlockWeights;

int64_t hc_mixes(C c) { return int64_t(2 + c.hc_mult) * c.hc_mult; }  // pre, post and the hc x hc mix
int64_t q_width(C c) { return int64_t(c.n_heads) * c.head_dim; }
int64_t index_q_width(C c) { return int64_t(c.index_n_heads) * c.index_head_dim; }

// The released layout (spec backbone.md §2.2, engram_dspark_vision.md §A.11, §B.2), in the
// order mkmodel writes it.
const BlockTensor kBlockTensors[] = {
    {"attn_norm.weight", F::Bf16, G::Norm, W::Always, [](C c, P) -> Dims { return {c.dim}; }, &B::attn_norm},
    {"ffn_norm.weight", F::Bf16, G::Norm, W::Always, [](C c, P) -> Dims { return {c.dim}; }, &B::ffn_norm},
    {"hc_attn_fn", F::F32, G::HyperConnection, W::Always, [](C c, P) -> Dims { return {hc_mixes(c), c.hc_mult * c.dim}; }, &B::hc_attn_fn},
    {"hc_ffn_fn", F::F32, G::HyperConnection, W::Always, [](C c, P) -> Dims { return {hc_mixes(c), c.hc_mult * c.dim}; }, &B::hc_ffn_fn},
    {"hc_attn_base", F::F32, G::HyperConnection, W::Always, [](C c, P) -> Dims { return {hc_mixes(c)}; }, &B::hc_attn_base},
    {"hc_ffn_base", F::F32, G::HyperConnection, W::Always, [](C c, P) -> Dims { return {hc_mixes(c)}; }, &B::hc_ffn_base},
    {"hc_attn_scale", F::F32, G::HyperConnection, W::Always, [](C, P) -> Dims { return {3}; }, &B::hc_attn_scale},
    {"hc_ffn_scale", F::F32, G::HyperConnection, W::Always, [](C, P) -> Dims { return {3}; }, &B::hc_ffn_scale},

    {"attn.wq_a", F::Fp8, G::Attention, W::Always, [](C c, P) -> Dims { return {c.q_lora_rank, c.dim}; }, &B::wq_a},
    {"attn.q_norm.weight", F::Bf16, G::Attention, W::Always, [](C c, P) -> Dims { return {c.q_lora_rank}; }, &B::q_norm},
    {"attn.wq_b", F::Fp8, G::Attention, W::Always, [](C c, P) -> Dims { return {q_width(c), c.q_lora_rank}; }, &B::wq_b},
    {"attn.wkv", F::Fp8, G::Attention, W::Always, [](C c, P) -> Dims { return {c.head_dim, c.dim}; }, &B::wkv},
    {"attn.kv_norm.weight", F::Bf16, G::Attention, W::Always, [](C c, P) -> Dims { return {c.head_dim}; }, &B::kv_norm},
    {"attn.wo_a", F::Fp8, G::Attention, W::Always,
     [](C c, P) -> Dims { return {int64_t(c.o_groups) * c.o_lora_rank, q_width(c) / c.o_groups}; }, &B::wo_a_fp8,
     /*decode_copy=*/false},
    {"attn.wo_b", F::Fp8, G::Attention, W::Always, [](C c, P) -> Dims { return {c.dim, int64_t(c.o_groups) * c.o_lora_rank}; }, &B::wo_b},
    {"attn.attn_sink", F::F32, G::Attention, W::Always, [](C c, P) -> Dims { return {c.n_heads}; }, &B::attn_sink},
    {"attn.compressor.wkv.weight", F::Bf16, G::Attention, W::KvSource, [](C c, P) -> Dims { return {c.head_dim, c.dim}; }, &B::comp_wkv_bf16},
    {"attn.compressor.wgate.weight", F::Bf16, G::Attention, W::GatedKvSource, [](C c, P) -> Dims { return {c.head_dim, c.dim}; }, &B::comp_wgate_bf16},
    {"attn.compressor.norm.weight", F::Bf16, G::Attention, W::KvSource, [](C c, P) -> Dims { return {c.head_dim}; }, &B::comp_norm},
    {"attn.indexer.wq_b", F::Fp8, G::Attention, W::IndexSource, [](C c, P) -> Dims { return {index_q_width(c), c.q_lora_rank}; }, &B::idx_wq_b},
    {"attn.indexer.weights_proj.weight", F::Bf16, G::Attention, W::IndexSource, [](C c, P) -> Dims { return {c.index_n_heads, c.dim}; }, &B::idx_weights_proj},
    {"attn.indexer.wk.weight", F::Bf16, G::Attention, W::OwnsIndexK, [](C c, P) -> Dims { return {c.index_head_dim, c.head_dim}; }, &B::idx_wk},
    {"attn.indexer.k_norm.weight", F::Bf16, G::Attention, W::OwnsIndexK, [](C c, P) -> Dims { return {c.index_head_dim}; }, &B::idx_k_norm},

    {"ffn.gate.weight", F::Bf16, G::MoE, W::Always, [](C c, P lp) -> Dims { return {lp.routed_experts, c.dim}; }, &B::gate_w},
    {"ffn.gate.bias", F::F32, G::MoE, W::Always, [](C, P lp) -> Dims { return {lp.routed_experts}; }, &B::gate_bias},
    {"ffn.gate.bias_vl", F::F32, G::MoE, W::GateVisionBias, [](C, P lp) -> Dims { return {lp.routed_experts}; }, &B::gate_bias_vl},
    {"w1", F::Fp4, G::MoE, W::RoutedExpert, [](C c, P) -> Dims { return {c.moe_inter_dim, c.dim}; }, &ExpertWeights::w1},
    {"w2", F::Fp4, G::MoE, W::RoutedExpert, [](C c, P) -> Dims { return {c.dim, c.moe_inter_dim}; }, &ExpertWeights::w2},
    {"w3", F::Fp4, G::MoE, W::RoutedExpert, [](C c, P) -> Dims { return {c.moe_inter_dim, c.dim}; }, &ExpertWeights::w3},
    {"ffn.shared_experts.w1", F::Fp8, G::MoE, W::Always, [](C c, P) -> Dims { return {c.moe_inter_dim, c.dim}; }, &SharedExpertWeights::w1},
    {"ffn.shared_experts.w2", F::Fp8, G::MoE, W::Always, [](C c, P) -> Dims { return {c.dim, c.moe_inter_dim}; }, &SharedExpertWeights::w2},
    {"ffn.shared_experts.w3", F::Fp8, G::MoE, W::Always, [](C c, P) -> Dims { return {c.moe_inter_dim, c.dim}; }, &SharedExpertWeights::w3},

    {"engram.embed", F::EngramTable, G::Engram, W::Engram,
     [](C c, P lp) -> Dims { return {c.engram_num_embeddings[size_t(lp.engram_index)], c.engram_head_dim}; }, &B::engram_table},
    {"engram.wkv", F::Fp8, G::Engram, W::Engram,
     [](C c, P) -> Dims {
       return {c.dim * (c.hc_mult + 1), int64_t(c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim};
     },
     &B::engram_wkv},
    {"engram.q_weight", F::Bf16, G::Engram, W::Engram, [](C c, P) -> Dims { return {c.hc_mult, c.dim}; }, &B::engram_q_weight},
    {"engram.k_weight", F::Bf16, G::Engram, W::Engram, [](C c, P) -> Dims { return {c.hc_mult, c.dim}; }, &B::engram_k_weight},

    {"main_proj", F::Fp8, G::DSpark, W::DSparkFirst,
     [](C c, P) -> Dims { return {c.dim, c.dim * int64_t(c.dspark_target_layer_ids.size())}; }, &DSparkHeadWeights::main_proj},
    {"main_norm.weight", F::Bf16, G::DSpark, W::DSparkFirst, [](C c, P) -> Dims { return {c.dim}; }, &DSparkHeadWeights::main_norm},
    {"norm.weight", F::Bf16, G::DSpark, W::DSparkLast, [](C c, P) -> Dims { return {c.dim}; }, &DSparkHeadWeights::norm},
    {"markov_head.embed.weight", F::Bf16, G::DSpark, W::DSparkLast,
     [](C c, P) -> Dims { return {c.vocab_size, c.dspark_markov_rank}; }, &DSparkHeadWeights::markov_embed},
    {"markov_head.head.weight", F::Bf16, G::DSpark, W::DSparkLast,
     [](C c, P) -> Dims { return {c.vocab_size, c.dspark_markov_rank}; }, &DSparkHeadWeights::markov_head},
    {"confidence_head.proj.weight", F::Bf16, G::DSpark, W::DSparkLast,
     [](C c, P) -> Dims { return {1, c.dim + c.dspark_markov_rank}; }, &DSparkHeadWeights::confidence},
};

using M = ModelWeights;
using V = VisionWeights;

const ModelTensor kTextModelTensors[] = {
    {"embed.weight", G::EmbedHead, W::Always, [](C c) -> Dims { return {c.vocab_size, c.dim}; }, &M::embed},
    {kHeadTensor, G::EmbedHead, W::Always, [](C c) -> Dims { return {c.vocab_size, c.dim}; }, &M::head},
    {"norm.weight", G::Norm, W::Always, [](C c) -> Dims { return {c.dim}; }, &M::norm},
};

// spec engram_dspark_vision.md §C.7
const ModelTensor kVisionTensors[] = {
    {"vision.patch_embed.proj.weight", G::Vision, W::Vision,
     [](C c) -> Dims { return {c.vision_dim, 3 * int64_t(c.vision_patch_size) * c.vision_patch_size}; }, &V::patch_w},
    {"vision.patch_embed.proj.bias", G::Vision, W::Vision, [](C c) -> Dims { return {c.vision_dim}; }, &V::patch_b},
    {"vision.norm.weight", G::Vision, W::Vision, [](C c) -> Dims { return {c.vision_dim}; }, &V::norm},
    {"aligner.w1.weight", G::Vision, W::Vision,
     [](C c) -> Dims { return {c.dim, int64_t(c.vision_dim) * c.vision_downsample_ratio * c.vision_downsample_ratio}; },
     &V::aligner_w1},
    {"aligner.w1.bias", G::Vision, W::Vision, [](C c) -> Dims { return {c.dim}; }, &V::aligner_b1},
    {"aligner.w2.weight", G::Vision, W::Vision, [](C c) -> Dims { return {c.dim, c.dim}; }, &V::aligner_w2},
    {"aligner.w2.bias", G::Vision, W::Vision, [](C c) -> Dims { return {c.dim}; }, &V::aligner_b2},
    {"image_start", G::Vision, W::Vision, [](C c) -> Dims { return {c.dim}; }, &V::image_start},
    {"image_end", G::Vision, W::Vision, [](C c) -> Dims { return {c.dim}; }, &V::image_end},
    {"image_newline", G::Vision, W::Vision, [](C c) -> Dims { return {c.dim}; }, &V::image_newline},
};

using VB = VisionBlockWeights;
const VisionBlockTensor kVisionBlockTensors[] = {
    {"attn.wqkv.weight", [](C c) -> Dims { return {3 * int64_t(c.vision_dim), c.vision_dim}; }, &VB::wqkv},
    {"attn.wqkv.bias", [](C c) -> Dims { return {3 * int64_t(c.vision_dim)}; }, &VB::wqkv_bias},
    {"attn.wo.weight", [](C c) -> Dims { return {c.vision_dim, c.vision_dim}; }, &VB::wo},
    {"attn.wo.bias", [](C c) -> Dims { return {c.vision_dim}; }, &VB::wo_bias},
    {"mlp.w1.weight", [](C c) -> Dims { return {2 * int64_t(c.vision_inter_dim), c.vision_dim}; }, &VB::w1},
    {"mlp.w2.weight", [](C c) -> Dims { return {c.vision_dim, c.vision_inter_dim}; }, &VB::w2},
    {"norm1.weight", [](C c) -> Dims { return {c.vision_dim}; }, &VB::norm1},
    {"norm2.weight", [](C c) -> Dims { return {c.vision_dim}; }, &VB::norm2},
};

}  // namespace

std::span<const ModelTensor> text_model_tensors() { return kTextModelTensors; }
std::span<const BlockTensor> block_tensors() { return kBlockTensors; }
std::span<const ModelTensor> vision_tensors() { return kVisionTensors; }
std::span<const VisionBlockTensor> vision_block_tensors() { return kVisionBlockTensors; }

bool block_has(const BlockTensor& t, const ModelConfig& c, const LayerPlan& lp) {
  switch (t.when) {
    case W::Always:
    case W::GateVisionBias:
    case W::RoutedExpert: return true;
    case W::KvSource: return lp.kv_source;
    case W::GatedKvSource: return lp.kv_source && lp.ratio > 1;
    case W::IndexSource: return lp.index_source;
    case W::OwnsIndexK: return lp.index_source && lp.owns_index_k;
    case W::Engram: return lp.engram && !lp.is_dspark;
    case W::DSparkFirst: return lp.is_dspark && lp.dspark_stage == 0;
    case W::DSparkLast: return lp.is_dspark && lp.dspark_stage == c.n_mtp_layers - 1;
    case W::Vision: return c.vision_enabled();
  }
  return false;
}

bool block_requires(const BlockTensor& t, const ModelConfig& c, const LayerPlan& lp) {
  if (t.when == W::GateVisionBias) return c.vision_enabled() && !lp.is_dspark;
  return block_has(t, c, lp);
}

std::string expert_prefix(const LayerPlan& lp, int expert) {
  return lp.prefix + "ffn.experts." + std::to_string(expert) + ".";
}

std::string vision_block_prefix(int block) { return "vision.blocks." + std::to_string(block) + "."; }

}  // namespace ds41
