#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/config.h"
#include "model/engram_layout.h"
#include "model/presets.h"
#include "test_paths.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

std::string error_of(const ModelConfig& c) {
  try {
    validate_config(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ReleasedHfAndFlatFilesDescribeTheSameModel) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  ModelConfig hf = load_config_file(test::shared_dir() + "/assets/config.json");
  ModelConfig flat = load_config_file(test::shared_dir() + "/assets/inference_config.json");
  EXPECT_TRUE(hf.differences_in_model_fields(flat).empty());
  for (auto& d : hf.differences_in_model_fields(flat)) ADD_FAILURE() << d;
  EXPECT_NO_THROW(validate_config(hf));
  EXPECT_NO_THROW(validate_config(flat));
  EXPECT_EQ(hf.dim, 5120);
  EXPECT_EQ(hf.n_layers, 40);
  EXPECT_EQ(hf.compress_ratios.size(), 43u);
  EXPECT_EQ(hf.norm_eps, 1e-20);
  EXPECT_EQ(hf.engram_pad_id, 2);
  EXPECT_EQ(hf.dspark_n_activated_experts, 3);
  EXPECT_EQ(hf.original_seq_len, 65536);
  EXPECT_TRUE(hf.vision_enabled());
  EXPECT_FALSE(hf.vision_max_wh_ratio.has_value());
  // Our built-in description of the release must agree with the shipped files.
  for (auto& d : released_config().differences_in_model_fields(hf)) ADD_FAILURE() << d;
}

TEST(Config, EveryGoldenCheckpointConfigValidatesAndBothFormsAgree) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  int cases = 0;
  for (const char* set : {"/goldens", "/goldens-unseen"}) {
    if (!std::filesystem::is_directory(test::shared_dir() + set)) continue;
    for (auto& entry : std::filesystem::directory_iterator(test::shared_dir() + set)) {
      if (!entry.is_directory()) continue;
      ++cases;
      std::string dir = entry.path().string() + "/model";
      ModelConfig c;
      ASSERT_NO_THROW(c = load_model_dir_config(dir)) << dir;
      EXPECT_NO_THROW(validate_config(c)) << dir;
    }
  }
  EXPECT_GE(cases, 1);
}

TEST(Config, SerializationRoundTripsThroughBothForms) {
  ModelConfig t = preset_config("tiny");
  ModelConfig from_hf = parse_config_json(config_to_hf_json(t), "hf");
  ModelConfig from_flat = parse_config_json(config_to_flat_json(t), "flat");
  for (auto& d : t.differences_in_model_fields(from_hf)) ADD_FAILURE() << "hf: " << d;
  for (auto& d : t.differences_in_model_fields(from_flat)) ADD_FAILURE() << "flat: " << d;
  ModelConfig r = released_config();
  for (auto& d : r.differences_in_model_fields(parse_config_json(config_to_hf_json(r), "hf"))) ADD_FAILURE() << d;
}

TEST(Presets, EveryPresetValidatesAndUnknownNamesListTheKnownOnes) {
  const auto names = preset_names();
  EXPECT_EQ(names, (std::vector<std::string>{"tiny", "small", "wide"}));
  for (const auto& n : names) EXPECT_NO_THROW(validate_config(preset_config(n))) << n;
  // The building blocks of the table are not presets of their own.
  for (const char* n : {"constants", "released", "huge"}) {
    try {
      preset_config(n);
      ADD_FAILURE() << n << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("known presets: tiny, small, wide"), std::string::npos) << e.what();
    }
  }
  // wide is the release at 6 layers: every width the same.
  const ModelConfig w = preset_config("wide"), r = released_config();
  EXPECT_EQ(w.dim, r.dim);
  EXPECT_EQ(w.moe_inter_dim, r.moe_inter_dim);
  EXPECT_EQ(w.index_topk, r.index_topk);
  EXPECT_EQ(w.n_layers, 6);
}

TEST(Config, ApplyFlatFieldsSetsOnlyWhatItNamesAndRejectsUnknownKeys) {
  ModelConfig c = preset_config("tiny");
  const ModelConfig before = c;
  apply_flat_fields(c, json{{"dim", 256}, {"kv_source_layers", {2}}}, "overlay");
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.kv_source_layers, std::vector<int>{2});
  EXPECT_EQ(c.n_layers, before.n_layers);
  EXPECT_EQ(c.engram_layer_ids, before.engram_layer_ids);
  try {
    apply_flat_fields(c, json{{"dimm", 256}}, "overlay");
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "overlay: 'dimm' is not a config field");
  }
  try {
    apply_flat_fields(c, json{{"dim", "wide"}}, "overlay");
    ADD_FAILURE() << "a string dim was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'dim' must be an integer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(apply_flat_fields(c, json::array({1}), "overlay"), Error);
}

