// `ds41 inspect DIR` / `ds41 inspect --config FILE`: config summary, the layer plan, tensor counts
// and bytes by dtype and group, KV-cache bytes per token, and the validation result.
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/layer_plan.h"
#include "model/weight_catalogue.h"

namespace ds41::cli {

using json = nlohmann::json;

namespace {

std::string ids(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string with_commas(uint64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

json layer_json(const LayerPlan& l) {
  json j;
  j["id"] = l.id;
  j["name"] = l.prefix.substr(0, l.prefix.size() - 1);
  j["side"] = l.is_dspark ? "dspark" : (l.decoder ? "decoder" : "encoder");
  j["ratio"] = l.ratio;
  j["mode"] = attn_mode_name(l.mode);
  j["kv_source"] = l.kv_source;
  j["index_source"] = l.index_source;
  j["candidate_source"] = l.candidate_source;
  j["uses_candidates"] = l.uses_candidates;
  j["kv_source_layer"] = l.kv_source_layer;
  j["index_source_layer"] = l.index_source_layer;
  j["rope"] = {{"theta", l.rope.theta}, {"yarn", l.rope.yarn}, {"dim", l.rope.dim}};
  j["engram"] = l.engram;
  j["dspark_target"] = l.dspark_target;
  j["routed_experts"] = l.routed_experts;
  j["activated_experts"] = l.activated_experts;
  return j;
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  Args args("inspect", "describe a checkpoint or config: layer plan, tensors, KV-cache size, validation",
            "ds41 inspect DIR [--json]\n       ds41 inspect --config FILE [--json]",
            {{"config", "FILE", "inspect a config.json (HF or inference/ flat form) without weights", ""},
             {"json", "", "print machine-readable JSON (keys: tensors, dtype_counts, bytes, layers, kv_bytes_per_token, errors)", ""}});
  if (!args.parse(argc, argv)) return 0;
  const bool as_json = args.flag("json");
  auto config_path = args.get("config");
  if (config_path.has_value() == !args.positional().empty() || args.positional().size() > 1)
    throw Error("ds41 inspect: give either a checkpoint directory or --config FILE (see --help)");

  std::vector<std::string> errors;
  std::string source = config_path ? *config_path : args.positional()[0];
  ModelConfig cfg;
  bool config_loaded = false;
  try {
    cfg = config_path ? load_config_file(*config_path) : load_model_dir_config(source);
    config_loaded = true;
    for (auto& p : config_problems(cfg)) errors.push_back("config: " + p);
  } catch (const Error& e) {
    errors.push_back(std::string("config: ") + e.what());
  }

  ModelPlan plan;
  std::vector<TensorSpec> catalogue;
  if (config_loaded && errors.empty()) {
    plan = build_model_plan(cfg);
    catalogue = build_weight_catalogue(cfg);
  }

  // Counts: from the checkpoint's own headers when there is one, else from the catalogue.
  std::map<std::string, uint64_t> dtype_counts, dtype_bytes, group_counts, group_bytes, group_params;
  uint64_t n_tensors = 0, total_bytes = 0, total_params = 0;
  std::map<std::string, const TensorSpec*> spec_by_name;
  for (const TensorSpec& s : catalogue) spec_by_name[s.name] = &s;
  auto count = [&](const std::string& name, DType dt, uint64_t bytes, uint64_t params) {
    ++n_tensors;
    total_bytes += bytes;
    total_params += params;
    dtype_counts[std::string(dtype_name(dt))]++;
    dtype_bytes[std::string(dtype_name(dt))] += bytes;
    auto it = spec_by_name.find(name);
    std::string g = it == spec_by_name.end() ? "unknown" : tensor_group_name(it->second->group);
    group_counts[g]++;
    group_bytes[g] += bytes;
    group_params[g] += params;
  };
  std::unique_ptr<TensorStore> store;
  if (!config_path) {
    try {
      store = std::make_unique<TensorStore>(TensorStore::open(source));
    } catch (const Error& e) {
      errors.push_back(std::string("checkpoint: ") + e.what());
    }
  }
  if (store) {
    for (const TensorInfo& tref : store->tensors()) {
      const TensorInfo* t = &tref;
      auto it = spec_by_name.find(t->name);
      uint64_t params = it == spec_by_name.end() ? uint64_t(t->numel()) : uint64_t(it->second->params());
      count(t->name, t->dtype, t->nbytes, params);
    }
    if (!catalogue.empty())
      for (auto& p : catalogue_problems(*store, catalogue)) errors.push_back("checkpoint: " + p);
  } else if (config_path) {
    for (const TensorSpec& s : catalogue) count(s.name, s.dtype, uint64_t(s.nbytes()), uint64_t(s.params()));
  }

  if (as_json) {
    json j;
    j["source"] = source;
    j["tensors"] = n_tensors;
    j["dtype_counts"] = dtype_counts;
    j["bytes"] = {{"total", total_bytes}, {"by_dtype", dtype_bytes}, {"by_group", group_bytes}};
    j["group_counts"] = group_counts;
    j["params"] = {{"total", total_params}, {"by_group", group_params}};
    json layers = json::array();
    for (const LayerPlan& l : plan.layers) layers.push_back(layer_json(l));
    j["layers"] = layers;
    j["kv_bytes_per_token"] = plan.kv_bytes_per_token;
    j["swa_bytes_per_sequence"] = plan.swa_bytes_per_sequence;
    j["errors"] = errors;
    std::printf("%s\n", j.dump(2).c_str());
    return errors.empty() ? 0 : 1;
  }

  std::ostringstream o;
  o << "DeepSeek-V4.1 model from " << source << "\n";
  o << "  vocab " << cfg.vocab_size << ", dim " << cfg.dim << ", " << cfg.n_layers << " layers";
  if (cfg.dspark_enabled()) o << " + " << cfg.n_mtp_layers << " DSpark stages";
  o << ", hyper-connections x" << cfg.hc_mult << "\n";
  o << "  attention: " << cfg.n_heads << " heads x " << cfg.head_dim << " (rope " << cfg.rope_head_dim
    << "), q_lora " << cfg.q_lora_rank << ", output " << cfg.o_groups << " groups x " << cfg.o_lora_rank
    << ", window " << cfg.window_size << "\n";
  o << "  CSA2: kv sources " << ids(cfg.kv_source_layers) << ", index sources " << ids(cfg.index_source_layers)
    << ", indexer " << cfg.index_n_heads << " x " << cfg.index_head_dim << " top-" << cfg.index_topk;
  if (cfg.candidate_source_layer >= 0)
    o << ", candidate pool at layer " << cfg.candidate_source_layer << " (" << cfg.candidate_topk_blocks
      << " blocks x " << cfg.candidate_block_size << ")";
  o << "\n  MoE: " << cfg.n_routed_experts << " routed experts, top-" << cfg.n_activated_experts
    << " + " << cfg.n_shared_experts << " shared, inter " << cfg.moe_inter_dim << ", " << cfg.score_func
    << ", route scale " << cfg.route_scale << "\n";
  if (!cfg.engram_layer_ids.empty()) {
    o << "  Engram: layers " << ids(cfg.engram_layer_ids) << ", " << (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads
      << " hash columns x " << cfg.engram_head_dim << ", table rows";
    for (auto r : cfg.engram_num_embeddings) o << " " << with_commas(uint64_t(r));
    o << "\n";
  }
  if (cfg.dspark_enabled())
    o << "  DSpark: " << cfg.n_mtp_layers << " stages, block " << cfg.dspark_block_size << ", targets "
      << ids(cfg.dspark_target_layer_ids) << ", " << cfg.routed_experts(cfg.n_layers) << " experts top-"
      << cfg.activated_experts(cfg.n_layers) << "\n";
  if (cfg.vision_enabled())
    o << "  Vision: " << cfg.vision_n_layers << " ViT blocks, dim " << cfg.vision_dim << ", patch "
      << cfg.vision_patch_size << ", " << cfg.vision_downsample_ratio << "x" << cfg.vision_downsample_ratio << " merge\n";

  if (!plan.layers.empty()) {
    o << "\nlayer plan:\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-8s %-8s %5s  %-8s %6s %7s  %-10s %-13s %s\n", "layer", "side", "ratio",
                  "mode", "kv_src", "idx_src", "candidates", "rope", "extras");
    o << line;
    for (const LayerPlan& l : plan.layers) {
      std::string cand = l.candidate_source ? "source" : l.uses_candidates ? "restricted" : "-";
      char rope[64];
      std::snprintf(rope, sizeof rope, "%g%s", l.rope.theta, l.rope.yarn ? "+yarn" : "");
      std::string extras;
      if (l.engram) extras += "engram ";
      if (l.dspark_target) extras += "dspark-target ";
      extras += std::to_string(l.routed_experts) + "e/top" + std::to_string(l.activated_experts);
      std::snprintf(line, sizeof line, "  %-8s %-8s %5d  %-8s %6s %7s  %-10s %-13s %s\n",
                    l.prefix.substr(0, l.prefix.size() - 1).c_str(),
                    l.is_dspark ? "dspark" : (l.decoder ? "decoder" : "encoder"), l.ratio, attn_mode_name(l.mode),
                    l.kv_source_layer >= 0 ? std::to_string(l.kv_source_layer).c_str() : "-",
                    l.index_source_layer >= 0 ? std::to_string(l.index_source_layer).c_str() : "-", cand.c_str(),
                    rope, extras.c_str());
      o << line;
    }
  }
  o << "\ntensors: " << with_commas(n_tensors) << ", " << with_commas(total_bytes) << " bytes ("
    << human_bytes(double(total_bytes)) << "), " << with_commas(total_params) << " parameters"
    << (store ? "" : " (from the config's catalogue)") << "\n  by dtype:";
  for (auto& [k, v] : dtype_counts) o << " " << k << " " << with_commas(v) << " (" << human_bytes(double(dtype_bytes[k])) << ");";
  o << "\n  by group:\n";
  for (auto& [k, v] : group_counts) {
    char line[160];
    std::snprintf(line, sizeof line, "    %-17s %8s tensors %12s  %s params\n", k.c_str(), with_commas(v).c_str(),
                  human_bytes(double(group_bytes[k])).c_str(), with_commas(group_params[k]).c_str());
    o << line;
  }
  char kv[160];
  std::snprintf(kv, sizeof kv, "\nKV cache: %.1f bytes/token (packed compressed KV + index keys), plus %s per sequence for the sliding windows\n",
                plan.kv_bytes_per_token, human_bytes(double(plan.swa_bytes_per_sequence)).c_str());
  o << kv;
  if (errors.empty()) {
    o << "validation: OK\n";
  } else {
    o << "validation: " << errors.size() << " problem(s)\n";
    for (auto& e : errors) o << "  " << e << "\n";
  }
  std::fputs(o.str().c_str(), stdout);
  return errors.empty() ? 0 : 1;
}

}  // namespace ds41::cli
