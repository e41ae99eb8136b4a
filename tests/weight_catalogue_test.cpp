#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <cstring>

#include "base/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/weight_catalogue.h"
#include "test_paths.h"

namespace ds41 {
namespace {

TEST(WeightCatalogue, ReleasedConfigGivesTheCensusCounts) {
  auto cat = build_weight_catalogue(released_config());
  std::map<DType, int> counts;
  int64_t bytes = 0;
  for (auto& s : cat) {
    counts[s.dtype]++;
    bytes += s.nbytes();
  }
  // checkpoint_census.md: 96,085 tensors by dtype
  EXPECT_EQ(cat.size(), 96085u);
  EXPECT_EQ(counts[DType::BF16], 520);
  EXPECT_EQ(counts[DType::F32], 387);
  EXPECT_EQ(counts[DType::F8_E4M3], 357);
  EXPECT_EQ(counts[DType::F8_E8M0], 47589);
  EXPECT_EQ(counts[DType::I8], 47232);
  // The release record's byte total (sources.md §C: 510,286,023,000 B).
  EXPECT_EQ(bytes, 510286023000);
  std::set<std::string> names;
  for (auto& s : cat) EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
}

TEST(WeightCatalogue, ReleasedParametersByGroupMatchTheCensus) {
  std::map<TensorGroup, int64_t> params;
  int64_t total = 0;
  for (auto& s : build_weight_catalogue(released_config())) {
    params[s.group] += s.params();
    total += s.params();
  }
  // checkpoint_census.md "Parameters by group"
  EXPECT_EQ(params[TensorGroup::Attention], 5126564864);
  EXPECT_EQ(params[TensorGroup::HyperConnection], 39323760);
  EXPECT_EQ(params[TensorGroup::MoE], 545076049920);
  EXPECT_EQ(params[TensorGroup::Norm], 409600 + 5120);
  EXPECT_EQ(params[TensorGroup::EmbedHead], 1323827200);
  EXPECT_EQ(params[TensorGroup::Engram], 196928504320);
  EXPECT_EQ(params[TensorGroup::DSpark], 14225362530);
  EXPECT_EQ(params[TensorGroup::Vision], 485268480);
  // The census total leaves out the final norm (its row says "409,600 (+5,120)").
  EXPECT_EQ(total, 763205310674 + 5120);
}

TEST(WeightCatalogue, EveryCensusShapeSpotCheckIsInTheCatalogue) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  std::ifstream in(test::shared_dir() + "/assets/checkpoint_census.md");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  auto start = text.find("## Shape spot checks");
  ASSERT_NE(start, std::string::npos);
  text = text.substr(start, text.find("\n## ", start + 5) - start);
  std::map<std::string, const TensorSpec*> by_name;
  auto cat = build_weight_catalogue(released_config());
  for (auto& s : cat) by_name[s.name] = &s;
  std::regex entry(R"(([A-Za-z0-9_.]+) \[([0-9,]+)\] (BF16|F32|F8_E4M3|F8_E8M0|I8))");
  int checked = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), entry); it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[1], dims = (*it)[2], dtype = (*it)[3];
    std::vector<int64_t> shape;
    std::stringstream ds(dims);
    for (std::string d; std::getline(ds, d, ',');) shape.push_back(std::stoll(d));
    auto f = by_name.find(name);
    ASSERT_NE(f, by_name.end()) << name;
    EXPECT_EQ(f->second->shape, shape) << name;
    EXPECT_EQ(std::string(dtype_name(f->second->dtype)), dtype) << name;
    ++checked;
  }
  EXPECT_GE(checked, 35);
}

