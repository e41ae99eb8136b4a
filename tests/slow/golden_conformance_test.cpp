// Every golden case in ../shared/goldens (produced by the official reference) is read and run in
// the teacher-forced, pinned-decision and free-running modes. A case whose features this build lacks is
// reported as skipped with the reason; everything else must pass within the case's tolerances.
#include <gtest/gtest.h>

#include <filesystem>
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

// Beyond the tolerances: the engine reproduces the reference's arithmetic (dense linears as
// sequential fp32 sums, PyTorch's reduction order and vectorized exp in the hyper-connections), so
// in every mode (free running included: no decision differs) every block output, the logits, DSpark's draft logits and
// confidences and every vision stage are bit-identical to the golden tensors. Only the pre-mix
// coefficients may differ in the last bit (PyTorch's scalar tail path for the last values of a
// call, which the engine does not follow so that results never depend on call shapes).
bool must_be_bit_exact(const std::string& check) {
  return check.find("stream.layer") != std::string::npos || check == "logits" ||
         check.rfind("dspark draft_logits", 0) == 0 || check.rfind("dspark confidence", 0) == 0 ||
         check.rfind("vision ", 0) == 0;
}

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
  int exact_checks = 0;
  for (const auto& c : r.checks) {
    EXPECT_TRUE(c.pass) << name << " [" << mode << "] " << c.name << ": " << c.max_abs << " > " << c.tolerance << " "
                        << c.note;
    if (must_be_bit_exact(c.name)) {
      ++exact_checks;
      EXPECT_EQ(c.max_abs, 0.0) << name << " [" << mode << "] " << c.name << " is no longer bit-identical";
    }
  }
  EXPECT_GE(exact_checks, 17) << "the report no longer names its stream / logits checks as expected";
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
