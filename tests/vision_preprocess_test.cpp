// Image decoding and preprocessing against Pillow 9.4.0 (the reference's version): the data in
// tests/data/vision comes from tools/make_vision_reference.py (see there). Everything is exact:
// decoded RGB bytes, the resize plan, the letterboxed uint8 image, the bf16 normalisation; and the
// golden vision-a's preprocessed ViT inputs. Bad files must give clear errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/hash.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "vision/image_decode.h"
#include "vision/image_grid.h"
#include "vision/image_preprocess.h"
#include "vision/pillow_resize.h"
#include "test_paths.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

const std::string kDataDir = std::string(DS41_SOURCE_DIR) + "/tests/data/vision";

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string fnv_hex(const std::vector<uint8_t>& bytes) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a64(bytes.data(), bytes.size())));
  return buf;
}

const json& manifest() {
  static const json j = [] {
    std::ifstream in(kDataDir + "/preprocess_reference.json");
    return json::parse(in);
  }();
  return j;
}

ModelConfig vision_config(const json& cfg) {
  ModelConfig c;
  c.vision_n_layers = 1;
  c.vision_patch_size = manifest().at("patch").get<int>();
  c.vision_downsample_ratio = manifest().at("downsample").get<int>();
  c.vision_min_pixels = cfg.at("min_pixels").get<int64_t>();
  c.vision_max_n_token = cfg.at("max_n_token").get<int>();
  if (!cfg.at("max_wh_ratio").is_null()) c.vision_max_wh_ratio = cfg.at("max_wh_ratio").get<double>();
  return c;
}

std::string tensor_key(const std::string& file) {
  std::string k = std::filesystem::path(file).filename().string();
  for (char& ch : k)
    if (ch == '.') ch = '_';
  return k;
}

// Exact comparison with the first differing byte located.
void expect_same_pixels(const RgbImage& got, const TensorInfo& want, const std::string& what) {
  ASSERT_EQ(want.shape.size(), 3u) << what;
  ASSERT_EQ(got.height, want.shape[0]) << what;
  ASSERT_EQ(got.width, want.shape[1]) << what;
  ASSERT_EQ(got.rgb.size(), want.nbytes) << what;
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < got.rgb.size(); ++i)
    if (got.rgb[i] != want.data[i] && mismatches++ == 0) first = i;
  EXPECT_EQ(mismatches, 0u) << what << ": first difference at y " << first / 3 / size_t(got.width) << " x "
                            << first / 3 % size_t(got.width) << " channel " << first % 3 << ": "
                            << int(got.rgb[first]) << " vs " << int(want.data[first]);
}

TEST(VisionDecode, EveryTestImageDecodesExactlyAsPillow) {
  SafetensorsFile tensors(kDataDir + "/preprocess_reference.safetensors");
  int full = 0;
  ASSERT_GE(manifest().at("images").size(), 25u);
  for (const json& im : manifest().at("images")) {
    const std::string file = im.at("file");
    SCOPED_TRACE(file);
    const RgbImage img = read_image_file(kDataDir + "/" + file);
    EXPECT_EQ(img.width, im.at("width").get<int64_t>());
    EXPECT_EQ(img.height, im.at("height").get<int64_t>());
    EXPECT_EQ(fnv_hex(img.rgb), im.at("decoded_fnv1a64").get<std::string>()) << im.at("what");
    if (const TensorInfo* t = tensors.find("decoded." + tensor_key(file))) {
      expect_same_pixels(img, *t, file);
      ++full;
    }
  }
  EXPECT_GE(full, 15);
}

