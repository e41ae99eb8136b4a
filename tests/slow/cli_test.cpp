// The ds41 command as a user runs it: exit codes, JSON output, error messages on stderr.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_paths.h"
#include "../tiny_model.h"

namespace ds41 {
namespace {

struct CommandResult {
  int status = -1;
  std::string out, err;
};

CommandResult run_ds41(const std::string& args) {
  test::TempDir tmp;
  const std::string err_file = tmp / "stderr";
  const std::string cmd = test::ds41_binary() + " " + args + " 2>" + err_file;
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err_file);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  return r;
}

TEST(Cli, InspectReleasedConfigReportsTheCensus) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  auto r = run_ds41("inspect --config " + test::shared_dir() + "/assets/config.json --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tensors"], 96085);
  EXPECT_EQ(j["dtype_counts"]["BF16"], 520);
  EXPECT_EQ(j["dtype_counts"]["F32"], 387);
  EXPECT_EQ(j["dtype_counts"]["F8_E4M3"], 357);
  EXPECT_EQ(j["dtype_counts"]["F8_E8M0"], 47589);
  EXPECT_EQ(j["dtype_counts"]["I8"], 47232);
  EXPECT_EQ(j["kv_bytes_per_token"], 890.0);
  EXPECT_EQ(j["layers"].size(), 43u);
  EXPECT_TRUE(j["errors"].empty());
  // The flat form gives the same answer.
  auto f = run_ds41("inspect --config " + test::shared_dir() + "/assets/inference_config.json --json");
  ASSERT_EQ(f.status, 0) << f.err;
  EXPECT_EQ(nlohmann::json::parse(f.out)["tensors"], 96085);
}

TEST(Cli, MkmodelTinyThenInspectValidatesClean) {
  test::TempDir tmp;
  auto m = run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/tiny --quiet --threads 2");
  ASSERT_EQ(m.status, 0) << m.err;
  auto r = run_ds41("inspect " + tmp.path() + "/tiny --json");
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["errors"].empty()) << j["errors"].dump();
  EXPECT_GT(j["tensors"].get<int>(), 800);
  // Human-readable form names the plan's modes.
  auto h = run_ds41("inspect " + tmp.path() + "/tiny");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("reindex"), std::string::npos);
  EXPECT_NE(h.out.find("validation: OK"), std::string::npos);
}

