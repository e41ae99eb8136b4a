// The vision tower against the golden vision-a (official reference on a 2-layer ViT): every stage
// teacher-forced (each gets the recorded input) and end to end from the recorded pixels. The
// engine reproduces every recorded stage bit for bit; the gate is the case's vision tolerances
// (and the exact agreement is printed); plus structural checks with hand-made weights (2D RoPE pairing and
// angles, the aligner's channel-major unfold and zero padding, attention over one patch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "io/safetensors.h"
#include "kernels/numeric_formats.h"
#include "model/model.h"
#include "vision/vision_tower.h"
#include "test_paths.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

std::vector<uint16_t> bf16_tensor(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  if (!t) throw std::runtime_error("missing " + name);
  std::vector<uint16_t> v(t->nbytes / 2);
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

double max_abs_diff(const uint16_t* a, const uint16_t* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(bf16_to_f32(a[i])) - double(bf16_to_f32(b[i]))));
  return m;
}

struct Golden {
  std::string dir = test::shared_dir() + "/goldens/vision-a";
  bool present() const { return std::filesystem::exists(dir + "/case.json"); }
};

TEST(VisionTower, GoldenStagesTeacherForcedAndEndToEnd) {
  Golden g;
  if (!g.present()) GTEST_SKIP() << "golden vision-a not present";
  std::ifstream in(g.dir + "/case.json");
  const json cj = json::parse(in);
  const json& tol = cj.at("vision").at("tolerance");
  auto model = Model::load(g.dir + "/model");
  const ModelConfig& c = model->config();
  const VisionWeights& w = model->weights().vision;
  SafetensorsFile exp(g.dir + "/expected.safetensors");
  const int64_t vd = c.vision_dim;
  const int layers = c.vision_n_layers;
  const json& images = cj.at("vision").at("images");
  for (size_t i = 0; i < images.size(); ++i) {
    SCOPED_TRACE("image " + std::to_string(i));
    const int64_t nh = images[i].at("n_vit_h"), nw = images[i].at("n_vit_w"), n = nh * nw;
    const std::string s = std::string(".").append(std::to_string(i));
    const auto pixels = bf16_tensor(exp, "vision.pixels" + s);
    const auto hidden = bf16_tensor(exp, "vision.vit_hidden" + s);  // [layers + 1][n][vd]
    const auto vit_out = bf16_tensor(exp, "vision.vit_out" + s);
    const auto aligned = bf16_tensor(exp, "vision.aligner_out" + s);
    auto stage = [&](int j) { return hidden.data() + size_t(j) * size_t(n * vd); };
    // Teacher-forced.
    const json& tf = tol.at("teacher_forced_max_abs");
    auto x0 = vit_patch_embed(w, c, pixels.data(), n, nullptr);
    EXPECT_LE(max_abs_diff(x0.data(), stage(0), x0.size()), tf.at("vit_hidden[0]").get<double>());
    const VisionRope rope = make_vision_rope(c, nh, nw);
    for (int j = 0; j < layers; ++j) {
      std::vector<uint16_t> x(stage(j), stage(j) + n * vd);
      vit_block(w.blocks[size_t(j)], c, rope, x.data(), n, nullptr);
      const double e = max_abs_diff(x.data(), stage(j + 1), x.size());
      EXPECT_LE(e, tf.at("vit_hidden[" + std::to_string(j + 1) + "]").get<double>()) << "block " << j;
      std::printf("image %zu block %d teacher-forced max abs %.6f\n", i, j, e);
    }
    auto out = vit_final_norm(w, c, stage(layers), n);
    EXPECT_LE(max_abs_diff(out.data(), vit_out.data(), out.size()), tf.at("vit_out").get<double>());
    auto al = aligner_forward(w, c, vit_out.data(), nh, nw, nullptr);
    ASSERT_EQ(al.size(), aligned.size());
    EXPECT_LE(max_abs_diff(al.data(), aligned.data(), al.size()), tf.at("aligner_out").get<double>());
    // End to end from the pixels.
    const json& ee = tol.at("end_to_end_max_abs");
    VitObserver obs = [&](int st, const uint16_t* x, int64_t rows) {
      const std::string key = st < 0 ? "vit_out" : "vit_hidden[" + std::to_string(st) + "]";
      const uint16_t* ref = st < 0 ? vit_out.data() : stage(st);
      const double e = max_abs_diff(x, ref, size_t(rows * vd));
      EXPECT_LE(e, ee.at(key).get<double>()) << key;
      std::printf("image %zu %s end-to-end max abs %.6f\n", i, key.c_str(), e);
    };
    auto full = encode_image_patches(w, c, pixels.data(), nh, nw, nullptr, &obs);
    const double e = max_abs_diff(full.data(), aligned.data(), full.size());
    EXPECT_LE(e, ee.at("aligner_out").get<double>());
    std::printf("image %zu aligner end-to-end max abs %.6f\n", i, e);
  }
}

