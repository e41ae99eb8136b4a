#include "model/weight_catalogue.h"

#include <map>
#include <unordered_map>

#include "base/error.h"
#include "io/safetensors.h"
#include "model/layer_plan.h"
#include "model/tensor_table.h"

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

// The catalogue entries of one table row: a plain tensor, or a quantized one with its scales.
void add(std::vector<TensorSpec>& out, const std::string& name, TensorFormat format, const Dims& d, TensorGroup group,
         bool required) {
  switch (format) {
    case TensorFormat::Bf16:
    case TensorFormat::F32:
      out.push_back({name, format == TensorFormat::Bf16 ? DType::BF16 : DType::F32, d, group, TensorRole::Plain, required});
      return;
    case TensorFormat::Fp8:  // [out, in] + 32x32 block scales
      out.push_back({name + ".weight", DType::F8_E4M3, d, group, TensorRole::Fp8Weight, required});
      out.push_back({name + ".scale", DType::F8_E8M0, {ceil_div(d[0], 32), ceil_div(d[1], 32)}, group,
                     TensorRole::BlockScale, required});
      return;
    case TensorFormat::Fp4:  // two E2M1 per byte along K, one E8M0 scale per 32 K elements of a row
      out.push_back({name + ".weight", DType::I8, {d[0], d[1] / 2}, group, TensorRole::Fp4Weight, required});
      out.push_back({name + ".scale", DType::F8_E8M0, {d[0], d[1] / 32}, group, TensorRole::BlockScale, required});
      return;
    case TensorFormat::EngramTable:  // FP8 rows, one E8M0 scale per 32 of a row
      out.push_back({name + ".weight", DType::F8_E4M3, d, group, TensorRole::EngramTable, required});
      out.push_back({name + ".scale", DType::F8_E8M0, {d[0], d[1] / 32}, group, TensorRole::BlockScale, required});
      return;
  }
}

}  // namespace

std::vector<TensorSpec> build_weight_catalogue(const ModelConfig& c) {
  ModelPlan plan = build_model_plan(c);
  std::vector<TensorSpec> out;
  for (const ModelTensor& t : text_model_tensors()) add(out, t.name, TensorFormat::Bf16, t.dims(c), t.group, true);
  const std::span<const BlockTensor> rows = block_tensors();
  for (const LayerPlan& lp : plan.layers) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const BlockTensor& t = rows[i];
      if (!block_has(t, c, lp)) continue;
      const TensorGroup group = lp.is_dspark ? TensorGroup::DSpark : t.group;
      if (t.when != TensorWhen::RoutedExpert) {
        add(out, lp.prefix + t.name, t.format, t.dims(c, lp), group, block_requires(t, c, lp));
        continue;
      }
      // The routed experts' rows are consecutive in the table; the checkpoint holds each expert's
      // tensors together, expert by expert.
      size_t end = i;
      while (end < rows.size() && rows[end].when == TensorWhen::RoutedExpert) ++end;
      for (int e = 0; e < lp.routed_experts; ++e)
        for (size_t k = i; k < end; ++k)
          add(out, expert_prefix(lp, e) + rows[k].name, rows[k].format, rows[k].dims(c, lp), group, true);
      i = end - 1;
    }
  }
  if (c.vision_enabled()) {
    for (const ModelTensor& t : vision_tensors()) add(out, t.name, TensorFormat::Bf16, t.dims(c), t.group, true);
    for (int i = 0; i < c.vision_n_layers; ++i)
      for (const VisionBlockTensor& t : vision_block_tensors())
        add(out, vision_block_prefix(i) + t.name, TensorFormat::Bf16, t.dims(c), TensorGroup::Vision, true);
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
