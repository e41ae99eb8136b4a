// `ds41 run --dspark` as a user runs it: the same tokens and logits as without it (greedy), the
// statistics in --json, seeded sampling reproducible, sessions, and bad options as errors.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "tiny_model.h"
#include "test_command.h"

namespace ds41 {
namespace {

using test::CommandResult;
using test::run_ds41;

// The tiny layout (Engram on) with a 512-token vocabulary: cheap heads.
const std::string& model_dir() {
  static std::unique_ptr<test::TempDir> dir;
  if (!dir) {
    dir = std::make_unique<test::TempDir>();
    ModelConfig c = test::tiny_config(true);
    c.vocab_size = 512;
    c.dspark_noise_token_id = 500;
    c.image_token_id = 511;
    c.engram_compressed_vocab_size = 400;
    RandomCheckpointOptions opt;
    opt.seed = 5;
    write_random_checkpoint(c, dir->path(), opt);
  }
  return dir->path();
}

const std::string kPrompt = "0,17,300,41,99,256,7,480,12,13,14,200,201,333,444,55";

TEST(DsparkCli, GreedyRunEqualsPlainRunAndReportsStatistics) {
  const std::string base = "run -m " + model_dir() + " --tokens " + kPrompt + " --max-tokens 24 --threads 2 --json";
  auto plain = run_ds41(base);
  ASSERT_EQ(plain.status, 0) << plain.err;
  auto spec = run_ds41(base + " --dspark --draft-tokens 3 --compare");
  ASSERT_EQ(spec.status, 0) << spec.err;
  const auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["generated"], p["generated"]);
  EXPECT_EQ(s["generated"].size(), 24u);
  EXPECT_EQ(s["steps"], p["steps"]);  // top-5 logits of every step, bit for bit
  const auto& d = s["dspark"];
  EXPECT_EQ(d["draft_tokens"], 3);
  EXPECT_GT(d["cycles"].get<int>(), 0);
  EXPECT_LE(d["drafted"].get<int>(), 3 * d["cycles"].get<int>());
  EXPECT_LE(d["accepted"].get<int>(), d["drafted"].get<int>());
  // Every cycle emits its accepted drafts and one more token; the first comes from the prefill.
  EXPECT_EQ(d["accepted"].get<int>() + d["cycles"].get<int>(), 23);
  EXPECT_TRUE(d["same_tokens_as_plain"].get<bool>());
  EXPECT_GT(d["plain_decode_tokens_per_s"].get<double>(), 0);
  // Without --json the statistics go to stderr.
  auto text = run_ds41("run -m " + model_dir() + " --tokens " + kPrompt + " --max-tokens 6 --threads 2 --dspark");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.err.find("dspark: "), std::string::npos) << text.err;
  EXPECT_NE(text.err.find("mean accepted length"), std::string::npos) << text.err;
}

TEST(DsparkCli, SeededSamplingIsReproducible) {
  const std::string base = "run -m " + model_dir() + " --tokens " + kPrompt +
                           " --max-tokens 16 --threads 2 --json --temp 0.9 --top-p 0.95 --repeat-penalty 1.2 --seed 4";
  auto a = run_ds41(base + " --dspark"), b = run_ds41(base + " --dspark"), plain = run_ds41(base);
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto ja = nlohmann::json::parse(a.out);
  EXPECT_EQ(ja["generated"], nlohmann::json::parse(b.out)["generated"]);
  // The first token is drawn from the prefill's logits with the key plain sampling uses (its
  // position): the same token. Later ones follow the same law, not the same draws.
  EXPECT_EQ(ja["generated"][0], nlohmann::json::parse(plain.out)["generated"][0]);
}

// Greedy with penalties: the target's choice is the penalised argmax, over the sequence so far
// (prompt, accepted drafts), exactly as plain decoding takes it.
TEST(DsparkCli, GreedyWithPenaltiesEqualsPlainRun) {
  const std::string base = "run -m " + model_dir() + " --tokens " + kPrompt +
                           " --max-tokens 20 --threads 2 --json --repeat-penalty 1.6 --presence-penalty 0.8 --frequency-penalty 0.3";
  auto plain = run_ds41(base), spec = run_ds41(base + " --dspark");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(spec.status, 0) << spec.err;
  const auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["generated"], p["generated"]);
  EXPECT_EQ(s["steps"], p["steps"]);
  EXPECT_GT(s["dspark"]["cycles"].get<int>(), 0);
}

