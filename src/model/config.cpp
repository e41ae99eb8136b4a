#include "model/config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/engram_layout.h"

namespace ds41 {

using json = nlohmann::json;
namespace fs = std::filesystem;

int ModelConfig::routed_experts(int layer) const {
  if (layer < n_layers) return n_routed_experts;
  return dspark_n_routed_experts ? dspark_n_routed_experts : n_routed_experts;
}
int ModelConfig::activated_experts(int layer) const {
  if (layer < n_layers) return n_activated_experts;
  return dspark_n_activated_experts ? dspark_n_activated_experts : n_activated_experts;
}

namespace {

// Reads typed fields out of one JSON object, naming the file and key path in every error.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string label, std::string prefix)
      : obj_(obj), label_(std::move(label)), prefix_(std::move(prefix)) {
    if (!obj_.is_object()) fail("", "must be a JSON object");
  }
  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

  template <class T>
  void integer(const char* key, T& out) const {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (v.is_number_integer()) { out = static_cast<T>(v.get<int64_t>()); return; }
    // Some writers emit 2.0 for integers; accept exact integral floats.
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
        std::abs(v.get<double>()) < 9.0e15) {
      out = static_cast<T>(v.get<double>());
      return;
    }
    fail(key, "must be an integer, got " + describe(v));
  }
  void number(const char* key, double& out) const {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (!v.is_number()) fail(key, "must be a number, got " + describe(v));
    out = v.get<double>();
  }
  void optional_number(const char* key, std::optional<double>& out) const {
    if (!obj_.contains(key)) return;
    if (obj_.at(key).is_null()) { out.reset(); return; }
    double d = 0;
    number(key, d);
    out = d;
  }
  void boolean(const char* key, bool& out) const {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (!v.is_boolean()) fail(key, "must be true or false, got " + describe(v));
    out = v.get<bool>();
  }
  void string(const char* key, std::string& out) const {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (!v.is_string()) fail(key, "must be a string, got " + describe(v));
    out = v.get<std::string>();
  }
  template <class T>
  void int_list(const char* key, std::vector<T>& out) const {
    if (!has(key)) return;
    const json& v = obj_.at(key);
    if (!v.is_array()) fail(key, "must be a list of integers, got " + describe(v));
    out.clear();
    for (const json& e : v) {
      if (!e.is_number_integer()) fail(key, "must be a list of integers, found " + describe(e));
      out.push_back(static_cast<T>(e.get<int64_t>()));
    }
  }
  const json* object(const char* key) const {
    if (!has(key)) return nullptr;
    if (!obj_.at(key).is_object()) fail(key, "must be a JSON object, got " + describe(obj_.at(key)));
    return &obj_.at(key);
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    std::string path = prefix_.empty() ? key : (key.empty() ? prefix_ : prefix_ + "." + key);
    throw Error(label_ + ": " + (path.empty() ? "" : "'" + path + "' ") + what);
  }

 private:
  static std::string describe(const json& v) {
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return std::string(v.type_name()) + " " + s;
  }
  const json& obj_;
  std::string label_, prefix_;
};

// Every hyperparameter once. Its key in inference/config.json is its member name; `flags` say
// whether config_to_flat_json writes it (that JSON feeds the session fingerprint, so this set is
// frozen) and whether it is a model field (differences_in_model_fields); `hf` and `hf_key` place
// it in the HF config.json (Root, text_config, vision_config, text_config.rope_scaling; None:
// not there, or read by hand: dtype and expert_dtype come from quantization_config).
using Member = std::variant<int ModelConfig::*, int64_t ModelConfig::*, double ModelConfig::*, bool ModelConfig::*,
                            std::string ModelConfig::*, std::vector<int> ModelConfig::*,
                            std::vector<int64_t> ModelConfig::*, std::optional<double> ModelConfig::*>;
enum class Hf { None, Root, Text, Vision, RopeScaling };
enum FieldFlags : unsigned { kFlatOut = 1, kModel = 2 };
struct ConfigField {
  const char* name;
  Member member;
  unsigned flags;
  Hf hf;
  const char* hf_key;
};

