#include "devtools/conformance_vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "io/safetensors.h"
#include "kernels/numeric_formats.h"
#include "vision/image_preprocess.h"
#include "vision/image_prompt.h"
#include "vision/vision_tower.h"

namespace ds41 {

namespace {

using json = nlohmann::json;

template <class T>
std::vector<T> read_tensor(const SafetensorsFile& f, const std::string& name, DType dt) {
  const TensorInfo* t = f.find(name);
  if (!t) throw Error(f.path() + ": expected tensor '" + name + "' is missing");
  if (t->dtype != dt) throw Error(f.path() + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t->dtype)));
  std::vector<T> v(t->nbytes / sizeof(T));
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

double max_abs_bf16(const uint16_t* a, const uint16_t* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::abs(double(bf16_to_f32(a[i])) - double(bf16_to_f32(b[i])));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace

VisionConformance run_vision_conformance(const std::string& case_dir, const json& cj, const Model& model,
                                         const SafetensorsFile& exp, bool teacher, ThreadPool* pool) {
  namespace fs = std::filesystem;
  const ModelConfig& c = model.config();
  const VisionWeights& w = model.weights().vision;
  const json& vj = cj.at("vision");
  const json& tol = vj.at("tolerance").at(teacher ? "teacher_forced_max_abs" : "end_to_end_max_abs");
  const int64_t vd = c.vision_dim, D = c.dim;
  VisionConformance out;
  auto add = [&](const std::string& name, double err, double t, const std::string& note = "") {
    out.checks.push_back({"vision " + name, err, t, err <= t, note});
  };
  auto count_diff = [](const auto& a, const auto& b) {
    if (a.size() != b.size()) return double(std::max(a.size(), b.size()));
    double n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return n;
  };

  // Preprocessing from the PNGs, and the expansion of the unexpanded prompt.
  const json& images = vj.at("images");
  std::vector<PreparedImage> prepared;
  std::vector<ImageGrid> grids;
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string file = (fs::path(case_dir) / images[i].at("file").get<std::string>()).string();
    prepared.push_back(prepare_image(read_image_file(file), c));
    grids.push_back(prepared.back().grid);
    const auto golden = read_tensor<uint16_t>(exp, "vision.pixels." + std::to_string(i), DType::BF16);
    add("pixels." + std::to_string(i) + " (values differing)", count_diff(prepared.back().patches, golden), 0.0);
  }
  ImagePrompt p = expand_image_placeholders(vj.at("prompt_tokens_unexpanded").get<std::vector<int32_t>>(),
                                            c.image_token_id, grids);
  const auto ids = read_tensor<int32_t>(exp, "vision.input_ids", DType::I32);
  const auto types = read_tensor<int32_t>(exp, "vision.token_types", DType::I32);
  const auto spans = read_tensor<int32_t>(exp, "vision.image_spans", DType::I32);
  std::vector<int32_t> my_types(p.inputs.token_types.begin(), p.inputs.token_types.end()), my_spans;
  for (const ImageSpan& s : p.spans) my_spans.insert(my_spans.end(), {int32_t(s.start), int32_t(s.length())});
  add("input_ids (positions differing)", count_diff(p.tokens, ids), 0.0);
  add("token_types (positions differing)", count_diff(my_types, types), 0.0);
  add("image_spans (values differing)", count_diff(my_spans, spans), 0.0);
  if (p.tokens != cj.at("prompt_tokens").get<std::vector<int32_t>>())
    throw Error(case_dir + ": case.json prompt_tokens differ from the expanded vision prompt");

  // The tower, per image.
  const int layers = c.vision_n_layers;
  std::vector<std::vector<uint16_t>> aligner_rows;
  for (size_t i = 0; i < prepared.size(); ++i) {
    const std::string sfx = std::string(".").append(std::to_string(i));
    const ImageGrid& g = grids[i];
    const int64_t n = g.n_patches();
    const auto hidden = read_tensor<uint16_t>(exp, "vision.vit_hidden" + sfx, DType::BF16);
    const auto vit_out = read_tensor<uint16_t>(exp, "vision.vit_out" + sfx, DType::BF16);
    const auto golden_rows = read_tensor<uint16_t>(exp, "vision.aligner_out" + sfx, DType::BF16);
    if (hidden.size() != size_t((layers + 1) * n * vd) || vit_out.size() != size_t(n * vd))
      throw Error(case_dir + ": vision tensors of image " + std::to_string(i) + " do not match the model's tower");
    auto stage = [&](int j) { return hidden.data() + size_t(j) * size_t(n * vd); };
    std::vector<uint16_t> rows;
    if (teacher) {
      const auto pixels = read_tensor<uint16_t>(exp, "vision.pixels" + sfx, DType::BF16);
      auto x = vit_patch_embed(w, c, pixels.data(), n, pool);
      add("vit_hidden[0]" + sfx, max_abs_bf16(x.data(), stage(0), x.size()), tol.at("vit_hidden[0]").get<double>());
      const VisionRope rope = make_vision_rope(c, g.n_vit_h, g.n_vit_w);
      for (int j = 0; j < layers; ++j) {
        std::vector<uint16_t> h(stage(j), stage(j) + n * vd);
        vit_block(w.blocks[size_t(j)], c, rope, h.data(), n, pool);
        const std::string key = "vit_hidden[" + std::to_string(j + 1) + "]";
        // The case lists tolerances for its own block count; later blocks use the last one.
        const std::string tkey = tol.contains(key) ? key : "vit_hidden[" + std::to_string(layers) + "]";
        add(key + sfx, max_abs_bf16(h.data(), stage(j + 1), h.size()), tol.value(tkey, 0.0));
      }
      const auto normed = vit_final_norm(w, c, stage(layers), n);
      add("vit_out" + sfx, max_abs_bf16(normed.data(), vit_out.data(), normed.size()), tol.at("vit_out").get<double>());
      rows = aligner_forward(w, c, vit_out.data(), g.n_vit_h, g.n_vit_w, pool);
    } else {
      VitObserver obs = [&](int st, const uint16_t* x, int64_t r) {
        const std::string key = st < 0 ? "vit_out" : "vit_hidden[" + std::to_string(st) + "]";
        const std::string tkey = st < 0 || tol.contains(key) ? key : "vit_hidden[" + std::to_string(layers) + "]";
        add(key + sfx, max_abs_bf16(x, st < 0 ? vit_out.data() : stage(st), size_t(r * vd)), tol.value(tkey, 0.0));
      };
      rows = encode_image_patches(w, c, prepared[i].patches.data(), g.n_vit_h, g.n_vit_w, pool, &obs);
    }
    if (rows.size() != golden_rows.size()) throw Error(case_dir + ": aligner rows of image " + std::to_string(i) + " differ in size");
    add("aligner_out" + sfx, max_abs_bf16(rows.data(), golden_rows.data(), rows.size()), tol.at("aligner_out").get<double>());
    fill_image_span_rows(p, i, rows.data(), w, D);
    aligner_rows.push_back(std::move(rows));
  }

  // The merged embedding: text rows are embedding rows, span rows the delimiters / aligner rows.
  const auto merged = read_tensor<uint16_t>(exp, "vision.embed_merged", DType::BF16);
  const int64_t S = int64_t(p.tokens.size());
  if (merged.size() != size_t(S * D)) throw Error(case_dir + ": vision.embed_merged has the wrong shape");
  double text_err = 0, image_err = 0;
  const uint16_t* row = p.inputs.rows.data();
  InputEmbeddings golden_inputs;
  golden_inputs.token_types = p.inputs.token_types;
  for (int64_t s = 0; s < S; ++s) {
    const uint16_t* want = merged.data() + s * D;
    const int8_t t = p.inputs.token_types[size_t(s)];
    const uint16_t* got = t < 0 ? model.weights().embed + int64_t(p.tokens[size_t(s)]) * D : row;
    const double e = max_abs_bf16(got, want, size_t(D));
    (t == int8_t(TokenType::Image) ? image_err : text_err) = std::max(t == int8_t(TokenType::Image) ? image_err : text_err, e);
    if (t >= 0) {
      golden_inputs.rows.insert(golden_inputs.rows.end(), want, want + D);
      row += D;
    }
  }
  add("embed_merged text and delimiter rows", text_err, 0.0);
  add("embed_merged image rows", image_err, tol.at("aligner_out").get<double>(), "the engine's aligner rows of this mode");
  out.prefill_inputs = teacher ? std::move(golden_inputs) : std::move(p.inputs);
  return out;
}

}  // namespace ds41