TEST(VisionPreprocess, PlanAndLetterboxMatchPillowForEveryImageAndConfig) {
  SafetensorsFile tensors(kDataDir + "/preprocess_reference.safetensors");
  int checked = 0, full = 0;
  for (const json& im : manifest().at("images")) {
    const std::string file = im.at("file");
    const RgbImage img = read_image_file(kDataDir + "/" + file);
    for (const auto& [name, cfg] : manifest().at("configs").items()) {
      SCOPED_TRACE(file + " config " + name);
      const ModelConfig c = vision_config(cfg);
      const json& want = im.at("configs").at(name);
      const ImageGrid g = plan_image_grid(img.width, img.height, c);
      EXPECT_EQ(g.best_width, want.at("best_width").get<int64_t>());
      EXPECT_EQ(g.best_height, want.at("best_height").get<int64_t>());
      EXPECT_EQ(g.n_vit_h, want.at("n_vit_h").get<int64_t>());
      EXPECT_EQ(g.n_vit_w, want.at("n_vit_w").get<int64_t>());
      EXPECT_EQ(g.n_llm_h, want.at("n_llm_h").get<int64_t>());
      EXPECT_EQ(g.n_llm_w, want.at("n_llm_w").get<int64_t>());
      EXPECT_LE(g.span_length(), c.vision_max_n_token);
      const RgbImage sized = resize_for_grid(img, g);
      EXPECT_EQ(fnv_hex(sized.rgb), want.at("letterbox_fnv1a64").get<std::string>());
      if (const TensorInfo* t = tensors.find("letterbox." + tensor_key(file) + "." + name)) {
        expect_same_pixels(sized, *t, file + " letterbox " + name);
        ++full;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 100);
  EXPECT_GE(full, 4);
}

TEST(VisionPreprocess, PlansOfManySizesMatchTheReferenceArithmetic) {
  const json& configs = manifest().at("configs");
  std::vector<ModelConfig> cs;
  for (const auto& [name, cfg] : configs.items()) cs.push_back(vision_config(cfg));  // JSON keys sorted: A B C R
  int n = 0;
  for (const json& row : manifest().at("plans")) {
    const int64_t w = row[0], h = row[1];
    for (size_t k = 0; k < cs.size(); ++k) {
      const ImageGrid g = plan_image_grid(w, h, cs[k]);
      const size_t o = 2 + 4 * k;
      EXPECT_EQ(g.best_width, row[o].get<int64_t>()) << w << "x" << h << " config " << k;
      EXPECT_EQ(g.best_height, row[o + 1].get<int64_t>()) << w << "x" << h << " config " << k;
      EXPECT_EQ(g.n_llm_h, row[o + 2].get<int64_t>()) << w << "x" << h << " config " << k;
      EXPECT_EQ(g.n_llm_w, row[o + 3].get<int64_t>()) << w << "x" << h << " config " << k;
      ++n;
    }
  }
  EXPECT_GE(n, 1500);
}

// The worked examples of spec §C.2 (released geometry), recomputed there independently.
TEST(VisionPreprocess, SpecWorkedExamplesOfTheResizePlan) {
  ModelConfig c;  // the defaults are the released vision geometry
  c.vision_n_layers = 32;
  struct Case {
    int64_t w, h, bw, bh, vh, vw, lh, lw, tokens;
  };
  const Case cases[] = {
      {640, 480, 644, 490, 35, 46, 12, 16, 206},  {300, 200, 672, 448, 32, 48, 11, 16, 189},
      {1344, 1344, 1302, 1302, 93, 93, 31, 31, 994}, {4000, 3000, 1512, 1134, 81, 108, 27, 36, 1001},
      {1, 1, 546, 546, 39, 39, 13, 13, 184},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(std::to_string(k.w) + "x" + std::to_string(k.h));
    const ImageGrid g = plan_image_grid(k.w, k.h, c);
    EXPECT_EQ(g.best_width, k.bw);
    EXPECT_EQ(g.best_height, k.bh);
    EXPECT_EQ(g.n_vit_h, k.vh);
    EXPECT_EQ(g.n_vit_w, k.vw);
    EXPECT_EQ(g.n_llm_h, k.lh);
    EXPECT_EQ(g.n_llm_w, k.lw);
    EXPECT_EQ(g.span_length(), k.tokens);
  }
  // Note (a): the limiting side is an exact integer in real arithmetic; double lands one short.
  const ImageGrid edge = plan_image_grid(1151, 2302, c);
  EXPECT_EQ(edge.n_vit_w, 65);
  EXPECT_EQ(edge.n_vit_h, 131);
}

TEST(VisionPreprocess, NormalisationTableIsTheReferenceFp32ArithmeticRoundedToBf16) {
  const json& lut = manifest().at("normalized_bf16");
  ASSERT_EQ(lut.size(), 256u);
  for (int v = 0; v < 256; ++v) EXPECT_EQ(normalized_pixel_bf16(uint8_t(v)), lut[size_t(v)].get<int>()) << v;
  EXPECT_EQ(normalized_pixel_bf16(0), 0xbf80);    // -1
  EXPECT_EQ(normalized_pixel_bf16(255), 0x3f80);  // +1
}

TEST(VisionPreprocess, BicubicKernelIsPillowsCatmullRomVariant) {
  EXPECT_EQ(pillow_bicubic_kernel(0.0), 1.0);
  EXPECT_EQ(pillow_bicubic_kernel(1.0), 0.0);
  EXPECT_EQ(pillow_bicubic_kernel(2.0), 0.0);
  EXPECT_EQ(pillow_bicubic_kernel(0.5), 0.5625);
  EXPECT_EQ(pillow_bicubic_kernel(-1.5), -0.0625);
  EXPECT_EQ(pillow_bicubic_kernel(3.0), 0.0);
}

TEST(VisionPreprocess, UnchangedSizeIsACopyAndPatchOrderIsChannelRowColumn) {
  RgbImage img;
  img.width = 28;
  img.height = 14;
  img.rgb.resize(28 * 14 * 3);
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = uint8_t(i * 7 % 251);
  EXPECT_EQ(pillow_resize_bicubic(img, 28, 14).rgb, img.rgb);
  ImageGrid g;
  g.best_width = 28;
  g.best_height = 14;
  g.n_vit_h = 1;
  g.n_vit_w = 2;
  const std::vector<uint16_t> p = patchify(img, g, 14);
  ASSERT_EQ(p.size(), 2u * 588);
  // patch 1, channel 2, row 3, column 5 = pixel (x 14 + 5, y 3), channel 2
  EXPECT_EQ(p[588 + 2 * 196 + 3 * 14 + 5], normalized_pixel_bf16(img.rgb[(3 * 28 + 19) * 3 + 2]));
}

// The golden case's ViT inputs, from its PNGs through the engine's whole preprocessing path.
TEST(VisionPreprocess, GoldenVisionAPixelsAreExact) {
  const std::string dir = test::shared_dir() + "/goldens/vision-a";
  if (!std::filesystem::exists(dir + "/case.json")) GTEST_SKIP() << "golden vision-a not present";
  std::ifstream in(dir + "/case.json");
  const json cj = json::parse(in);
  const ModelConfig c = load_model_dir_config(dir + "/model");
  SafetensorsFile exp(dir + "/expected.safetensors");
  const json& images = cj.at("vision").at("images");
  for (size_t i = 0; i < images.size(); ++i) {
    SCOPED_TRACE("image " + std::to_string(i));
    const RgbImage img = read_image_file(dir + "/" + images[i].at("file").get<std::string>());
    const PreparedImage p = prepare_image(img, c);
    EXPECT_EQ(p.grid.n_vit_h, images[i].at("n_vit_h").get<int64_t>());
    EXPECT_EQ(p.grid.n_vit_w, images[i].at("n_vit_w").get<int64_t>());
    EXPECT_EQ(p.grid.n_llm_h, images[i].at("n_llm_h").get<int64_t>());
    EXPECT_EQ(p.grid.n_llm_w, images[i].at("n_llm_w").get<int64_t>());
    EXPECT_EQ(p.grid.span_length(), images[i].at("span_length").get<int64_t>());
    const TensorInfo* t = exp.find("vision.pixels." + std::to_string(i));
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->nbytes, p.patches.size() * 2);
    size_t mismatches = 0;
    for (size_t k = 0; k < p.patches.size(); ++k) {
      uint16_t v;
      std::memcpy(&v, t->data + 2 * k, 2);
      mismatches += v != p.patches[k];
    }
    EXPECT_EQ(mismatches, 0u);
  }
}

// ---- bad input ---------------------------------------------------------------------------------

std::vector<uint8_t> test_image(const std::string& name) { return read_file(kDataDir + "/images/" + name); }

std::string decode_error(const std::vector<uint8_t>& bytes, int64_t max_pixels = kMaxImagePixels) {
  return error_of([&] { decode_image(bytes.data(), bytes.size(), "test image", max_pixels); });
}

TEST(VisionDecode, EmptyUnknownAndUnsupportedFormatsAreClearErrors) {
  EXPECT_NE(decode_error({}).find("empty"), std::string::npos);
  const std::string gif = "GIF89a\x01\x00\x01\x00";
  EXPECT_NE(decode_error(std::vector<uint8_t>(gif.begin(), gif.end())).find("GIF is not a supported image"),
            std::string::npos);
  const std::string text = "hello, world";
  EXPECT_NE(decode_error(std::vector<uint8_t>(text.begin(), text.end())).find("unrecognised format"), std::string::npos);
  EXPECT_NE(error_of([] { read_image_file(kDataDir + "/no-such-file.png"); }).find("cannot open"), std::string::npos);
}

TEST(VisionDecode, TruncatedFilesOfEveryFormatAreRejected) {
  for (const char* name : {"rgb_100x60.png", "interlaced_rgb_31x27.png", "photo_444_90x70.jpg", "progressive_120x90.jpg",
                           "cmyk_48x40.jpg", "lossy_120x80.webp", "lossless_rgba_70x50.webp"}) {
    SCOPED_TRACE(name);
    std::vector<uint8_t> b = test_image(name);
    ASSERT_FALSE(b.empty());
    for (double frac : {0.5, 0.9}) {
      std::vector<uint8_t> cut(b.begin(), b.begin() + long(double(b.size()) * frac));
      const std::string e = decode_error(cut);
      EXPECT_NE(e.find("test image: "), std::string::npos) << e;
      EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("not a valid") != std::string::npos) << e;
    }
  }
}

