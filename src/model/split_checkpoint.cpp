#include "model/split_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/hash.h"
#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/tensor_table.h"
#include "model/weights.h"

namespace ds41 {

namespace fs = std::filesystem;

uint64_t checkpoint_fingerprint(const std::string& dir, const TensorStore& store) {
  uint64_t h = kFnv1a64Offset;
  for (const char* name : {"config.json", "inference_config.json"}) {
    std::ifstream f(fs::path(dir) / name, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    h = fnv1a64(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), h);
    h = fnv1a64(reinterpret_cast<const uint8_t*>("|"), 1, h);
  }
  const std::vector<TensorInfo>& tensors = store.tensors();
  for (const TensorInfo& t : tensors) {
    h = fnv1a64(reinterpret_cast<const uint8_t*>(t.name.data()), t.name.size(), h);
    const int64_t fields[] = {int64_t(t.dtype), int64_t(t.nbytes), int64_t(t.shape.size())};
    h = fnv1a64(reinterpret_cast<const uint8_t*>(fields), sizeof fields, h);
    h = fnv1a64(reinterpret_cast<const uint8_t*>(t.shape.data()), t.shape.size() * sizeof(int64_t), h);
  }
  // And the first bytes of 16 tensors spread over the list (a page read each), so that two
  // checkpoints of the same shapes with different weights (another seed, a fine-tune) differ.
  constexpr size_t kSamples = 16, kSampleBytes = 256;
  for (size_t i = 0; i < kSamples && !tensors.empty(); ++i) {
    const TensorInfo& t = tensors[i * tensors.size() / kSamples];
    h = fnv1a64(t.data, std::min(t.nbytes, kSampleBytes), h);
  }
  return h;
}

std::optional<SplitMarker> read_split_marker(const std::string& dir) {
  const fs::path path = fs::path(dir) / kSplitMarkerFileName;
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  SplitMarker m;
  if (!j.is_object() || !j.contains("ranks") || !j.contains("rank") || !j.contains("source_fingerprint") ||
      !j["ranks"].is_number_integer() || !j["rank"].is_number_integer() || !j["source_fingerprint"].is_string())
    throw Error(path.string() + ": not a valid split marker (expected {\"ranks\", \"rank\", \"source_fingerprint\"})");
  m.ranks = j["ranks"].get<int>();
  m.rank = j["rank"].get<int>();
  const std::string fp = j["source_fingerprint"].get<std::string>();
  char* end = nullptr;
  m.source_fingerprint = std::strtoull(fp.c_str(), &end, 16);
  if (m.ranks < 1 || m.rank < 0 || m.rank >= m.ranks || fp.empty() || *end != '\0')
    throw Error(path.string() + ": not a valid split marker (rank " + std::to_string(m.rank) + " of " +
                std::to_string(m.ranks) + ", fingerprint '" + fp + "')");
  return m;
}

ForeignExperts::ForeignExperts(const ModelPlan& plan, const ExpertShare& share) : share_(share) {
  if (share.ranks <= 1) return;
  for (const LayerPlan& lp : plan.layers)
    for (int e = 0; e < lp.routed_experts; ++e)
      if (!share.owns(e, lp.routed_experts)) prefixes_.push_back(expert_prefix(lp, e));
  std::sort(prefixes_.begin(), prefixes_.end());
}

bool ForeignExperts::foreign(const std::string& name) const {
  if (prefixes_.empty()) return false;
  const size_t at = name.find(".ffn.experts.");
  if (at == std::string::npos) return false;
  const size_t end = name.find('.', at + std::strlen(".ffn.experts."));
  return end != std::string::npos && std::binary_search(prefixes_.begin(), prefixes_.end(), name.substr(0, end + 1));
}

bool ForeignExperts::needed(const std::string& name) const {
  if (weight_use(name) == WeightUse::RoutedExpert) return !foreign(name);
  return !share_.experts_only;
}

int64_t write_split_checkpoint(const std::string& src, int ranks, int rank, const std::string& out, uint64_t shard_bytes,
                               const std::function<void(int64_t, int64_t)>& progress) {
  if (ranks < 2 || rank < 0 || rank >= ranks)
    throw Error("split: --rank must be in [0, --ranks) and --ranks at least 2 (got rank " + std::to_string(rank) +
                " of " + std::to_string(ranks) + ")");
  if (fs::exists(fs::path(out) / "model.safetensors.index.json") || fs::exists(fs::path(out) / kSplitMarkerFileName))
    throw Error(out + ": already holds a checkpoint; give an empty or new directory");
  if (read_split_marker(src)) throw Error(src + ": is itself a split copy; split the whole checkpoint");
  const ModelConfig config = load_model_dir_config(src);
  validate_config(config);
  const ModelPlan plan = build_model_plan(config);
  const TensorStore store = TensorStore::open(src);
  const ForeignExperts rank_view(plan, ExpertShare{rank, ranks, rank > 0});
  std::vector<TensorToWrite> tensors;
  int64_t total = 0;
  for (const TensorInfo& t : store.tensors())
    if (rank_view.needed(t.name)) total += int64_t(t.nbytes);
  int64_t done = 0;
  for (const TensorInfo& t : store.tensors()) {
    if (!rank_view.needed(t.name)) continue;
    const TensorInfo* info = &t;
    tensors.push_back({t.name, t.dtype, t.shape, [info, &done, total, &progress](uint8_t* dst, size_t n) {
                         if (n != info->nbytes) throw Error("split: " + info->name + ": size changed while copying");
                         std::memcpy(dst, info->data, n);
                         done += int64_t(n);
                         if (progress) progress(done, total);
                       }});
  }
  fs::create_directories(out);
  // Everything beside the weights: config files, tokenizer, Engram map, the inference/ folder.
  for (const fs::directory_entry& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (name == "model.safetensors.index.json" || name == kSplitMarkerFileName ||
        (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0))
      continue;
    fs::copy(e.path(), fs::path(out) / name, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  write_sharded_checkpoint(out, std::move(tensors), shard_bytes);
  char fp[32];
  std::snprintf(fp, sizeof fp, "%016llx", (unsigned long long)checkpoint_fingerprint(src, store));
  const nlohmann::json marker = {{"ranks", ranks}, {"rank", rank}, {"source_fingerprint", fp},
                                 {"holds", rank == 0 ? "every tensor but the other ranks' routed experts"
                                                     : "its own routed experts only"}};
  const fs::path tmp = fs::path(out) / (std::string(kSplitMarkerFileName) + ".tmp");
  {
    std::ofstream f(tmp);
    f << marker.dump(2) << "\n";
    if (!f) throw Error(tmp.string() + ": cannot write");
  }
  fs::rename(tmp, fs::path(out) / kSplitMarkerFileName);
  return total;
}

}  // namespace ds41