TEST(WeightCatalogue, ModulePresenceFollowsTheLayerPlan) {
  std::set<std::string> names;
  for (auto& s : build_weight_catalogue(released_config())) names.insert(s.name);
  for (int l = 0; l < 40; ++l) {
    bool kv = l == 2 || l == 8 || l == 14 || l == 20;
    bool idx = kv || l == 24 || l == 28 || l == 32 || l == 36;
    std::string p = "layers." + std::to_string(l) + ".attn.";
    EXPECT_EQ(names.count(p + "compressor.wkv.weight"), kv ? 1u : 0u) << l;
    EXPECT_EQ(names.count(p + "compressor.wgate.weight"), (kv && l != 20) ? 1u : 0u) << l;
    EXPECT_EQ(names.count(p + "indexer.wq_b.weight"), idx ? 1u : 0u) << l;
    EXPECT_EQ(names.count(p + "indexer.wk.weight"), kv ? 1u : 0u) << l;
    EXPECT_EQ(names.count("layers." + std::to_string(l) + ".engram.wkv.weight"), (l == 1 || l == 14) ? 1u : 0u) << l;
  }
  EXPECT_EQ(names.count("mtp.0.main_proj.weight"), 1u);
  EXPECT_EQ(names.count("mtp.1.main_proj.weight"), 0u);
  EXPECT_EQ(names.count("mtp.2.markov_head.head.weight"), 1u);
  EXPECT_EQ(names.count("mtp.0.norm.weight"), 0u);
  EXPECT_EQ(names.count("mtp.0.embed.weight"), 0u);  // tied to the backbone's
  EXPECT_EQ(names.count("hc_head_fn"), 0u);
}

// The strongest check: every golden checkpoint written by the official reference's tooling holds
// exactly the tensors our catalogue derives from its config.
TEST(WeightCatalogue, MatchesEveryGoldenCheckpointExactly) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  int cases = 0;
  for (auto& entry : std::filesystem::directory_iterator(test::shared_dir() + "/goldens")) {
    if (!entry.is_directory()) continue;
    std::string dir = entry.path().string() + "/model";
    ModelConfig c = load_model_dir_config(dir);
    TensorStore store = TensorStore::open(dir);
    auto problems = catalogue_problems(store, build_weight_catalogue(c));
    for (auto& p : problems) ADD_FAILURE() << dir << ": " << p;
    ++cases;
  }
  EXPECT_GE(cases, 4);
}

}  // namespace
}  // namespace ds41

namespace ds41 {
namespace {

// A copy of the golden backbone-a checkpoint with one tensor missing, one mis-shaped, one of the
// wrong dtype and one extra: all four are reported together, each naming its tensor.
TEST(WeightCatalogue, ReportsMissingMisshapedWrongTypeAndUnexpectedTogether) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const std::string src = test::shared_dir() + "/goldens/backbone-a/model";
  ModelConfig c = load_model_dir_config(src);
  TensorStore golden = TensorStore::open(src);
  std::vector<TensorToWrite> out;
  for (const TensorInfo& t : golden.tensors()) {
    if (t.name == "layers.3.attn.wkv.weight") continue;  // missing
    TensorToWrite w{t.name, t.dtype, t.shape, nullptr};
    if (t.name == "layers.0.attn.wq_a.weight") std::swap(w.shape[0], w.shape[1]);  // wrong shape
    if (t.name == "layers.1.attn.attn_sink") w.dtype = DType::I32;                 // wrong dtype
    const TensorInfo* ti = &t;
    w.fill = [ti](uint8_t* dst, size_t n) { std::memcpy(dst, ti->data, n); };
    out.push_back(std::move(w));
  }
  out.push_back({"layers.0.attn.extra", DType::F32, {4}, nullptr});  // unexpected
  test::TempDir tmp;
  write_sharded_checkpoint(tmp.path(), out, 1 << 20, 2);
  TensorStore broken = TensorStore::open(tmp.path());
  auto problems = catalogue_problems(broken, build_weight_catalogue(c));
  std::string all;
  for (auto& p : problems) all += p + "\n";
  EXPECT_NE(all.find("missing tensors (1)"), std::string::npos) << all;
  EXPECT_NE(all.find("layers.3.attn.wkv.weight"), std::string::npos) << all;
  EXPECT_NE(all.find("layers.0.attn.wq_a.weight: shape [128, 64], expected [64, 128]"), std::string::npos) << all;
  EXPECT_NE(all.find("layers.1.attn.attn_sink: dtype I32, expected F32"), std::string::npos) << all;
  EXPECT_NE(all.find("unexpected tensors (not in the model described by the config) (1)"), std::string::npos) << all;
  EXPECT_NE(all.find("layers.0.attn.extra"), std::string::npos) << all;
  // Model loading refuses it with the same list in one error.
  try {
    check_checkpoint_against_catalogue(broken, build_weight_catalogue(c));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not match its config"), std::string::npos);
  }
}

}  // namespace
}  // namespace ds41