const std::vector<ConfigField>& config_fields() {
#define DS41_FIELD(m, flags, hf, hf_key) ConfigField{#m, &ModelConfig::m, unsigned(flags), Hf::hf, hf_key}
  static const std::vector<ConfigField> fields = {
      DS41_FIELD(vocab_size, kFlatOut | kModel, Text, "vocab_size"),
      DS41_FIELD(dim, kFlatOut | kModel, Text, "hidden_size"),
      DS41_FIELD(moe_inter_dim, kFlatOut | kModel, Text, "moe_intermediate_size"),
      DS41_FIELD(n_layers, kFlatOut | kModel, Text, "num_hidden_layers"),
      DS41_FIELD(n_mtp_layers, kFlatOut | kModel, Text, "num_nextn_predict_layers"),
      DS41_FIELD(n_heads, kFlatOut | kModel, Text, "num_attention_heads"),
      DS41_FIELD(n_routed_experts, kFlatOut | kModel, Text, "n_routed_experts"),
      DS41_FIELD(n_shared_experts, kFlatOut | kModel, Text, "n_shared_experts"),
      DS41_FIELD(n_activated_experts, kFlatOut | kModel, Text, "num_experts_per_tok"),
      DS41_FIELD(score_func, kFlatOut | kModel, Text, "scoring_func"),
      DS41_FIELD(gate_temp, kModel, None, nullptr),
      DS41_FIELD(norm_topk_prob, kModel, Text, "norm_topk_prob"),
      DS41_FIELD(route_scale, kFlatOut | kModel, Text, "routed_scaling_factor"),
      DS41_FIELD(swiglu_limit, kFlatOut | kModel, Text, "swiglu_limit"),
      DS41_FIELD(q_lora_rank, kFlatOut | kModel, Text, "q_lora_rank"),
      DS41_FIELD(head_dim, kFlatOut | kModel, Text, "head_dim"),
      DS41_FIELD(rope_head_dim, kFlatOut | kModel, Text, "qk_rope_head_dim"),
      DS41_FIELD(norm_eps, kFlatOut | kModel, Text, "rms_norm_eps"),
      DS41_FIELD(o_groups, kFlatOut | kModel, Text, "o_groups"),
      DS41_FIELD(o_lora_rank, kFlatOut | kModel, Text, "o_lora_rank"),
      DS41_FIELD(window_size, kFlatOut | kModel, Text, "sliding_window"),
      DS41_FIELD(compress_ratios, kFlatOut | kModel, Text, "compress_ratios"),
      DS41_FIELD(kv_source_layers, kFlatOut | kModel, Text, "kv_source_layer_ids"),
      DS41_FIELD(index_source_layers, kFlatOut | kModel, Text, "index_source_layer_ids"),
      DS41_FIELD(compress_rope_theta, kFlatOut | kModel, Text, "compress_rope_theta"),
      DS41_FIELD(original_seq_len, kFlatOut | kModel, RopeScaling, "original_max_position_embeddings"),
      DS41_FIELD(rope_theta, kFlatOut | kModel, Text, "rope_theta"),
      DS41_FIELD(rope_factor, kFlatOut | kModel, RopeScaling, "factor"),
      DS41_FIELD(beta_fast, kFlatOut | kModel, RopeScaling, "beta_fast"),
      DS41_FIELD(beta_slow, kFlatOut | kModel, RopeScaling, "beta_slow"),
      DS41_FIELD(index_n_heads, kFlatOut | kModel, Text, "index_n_heads"),
      DS41_FIELD(index_head_dim, kFlatOut | kModel, Text, "index_head_dim"),
      DS41_FIELD(index_topk, kFlatOut | kModel, Text, "index_topk"),
      DS41_FIELD(candidate_source_layer, kFlatOut | kModel, Text, "candidate_source_layer_id"),
      DS41_FIELD(candidate_topk_blocks, kFlatOut | kModel, Text, "candidate_topk_blocks"),
      DS41_FIELD(candidate_block_size, kFlatOut | kModel, Text, "candidate_block_size"),
      DS41_FIELD(hc_mult, kFlatOut | kModel, Text, "hc_mult"),
      DS41_FIELD(hc_sinkhorn_iters, kFlatOut | kModel, Text, "hc_sinkhorn_iters"),
      DS41_FIELD(hc_eps, kFlatOut | kModel, Text, "hc_eps"),
      DS41_FIELD(engram_layer_ids, kFlatOut | kModel, Text, "engram_layer_ids"),
      DS41_FIELD(engram_num_embeddings, kFlatOut | kModel, Text, "engram_num_embeddings"),
      DS41_FIELD(engram_max_ngram_size, kFlatOut | kModel, Text, "engram_max_ngram_size"),
      DS41_FIELD(engram_vocab_size, kFlatOut | kModel, Text, "engram_vocab_size"),
      DS41_FIELD(engram_n_heads, kFlatOut | kModel, Text, "engram_n_heads"),
      DS41_FIELD(engram_head_dim, kFlatOut | kModel, Text, "engram_head_dim"),
      DS41_FIELD(engram_pad_id, kFlatOut | kModel, Text, "engram_pad_token_id"),
      DS41_FIELD(engram_compressed_vocab_size, kFlatOut | kModel, Text, "engram_compressed_vocab_size"),
      DS41_FIELD(vision_n_layers, kFlatOut | kModel, Vision, "num_hidden_layers"),
      DS41_FIELD(vision_dim, kFlatOut | kModel, Vision, "hidden_size"),
      DS41_FIELD(vision_n_heads, kFlatOut | kModel, Vision, "num_attention_heads"),
      DS41_FIELD(vision_inter_dim, kFlatOut | kModel, Vision, "intermediate_size"),
      DS41_FIELD(vision_patch_size, kFlatOut | kModel, Vision, "patch_size"),
      DS41_FIELD(vision_rope_theta, kFlatOut | kModel, Vision, "rope_theta"),
      DS41_FIELD(vision_downsample_ratio, kFlatOut | kModel, Vision, "downsample_ratio"),
      DS41_FIELD(vision_max_n_token, kFlatOut | kModel, Vision, "max_image_tokens"),
      DS41_FIELD(vision_min_pixels, kFlatOut | kModel, Vision, "min_pixels"),
      DS41_FIELD(vision_max_wh_ratio, kFlatOut | kModel, Vision, "max_wh_ratio"),
      DS41_FIELD(image_token_id, kFlatOut | kModel, Root, "image_token_id"),
      DS41_FIELD(dspark_block_size, kFlatOut | kModel, Text, "dspark_block_size"),
      DS41_FIELD(dspark_noise_token_id, kFlatOut | kModel, Text, "dspark_noise_token_id"),
      DS41_FIELD(dspark_target_layer_ids, kFlatOut | kModel, Text, "dspark_target_layer_ids"),
      DS41_FIELD(dspark_markov_rank, kFlatOut | kModel, Text, "dspark_markov_rank"),
      DS41_FIELD(dspark_n_routed_experts, kFlatOut | kModel, Text, "dspark_n_routed_experts"),
      DS41_FIELD(dspark_n_activated_experts, kFlatOut | kModel, Text, "dspark_num_experts_per_tok"),
      DS41_FIELD(dtype, kFlatOut | kModel, None, nullptr),
      DS41_FIELD(expert_dtype, kFlatOut | kModel, None, nullptr),
      DS41_FIELD(max_seq_len, kFlatOut, Text, "max_position_embeddings"),
      DS41_FIELD(max_batch_size, 0, None, nullptr),
      DS41_FIELD(temperature, 0, None, nullptr),
      DS41_FIELD(bos_token_id, 0, Root, "bos_token_id"),
      DS41_FIELD(eos_token_id, 0, Root, "eos_token_id"),
      DS41_FIELD(pad_token_id, 0, Root, "pad_token_id"),
  };
#undef DS41_FIELD
  return fields;
}