// A CED prefill (prompt longer than the 128-token window): the drafter's rings take the last
// window of the narrowed call; the target's tokens are CED decoding's.
TEST(DsparkCli, CedPrefillGivesPlainCedTokens) {
  std::string prompt = "0";
  for (int i = 1; i < 150; ++i) {
    prompt += ',';
    prompt += std::to_string(3 + (i * 37) % 480);
  }
  const std::string base = "run -m " + model_dir() + " --tokens " + prompt + " --prefill ced --max-tokens 12 --threads 2 --json";
  auto plain = run_ds41(base), spec = run_ds41(base + " --dspark");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(spec.status, 0) << spec.err;
  const auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["generated"], p["generated"]);
  EXPECT_EQ(s["steps"], p["steps"]);
  // The full prefill gives other numbers (CED is an approximation): the option did reach the model.
  auto full = run_ds41("run -m " + model_dir() + " --tokens " + prompt + " --max-tokens 12 --threads 2 --json --dspark");
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_NE(nlohmann::json::parse(full.out)["steps"], s["steps"]);
}

// Image spans in the prompt (the tiny preset has a vision tower and a DSpark head).
TEST(DsparkCli, ImagePromptGivesPlainTokens) {
  const std::string images = std::string(DS41_SOURCE_DIR) + "/tests/data/vision/images/";
  // Chunked: the calls after the first cut through the image span (InputEmbeddings sliced).
  const std::string base = "run -m " + test::tiny_model_dir(true) + " --tokens 0,129264,5,9 --image " + images +
                           "rgb_3x2.png --max-tokens 8 --threads 2 --json --chunk 50";
  auto plain = run_ds41(base), spec = run_ds41(base + " --dspark");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(spec.status, 0) << spec.err;
  const auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["prompt"], p["prompt"]);
  EXPECT_EQ(s["generated"], p["generated"]);
  EXPECT_EQ(s["steps"], p["steps"]);
}

// -p: the prompt format, the streamed reply and its JSON are the same with --dspark.
TEST(DsparkCli, TextPromptGivesPlainReply) {
  if (!test::have_shared()) GTEST_SKIP() << "needs ../shared (V3 tokenizer)";
  const std::string v3 = test::shared_dir() + "/assets/deepseek_v3_tokenizer/tokenizer.json";
  const std::string base = "run -m " + test::tiny_model_dir(true) + " --tokenizer " + v3 +
                           " -p 'Hello there' --max-tokens 10 --threads 2 --json";
  auto plain = run_ds41(base), spec = run_ds41(base + " --dspark");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(spec.status, 0) << spec.err;
  const auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["prompt"], p["prompt"]);
  EXPECT_EQ(s["generated"], p["generated"]);
  EXPECT_EQ(s["content"], p["content"]);
  EXPECT_EQ(s["finish_reason"], p["finish_reason"]);
  ASSERT_TRUE(s.contains("dspark"));
  auto text = run_ds41("run -m " + test::tiny_model_dir(true) + " --tokenizer " + v3 + " -p 'Hello there' --max-tokens 4 --threads 2 --dspark");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.err.find("dspark: "), std::string::npos) << text.err;
}

TEST(DsparkCli, SessionSavedAfterDsparkContinuesLikeOneSavedWithoutIt) {
  test::TempDir tmp;
  const std::string base = "run -m " + model_dir() + " --tokens " + kPrompt + " --max-tokens 10 --threads 2";
  ASSERT_EQ(run_ds41(base + " --save-session " + (tmp / "plain.session")).status, 0);
  auto saved = run_ds41(base + " --dspark --save-session " + (tmp / "dspark.session"));
  ASSERT_EQ(saved.status, 0) << saved.err;
  const std::string more = " --tokens 9,8,7 --max-tokens 8 --threads 2 --json";
  auto a = run_ds41("run -m " + model_dir() + " --load-session " + (tmp / "plain.session") + more);
  auto b = run_ds41("run -m " + model_dir() + " --load-session " + (tmp / "dspark.session") + more);
  auto c = run_ds41("run -m " + model_dir() + " --load-session " + (tmp / "dspark.session") + more + " --dspark");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  ASSERT_EQ(c.status, 0) << c.err;
  const auto ja = nlohmann::json::parse(a.out);
  EXPECT_EQ(ja["generated"], nlohmann::json::parse(b.out)["generated"]);
  EXPECT_EQ(ja["steps"], nlohmann::json::parse(c.out)["steps"]);  // draft rings restart; output unchanged
}

TEST(DsparkCli, BadOptionsAreErrors) {
  const std::string base = "run -m " + model_dir() + " --tokens " + kPrompt + " --max-tokens 2";
  auto r = run_ds41(base + " --dspark --draft-tokens 9");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--draft-tokens must be 1..4"), std::string::npos) << r.err;
  r = run_ds41(base + " --draft-tokens 2");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("only applies with --dspark"), std::string::npos) << r.err;
  r = run_ds41(base + " --dspark --dspark-confidence 1.5");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--dspark-confidence"), std::string::npos) << r.err;
  r = run_ds41(base + " --dspark --draft-tokens x");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("expects an integer"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ds41
