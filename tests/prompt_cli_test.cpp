// `ds41 prompt` as a user runs it: the golden prompt texts, options overriding the file, errors.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "test_paths.h"
#include "test_command.h"

namespace ds41 {
namespace {

using test::CommandResult;
using test::run_ds41;

std::string data(const std::string& leaf) { return std::string(DS41_SOURCE_DIR) + "/tests/data/prompt_encoding/" + leaf; }
std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(PromptCli, PrintsTheGoldenPrompt) {
  auto r = run_ds41("prompt --messages " + data("01_tool_call_round_trip.json"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, read(data("01_tool_call_round_trip.txt")) + "\n");
  r = run_ds41("prompt --messages " + data("06_images.json") + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::ordered_json::parse(r.out);
  EXPECT_EQ(j["prompt"], read(data("06_images.txt")));
  EXPECT_EQ(j["images"], nlohmann::ordered_json::parse(read(data("06_images.images.json"))));
}

TEST(PromptCli, OptionsOverrideTheFile) {
  // 02 is a thinking-mode case; --no-think renders it in chat mode, --effort replaces 75.
  auto chat = run_ds41("prompt --messages " + data("02_multi_turn_drop_thinking.json") + " --no-think --json");
  ASSERT_EQ(chat.status, 0) << chat.err;
  const std::string p = nlohmann::json::parse(chat.out)["prompt"];
  EXPECT_EQ(p.find("Reasoning Effort"), std::string::npos);
  auto effort = run_ds41("prompt --messages " + data("02_multi_turn_drop_thinking.json") + " --effort max --keep-thinking");
  ASSERT_EQ(effort.status, 0) << effort.err;
  EXPECT_NE(effort.out.find("Reasoning Effort: 100 "), std::string::npos);
  EXPECT_NE(effort.out.find("<think>The user said hello"), std::string::npos);  // earlier reasoning kept
}

TEST(PromptCli, ErrorsGoToStderr) {
  test::TempDir tmp;
  const std::pair<std::string, std::string> cases[] = {
      {"prompt", "give --messages"},
      {"prompt --messages " + tmp.path() + "/missing.json", "cannot open"},
      {"prompt --messages " + data("01_tool_call_round_trip.json") + " --effort 0", "reasoning effort"},
      {"prompt --messages " + data("01_tool_call_round_trip.json") + " --think --no-think", "exclude"},
      {"prompt --messages " + data("01_tool_call_round_trip.txt"), "not valid JSON"},
      {"prompt --messages " + data("01_tool_call_round_trip.json") + " -m " + tmp.path() + "/nope", "no such model directory"},
  };
  for (const auto& [args, needle] : cases) {
    auto r = run_ds41(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_TRUE(r.out.empty()) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << " -> " << r.err;
  }
  std::ofstream(tmp / "bad.json") << R"([{"role":"robot","content":"x"}])";
  auto r = run_ds41("prompt --messages " + (tmp / "bad.json"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("unknown role 'robot'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ds41