TEST(Cli, MkmodelIsDeterministicForASeed) {
  test::TempDir tmp;
  ASSERT_EQ(run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/a --seed 7 --quiet").status, 0);
  ASSERT_EQ(run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/b --seed 7 --quiet --threads 1").status, 0);
  ASSERT_EQ(run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/c --seed 8 --quiet").status, 0);
  int files = 0;
  bool any_differs_from_c = false;
  for (auto& e : std::filesystem::directory_iterator(tmp.path() + "/a")) {
    if (!e.is_regular_file()) continue;
    auto read = [](const std::string& p) {
      std::ifstream in(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string name = e.path().filename().string();
    const std::string a = read(e.path().string());
    EXPECT_EQ(a, read(tmp.path() + "/b/" + name)) << name;
    any_differs_from_c |= a != read(tmp.path() + "/c/" + name);
    ++files;
  }
  EXPECT_GE(files, 4);
  EXPECT_TRUE(any_differs_from_c);
}

TEST(Cli, EngramToolPrintsTheSpecRowIds) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  // spec engram_dspark_vision.md §A.6: compressed ids [5231, 887, 40211, 96, 7712, 330], pad 2.
  auto r = run_ds41("engram --config " + test::shared_dir() + "/assets/config.json --compressed-ids 5231,887,40211,96,7712,330 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["1"].size(), 6u);
  ASSERT_EQ(j["14"].size(), 6u);
  const std::vector<int64_t> l1p4 = {8264676, 16730195, 32156052, 60226870, 72547671, 87911952, 103704897, 123344130,
                                     134840050, 150641106, 169071798, 185892426, 205763263, 211119839, 239431612, 247221767,
                                     269445064, 273058720, 288485192, 313073981, 329790643, 339351431, 354783518, 371650938};
  const std::vector<int64_t> l14p0 = {3433227, 21826515, 47463766, 59443103, 73499425, 89026187, 111696466, 116375847,
                                      133271081, 144456954, 167545859, 190216405, 205909100, 213167225, 227255830, 253839647,
                                      262075331, 275474987, 297184019, 318083086, 326228440, 343900823, 356543967, 371923090};
  EXPECT_EQ(j["1"][4].get<std::vector<int64_t>>(), l1p4);
  EXPECT_EQ(j["14"][0].get<std::vector<int64_t>>(), l14p0);
  // -1 marks an image position: it and the n-grams reaching over it use the pad.
  auto img = run_ds41("engram --config " + test::shared_dir() + "/assets/config.json --compressed-ids 5231,-1,40211 --json");
  ASSERT_EQ(img.status, 0) << img.err;
  auto k = nlohmann::json::parse(img.out);
  EXPECT_NE(k["1"][2], j["1"][2]);
}

TEST(Cli, BadInputGivesAClearErrorAndNonZeroExit) {
  auto a = run_ds41("inspect /nonexistent/dir");
  EXPECT_NE(a.status, 0);
  auto b = run_ds41("mkmodel --preset huge --out /tmp/x");
  EXPECT_NE(b.status, 0);
  EXPECT_NE(b.err.find("unknown preset 'huge'"), std::string::npos) << b.err;
  auto c = run_ds41("run --tokens 1,x,3 --max-tokens 1 -m /nonexistent");
  EXPECT_NE(c.status, 0);
  auto d = run_ds41("inspect --bogus");
  EXPECT_NE(d.status, 0);
  EXPECT_NE(d.err.find("unknown option '--bogus'"), std::string::npos) << d.err;
  auto e = run_ds41("frobnicate");
  EXPECT_NE(e.status, 0);
  auto h = run_ds41("run --help");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("--threads"), std::string::npos);
}

TEST(Cli, CorruptCheckpointIsReportedByInspect) {
  test::TempDir tmp;
  ASSERT_EQ(run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/m --quiet").status, 0);
  // Truncate the second shard in its data area.
  const std::string shard = tmp.path() + "/m/model-00002-of-00003.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
  auto r = run_ds41("inspect " + tmp.path() + "/m --json");
  EXPECT_NE(r.status, 0);
  auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j["errors"].empty());
  EXPECT_NE(j["errors"][0].get<std::string>().find("model-00002-of-00003.safetensors"), std::string::npos) << j["errors"].dump();
}

TEST(Cli, RunSavesAndContinuesASession) {
  test::TempDir tmp;
  const std::string m = "-m " + tmp.path() + "/tiny --threads 2";
  ASSERT_EQ(run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/tiny --quiet --threads 2").status, 0);
  // Generate 3 tokens and save; the session then holds prompt + all 3 generated tokens.
  auto a = run_ds41("run " + m + " --tokens 1,2,3 --max-tokens 3 --save-session " + tmp.path() + "/s.session");
  ASSERT_EQ(a.status, 0) << a.err;
  std::string g = a.out.substr(0, a.out.find('\n'));
  // Continuing the session with one more token must equal running the whole sequence at once.
  auto full = run_ds41("run " + m + " --tokens 1,2,3," + g + ",7 --max-tokens 4");
  auto cont = run_ds41("run " + m + " --load-session " + tmp.path() + "/s.session --tokens 7 --max-tokens 4");
  ASSERT_EQ(full.status, 0) << full.err;
  ASSERT_EQ(cont.status, 0) << cont.err;
  EXPECT_EQ(cont.out, full.out);
  // A damaged session is a clear error, not a crash or a fresh sequence.
  std::filesystem::resize_file(tmp.path() + "/s.session", 100);
  auto bad = run_ds41("run " + m + " --load-session " + tmp.path() + "/s.session --tokens 7 --max-tokens 1");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("truncated"), std::string::npos) << bad.err;
}

// `run --image`: each image fills the next placeholder id (129264 in the tiny preset, as released);
// bad images and unpaired placeholders are clear errors (chunked prefill with images:
// vision_forward_test.cpp).
TEST(Cli, RunTakesImagesForPlaceholderTokens) {
  test::TempDir tmp;
  const std::string images = std::string(DS41_SOURCE_DIR) + "/tests/data/vision/images/";
  const std::string m = "-m " + tmp.path() + "/tiny --threads 2";
  ASSERT_EQ(run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/tiny --quiet --threads 2").status, 0);
  const std::string two = " --tokens 0,129264,5,129264,9 --image " + images + "rgb_3x2.png --image " + images +
                          "gray_57x43.jpg --max-tokens 2";
  auto a = run_ds41("run " + m + two + " --json");
  ASSERT_EQ(a.status, 0) << a.err;
  auto j = nlohmann::json::parse(a.out);
  ASSERT_EQ(j["images"].size(), 2u);
  // 3 x 2 is upscaled to the 295,936-pixel minimum: 666 x 444 -> 672 x 448, 11 x 16 tokens (spec §C.2).
  EXPECT_EQ(j["images"][0]["span_length"], 11 * 17 + 2);
  EXPECT_EQ(j["images"][0]["span_start"], 1);
  const int64_t len0 = j["images"][0]["span_length"], len1 = j["images"][1]["span_length"];
  EXPECT_EQ(j["prompt"].size(), size_t(3 + len0 + len1));
  // Errors: a damaged image, a missing file, placeholders and images that do not pair up.
  {
    std::ifstream in(images + "rgb_100x60.png", std::ios::binary);
    std::string bytes(std::istreambuf_iterator<char>(in), {});
    std::ofstream(tmp.path() + "/cut.png", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  auto bad = run_ds41("run " + m + " --tokens 0,129264 --image " + tmp.path() + "/cut.png --max-tokens 1");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("cut.png: not a valid PNG image"), std::string::npos) << bad.err;
  auto missing = run_ds41("run " + m + " --tokens 0,129264 --image " + tmp.path() + "/none.png --max-tokens 1");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("none.png: cannot open"), std::string::npos) << missing.err;
  auto unpaired = run_ds41("run " + m + " --tokens 0,5 --image " + images + "rgb_3x2.png --max-tokens 1");
  EXPECT_EQ(unpaired.status, 1);
  EXPECT_NE(unpaired.err.find("0 image placeholder tokens (id 129264) but 1 image"), std::string::npos) << unpaired.err;
}

TEST(Cli, EngramBenchReportsRowsPerTokenOfThePlan) {
  const ModelConfig c = test::tiny_config(true);
  auto r = run_ds41("engram -m " + test::tiny_model_dir(true) + " --bench --positions 8 --threads 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const int64_t rows = int64_t(c.engram_layer_ids.size()) * (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  EXPECT_EQ(j["rows_per_token"], rows);
  EXPECT_EQ(j["bytes_read_per_token"], rows * (c.engram_head_dim + c.engram_head_dim / 32));
  for (const char* k : {"hash_us_per_token", "gather_cold_us_per_token", "gather_warm_us_per_token",
                        "engram_step_us_per_token", "decode_step_us"})
    EXPECT_GT(j[k].get<double>(), 0.0) << k;
  // A model without Engram is a clear error.
  auto none = run_ds41("engram -m " + test::tiny_model_dir(false) + " --bench --positions 8");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.err.find("no Engram"), std::string::npos) << none.err;
}

}  // namespace
}  // namespace ds41