TEST(VisionDecode, CorruptDataIsRejected) {
  // A PNG whose image data was overwritten (CRC and zlib checks catch it).
  std::vector<uint8_t> png = test_image("rgb_100x60.png");
  for (size_t i = 100; i < 200; ++i) png[i] ^= 0x5a;
  EXPECT_NE(decode_error(png).find("not a valid PNG image"), std::string::npos);
  // A JPEG whose header was damaged.
  std::vector<uint8_t> jpg = test_image("photo_444_90x70.jpg");
  for (size_t i = 2; i < 40; ++i) jpg[i] = 0xff;
  EXPECT_NE(decode_error(jpg).find("not a valid JPEG image"), std::string::npos);
  // A lossy WebP whose VP8 start code was damaged (its entropy-coded data would decode to
  // something whatever its bytes, as in Pillow).
  std::vector<uint8_t> webp = test_image("lossy_120x80.webp");
  ASSERT_EQ(std::memcmp(webp.data() + 12, "VP8 ", 4), 0);
  for (size_t i = 23; i < 26; ++i) webp[i] = 0;
  EXPECT_NE(decode_error(webp).find("not a valid WebP image"), std::string::npos);
}

// Sizes are refused from the header: a PNG claiming 40000 x 40000 pixels fails at once.
TEST(VisionDecode, DecompressionBombsAreRefusedBeforeDecoding) {
  std::vector<uint8_t> png = test_image("rgb_3x2.png");
  auto put_be32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + size_t(i)] = uint8_t(v >> (24 - 8 * i));
  };
  put_be32(16, 40000);  // IHDR width
  put_be32(20, 40000);  // IHDR height
  const uint32_t crc = [&] {  // IHDR CRC over type + data (bytes 12..28)
    uint32_t c = 0xffffffffu;
    for (size_t i = 12; i < 29; ++i) {
      c ^= png[i];
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
  }();
  put_be32(29, crc);
  const std::string e = decode_error(png);
  EXPECT_NE(e.find("40000 x 40000 pixels, more than the limit of 178956970"), std::string::npos) << e;
  // A lower limit applies the same way to every format.
  EXPECT_NE(decode_error(test_image("photo_444_90x70.jpg"), 1000).find("more than the limit of 1000"), std::string::npos);
  EXPECT_NE(decode_error(test_image("lossy_120x80.webp"), 1000).find("more than the limit of 1000"), std::string::npos);
  // Zero width in the header.
  put_be32(16, 0);
  EXPECT_NE(decode_error(png).find("test image: "), std::string::npos);
}

TEST(VisionPreprocess, DegenerateAspectRatiosAreClearErrors) {
  ModelConfig c;
  c.vision_n_layers = 1;
  // 1 x 100000: the plan is a 42 x 21462 column, but the letterbox width rounds to 0 pixels
  // (Pillow raises there too).
  RgbImage thin;
  thin.width = 1;
  thin.height = 100000;
  thin.rgb.assign(size_t(3 * 100000), 9);
  const ImageGrid g = plan_image_grid(thin.width, thin.height, c);
  EXPECT_EQ(g.best_width, 42);
  EXPECT_NE(error_of([&] { resize_for_grid(thin, g); }).find("aspect ratio is too extreme"), std::string::npos);
}

}  // namespace
}  // namespace ds41
