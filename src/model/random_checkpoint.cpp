#include "model/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/hash.h"
#include "base/thread_pool.h"
#include "io/safetensors_writer.h"
#include "kernels/numeric_formats.h"
#include "model/model.h"
#include "model/weight_catalogue.h"
#include "text/compressed_vocab.h"

namespace ds41 {

namespace fs = std::filesystem;

namespace {

double uniform01(uint64_t key, uint64_t i) {
  // 53 random bits in (0, 1]: never 0, so log() below is finite.
  return (double((splitmix64(key ^ splitmix64(i)) >> 11)) + 1.0) * (1.0 / 9007199254740992.0);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Standard deviation (or center) of the values of a tensor, from its role in the network.
struct ValueLaw {
  double mean = 0, std = 1;
};

ValueLaw law_for(const TensorSpec& s) {
  const std::string& n = s.name;
  const int64_t fan_in = s.shape.size() >= 2 ? (s.role == TensorRole::Fp4Weight ? 2 * s.shape[1] : s.shape[1]) : 1;
  const double inv_sqrt_fan_in = 1.0 / std::sqrt(double(std::max<int64_t>(fan_in, 1)));
  // Norm gains and Engram q/k weights hover around 1 (RMSNorm output is then unit-RMS).
  if (ends_with(n, "norm.weight") || ends_with(n, "norm1.weight") || ends_with(n, "norm2.weight") ||
      ends_with(n, "q_weight") || ends_with(n, "k_weight"))
    return {1.0, 0.1};
  if (ends_with(n, "attn_sink")) return {0.0, 1.0};
  if (contains(n, "hc_") && ends_with(n, "_fn")) return {0.0, inv_sqrt_fan_in};  // mixes m ~ N(0,1)
  if (contains(n, "hc_") && ends_with(n, "_base")) return {0.0, 0.5};
  if (contains(n, "hc_") && ends_with(n, "_scale")) return {0.5, 0.1};
  if (ends_with(n, "gate.bias") || ends_with(n, "gate.bias_vl")) return {0.0, 0.05};
  if (ends_with(n, ".bias")) return {0.0, 0.02};
  if (n == "embed.weight" || n == "image_start" || n == "image_end" || n == "image_newline" ||
      ends_with(n, "markov_head.embed.weight"))
    return {0.0, 1.0};
  if (s.role == TensorRole::EngramTable) return {0.0, 1.0};
  // Every projection roughly preserves the RMS of its (normalized) input.
  return {0.0, inv_sqrt_fan_in};
}

// Power-of-two block scale for quantized weights: about 3 sigma maps to the format's top code,
// with a deterministic +-1 exponent jitter so that decoders see varied scales.
float block_scale(uint64_t key, uint64_t block, double std, double max_code) {
  double target = std::log2(std::max(std, 1e-30) * 3.0 / max_code);
  int jitter = int(splitmix64(key ^ 0x5ca1e ^ splitmix64(block)) % 3) - 1;
  int e = int(std::lround(target)) + jitter;
  e = std::clamp(e, -126, 126);
  return std::ldexp(1.0f, e);
}

struct Generator {
  uint64_t seed;

  // Fill rows [r0, r1) of a tensor's bytes (row = first dimension).
  void fill(const TensorSpec& s, const TensorSpec* weight_of_scale, uint8_t* dst, int64_t r0, int64_t r1) const {
    const TensorSpec& ws = weight_of_scale ? *weight_of_scale : s;
    const uint64_t key = tensor_stream_key(seed, ws.name);
    const ValueLaw law = law_for(ws);
    const int64_t cols = s.shape.size() >= 2 ? s.shape[1] : (s.shape.empty() ? 1 : s.shape[0]);
    if (s.shape.size() < 2) { r0 = 0; r1 = 1; }
    switch (s.role) {
      case TensorRole::Plain:
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = 0; k < cols; ++k) {
            uint64_t i = uint64_t(r * cols + k);
            float v = float(law.mean + law.std * random_normal(key, i));
            if (s.dtype == DType::BF16) {
              uint16_t h = f32_to_bf16(v);
              std::memcpy(dst + 2 * (r - r0) * cols + 2 * k, &h, 2);
            } else {
              std::memcpy(dst + 4 * (r - r0) * cols + 4 * k, &v, 4);
            }
          }
        break;
      case TensorRole::Fp8Weight: {
        const int64_t K = cols, kb_count = (K + 31) / 32;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k0 = 0; k0 < K; k0 += 32) {  // one scale per 32 x 32 block, computed once
            const float sc = block_scale(key, uint64_t((r / 32) * kb_count + k0 / 32), law.std, 448.0);
            for (int64_t k = k0; k < std::min(K, k0 + 32); ++k) {
              const float v = float(law.std * random_normal(key, uint64_t(r * K + k)));
              dst[(r - r0) * K + k] = f32_to_e4m3(v / sc);
            }
          }
        break;
      }
      case TensorRole::EngramTable: {
        // Tables reach ~100 GB in the release, so their codes come straight from the hash (no
        // Box-Muller): a random sign and a magnitude code spread over the E4M3 range below 448
        // (0x7E = 448 and 0x7F = NaN are avoided). With the block scales above
        // the row values have an RMS of the same order as the normal draws elsewhere.
        const int64_t K = cols;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = 0; k < K; k += 8) {
            uint64_t bits = splitmix64(key ^ splitmix64(uint64_t(r * K + k)));
            for (int64_t t = 0; t < 8 && k + t < K; ++t, bits >>= 8) {
              const uint8_t b = uint8_t(bits);
              // magnitude codes 0x58-0x7D (16 .. 416): where |x| / scale of normal draws falls
              // with the scale mapping 3 sigma to 448
              dst[(r - r0) * K + k + t] = uint8_t((b & 0x80) | (0x58 + (b & 0x7f) % 38));
            }
          }
        break;
      }
      case TensorRole::Fp4Weight: {
        const int64_t K = cols * 2, kb_count = K / 32;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k0 = 0; k0 < K; k0 += 32) {  // one scale per 1 x 32 block, computed once
            const float sc = block_scale(key, uint64_t(r * kb_count + k0 / 32), law.std, 6.0);
            for (int64_t k = k0; k < std::min(K, k0 + 32); k += 2) {
              uint8_t pair = 0;
              for (int t = 0; t < 2; ++t) {
                const float v = float(law.std * random_normal(key, uint64_t(r * K + k + t)));
                pair |= uint8_t(f32_to_e2m1(v / sc) << (4 * t));  // low nibble = even element
              }
              dst[(r - r0) * cols + k / 2] = pair;
            }
          }
        break;
      }
      case TensorRole::BlockScale: {
        const double max_code = ws.role == TensorRole::Fp4Weight ? 6.0 : 448.0;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t k = 0; k < cols; ++k)
            dst[(r - r0) * cols + k] = f32_to_e8m0(block_scale(key, uint64_t(r * cols + k), law.std, max_code));
        break;
      }
    }
  }
};

