// The ds41 command as a user runs it: exit codes, JSON output, error messages on stderr.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "kernels/simd_level.h"
#include "test_paths.h"
#include "test_tokenizer_files.h"
#include "../tiny_model.h"
#include "test_command.h"

namespace ds41 {
namespace {

using test::CommandResult;
using test::run_ds41;

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

// The kernel switches of the environment (DS41_SIMD, DS41_SUBNORMAL_INPUTS) with an unknown value
// stop a compute command with an error naming the variable and a non-zero exit, whatever level
// would have run.
TEST(Cli, UnknownKernelSwitchValuesAreErrors) {
  const std::string dir = test::tiny_model_dir(false);
  for (const std::string var : {"DS41_SIMD", "DS41_SUBNORMAL_INPUTS"}) {
    const std::string cmd = var + "=bogus " + test::ds41_binary() + " run -m " + dir + " --tokens 1,2 -n 1 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    std::array<char, 4096> buf;
    for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
    const int st = pclose(p);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << var << ": " << out;
    EXPECT_NE(out.find(var + "=bogus: unknown"), std::string::npos) << out;
  }
}

// `ds41 --help` lists every DS41_ environment variable the engine reads (found in the sources,
// so a new switch without a help line fails here) and every kernel level DS41_SIMD takes.
TEST(Cli, HelpListsEveryEnvironmentSwitch) {
  const auto help = run_ds41("--help");
  ASSERT_EQ(help.status, 0);
  std::set<std::string> names;
  const std::string marker = "getenv(\"DS41_";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(std::string(DS41_SOURCE_DIR) + "/src")) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
      const size_t begin = at + marker.size() - 5, end = text.find('"', begin);
      names.insert(text.substr(begin, end - begin));
    }
  }
  EXPECT_GE(names.size(), 5u);  // DS41_SIMD, DS41_SUBNORMAL_INPUTS, DS41_DECODE_COPIES, DS41_EXPERT_*
  for (const std::string& name : names) EXPECT_NE(help.out.find("  " + name + "="), std::string::npos) << name;
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx2Vnni, SimdLevel::Avx512,
                      SimdLevel::Avx512Vbmi, SimdLevel::Amx}) {
    ASSERT_EQ(parse_simd_level(simd_level_name(l)), l);
    EXPECT_NE(help.out.find(std::string(simd_level_name(l)) + "|"), std::string::npos) << simd_level_name(l);
  }
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