// Reads `key` of `r` into the field, as its type says.
void read_field(const FieldReader& r, const char* key, const Member& member, ModelConfig& c) {
  std::visit(
      [&](auto m) {
        using T = std::remove_cvref_t<decltype(c.*m)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t>) r.integer(key, c.*m);
        else if constexpr (std::is_same_v<T, double>) r.number(key, c.*m);
        else if constexpr (std::is_same_v<T, bool>) r.boolean(key, c.*m);
        else if constexpr (std::is_same_v<T, std::string>) r.string(key, c.*m);
        else if constexpr (std::is_same_v<T, std::optional<double>>) r.optional_number(key, c.*m);
        else r.int_list(key, c.*m);
      },
      member);
}

json field_json(const Member& member, const ModelConfig& c) {
  return std::visit(
      [&](auto m) -> json {
        using T = std::remove_cvref_t<decltype(c.*m)>;
        if constexpr (std::is_same_v<T, std::optional<double>>) return (c.*m) ? json(*(c.*m)) : json(nullptr);
        else return json(c.*m);
      },
      member);
}

// Reads the fields placed in `section` of an HF config.json from `r`.
void read_hf_section(const FieldReader& r, Hf section, ModelConfig& c) {
  for (const ConfigField& f : config_fields())
    if (f.hf == section) read_field(r, f.hf_key, f.member, c);
}

