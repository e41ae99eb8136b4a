// Every golden case (produced by the official reference) in ../shared/goldens and
// ../shared/goldens-unseen is found by listing the folders, so a new case needs no code, and run in
// the teacher-forced, pinned-decision and free-running modes. A case whose features this build
// lacks is reported as skipped with the reason; everything else must pass, bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "devtools/conformance.h"
#include "test_paths.h"

namespace ds41 {
namespace {

// The folders that hold cases, relative to shared/.
const char* const kCaseFolders[] = {"goldens", "goldens-unseen"};

// "folder/case" of every case directory (one with a case.json), sorted.
std::vector<std::string> golden_cases() {
  std::vector<std::string> out;
  for (const char* folder : kCaseFolders) {
    const std::string root = test::shared_dir() + "/" + folder;
    if (!std::filesystem::is_directory(root)) continue;
    for (auto& e : std::filesystem::directory_iterator(root))
      if (e.is_directory() && std::filesystem::exists(e.path() / "case.json"))
        out.push_back(std::string(folder) + "/" + e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GoldenConformance, EveryCaseIsPresentAndReadable) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  auto cases = golden_cases();
  ASSERT_GE(cases.size(), 12u);
  for (const auto& c : cases) {
    std::ifstream in(test::shared_dir() + "/" + c + "/case.json");
    nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_TRUE(j.contains("prompt_tokens") && j.contains("forced_tokens") && j.contains("tolerance")) << c;
  }
}

// Beyond the tolerances: the engine reproduces the reference's arithmetic (dense linears as
// sequential fp32 sums, PyTorch's reduction order, its vectorized exp and log1p and their scalar
// tails, the attention list's blocks as the reference lays them out), so in every mode every
// block output and pre-mix, the logits, DSpark's draft logits and confidences and every vision
// stage are bit-identical to the golden tensors: teacher-forced and pinned over every call, free
// running up to the first exact tie it resolves otherwise. Exact ties are the reference's
// arbitrary picks (the goldens README): teacher forcing takes them from the golden.
bool must_be_bit_exact(const std::string& check) {
  return check.find("stream.layer") != std::string::npos || check.find("pre_mix.layer") != std::string::npos ||
         check == "logits" || check.rfind("dspark draft_logits", 0) == 0 || check.rfind("dspark confidence", 0) == 0 ||
         check.rfind("dspark main_hidden", 0) == 0 || check.rfind("vision ", 0) == 0;
}

class GoldenCase : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenCase, IsBitIdenticalToTheReference) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const auto& [name, mode] = GetParam();
  const std::string dir = test::shared_dir() + "/" + name;
  if (!std::filesystem::exists(dir + "/case.json")) GTEST_SKIP() << "case " << name << " not present";
  ThreadPool pool(2);
  ConformOptions opt;
  opt.mode = mode;
  ConformReport r = run_conformance(dir, opt, &pool);
  if (!r.ran) GTEST_SKIP() << r.summary();
  int exact_checks = 0;
  for (const auto& c : r.checks) {
    EXPECT_TRUE(c.pass) << name << " [" << mode << "] " << c.name << ": " << c.max_abs << " > " << c.tolerance << " "
                        << c.note;
    // Gated checks, and the pre-mixes everywhere (pinned mode reports them ungated: the case has
    // no end-to-end tolerance for them); not what free running reports past its cut.
    if (must_be_bit_exact(c.name) && (c.tolerance >= 0 || c.name.find("pre_mix") != std::string::npos)) {
      ++exact_checks;
      EXPECT_EQ(c.max_abs, 0.0) << name << " [" << mode << "] " << c.name << " is no longer bit-identical";
    }
  }
  EXPECT_GE(exact_checks, 33) << "the report no longer names its stream / pre-mix / logits checks as expected";
  EXPECT_GT(r.decisions_compared, 0);
  EXPECT_EQ(r.decisions_matched, r.decisions_compared);
  EXPECT_TRUE(r.pass) << r.summary();
  std::cout << r.summary() << "\n";
}

// The vision stages of vision-a (preprocessing from its PNGs, every ViT stage, the aligner, the
// merged embedding, ids / types / spans) are gated in every mode, whether or not the backbone part
// of the case is a known gap.
TEST(GoldenConformance, VisionStagesOfVisionAPassInEveryMode) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const std::string dir = test::shared_dir() + "/goldens/vision-a";
  if (!std::filesystem::exists(dir + "/case.json")) GTEST_SKIP() << "case vision-a not present";
  ThreadPool pool(2);
  for (const char* mode : {"teacher", "pinned", "free"}) {
    ConformOptions opt;
    opt.mode = mode;
    ConformReport r = run_conformance(dir, opt, &pool);
    ASSERT_TRUE(r.ran) << r.summary();
    int vision_checks = 0;
    for (const auto& c : r.checks) {
      if (c.name.rfind("vision ", 0) != 0) continue;
      ++vision_checks;
      EXPECT_TRUE(c.pass) << mode << " " << c.name << ": " << c.max_abs << " > " << c.tolerance;
    }
    EXPECT_GE(vision_checks, 17) << mode;
  }
}

std::vector<std::tuple<std::string, std::string>> all_case_modes() {
  std::vector<std::tuple<std::string, std::string>> v;
  auto cases = golden_cases();
  // Without the shared folder the test list still names the first cases (each then skips).
  if (cases.empty()) cases = {"goldens/backbone-a", "goldens/dspark-a", "goldens/engram-a", "goldens/vision-a"};
  for (const auto& c : cases)
    for (const char* m : {"teacher", "pinned", "free"}) v.emplace_back(c, m);
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllCases, GoldenCase, ::testing::ValuesIn(all_case_modes()),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& ch : s)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace ds41