// --mem-budget: a budget too small is refused with the smallest that runs; at that budget the
// routed experts stream from disk (said on stderr) and the tokens are those of the in-RAM run,
// with --dspark too; a malformed size is a clear error.
TEST(Cli, MemoryBudgetStreamsExpertsWithTheSameTokens) {
  test::TempDir tmp;
  const std::string m = "-m " + tmp.path() + "/tiny --threads 2";
  ASSERT_EQ(run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/tiny --quiet --threads 2").status, 0);
  auto small = run_ds41("run " + m + " --tokens 1,2,3 --max-tokens 2 --mem-budget 2M");
  EXPECT_EQ(small.status, 1);
  const size_t at = small.err.find("give --mem-budget ");
  ASSERT_NE(at, std::string::npos) << small.err;
  const std::string minimum = small.err.substr(at + 18, small.err.find(' ', at + 18) - at - 18);
  for (const std::string extra : {"", " --dspark"}) {
    auto plain = run_ds41("run " + m + " --tokens 5,6,7,8,9 --max-tokens 12" + extra);
    auto streamed = run_ds41("run " + m + " --tokens 5,6,7,8,9 --max-tokens 12 --mem-budget " + minimum + extra);
    ASSERT_EQ(plain.status, 0) << plain.err;
    ASSERT_EQ(streamed.status, 0) << streamed.err;
    EXPECT_EQ(streamed.out, plain.out) << extra;
    EXPECT_NE(streamed.err.find("streamed from disk through"), std::string::npos) << streamed.err;
    EXPECT_NE(plain.err.find("the model's weights fit"), std::string::npos) << plain.err;
  }
  auto bad = run_ds41("run " + m + " --tokens 1 --max-tokens 1 --mem-budget 12Q");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--mem-budget 12Q: unknown unit"), std::string::npos) << bad.err;
}

// `run --image`: each image fills the next placeholder id (129264 in the tiny preset, as released):
// ids given with --tokens, or written by the prompt encoder for -p (a tokenizer that knows
// <｜deepseek_image｜>); bad images and unpaired placeholders are clear errors (chunked prefill
// with images: vision_forward_test.cpp).
TEST(Cli, RunTakesImagesForPlaceholderTokens) {
  test::TempDir tmp;
  const std::string images = std::string(DS41_SOURCE_DIR) + "/tests/data/vision/images/";
  const std::string m = "-m " + test::tiny_model_dir(true) + " --threads 2";
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
  EXPECT_GT(j["timing"]["vision_s"].get<double>(), 0.0);
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
  if (!test::have_shared()) return;
  // -p: the V3 tokenizer has no <｜deepseek_image｜> (a clear error); with that token added as
  // id 129264 (as in V4.1), the encoder's placeholder becomes the image's span.
  const std::string v3 = test::v3_tokenizer_path();
  auto no_token = run_ds41("run " + m + " --tokenizer " + v3 + " -p Describe --image " + images + "rgb_3x2.png --max-tokens 1");
  EXPECT_EQ(no_token.status, 1);
  EXPECT_NE(no_token.err.find("does not encode <｜deepseek_image｜>"), std::string::npos) << no_token.err;
  test::write_v3_tokenizer_with_image_token(tmp / "tok.json");
  auto p = run_ds41("run " + m + " --tokenizer " + tmp / "tok.json" + " -p Describe --image " + images +
                    "rgb_3x2.png --max-tokens 1 --json");
  ASSERT_EQ(p.status, 0) << p.err;
  auto pj = nlohmann::json::parse(p.out);
  ASSERT_EQ(pj["images"].size(), 1u);
  const int64_t start = pj["images"][0]["span_start"], len = pj["images"][0]["span_length"];
  EXPECT_EQ(len, 11 * 17 + 2);
  for (int64_t i = start; i < start + len; ++i) EXPECT_EQ(pj["prompt"][size_t(i)], 129264) << i;
  EXPECT_NE(pj["prompt"][size_t(start - 1)], 129264);
  EXPECT_NE(pj["prompt"][size_t(start + len)], 129264);
}

// Comma-separated ids of a deterministic prompt longer than the window.
std::string long_prompt(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string((int64_t(i) * 7919 + 13) % 129280);
  return s;
}

TEST(Cli, RunSavesExactAndCompactSessionsOfALongSequence) {
  const std::string m = "-m " + test::tiny_model_dir(true) + " --threads 2";
  test::TempDir tmp;
  const std::string prompt = long_prompt(150);
  auto e = run_ds41("run " + m + " --tokens " + prompt + " --max-tokens 2 --save-session " + tmp.path() + "/e --exact");
  ASSERT_EQ(e.status, 0) << e.err;
  auto c = run_ds41("run " + m + " --tokens " + prompt + " --max-tokens 2 --save-session " + tmp.path() + "/c");
  ASSERT_EQ(c.status, 0) << c.err;
  ASSERT_EQ(c.out, e.out);
  const std::string g = e.out.substr(0, e.out.find('\n'));
  // Exact: the continuation equals running the whole sequence at once.
  auto full = run_ds41("run " + m + " --tokens " + prompt + "," + g + ",7 --max-tokens 4");
  auto cont = run_ds41("run " + m + " --load-session " + tmp.path() + "/e --tokens 7 --max-tokens 4");
  ASSERT_EQ(cont.status, 0) << cont.err;
  EXPECT_EQ(cont.out, full.out);
  // Compact: restored by bounded replay (approximate beyond the window), and much smaller.
  auto approx = run_ds41("run " + m + " --load-session " + tmp.path() + "/c --tokens 7 --max-tokens 4 --json");
  ASSERT_EQ(approx.status, 0) << approx.err;
  EXPECT_EQ(nlohmann::json::parse(approx.out)["generated"].size(), 4u);
  EXPECT_LT(std::filesystem::file_size(tmp.path() + "/c") * 2, std::filesystem::file_size(tmp.path() + "/e"));
  auto bad = run_ds41("run " + m + " --tokens 1 --exact");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--save-session"), std::string::npos) << bad.err;
}

// With the default options a sequence's greedy tokens do not depend on how it was cut into
// calls: one prefill, a chunked prefill, and a saved session continued with the rest of the
// prompt (exact, and compact within the window, where the replay rebuilds the rings exactly) all
// generate the same tokens. The prompt (160 tokens) wraps the 128-slot window.
TEST(Cli, DefaultTokensDoNotDependOnHowTheSequenceWasCut) {
  const std::string m = "-m " + test::tiny_model_dir(false) + " --threads 2";
  test::TempDir tmp;
  auto ids = [](int from, int to) {  // ids of long_prompt(160)[from, to)
    std::string s;
    for (int i = from; i < to; ++i) s += (i > from ? "," : "") + std::to_string((int64_t(i) * 7919 + 13) % 129280);
    return s;
  };
  const std::string gen = " --max-tokens 24";
  auto one = run_ds41("run " + m + " --tokens " + ids(0, 160) + gen);
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_FALSE(one.out.empty());
  for (const char* chunk : {"1", "7", "64"}) {
    auto chunked = run_ds41("run " + m + " --tokens " + ids(0, 160) + gen + " --chunk " + chunk);
    ASSERT_EQ(chunked.status, 0) << chunked.err;
    EXPECT_EQ(chunked.out, one.out) << "--chunk " << chunk;
  }
  // Sessions: the first part of the prompt in one process, the rest (and the answer) in another.
  for (const auto& [cut, kind] : std::vector<std::pair<int, std::string>>{{100, " --exact"}, {150, " --exact"}, {90, ""}}) {
    const std::string file = tmp.path() + "/s" + std::to_string(cut) + (kind.empty() ? "c" : "e");
    auto first = run_ds41("run " + m + " --tokens " + ids(0, cut) + " --max-tokens 0 --save-session " + file + kind);
    ASSERT_EQ(first.status, 0) << first.err;
    auto rest = run_ds41("run " + m + " --load-session " + file + " --tokens " + ids(cut, 160) + gen);
    ASSERT_EQ(rest.status, 0) << rest.err;
    EXPECT_EQ(rest.out, one.out) << "session cut at " << cut << kind;
  }
  // The reference's decode-path reading stays available, and is a different reading.
  auto ref = run_ds41("run " + m + " --tokens " + ids(0, 160) + gen + " --reference-index-keys --json");
  ASSERT_EQ(ref.status, 0) << ref.err;
  EXPECT_EQ(nlohmann::json::parse(ref.out)["generated"].size(), 24u);
}

// What llama.cpp users type works, and what ds41 does not know is an error, never ignored: the
// model directory as a positional argument, -n / -t / -f FILE / -p - (standard input), unknown
// short options and stray arguments refused, --threads capped at the cores, --save-session
// checked before any generation, and --help naming the short spellings.
TEST(Cli, RunTakesTheSpellingsLlamaCppUsersType) {
  const std::string dir = test::tiny_model_dir(false);
  test::TempDir tmp;
  auto base = run_ds41("run --model " + dir + " --tokens 0,5,9 --max-tokens 3 --threads 2");
  ASSERT_EQ(base.status, 0) << base.err;
  auto positional = run_ds41("run " + dir + " --tokens 0,5,9 -n 3 -t 2");
  ASSERT_EQ(positional.status, 0) << positional.err;
  EXPECT_EQ(positional.out.substr(0, positional.out.find('\n')), base.out.substr(0, base.out.find('\n')));
  EXPECT_EQ(std::count(positional.out.begin(), positional.out.begin() + long(positional.out.find('\n')), ','), 2);

  for (const char* bad : {"-ngl 99", "-x", "-q 3", "--tokens 0,5 extra_argument", "--no-such-option"}) {
    auto r = run_ds41("run " + dir + " --tokens 0,5 -n 1 " + std::string(bad));
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_TRUE(r.err.find("unknown option") != std::string::npos || r.err.find("unexpected argument") != std::string::npos)
        << bad << ": " << r.err;
  }
  if (test::have_shared()) {
    const std::string tok = " --tokenizer " + test::v3_tokenizer_path();
    std::ofstream(tmp / "prompt.txt") << "Name three colours.\n";
    auto p = run_ds41("run " + dir + tok + " -p 'Name three colours.' -n 2 --json");
    auto f = run_ds41("run " + dir + tok + " -f " + tmp / "prompt.txt" + " -n 2 --json");
    auto in = run_ds41("run " + dir + tok + " -p - -n 2 --json < " + tmp / "prompt.txt");
    ASSERT_EQ(p.status, 0) << p.err;
    ASSERT_EQ(f.status, 0) << f.err;
    ASSERT_EQ(in.status, 0) << in.err;
    const auto prompt_of = [](const std::string& out) { return nlohmann::json::parse(out)["prompt"]; };
    EXPECT_EQ(prompt_of(f.out), prompt_of(p.out));  // the file's last newline is the line's end
    EXPECT_EQ(prompt_of(in.out), prompt_of(p.out));
  }
  auto many = run_ds41("run " + dir + " --tokens 0,5 -n 1 --threads 100000");
  EXPECT_EQ(many.status, 0) << many.err;
  EXPECT_NE(many.err.find("cores of this machine: using"), std::string::npos) << many.err;
  auto unwritable = run_ds41("run " + dir + " --tokens 0,5 -n 400 --save-session " + tmp / "no/such/dir/s");
  EXPECT_EQ(unwritable.status, 1);
  EXPECT_NE(unwritable.err.find("--save-session: cannot write"), std::string::npos) << unwritable.err;
  EXPECT_TRUE(unwritable.out.empty()) << "generated before failing: " << unwritable.out.substr(0, 100);
  auto help = run_ds41("run --help");
  EXPECT_NE(help.out.find("-m, --model DIR"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("-n, --max-tokens N"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("--m DIR"), std::string::npos);
  EXPECT_EQ(help.out.find("--p TEXT"), std::string::npos);
}

// Where stderr is a log, not a terminal, long work reports plain progress lines (a server under
// systemd used to log nothing until its banner), never a carriage return. (mkmodel reports through
// the same class; the tiny preset is below its 64 MiB reporting floor.)
TEST(Cli, ProgressInALogIsPlainLines) {
  auto r = run_ds41("run " + test::tiny_model_dir(false) + " --tokens 0,5 -n 1 --threads 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("loading: validating"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("loading: preparing"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
}

// --load-session without new tokens continues the saved answer (it used to append the demo's
// default prompt): a compact session's replay gives the next-token logits, so the continuation is
// the one-shot run's next tokens. An exact session has no logits: a clear error.
TEST(Cli, RunContinuesASessionWithNoNewTokens) {
  const std::string m = test::tiny_model_dir(false) + " --threads 2";
  test::TempDir tmp;
  auto first = run_ds41("run " + m + " --tokens 0,5,9,11 -n 3 --save-session " + tmp / "c.session");
  ASSERT_EQ(first.status, 0) << first.err;
  auto whole = run_ds41("run " + m + " --tokens 0,5,9,11 -n 7");
  ASSERT_EQ(whole.status, 0) << whole.err;
  auto cont = run_ds41("run " + m + " --load-session " + tmp / "c.session" + " -n 4");
  ASSERT_EQ(cont.status, 0) << cont.err;
  const std::string a = first.out.substr(0, first.out.find('\n')), b = cont.out.substr(0, cont.out.find('\n'));
  EXPECT_EQ(a + "," + b, whole.out.substr(0, whole.out.find('\n')));
  ASSERT_EQ(run_ds41("run " + m + " --tokens 0,5,9,11 -n 3 --exact --save-session " + tmp / "e.session").status, 0);
  auto exact = run_ds41("run " + m + " --load-session " + tmp / "e.session" + " -n 4");
  EXPECT_EQ(exact.status, 1);
  EXPECT_NE(exact.err.find("holds no next-token logits"), std::string::npos) << exact.err;
}

TEST(Cli, RunCedPrefillWithinTheWindowEqualsFull) {
  const std::string m = "-m " + test::tiny_model_dir(false) + " --threads 2 --max-tokens 3";
  const std::string prompt = long_prompt(100);
  auto full = run_ds41("run " + m + " --tokens " + prompt);
  auto ced = run_ds41("run " + m + " --tokens " + prompt + " --prefill ced");
  ASSERT_EQ(ced.status, 0) << ced.err;
  EXPECT_EQ(ced.out, full.out);
  auto bad = run_ds41("run " + m + " --tokens 1 --prefill fast");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("expected full or ced"), std::string::npos) << bad.err;
}

TEST(Cli, BenchPrefillComparesFullAndCed) {
  test::TempDir tmp;
  {
    std::ofstream f(tmp / "prompt.txt");
    f << long_prompt(150) << "\n";
  }
  auto r = run_ds41("bench-prefill -m " + test::tiny_model_dir(false) + " --lengths 100,150 --continuation 4 --threads 2 "
                    "--compare ced,replay --json --tokens-file " + tmp.path() + "/prompt.txt");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["decoder_start"], 4);
  // Within the window CED is the full prefill and a compact restore is exact: no divergence.
  const auto& within = j["results"][0];
  EXPECT_EQ(within["tokens"], 100);
  for (const char* what : {"ced", "replay"}) {
    EXPECT_EQ(within[what]["first_kl"], 0.0) << what;
    EXPECT_EQ(within[what]["forced_max_kl"], 0.0) << what;
    EXPECT_EQ(within[what]["greedy_equal"], 4) << what;
  }
  const auto& beyond = j["results"][1];
  for (const char* what : {"ced", "replay"}) {
    EXPECT_GT(beyond[what]["first_max_logit_diff"].get<double>(), 0.0) << what;
    EXPECT_GE(beyond[what]["forced_mean_kl"].get<double>(), 0.0) << what;
  }
  EXPECT_GT(beyond["ced"]["s"].get<double>(), 0.0);
  EXPECT_GT(beyond["replay"]["session_bytes"].get<int64_t>(), 0);
  auto bad = run_ds41("bench-prefill -m " + test::tiny_model_dir(false) + " --compare exact");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("expected ced and/or replay"), std::string::npos) << bad.err;
  // Lengths the model cannot hold, or more than the prompt file gives, are errors.
  auto big = run_ds41("bench-prefill -m " + test::tiny_model_dir(false) + " --lengths 5000 --json");
  EXPECT_EQ(big.status, 1);
  EXPECT_NE(big.err.find("max_seq_len"), std::string::npos) << big.err;
  auto short_file = run_ds41("bench-prefill -m " + test::tiny_model_dir(false) + " --lengths 200 --tokens-file " +
                             tmp.path() + "/prompt.txt");
  EXPECT_EQ(short_file.status, 1);
  EXPECT_NE(short_file.err.find("fewer than the longest length"), std::string::npos) << short_file.err;
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

TEST(Cli, TokenizeAndDetokenizeWithTheModelDirectory) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const std::string dir = test::shared_dir() + "/assets/deepseek_v3_tokenizer";
  // HF tokenizers: "Hello world" -> 19923, 2058; "<｜User｜>" is 128803.
  auto r = run_ds41("tokenize -m " + dir + " -p 'Hello world<｜User｜>' --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int>>(), (std::vector<int>{19923, 2058, 128803}));
  auto plain = run_ds41("tokenize --tokenizer " + dir + "/tokenizer.json -p 'Hello world<｜User｜>'");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.out, "19923,2058,128803\n");
  auto back = run_ds41("detokenize -m " + dir + " --tokens 19923,2058,128803 --json");
  ASSERT_EQ(back.status, 0) << back.err;
  EXPECT_EQ(nlohmann::json::parse(back.out)["text"], "Hello world<｜User｜>");
  auto skip = run_ds41("detokenize -m " + dir + " --tokens 0,19923,1 --skip-special");
  EXPECT_EQ(skip.out, "Hello\n");
  // --file, and the benchmark's JSON.
  test::TempDir tmp;
  std::ofstream(tmp / "text.txt") << "The quick brown fox. 敏捷的棕色狐狸。\n";
  auto file = run_ds41("tokenize -m " + dir + " --file " + tmp / "text.txt" + " --json");
  ASSERT_EQ(file.status, 0) << file.err;
  auto ids = nlohmann::json::parse(file.out)["ids"].get<std::vector<int>>();
  std::string csv;
  for (int id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
  auto text = run_ds41("detokenize -m " + dir + " --tokens " + csv);
  EXPECT_EQ(text.out, "The quick brown fox. 敏捷的棕色狐狸。\n\n");
  auto bench = run_ds41("tokenize -m " + dir + " --file " + tmp / "text.txt" + " --bench --json");
  ASSERT_EQ(bench.status, 0) << bench.err;
  EXPECT_EQ(nlohmann::json::parse(bench.out)["ids"], ids.size());
  EXPECT_GT(nlohmann::json::parse(bench.out)["cold_mb_per_s"].get<double>(), 0.0);
}

TEST(Cli, TokenizeErrorsNameTheMissingFile) {
  test::TempDir tmp;
  auto r = run_ds41("tokenize -m " + tmp.path() + " -p hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no tokenizer.json in " + tmp.path()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(tmp / "tokenizer.json"), std::string::npos) << r.err;
  auto f = run_ds41("detokenize --tokenizer " + tmp / "tok.json" + " --tokens 1");
  EXPECT_EQ(f.status, 1);
  EXPECT_NE(f.err.find(tmp / "tok.json"), std::string::npos) << f.err;
  auto none = run_ds41("tokenize -p hi");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.err.find("-m DIR"), std::string::npos) << none.err;
  if (!test::have_shared()) return;
  const std::string dir = test::shared_dir() + "/assets/deepseek_v3_tokenizer";
  auto bad_id = run_ds41("detokenize -m " + dir + " --tokens 5,128815");
  EXPECT_EQ(bad_id.status, 1);
  EXPECT_NE(bad_id.err.find("128815 is outside the vocabulary"), std::string::npos) << bad_id.err;
  std::ofstream(tmp / "bad.txt", std::ios::binary) << "ok\xff";
  auto bad_text = run_ds41("tokenize -m " + dir + " --file " + tmp / "bad.txt");
  EXPECT_EQ(bad_text.status, 1);
  EXPECT_NE(bad_text.err.find("not valid UTF-8"), std::string::npos) << bad_text.err;
}

TEST(Cli, RunTextPromptIsRepeatableAndPrintsTimings) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  test::TempDir tmp;
  ASSERT_EQ(run_ds41("mkmodel --preset tiny --out " + tmp.path() + "/m --tokenizer " + test::shared_dir() +
                     "/assets/deepseek_v3_tokenizer/tokenizer.json --quiet --threads 2")
                .status,
            0);
  const std::string cmd = "run -m " + tmp.path() + "/m -p Hello --max-tokens 20 --temp 0 --threads 2";
  auto a = run_ds41(cmd), b = run_ds41(cmd);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_FALSE(a.out.empty());
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("tok/s"), std::string::npos) << a.err;
  auto j = run_ds41(cmd + " --json");
  ASSERT_EQ(j.status, 0) << j.err;
  auto r = nlohmann::json::parse(j.out);
  if (r["finish_reason"] == "length") { EXPECT_EQ(r["generated"].size(), 20u); }
  EXPECT_EQ(r["content"].get<std::string>() + "\n", a.out);
  // Without a tokenizer the error names the file that is missing.
  auto none = run_ds41("run -m " + test::tiny_model_dir(false) + " -p Hello --max-tokens 2");
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.err.find("tokenizer.json"), std::string::npos) << none.err;
}

}  // namespace
}  // namespace ds41
