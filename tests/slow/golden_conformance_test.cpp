// Every golden case in ../shared/goldens (produced by the official reference) is read and run in
// the teacher-forced and pinned-decision modes. A case whose features this build lacks is
// reported as skipped with the reason; everything else must pass within the case's tolerances.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/thread_pool.h"
#include "runtime/conformance.h"
#include "test_paths.h"

namespace ds41 {
namespace {

std::vector<std::string> golden_cases() {
  std::vector<std::string> out;
  const std::string root = test::shared_dir() + "/goldens";
  if (!std::filesystem::is_directory(root)) return out;
  for (auto& e : std::filesystem::directory_iterator(root))
    if (e.is_directory() && std::filesystem::exists(e.path() / "case.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GoldenConformance, EveryCaseIsPresentAndReadable) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  auto cases = golden_cases();
  ASSERT_GE(cases.size(), 4u);
  for (const auto& c : cases) {
    std::ifstream in(test::shared_dir() + "/goldens/" + c + "/case.json");
    nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_TRUE(j.contains("prompt_tokens") && j.contains("forced_tokens") && j.contains("tolerance")) << c;
  }
}

// Cases that run but do not yet pass, each with the open issue it belongs to. A listed case is
// still run and its report printed; the test fails if a listed case starts passing (so the list
// cannot go stale) and is skipped otherwise.
const std::map<std::pair<std::string, std::string>, std::string> kKnownGaps = {
    {{"engram-a", "pinned"},
     "issue #4 (open): end to end, one-ulp differences (decode row 15 of layer 0, prefill row 11 of layer 4, both "
     "present in teacher mode too) flip FP8 codes and grow to 0.6 at layer 7 vs tolerance 0.13; teacher mode passes"},
    {{"vision-a", "pinned"},
     "backbone, same kind as engram-a: every vision stage is bit-exact end to end (pixels, ViT blocks, aligner, "
     "merged embedding), but the backbone's one-ulp differences of teacher mode (prefill row 30 of layer 0, rows 6, "
     "12, 20, 23, 39 of layer 1) re-round FP8 codes in layer 2's compressed KV: prefill stream 0.20 at layer 2 vs "
     "tolerance 0.076 (rows 30+), 0.27 / 0.47 at layers 3 / 4; decode streams and all decisions pass"},
};

class GoldenCase : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenCase, PassesWithinTheCaseTolerances) {
  if (!test::have_shared()) GTEST_SKIP() << "shared assets not found";
  const auto& [name, mode] = GetParam();
  const std::string dir = test::shared_dir() + "/goldens/" + name;
  if (!std::filesystem::exists(dir + "/case.json")) GTEST_SKIP() << "case " << name << " not present";
  ThreadPool pool(2);
  ConformOptions opt;
  opt.mode = mode;
  ConformReport r = run_conformance(dir, opt, &pool);
  if (!r.ran) GTEST_SKIP() << r.summary();
  if (auto gap = kKnownGaps.find({name, mode}); gap != kKnownGaps.end()) {
    EXPECT_FALSE(r.pass) << name << " [" << mode << "] passes now: remove it from kKnownGaps";
    if (!r.pass) GTEST_SKIP() << "known gap: " << gap->second << "\n" << r.summary();
    return;
  }
  for (const auto& c : r.checks)
    EXPECT_TRUE(c.pass) << name << " [" << mode << "] " << c.name << ": " << c.max_abs << " > " << c.tolerance << " "
                        << c.note;
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
  if (cases.empty()) cases = {"backbone-a", "dspark-a", "engram-a", "vision-a"};
  for (const auto& c : cases)
    for (const char* m : {"teacher", "pinned"}) v.emplace_back(c, m);
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
