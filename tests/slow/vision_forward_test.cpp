// Image prompts through the whole model on a random-weight tiny checkpoint (2-layer ViT, Engram
// on, a small image budget so that spans stay short): token counts per image follow the budget
// formula, prefill == token-by-token decode == chunked calls bit for bit (spans cut anywhere),
// any thread count; image positions are dead for Engram; bad inputs are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/engram_hash.h"
#include "runtime/generation.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "vision/image_prompt.h"
#include "../tiny_model.h"

namespace ds41 {
namespace {

const std::string kImages = std::string(DS41_SOURCE_DIR) + "/tests/data/vision/images/";

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class VisionForward : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    ModelConfig c = test::tiny_config(true);
    c.vision_min_pixels = 8000;  // images of a few thousand pixels ...
    c.vision_max_n_token = 24;   // ... and at most 24 positions per span
    c.vocab_size = 4096;         // a small head keeps the many calls below cheap
    c.image_token_id = 4000;
    c.dspark_noise_token_id = 4001;
    c.engram_compressed_vocab_size = 3000;
    RandomCheckpointOptions opt;
    opt.seed = 77;
    write_random_checkpoint(c, dir_->path(), opt);
    model_ = Model::load(dir_->path()).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }
  static ImagePrompt two_image_prompt(ThreadPool* pool) {
    const int32_t img = int32_t(model_->config().image_token_id);
    const std::vector<int32_t> prompt = {0, 100, 200, img, 300, 400, 500, img, 600, 700, 800};  // ids < vocab
    return build_image_prompt(*model_, prompt,
                              {read_image_file(kImages + "rgb_100x60.png"), read_image_file(kImages + "rgb_79x132.png")},
                              pool);
  }
  // Logits of every position: one call per chunk of `chunk` tokens (0 = all in one call).
  static std::vector<float> run(const ImagePrompt& p, int64_t chunk, ThreadPool* pool) {
    const ModelConfig& c = model_->config();
    ForwardOptions opt;
    opt.all_logits = true;
    SequenceState st = model_->new_sequence();
    std::vector<float> all;
    EXPECT_EQ(c.vocab_size, 4096);
    const int64_t S = int64_t(p.tokens.size());
    for (int64_t b = 0; b < S; b += chunk ? chunk : S) {
      const int64_t e = std::min(S, b + (chunk ? chunk : S));
      const InputEmbeddings in = p.inputs.slice(b, e, c.dim);
      auto l = model_->forward(st, std::vector<int32_t>(p.tokens.begin() + b, p.tokens.begin() + e), opt, pool, nullptr, &in);
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  }
  static test::TempDir* dir_;
  static Model* model_;
};
test::TempDir* VisionForward::dir_ = nullptr;
Model* VisionForward::model_ = nullptr;

TEST_F(VisionForward, TokenCountsPerImageFollowTheBudgetFormula) {
  const ModelConfig& c = model_->config();
  const int32_t img = int32_t(c.image_token_id);
  for (const char* name : {"rgb_1x1.png", "rgb_wide_1000x8.png", "rgb_tall_7x900.png", "photo_444_90x70.jpg",
                           "gray_57x43.jpg", "lossy_120x80.webp"}) {
    SCOPED_TRACE(name);
    const RgbImage im = read_image_file(kImages + name);
    const ImagePrompt p = build_image_prompt(*model_, {0, img, 5}, {im}, nullptr);
    ASSERT_EQ(p.spans.size(), 1u);
    const ImageGrid& g = p.spans[0].grid;
    const ImageGrid want = plan_image_grid(im.width, im.height, c);
    EXPECT_EQ(g.n_llm_h, want.n_llm_h);
    EXPECT_EQ(g.n_llm_w, want.n_llm_w);
    // n_llm = ceil(n_vit / 3) per side; span = rows of (width + newline) plus start and end.
    EXPECT_EQ(g.n_llm_h, (g.n_vit_h + 2) / 3);
    EXPECT_EQ(g.n_llm_w, (g.n_vit_w + 2) / 3);
    EXPECT_EQ(p.spans[0].length(), g.n_llm_h * (g.n_llm_w + 1) + 2);
    EXPECT_LE(p.spans[0].length(), c.vision_max_n_token);
    EXPECT_EQ(int64_t(p.tokens.size()), 2 + p.spans[0].length());
    EXPECT_EQ(int64_t(p.inputs.rows.size()), p.spans[0].length() * c.dim);
  }
}

TEST_F(VisionForward, PrefillDecodeAndChunkedCallsGiveIdenticalLogits) {
  ThreadPool pool(2);
  const ImagePrompt p = two_image_prompt(&pool);
  ASSERT_EQ(p.spans.size(), 2u);
  const std::vector<float> whole = run(p, 0, &pool);
  EXPECT_EQ(whole, run(p, 1, &pool));        // token by token: every span position in its own call
  EXPECT_EQ(whole, run(p, 7, &pool));        // chunks that cut the spans
  EXPECT_EQ(whole, run(p, 5, nullptr));      // and one thread
  EXPECT_EQ(two_image_prompt(nullptr).inputs.rows, p.inputs.rows);  // the tower too
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
  // The image rows matter: the same ids read as text give other logits after the first span.
  ImagePrompt text = p;
  text.inputs.token_types.assign(p.tokens.size(), int8_t(TokenType::Text));
  text.inputs.rows.clear();
  const std::vector<float> as_text = run(text, 0, &pool);
  const int64_t V = model_->config().vocab_size;
  EXPECT_EQ(std::vector<float>(whole.begin(), whole.begin() + p.spans[0].start * V),
            std::vector<float>(as_text.begin(), as_text.begin() + p.spans[0].start * V));
  EXPECT_NE(whole, as_text);
}

// Generation::feed cuts the inputs with its chunks, with a pending (sampled, not yet fed) token in
// front: the same logits as one prefill of pending token + image prompt.
TEST_F(VisionForward, GenerationFeedsImagePromptsInChunks) {
  ThreadPool pool(2);
  const ImagePrompt p = two_image_prompt(&pool);
  SamplerOptions so;
  so.temperature = 0;
  ForwardOptions every_logit;
  every_logit.head_top_k = -1;  // compared whole below (greedy would otherwise keep only the top: head_screen.h)
  Generation gen(*model_, model_->new_sequence(), Sampler(so), &pool, every_logit);
  gen.feed({0, 17, 18}, 0);
  const std::optional<int32_t> pending = gen.next_token();  // sampled, not yet in the sequence
  ASSERT_TRUE(pending.has_value());
  gen.feed(p.tokens, 7, {}, &p.inputs);
  // The reference run: the same sequence in two direct calls.
  SequenceState st = model_->new_sequence();
  model_->forward(st, {0, 17, 18}, ForwardOptions{}, &pool);
  ImagePrompt q = p;
  q.tokens.insert(q.tokens.begin(), *pending);
  q.inputs.token_types.insert(q.inputs.token_types.begin(), int8_t(TokenType::Text));
  const std::vector<float> want = model_->forward(st, q.tokens, ForwardOptions{}, &pool, nullptr, &q.inputs);
  EXPECT_EQ(gen.last_logits(), want);
}

TEST_F(VisionForward, ImagePositionsAreDeadForEngram) {
  const ImagePrompt p = two_image_prompt(nullptr);
  SequenceState st = model_->new_sequence();
  ForwardOptions opt;
  model_->forward(st, p.tokens, opt, nullptr, nullptr, &p.inputs);
  ASSERT_EQ(st.engram_history.size(), p.tokens.size());
  for (size_t s = 0; s < p.tokens.size(); ++s)
    EXPECT_EQ(st.engram_history[s] == kEngramDead, p.inputs.token_types[s] >= 0) << "position " << s;
}

// Image positions in the last window: a bounded replay (compact session) cannot rebuild them.
TEST_F(VisionForward, CompactSessionsAndReplayRefuseImageWindows) {
  const ImagePrompt p = two_image_prompt(nullptr);
  SequenceState st = model_->new_sequence();
  model_->forward(st, p.tokens, ForwardOptions{}, nullptr, nullptr, &p.inputs);
  EXPECT_TRUE(model_->replay_window_has_images(st));
  test::TempDir tmp;
  EXPECT_NE(error_of([&] { save_session(tmp / "c.session", *model_, st, SessionKind::Compact); }).find("--exact"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(tmp / "c.session"));
  save_session(tmp / "e.session", *model_, st, SessionKind::Exact);
  const SequenceState back = load_session(tmp / "e.session", *model_);
  EXPECT_EQ(back.pos, st.pos);
  SequenceState copy = st;
  EXPECT_NE(error_of([&] { model_->replay_window(copy, ForwardOptions{}, nullptr); }).find("image-span positions"),
            std::string::npos);
  // Text only: no refusal.
  SequenceState text = model_->new_sequence();
  model_->forward(text, {0, 5, 6, 7}, ForwardOptions{}, nullptr);
  EXPECT_FALSE(model_->replay_window_has_images(text));
}

TEST_F(VisionForward, InputsThatDoNotFitAreErrors) {
  const ModelConfig& c = model_->config();
  const int32_t img = int32_t(c.image_token_id);
  const RgbImage im = read_image_file(kImages + "rgb_3x2.png");
  EXPECT_NE(error_of([&] { build_image_prompt(*model_, {0, img, img}, {im}, nullptr); }).find("2 image placeholder tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { build_image_prompt(*model_, {0, 5}, {im}, nullptr); }).find("0 image placeholder tokens"),
            std::string::npos);
  SequenceState st = model_->new_sequence();
  InputEmbeddings bad;
  bad.token_types = {-1, 0};
  EXPECT_NE(error_of([&] { model_->forward(st, {0, img}, ForwardOptions{}, nullptr, nullptr, &bad); })
                .find("1 image-span positions need as many embedding rows"),
            std::string::npos);
  bad.token_types = {-1};
  EXPECT_NE(error_of([&] { model_->forward(st, {0, img}, ForwardOptions{}, nullptr, nullptr, &bad); })
                .find("token types given for a different number of tokens"),
            std::string::npos);
  bad.token_types = {-1, 7};
  EXPECT_NE(error_of([&] { model_->forward(st, {0, img}, ForwardOptions{}, nullptr, nullptr, &bad); }).find("token type 7"),
            std::string::npos);
  EXPECT_EQ(st.pos, 0);  // nothing was consumed by the refused calls
}

}  // namespace
}  // namespace ds41