void write_hf_section(json& out, Hf section, const ModelConfig& c) {
  for (const ConfigField& f : config_fields())
    if (f.hf == section) out[f.hf_key] = field_json(f.member, c);
}

}  // namespace

ModelConfig parse_flat_config(const json& j, const std::string& label) {
  ModelConfig c;
  FieldReader r(j, label, "");
  for (const ConfigField& f : config_fields()) read_field(r, f.name, f.member, c);
  if (j.contains("expert_dtype") && j.at("expert_dtype").is_null()) c.expert_dtype = "";  // dense experts
  return c;
}

void apply_flat_fields(ModelConfig& c, const json& fields, const std::string& label) {
  FieldReader r(fields, label, "");
  for (const auto& item : fields.items()) {
    const std::string& key = item.key();  // not a structured binding: clang cannot capture one
    const auto& all = config_fields();
    auto f = std::find_if(all.begin(), all.end(), [&](const ConfigField& x) { return key == x.name; });
    if (f == all.end()) throw Error(label + ": '" + key + "' is not a config field");
    read_field(r, f->name, f->member, c);
  }
}

ModelConfig parse_hf_config(const json& j, const std::string& label) {
  ModelConfig c;
  FieldReader root(j, label, "");
  read_hf_section(root, Hf::Root, c);

  if (const json* q = root.object("quantization_config")) {
    FieldReader qr(*q, label, "quantization_config");
    std::string method = "fp8", fmt = "ue8m0";
    qr.string("quant_method", method);
    qr.string("scale_fmt", fmt);
    if (method != "fp8")
      qr.fail("quant_method", "is '" + method + "'; only 'fp8' checkpoints are supported");
    if (fmt != "ue8m0") qr.fail("scale_fmt", "is '" + fmt + "'; only 'ue8m0' is supported");
    std::vector<int64_t> block;
    qr.int_list("weight_block_size", block);
    if (!block.empty() && (block.size() != 2 || block[0] != 32 || block[1] != 32))
      qr.fail("weight_block_size", "must be [32, 32] (DeepSeek-V4.1 uses 32x32 FP8 blocks)");
    c.dtype = "fp8";
    if (q->contains("expert_dtype") && q->at("expert_dtype").is_null()) c.expert_dtype = "";
    else qr.string("expert_dtype", c.expert_dtype);
  } else {
    c.dtype = "bf16";
    c.expert_dtype = "";
  }

  const json* t = root.object("text_config");
  if (!t) root.fail("text_config", "is missing (an HF config.json for DeepSeek-V4.1 nests the model under text_config)");
  FieldReader r(*t, label, "text_config");
  read_hf_section(r, Hf::Text, c);
  int64_t kv_heads = 1;
  r.integer("num_key_value_heads", kv_heads);
  if (kv_heads != 1)
    r.fail("num_key_value_heads", "must be 1 (one shared latent KV), got " + std::to_string(kv_heads));
  c.original_seq_len = 0;  // no rope_scaling: no YaRN
  if (const json* rs = r.object("rope_scaling")) {
    FieldReader rr(*rs, label, "text_config.rope_scaling");
    std::string type = "yarn";
    rr.string("rope_type", type);
    if (rs->contains("type") && !rs->contains("rope_type")) rr.string("type", type);
    if (type != "yarn") rr.fail("rope_type", "is '" + type + "'; DeepSeek-V4.1 uses 'yarn'");
    read_hf_section(rr, Hf::RopeScaling, c);
  }

  c.vision_n_layers = 0;
  if (const json* v = root.object("vision_config")) {
    FieldReader vr(*v, label, "vision_config");
    read_hf_section(vr, Hf::Vision, c);
  }
  return c;
}