// The aligner with identity projections: each output row is GELU of the unfolded cell, so the
// feature order (channel-major: ch * 9 + ky * 3 + kx), the cell order (reading order) and the
// zero padding at the bottom/right are visible directly.
TEST(VisionTower, AlignerUnfoldsChannelMajorCellsInReadingOrderWithZeroPadding) {
  ModelConfig c;
  c.vision_dim = 2;
  c.vision_downsample_ratio = 3;
  c.dim = 18;
  const int64_t nh = 4, nw = 5;  // padded to 6 x 6: 2 x 2 cells
  std::vector<uint16_t> eye(18 * 18, 0), zero(18, 0);
  for (int i = 0; i < 18; ++i) eye[size_t(i * 18 + i)] = f32_to_bf16(1.0f);
  VisionWeights w;
  w.aligner_w1 = w.aligner_w2 = eye.data();
  w.aligner_b1 = w.aligner_b2 = zero.data();
  std::vector<uint16_t> vit(size_t(nh * nw * 2));
  auto value = [](int64_t p, int64_t ch) { return float(p * 2 + ch + 1) / 16.0f; };  // exact in bf16
  for (int64_t p = 0; p < nh * nw; ++p)
    for (int64_t ch = 0; ch < 2; ++ch) vit[size_t(p * 2 + ch)] = f32_to_bf16(value(p, ch));
  const std::vector<uint16_t> out = aligner_forward(w, c, vit.data(), nh, nw, nullptr);
  ASSERT_EQ(out.size(), 4u * 18);
  auto gelu = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  for (int64_t cy = 0; cy < 2; ++cy)
    for (int64_t cx = 0; cx < 2; ++cx)
      for (int64_t ch = 0; ch < 2; ++ch)
        for (int64_t ky = 0; ky < 3; ++ky)
          for (int64_t kx = 0; kx < 3; ++kx) {
            const int64_t py = cy * 3 + ky, px = cx * 3 + kx;
            const double x = py < nh && px < nw ? value(py * nw + px, ch) : 0.0;
            const float got = bf16_to_f32(out[size_t((cy * 2 + cx) * 18 + ch * 9 + ky * 3 + kx)]);
            EXPECT_NEAR(got, gelu(x), std::abs(gelu(x)) / 128 + 1e-30)
                << "cell " << cy << "," << cx << " ch " << ch << " k " << ky << "," << kx;
          }
}

// Angles of the 2D RoPE: the first rope_dim/2 slots follow the patch row, the rest its column,
// with frequencies theta^(-2j / rope_dim) (closed form in double; fp32 table within 1e-6).
TEST(VisionTower, RopeAnglesAreRowsThenColumns) {
  ModelConfig c;
  c.vision_dim = 64;
  c.vision_n_heads = 4;  // head dim 16, rope_dim 8
  c.vision_rope_theta = 10000;
  const int64_t nh = 3, nw = 7;
  const VisionRope r = make_vision_rope(c, nh, nw);
  ASSERT_EQ(r.rope_dim, 8);
  for (int64_t y = 0; y < nh; ++y)
    for (int64_t x = 0; x < nw; ++x)
      for (int j = 0; j < 4; ++j) {
        const double f = std::pow(10000.0, -2.0 * j / 8.0);
        const size_t at = size_t((y * nw + x) * 8);
        EXPECT_NEAR(r.cos[at + size_t(j)], std::cos(double(y) * f), 1e-6);
        EXPECT_NEAR(r.sin[at + size_t(j)], std::sin(double(y) * f), 1e-6);
        EXPECT_NEAR(r.cos[at + 4 + size_t(j)], std::cos(double(x) * f), 1e-6);
        EXPECT_NEAR(r.sin[at + 4 + size_t(j)], std::sin(double(x) * f), 1e-6);
      }
}

TEST(VisionTower, ResultDoesNotDependOnTheThreadCount) {
  Golden g;
  if (!g.present()) GTEST_SKIP() << "golden vision-a not present";
  auto model = Model::load(g.dir + "/model");
  SafetensorsFile exp(g.dir + "/expected.safetensors");
  const auto pixels = bf16_tensor(exp, "vision.pixels.0");
  ThreadPool pool(3);
  const auto a = encode_image_patches(model->weights().vision, model->config(), pixels.data(), 5, 9, nullptr);
  const auto b = encode_image_patches(model->weights().vision, model->config(), pixels.data(), 5, 9, &pool);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace ds41