TEST(Config, TypeErrorsNameTheFileAndKey) {
  json j = config_to_hf_json(preset_config("tiny"));
  j["text_config"]["hidden_size"] = "big";
  try {
    parse_config_json(j, "my/config.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("my/config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("text_config.hidden_size"), std::string::npos) << m;
    EXPECT_NE(m.find("integer"), std::string::npos) << m;
  }
  json f = config_to_flat_json(preset_config("tiny"));
  f["compress_ratios"] = json::array({0, "x"});
  EXPECT_THROW(parse_config_json(f, "flat"), Error);
  EXPECT_THROW(parse_config_json(json::array(), "arr"), Error);
  json q = config_to_hf_json(preset_config("tiny"));
  q["quantization_config"]["weight_block_size"] = json::array({128, 128});
  EXPECT_THROW(parse_config_json(q, "q"), Error);
}

// One test per rule: each breaks exactly one thing in a valid config.
TEST(ConfigRules, CompressRatiosNeedOneEntryPerLayerAndStage) {
  ModelConfig c = preset_config("tiny");
  c.compress_ratios.pop_back();
  EXPECT_NE(error_of(c).find("n_layers + n_mtp_layers"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, CompressedLayerNeedsAKvSourceBeforeIt) {
  ModelConfig c = preset_config("tiny");
  c.compress_ratios[1] = 2;  // layer 1 compressed, but the first kv source is layer 2
  EXPECT_NE(error_of(c).find("no kv source layer at or before it"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, ConsumerRatioMustMatchItsSource) {
  ModelConfig c = preset_config("tiny");
  c.compress_ratios[3] = 1;  // layer 3 reads layer 2 (ratio 2)
  EXPECT_NE(error_of(c).find("its kv source (layer 2) has ratio 2"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, IndexSourcesMustBeCompressedLayers) {
  ModelConfig c = preset_config("tiny");
  c.index_source_layers = {0, 2, 4, 6};
  EXPECT_NE(error_of(c).find("index source layer 0 has compress ratio 0"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, KvSourceMustBeAnIndexSource) {
  ModelConfig c = preset_config("tiny");
  c.index_source_layers = {2, 6};
  EXPECT_NE(error_of(c).find("kv source layer 4 must also be an index source"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, CandidateSourceMustBeAnIndexSource) {
  ModelConfig c = preset_config("tiny");
  c.candidate_source_layer = 5;
  EXPECT_NE(error_of(c).find("candidate_source_layer 5 must be an index source"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, DSparkStagesAreWindowOnly) {
  ModelConfig c = preset_config("tiny");
  c.compress_ratios.back() = 1;
  EXPECT_NE(error_of(c).find("DSpark stage"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, QuantizedDimensionsAreMultiplesOf32) {
  ModelConfig c = preset_config("tiny");
  c.moe_inter_dim = 48;
  EXPECT_NE(error_of(c).find("moe_inter_dim (48) must be a multiple of 32"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, HeadsDivisibleByOutputGroups) {
  ModelConfig c = preset_config("tiny");
  c.o_groups = 3;
  EXPECT_NE(error_of(c).find("divisible by o_groups"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, EngramRowsMustMatchThePrimeBuckets) {
  ModelConfig c = preset_config("tiny");
  c.engram_num_embeddings[1] += 1;
  EXPECT_NE(error_of(c).find("engram_num_embeddings[1]"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, ExactlyOneSharedExpert) {
  ModelConfig c = preset_config("tiny");
  c.n_shared_experts = 2;
  EXPECT_NE(error_of(c).find("n_shared_experts must be 1"), std::string::npos) << error_of(c);
}

TEST(ConfigRules, AllProblemsAreReportedTogether) {
  ModelConfig c = preset_config("tiny");
  c.n_shared_experts = 2;
  c.o_groups = 3;
  c.candidate_source_layer = 5;
  EXPECT_GE(config_problems(c).size(), 3u);
}

TEST(EngramLayout, ReleasedPrimesOffsetsAndRowsMatchTheSpecTable) {
  EngramLayout l = compute_engram_layout(released_config());
  ASSERT_EQ(l.primes.size(), 2u);
  ASSERT_EQ(l.columns_per_layer, 24);
  // spec engram_dspark_vision.md §A.3 table
  EXPECT_EQ(l.primes[0][0], 16000057);
  EXPECT_EQ(l.primes[0][7], 16000183);
  EXPECT_EQ(l.primes[0][8], 16000189);
  EXPECT_EQ(l.primes[0][23], 16000463);
  EXPECT_EQ(l.primes[1][0], 16000477);
  EXPECT_EQ(l.primes[1][23], 16000889);
  EXPECT_EQ(l.offsets[0][1], 16000057);
  EXPECT_EQ(l.offsets[0][23], 368005705);
  EXPECT_EQ(l.offsets[1][16], 256009984);
  EXPECT_EQ(l.rows[0], 384006168);
  EXPECT_EQ(l.rows[1], 384016682);
}

TEST(EngramLayout, MillerRabinAgreesWithTrialDivision) {
  for (uint64_t n = 0; n < 20000; ++n) {
    bool trial = n >= 2;
    for (uint64_t d = 2; d * d <= n && trial; ++d) trial = n % d != 0;
    ASSERT_EQ(is_prime_u64(n), trial) << n;
  }
  EXPECT_TRUE(is_prime_u64(18446744073709551557ull));  // largest 64-bit prime
  EXPECT_FALSE(is_prime_u64(3215031751ull));           // strong pseudoprime to bases 2,3,5,7
}

}  // namespace
}  // namespace ds41