ModelConfig parse_config_json(const json& j, const std::string& label) {
  if (!j.is_object()) throw Error(label + ": the config must be a JSON object");
  return j.contains("text_config") ? parse_hf_config(j, label) : parse_flat_config(j, label);
}

static json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open (" + std::string(std::strerror(errno)) + ")");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

ModelConfig load_config_file(const std::string& path) {
  return parse_config_json(read_json_file(path), path);
}

ModelConfig load_model_dir_config(const std::string& dir) {
  fs::path root = fs::path(dir) / "config.json";
  fs::path flat = fs::path(dir) / "inference" / "config.json";
  bool has_root = fs::is_regular_file(root), has_flat = fs::is_regular_file(flat);
  if (!has_root && !has_flat)
    throw Error(dir + ": no config.json or inference/config.json found; is this a DeepSeek-V4.1 checkpoint directory?");
  if (has_root && has_flat) {
    ModelConfig a = load_config_file(root.string());
    ModelConfig b = load_config_file(flat.string());
    auto diffs = a.differences_in_model_fields(b);
    if (!diffs.empty()) {
      std::string msg = dir + ": config.json and inference/config.json describe different models:";
      for (auto& d : diffs) msg += "\n  " + d;
      throw Error(msg);
    }
    // The flat file is what the reference runs with; keep its runtime limits when it has them.
    a.max_seq_len = b.max_seq_len;
    a.max_batch_size = b.max_batch_size;
    return a;
  }
  return load_config_file((has_root ? root : flat).string());
}

// ---- comparison ------------------------------------------------------------------------------

namespace {
template <class T>
std::string show(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
template <class T>
std::string show(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += show(v[i]);  // not `"," + show(...)`: GCC 12 warns falsely on that (-Wrestrict)
  }
  return s + "]";
}
std::string show(const std::optional<double>& v) { return v ? show(*v) : "null"; }
}  // namespace

std::vector<std::string> ModelConfig::differences_in_model_fields(const ModelConfig& o) const {
  std::vector<std::string> d;
  for (const ConfigField& f : config_fields()) {
    if (!(f.flags & kModel)) continue;
    std::visit(
        [&](auto m) {
          if (!(this->*m == o.*m)) d.push_back(std::string(f.name) + ": " + show(this->*m) + " vs " + show(o.*m));
        },
        f.member);
  }
  return d;
}

// ---- validation ------------------------------------------------------------------------------

