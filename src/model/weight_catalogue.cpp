#include "model/weight_catalogue.h"

#include <map>
#include <unordered_map>

#include "base/error.h"
#include "io/safetensors.h"
#include "model/layer_plan.h"

namespace ds41 {

const char* tensor_group_name(TensorGroup g) {
  switch (g) {
    case TensorGroup::EmbedHead: return "embed_head";
    case TensorGroup::Attention: return "attention";
    case TensorGroup::HyperConnection: return "hyper_connection";
    case TensorGroup::Norm: return "norm";
    case TensorGroup::MoE: return "moe";
    case TensorGroup::Engram: return "engram";
    case TensorGroup::DSpark: return "dspark";
    case TensorGroup::Vision: return "vision";
  }
  return "?";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
int64_t TensorSpec::nbytes() const { return numel() * int64_t(dtype_size(dtype)); }
int64_t TensorSpec::params() const {
  if (role == TensorRole::BlockScale) return 0;
  return role == TensorRole::Fp4Weight ? 2 * numel() : numel();
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class CatalogueBuilder {
 public:
  explicit CatalogueBuilder(std::vector<TensorSpec>& out) : out_(out) {}
  TensorGroup group = TensorGroup::Attention;

  void plain(const std::string& name, DType t, std::vector<int64_t> shape, bool required = true) {
    out_.push_back({name, t, std::move(shape), group, TensorRole::Plain, required});
  }
  // FP8 linear: weight [out, in] + 32x32 block scales.
  void fp8(const std::string& base, int64_t out, int64_t in) {
    out_.push_back({base + ".weight", DType::F8_E4M3, {out, in}, group, TensorRole::Fp8Weight, true});
    out_.push_back({base + ".scale", DType::F8_E8M0, {ceil_div(out, 32), ceil_div(in, 32)}, group,
                    TensorRole::BlockScale, true});
  }
  // FP4 expert linear: two E2M1 per byte along K, one E8M0 scale per 32 K elements of a row.
  void fp4(const std::string& base, int64_t out, int64_t in) {
    out_.push_back({base + ".weight", DType::I8, {out, in / 2}, group, TensorRole::Fp4Weight, true});
    out_.push_back({base + ".scale", DType::F8_E8M0, {out, in / 32}, group, TensorRole::BlockScale, true});
  }
  void bf16(const std::string& name, std::vector<int64_t> shape) { plain(name, DType::BF16, std::move(shape)); }
  void f32(const std::string& name, std::vector<int64_t> shape, bool required = true) {
    plain(name, DType::F32, std::move(shape), required);
  }

 private:
  std::vector<TensorSpec>& out_;
};

void add_block(CatalogueBuilder& b, const ModelConfig& c, const LayerPlan& lp) {
  const std::string& p = lp.prefix;
  const int64_t D = c.dim, hc = c.hc_mult, mix = (2 + hc) * hc;
  auto set = [&](TensorGroup g) { b.group = lp.is_dspark ? TensorGroup::DSpark : g; };

  set(TensorGroup::Norm);
  b.bf16(p + "attn_norm.weight", {D});
  b.bf16(p + "ffn_norm.weight", {D});
  set(TensorGroup::HyperConnection);
  b.f32(p + "hc_attn_fn", {mix, hc * D});
  b.f32(p + "hc_ffn_fn", {mix, hc * D});
  b.f32(p + "hc_attn_base", {mix});
  b.f32(p + "hc_ffn_base", {mix});
  b.f32(p + "hc_attn_scale", {3});
  b.f32(p + "hc_ffn_scale", {3});

  set(TensorGroup::Attention);
  const std::string a = p + "attn.";
  b.fp8(a + "wq_a", c.q_lora_rank, D);
  b.bf16(a + "q_norm.weight", {c.q_lora_rank});
  b.fp8(a + "wq_b", int64_t(c.n_heads) * c.head_dim, c.q_lora_rank);
  b.fp8(a + "wkv", c.head_dim, D);
  b.bf16(a + "kv_norm.weight", {c.head_dim});
  b.fp8(a + "wo_a", int64_t(c.o_groups) * c.o_lora_rank, int64_t(c.n_heads) * c.head_dim / c.o_groups);
  b.fp8(a + "wo_b", D, int64_t(c.o_groups) * c.o_lora_rank);
  b.f32(a + "attn_sink", {c.n_heads});
  if (lp.kv_source) {
    b.bf16(a + "compressor.wkv.weight", {c.head_dim, D});
    if (lp.ratio > 1) b.bf16(a + "compressor.wgate.weight", {c.head_dim, D});
    b.bf16(a + "compressor.norm.weight", {c.head_dim});
  }
  if (lp.index_source) {
    b.fp8(a + "indexer.wq_b", int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank);
    b.bf16(a + "indexer.weights_proj.weight", {c.index_n_heads, D});
    if (lp.owns_index_k) {
      b.bf16(a + "indexer.wk.weight", {c.index_head_dim, c.head_dim});
      b.bf16(a + "indexer.k_norm.weight", {c.index_head_dim});
    }
  }

  set(TensorGroup::MoE);
  const std::string f = p + "ffn.";
  const int64_t E = lp.routed_experts, I = c.moe_inter_dim;
  b.bf16(f + "gate.weight", {E, D});
  b.f32(f + "gate.bias", {E});
  // The release ships bias_vl in every gate; it only matters when vision is on.
  b.f32(f + "gate.bias_vl", {E}, /*required=*/c.vision_enabled() && !lp.is_dspark);
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = f + "experts." + std::to_string(e) + ".";
    b.fp4(x + "w1", I, D);
    b.fp4(x + "w2", D, I);
    b.fp4(x + "w3", I, D);
  }
  b.fp8(f + "shared_experts.w1", I, D);
  b.fp8(f + "shared_experts.w2", D, I);
  b.fp8(f + "shared_experts.w3", I, D);
}

}  // namespace

std::vector<TensorSpec> build_weight_catalogue(const ModelConfig& c) {
  ModelPlan plan = build_model_plan(c);
  std::vector<TensorSpec> out;
  CatalogueBuilder b(out);
  const int64_t D = c.dim;

  b.group = TensorGroup::EmbedHead;
  b.bf16("embed.weight", {c.vocab_size, D});
  b.bf16("head.weight", {c.vocab_size, D});
  b.group = TensorGroup::Norm;
  b.bf16("norm.weight", {D});

  for (const LayerPlan& lp : plan.layers) {
    if (lp.is_dspark) continue;
    add_block(b, c, lp);
    if (lp.engram) {
      b.group = TensorGroup::Engram;
      const std::string e = lp.prefix + "engram.";
      const int64_t rows = c.engram_num_embeddings[lp.engram_index];
      const int64_t cols = int64_t(c.engram_max_ngram_size - 1) * c.engram_n_heads;
      out.push_back({e + "embed.weight", DType::F8_E4M3, {rows, c.engram_head_dim}, b.group, TensorRole::EngramTable, true});
      out.push_back({e + "embed.scale", DType::F8_E8M0, {rows, c.engram_head_dim / 32}, b.group, TensorRole::BlockScale, true});
      b.fp8(e + "wkv", D * (c.hc_mult + 1), cols * c.engram_head_dim);
      b.bf16(e + "q_weight", {c.hc_mult, D});
      b.bf16(e + "k_weight", {c.hc_mult, D});
    }
  }

  if (c.dspark_enabled()) {
    for (const LayerPlan& lp : plan.layers) {
      if (!lp.is_dspark) continue;
      add_block(b, c, lp);
      b.group = TensorGroup::DSpark;
      if (lp.dspark_stage == 0) {
        b.fp8(lp.prefix + "main_proj", D, D * int64_t(c.dspark_target_layer_ids.size()));
        b.bf16(lp.prefix + "main_norm.weight", {D});
      }
      if (lp.dspark_stage == c.n_mtp_layers - 1) {
        b.bf16(lp.prefix + "norm.weight", {D});
        b.bf16(lp.prefix + "markov_head.embed.weight", {c.vocab_size, c.dspark_markov_rank});
        b.bf16(lp.prefix + "markov_head.head.weight", {c.vocab_size, c.dspark_markov_rank});
        b.bf16(lp.prefix + "confidence_head.proj.weight", {1, D + c.dspark_markov_rank});
      }
    }
  }

  if (c.vision_enabled()) {
    b.group = TensorGroup::Vision;
    const int64_t V = c.vision_dim, P = c.vision_patch_size;
    b.bf16("vision.patch_embed.proj.weight", {V, 3 * P * P});
    b.bf16("vision.patch_embed.proj.bias", {V});
    for (int i = 0; i < c.vision_n_layers; ++i) {
      const std::string v = "vision.blocks." + std::to_string(i) + ".";
      b.bf16(v + "attn.wqkv.weight", {3 * V, V});
      b.bf16(v + "attn.wqkv.bias", {3 * V});
      b.bf16(v + "attn.wo.weight", {V, V});
      b.bf16(v + "attn.wo.bias", {V});
      b.bf16(v + "mlp.w1.weight", {2 * c.vision_inter_dim, V});
      b.bf16(v + "mlp.w2.weight", {V, c.vision_inter_dim});
      b.bf16(v + "norm1.weight", {V});
      b.bf16(v + "norm2.weight", {V});
    }
    b.bf16("vision.norm.weight", {V});
    const int64_t cell = int64_t(c.vision_downsample_ratio) * c.vision_downsample_ratio;
    b.bf16("aligner.w1.weight", {D, V * cell});
    b.bf16("aligner.w1.bias", {D});
    b.bf16("aligner.w2.weight", {D, D});
    b.bf16("aligner.w2.bias", {D});
    b.bf16("image_start", {D});
    b.bf16("image_end", {D});
    b.bf16("image_newline", {D});
  }
  return out;
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::vector<std::string> catalogue_problems(const TensorStore& store, const std::vector<TensorSpec>& catalogue) {
  std::vector<std::string> missing, bad, unexpected;
  std::unordered_map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& s : catalogue) by_name.emplace(s.name, &s);
  for (const TensorSpec& s : catalogue) {
    const TensorInfo* t = store.find(s.name);
    if (!t) {
      if (s.required) missing.push_back(s.name + " (" + std::string(dtype_name(s.dtype)) + " " + shape_str(s.shape) + ")");
      continue;
    }
    if (t->dtype != s.dtype)
      bad.push_back(s.name + ": dtype " + std::string(dtype_name(t->dtype)) + ", expected " + std::string(dtype_name(s.dtype)));
    if (t->shape != s.shape)
      bad.push_back(s.name + ": shape " + shape_str(t->shape) + ", expected " + shape_str(s.shape));
  }
  for (const TensorInfo& tref : store.tensors())
  { const TensorInfo* t = &tref; if (!by_name.count(t->name)) unexpected.push_back(t->name + " (in " + t->file + ")"); }

  std::vector<std::string> out;
  auto section = [&](const std::vector<std::string>& items, const std::string& title) {
    if (items.empty()) return;
    out.push_back(title + " (" + std::to_string(items.size()) + "):");
    const size_t shown = 20;
    for (size_t i = 0; i < items.size() && i < shown; ++i) out.push_back("    " + items[i]);
    if (items.size() > shown) out.push_back("    ... and " + std::to_string(items.size() - shown) + " more");
  };
  section(missing, "missing tensors");
  section(bad, "tensors with the wrong dtype or shape");
  section(unexpected, "unexpected tensors (not in the model described by the config)");
  return out;
}

void check_checkpoint_against_catalogue(const TensorStore& store, const std::vector<TensorSpec>& catalogue) {
  auto problems = catalogue_problems(store, catalogue);
  if (problems.empty()) return;
  std::string msg = store.root() + ": the checkpoint does not match its config:";
  for (auto& p : problems) msg += "\n  " + p;
  throw Error(msg);
}

}  // namespace ds41