void write_json_file(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path.string() + ": cannot create file");
  out << j.dump(2) << "\n";
  if (!out.flush()) throw Error(path.string() + ": write failed (disk full?)");
}

}  // namespace

uint64_t tensor_stream_key(uint64_t seed, const std::string& name) {
  // FNV-1a of the name, mixed with the seed
  const uint64_t h = fnv1a64(reinterpret_cast<const uint8_t*>(name.data()), name.size());
  return splitmix64(h ^ splitmix64(seed));
}

float random_normal(uint64_t key, uint64_t index) {
  // Box-Muller on two independent uniforms of this (key, index); our own arithmetic so the
  // output does not depend on the standard library's distribution implementation.
  double u1 = uniform01(key, 2 * index), u2 = uniform01(key, 2 * index + 1);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void write_random_checkpoint(const ModelConfig& config, const std::string& dir, const RandomCheckpointOptions& opt) {
  ModelConfig c = config;
  // Engram needs the compressed token map (spec §A.2). With a tokenizer it is derived from it (and
  // the config takes its distinct-key count); ids the tokenizer lacks get their own new compressed
  // ids. Without one, a synthetic map with the configured count is used. Either way the map is
  // written beside the weights, so the model loads without re-deriving it.
  std::vector<int32_t> engram_map;
  if (!c.engram_layer_ids.empty()) {
    if (!opt.tokenizer_path.empty()) {
      int64_t distinct = 0;
      engram_map = derive_compressed_vocab(opt.tokenizer_path, &distinct);
      if (int64_t(engram_map.size()) > c.vocab_size) engram_map.resize(size_t(c.vocab_size));
      int32_t next = 0;
      for (int32_t v : engram_map) next = std::max(next, v + 1);
      while (int64_t(engram_map.size()) < c.vocab_size) engram_map.push_back(next++);
      c.engram_compressed_vocab_size = next;
    } else {
      engram_map = synthetic_compressed_vocab(c.vocab_size, c.engram_compressed_vocab_size);
    }
  }
  validate_config(c);
  std::vector<TensorSpec> cat = build_weight_catalogue(c);
  fs::create_directories(fs::path(dir) / "inference");

  std::unordered_map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& s : cat) by_name.emplace(s.name, &s);
  uint64_t total = 0;
  for (const TensorSpec& s : cat) total += uint64_t(s.nbytes());

  auto generator = std::make_shared<Generator>(Generator{opt.seed});
  auto done = std::make_shared<uint64_t>(0);
  std::vector<TensorToWrite> tensors;
  tensors.reserve(cat.size());
  for (const TensorSpec& s : cat) {
    const TensorSpec* weight = nullptr;
    if (s.role == TensorRole::BlockScale) {
      std::string base = s.name.substr(0, s.name.size() - std::string(".scale").size());
      auto it = by_name.find(base + ".weight");
      if (it == by_name.end()) throw Error("internal: scale tensor without weight: " + s.name);
      weight = it->second;
    }
    TensorToWrite t;
    t.name = s.name;
    t.dtype = s.dtype;
    t.shape = s.shape;
    const TensorSpec* sp = &s;
    t.fill = [generator, sp, weight, pool = opt.pool, progress = opt.progress, done, total](uint8_t* dst, size_t nbytes) {
      const int64_t rows = sp->shape.size() >= 2 ? sp->shape[0] : 1;
      const size_t row_bytes = rows ? nbytes / size_t(rows) : 0;
      auto work = [&](int64_t r0, int64_t r1) { generator->fill(*sp, weight, dst + r0 * row_bytes, r0, r1); };
      if (pool && rows >= 64) pool->parallel_for(rows, work);
      else work(0, rows);
      *done += nbytes;
      if (progress) progress(sp->name, *done, total);
    };
    tensors.push_back(std::move(t));
  }

  uint64_t shard_bytes = opt.max_shard_bytes;
  if (shard_bytes == 0) shard_bytes = std::max<uint64_t>(1, (total + opt.min_shards - 1) / std::max(1, opt.min_shards));
  write_sharded_checkpoint(dir, std::move(tensors), shard_bytes, opt.min_shards);

  if (!engram_map.empty()) write_compressed_vocab_file((fs::path(dir) / kEngramMapFileName).string(), engram_map);
  write_json_file(fs::path(dir) / "config.json", config_to_hf_json(c));
  write_json_file(fs::path(dir) / "inference" / "config.json", config_to_flat_json(c));

  if (!opt.tokenizer_path.empty()) {
    fs::path tok(opt.tokenizer_path);
    if (!fs::is_regular_file(tok)) throw Error(opt.tokenizer_path + ": tokenizer file not found");
    fs::copy_file(tok, fs::path(dir) / "tokenizer.json", fs::copy_options::overwrite_existing);
    fs::path tok_cfg = tok.parent_path() / "tokenizer_config.json";
    if (fs::is_regular_file(tok_cfg))
      fs::copy_file(tok_cfg, fs::path(dir) / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  }
}

}  // namespace ds41