std::vector<std::string> config_problems(const ModelConfig& c) {
  std::vector<std::string> p;
  auto need = [&](bool ok, const std::string& msg) { if (!ok) p.push_back(msg); };
  auto pos = [&](int64_t v, const char* name) {
    need(v > 0, std::string(name) + " must be positive, got " + std::to_string(v));
  };
  pos(c.vocab_size, "vocab_size"); pos(c.dim, "dim"); pos(c.moe_inter_dim, "moe_inter_dim");
  pos(c.n_layers, "n_layers"); pos(c.n_heads, "n_heads"); pos(c.q_lora_rank, "q_lora_rank");
  pos(c.head_dim, "head_dim"); pos(c.rope_head_dim, "rope_head_dim"); pos(c.o_groups, "o_groups");
  pos(c.o_lora_rank, "o_lora_rank"); pos(c.window_size, "window_size");
  pos(c.n_routed_experts, "n_routed_experts"); pos(c.n_activated_experts, "n_activated_experts");
  pos(c.hc_mult, "hc_mult"); pos(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
  pos(c.max_seq_len, "max_seq_len");
  need(c.n_mtp_layers >= 0, "n_mtp_layers must be >= 0");
  if (!p.empty()) return p;  // the checks below divide by these

  need(c.dtype == "fp8", "dtype is '" + c.dtype + "'; only 'fp8' checkpoints (E4M3 weights with 32x32 E8M0 scales) are supported");
  need(c.expert_dtype == "fp4", "expert_dtype is '" + c.expert_dtype + "'; only 'fp4' experts (packed E2M1 with per-32 E8M0 scales) are supported");
  need(c.score_func == "sqrtsoftplus" || c.score_func == "softmax" || c.score_func == "sigmoid",
       "score_func '" + c.score_func + "' is unknown (expected sqrtsoftplus, softmax or sigmoid)");
  need(c.n_shared_experts == 1, "n_shared_experts must be 1 (the model has exactly one shared expert), got " + std::to_string(c.n_shared_experts));
  need(c.n_activated_experts <= c.n_routed_experts, "n_activated_experts (" + std::to_string(c.n_activated_experts) + ") exceeds n_routed_experts (" + std::to_string(c.n_routed_experts) + ")");
  need(c.norm_eps > 0 && c.hc_eps > 0, "norm_eps and hc_eps must be positive");

  // Every GEMM input is quantized in blocks of 32 along K (act_quant), FP4 experts pack 2 per byte
  // with one scale per 32, and the compressed KV uses FP4 blocks of 16.
  auto mult32 = [&](int64_t v, const std::string& what) {
    need(v % 32 == 0, what + " (" + std::to_string(v) + ") must be a multiple of 32 (FP8/FP4 quantization blocks)");
  };
  mult32(c.dim, "dim");
  mult32(c.moe_inter_dim, "moe_inter_dim");
  mult32(c.q_lora_rank, "q_lora_rank");
  mult32(c.head_dim, "head_dim");
  mult32(c.o_lora_rank * c.o_groups, "o_groups * o_lora_rank");
  need(c.rope_head_dim % 2 == 0 && c.rope_head_dim <= c.head_dim,
       "rope_head_dim must be even and at most head_dim");
  need(c.n_heads % c.o_groups == 0, "n_heads (" + std::to_string(c.n_heads) + ") must be divisible by o_groups (" + std::to_string(c.o_groups) + ")");
  mult32(c.n_heads * c.head_dim / c.o_groups, "the grouped output width n_heads*head_dim/o_groups");

  const int L = c.n_layers;
  need(int(c.compress_ratios.size()) == L + c.n_mtp_layers,
       "compress_ratios has " + std::to_string(c.compress_ratios.size()) + " entries but needs n_layers + n_mtp_layers = " + std::to_string(L + c.n_mtp_layers));
  if (int(c.compress_ratios.size()) != L + c.n_mtp_layers) return p;
  for (int i = 0; i < int(c.compress_ratios.size()); ++i) {
    need(c.compress_ratios[i] >= 0, "compress_ratios[" + std::to_string(i) + "] is negative");
    if (i >= L)
      need(c.compress_ratios[i] == 0, "compress_ratios[" + std::to_string(i) + "] belongs to DSpark stage " + std::to_string(i - L) + " and must be 0 (draft layers are window-only)");
  }
  auto check_ids = [&](const std::vector<int>& ids, const char* name) {
    for (size_t i = 0; i < ids.size(); ++i) {
      need(ids[i] >= 0 && ids[i] < L, std::string(name) + " lists layer " + std::to_string(ids[i]) + ", outside 0.." + std::to_string(L - 1));
      if (i) need(ids[i] > ids[i - 1], std::string(name) + " must be strictly increasing");
    }
  };
  check_ids(c.kv_source_layers, "kv_source_layers");
  check_ids(c.index_source_layers, "index_source_layers");
  if (!p.empty()) return p;

  std::set<int> kv(c.kv_source_layers.begin(), c.kv_source_layers.end());
  std::set<int> idx(c.index_source_layers.begin(), c.index_source_layers.end());
  for (int s : c.kv_source_layers) {
    need(c.compress_ratios[s] > 0, "kv source layer " + std::to_string(s) + " has compress ratio 0; a kv source must compress");
    need(idx.count(s), "kv source layer " + std::to_string(s) + " must also be an index source (its indexer publishes the index keys)");
  }
  for (int s : c.index_source_layers)
    need(c.compress_ratios[s] > 0, "index source layer " + std::to_string(s) + " has compress ratio 0; only compressed layers have an indexer");
  // Each compressed layer reads the most recent kv source (same ratio) and the top-k of the most
  // recent index source, which must itself index that same kv source.
  int last_kv = -1, last_idx = -1, last_idx_kv = -1;
  for (int l = 0; l < L; ++l) {
    if (kv.count(l)) last_kv = l;
    if (idx.count(l)) { last_idx = l; last_idx_kv = last_kv; }
    int m = c.compress_ratios[l];
    if (m == 0) continue;
    if (last_kv < 0) {
      p.push_back("layer " + std::to_string(l) + " has compress ratio " + std::to_string(m) + " but no kv source layer at or before it");
      continue;
    }
    need(c.compress_ratios[last_kv] == m, "layer " + std::to_string(l) + " has compress ratio " + std::to_string(m) + " but its kv source (layer " + std::to_string(last_kv) + ") has ratio " + std::to_string(c.compress_ratios[last_kv]));
    need(last_idx >= 0 && last_idx_kv == last_kv, "layer " + std::to_string(l) + " has no index source reading its kv source (layer " + std::to_string(last_kv) + ") at or before it");
  }
  if (!c.index_source_layers.empty()) {
    pos(c.index_n_heads, "index_n_heads");
    pos(c.index_topk, "index_topk");
    mult32(c.index_head_dim, "index_head_dim");
    need(c.index_head_dim >= c.rope_head_dim, "index_head_dim must be at least rope_head_dim (the indexer rotates its last rope_head_dim dims)");
  }
  if (c.candidate_source_layer >= 0) {
    need(idx.count(c.candidate_source_layer), "candidate_source_layer " + std::to_string(c.candidate_source_layer) + " must be an index source layer");
    // The pool is a mask over the candidate source's entries: later index sources must score
    // those same entries, i.e. no other kv source may start after the candidate source.
    for (int s : c.kv_source_layers)
      need(s <= c.candidate_source_layer, "kv source layer " + std::to_string(s) + " comes after the candidate source layer " + std::to_string(c.candidate_source_layer) + "; the candidate pool would not apply to its entries");
    pos(c.candidate_topk_blocks, "candidate_topk_blocks");
    pos(c.candidate_block_size, "candidate_block_size");
  }
  bool any_compressed = std::any_of(c.compress_ratios.begin(), c.compress_ratios.end(), [](int m) { return m > 0; });
  if (any_compressed && c.original_seq_len > 0) {
    need(c.rope_factor > 0, "rope_factor must be positive when YaRN is on (original_seq_len > 0)");
    need(c.beta_fast > 0 && c.beta_slow > 0, "beta_fast and beta_slow must be positive");
  }
  need(c.rope_theta > 1 && c.compress_rope_theta > 1, "rope_theta and compress_rope_theta must be > 1");

  // Engram.
  if (!c.engram_layer_ids.empty()) {
    check_ids(c.engram_layer_ids, "engram_layer_ids");
    need(c.engram_num_embeddings.size() == c.engram_layer_ids.size(),
         "engram_num_embeddings has " + std::to_string(c.engram_num_embeddings.size()) + " entries but engram_layer_ids has " + std::to_string(c.engram_layer_ids.size()));
    need(c.engram_max_ngram_size >= 2, "engram_max_ngram_size must be at least 2 (n-grams of size 2..max)");
    pos(c.engram_n_heads, "engram_n_heads");
    pos(c.engram_vocab_size, "engram_vocab_size");
    pos(c.engram_compressed_vocab_size, "engram_compressed_vocab_size");
    mult32(c.engram_head_dim, "engram_head_dim");
    if (p.empty()) {
      // The reference never checks the table rows against the prime buckets (rows past the end
      // would silently read as zero); we do.
      EngramLayout layout = compute_engram_layout(c);
      for (size_t i = 0; i < c.engram_layer_ids.size(); ++i)
        need(layout.rows[i] == c.engram_num_embeddings[i],
             "engram_num_embeddings[" + std::to_string(i) + "] is " + std::to_string(c.engram_num_embeddings[i]) + " but the hash buckets of layer " + std::to_string(c.engram_layer_ids[i]) + " need exactly " + std::to_string(layout.rows[i]) + " rows");
    }
  }
  // DSpark.
  if (c.dspark_enabled()) {
    need(!c.dspark_target_layer_ids.empty(), "DSpark is on (dspark_block_size > 0) but dspark_target_layer_ids is empty");
    check_ids(c.dspark_target_layer_ids, "dspark_target_layer_ids");
    pos(c.dspark_markov_rank, "dspark_markov_rank");
    need(c.dspark_block_size >= 2, "dspark_block_size must be at least 2 (one real token + noise slots)");
    need(c.dspark_noise_token_id >= 0 && c.dspark_noise_token_id < c.vocab_size, "dspark_noise_token_id is outside the vocabulary");
    need(c.routed_experts(L) >= c.activated_experts(L), "DSpark activated experts exceed its routed experts");
  }
  // Vision.
  if (c.vision_enabled()) {
    pos(c.vision_dim, "vision_dim"); pos(c.vision_n_heads, "vision_n_heads");
    pos(c.vision_inter_dim, "vision_inter_dim"); pos(c.vision_patch_size, "vision_patch_size");
    pos(c.vision_downsample_ratio, "vision_downsample_ratio");
    need(c.vision_max_n_token >= 4, "vision_max_n_token must be at least 4 (start, one image token, newline, end)");
    need(c.vision_min_pixels >= 0, "vision_min_pixels must not be negative");
    need(!c.vision_max_wh_ratio || *c.vision_max_wh_ratio > 0, "vision_max_wh_ratio must be positive (or null)");
    if (c.vision_n_heads > 0) {
      need(c.vision_dim % c.vision_n_heads == 0, "vision_dim must be divisible by vision_n_heads");
      need((c.vision_dim / c.vision_n_heads) % 4 == 0, "the vision head dim must be a multiple of 4 (2D RoPE splits it in row and column halves of pairs)");
    }
    need(c.image_token_id >= 0 && c.image_token_id < c.vocab_size, "image_token_id is outside the vocabulary");
  }
  need(c.bos_token_id >= 0 && c.bos_token_id < c.vocab_size && c.eos_token_id >= 0 && c.eos_token_id < c.vocab_size,
       "bos_token_id / eos_token_id must be inside the vocabulary");
  return p;
}

void validate_config(const ModelConfig& c) {
  auto p = config_problems(c);
  if (p.empty()) return;
  std::string msg = "invalid model config (" + std::to_string(p.size()) + " problem" + (p.size() > 1 ? "s" : "") + "):";
  for (auto& s : p) msg += "\n  - " + s;
  throw Error(msg);
}

// ---- serialization ---------------------------------------------------------------------------

json config_to_flat_json(const ModelConfig& c) {
  json j = json::object();
  for (const ConfigField& f : config_fields())
    if (f.flags & kFlatOut) j[f.name] = field_json(f.member, c);
  return j;
}

json config_to_hf_json(const ModelConfig& c) {
  json t = json::object();
  write_hf_section(t, Hf::Text, c);
  t["model_type"] = "deepseek_v41_text";
  t["num_key_value_heads"] = 1;
  t["hidden_act"] = "silu";
  t["tie_word_embeddings"] = false;
  t["topk_method"] = "noaux_tc";
  json rope = {{"rope_type", "yarn"}};
  write_hf_section(rope, Hf::RopeScaling, c);
  t["rope_scaling"] = rope;

  json v = json::object();
  v["model_type"] = "deepseek_v41_vision";
  write_hf_section(v, Hf::Vision, c);

  json j = json::object();
  j["architectures"] = {"DeepseekV41ForCausalLM"};
  j["model_type"] = "deepseek_v41";
  write_hf_section(j, Hf::Root, c);
  j["dtype"] = "bfloat16";
  j["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                              {"weight_block_size", {32, 32}}, {"scale_fmt", "ue8m0"},
                              {"expert_dtype", c.expert_dtype}};
  j["text_config"] = t;
  j["vision_config"] = v;
  return j;
}

}  // namespace ds41
