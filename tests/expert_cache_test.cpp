// Routed experts streamed from disk (model/expert_cache.h): a model whose experts go through a
// cache of a few slots gives the all-in-RAM model's outputs bit for bit - prefill, chunked
// prefill, decode, batched decode steps and DSpark drafts - whatever the slot count (one slot:
// every expert its own wave and read again and again); a budget too small is refused at load
// with the smallest one that runs, and that one runs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/expert_cache.h"
#include "model/model.h"
#include "state_compare.h"
#include "model_transcript.h"
#include "tiny_model.h"

namespace ds41 {
namespace {

using test::tokens_for;
using test::transcript;

TEST(ExpertCache, StreamedExpertsGiveTheInRamOutputsBitForBit) {
  ThreadPool pool(2);
  const std::string dir = test::tiny_model_dir(true);
  auto in_ram = Model::load(dir);
  ASSERT_FALSE(in_ram->memory_plan().stream_experts);
  ASSERT_EQ(in_ram->weights().expert_cache, nullptr);
  const auto want = transcript(*in_ram, &pool);
  for (const int64_t slots : {int64_t{1}, int64_t{3}, int64_t{20}, int64_t{-3}}) {  // -3: 3, least recent first
    Model::LoadOptions opt;
    opt.expert_slots = std::abs(slots);
    opt.io_threads = 3;
    auto streamed = Model::load(dir, {}, opt);
    if (slots < 0) streamed->weights().expert_cache->policy = ExpertCache::Policy::LeastRecent;
    ASSERT_TRUE(streamed->memory_plan().stream_experts);
    ASSERT_NE(streamed->weights().expert_cache, nullptr);
    EXPECT_EQ(streamed->weights().expert_cache->slots(), std::abs(slots));
    const auto got = transcript(*streamed, &pool);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(test::same_bits(got[i], want[i])) << "slots " << slots << " output " << i;
    const ExpertCacheStats st = streamed->weights().expert_cache->stats();
    EXPECT_GT(st.requests, 0);
    EXPECT_GT(st.reads, 0);
    EXPECT_EQ(st.requests, st.hits + st.reads);
    EXPECT_GE(st.bytes_read, st.reads * 4096);
    if (slots == 1) EXPECT_LT(st.hit_rate(), 0.9);
  }
}

TEST(ExpertCache, TooSmallABudgetIsRefusedWithTheSmallestThatRuns) {
  const std::string dir = test::tiny_model_dir(true);
  Model::LoadOptions opt;
  opt.mem_budget = int64_t(2) << 20;
  std::string message;
  try {
    Model::load(dir, {}, opt);
  } catch (const Error& e) {
    message = e.what();
  }
  ASSERT_NE(message.find("is too small for this model"), std::string::npos) << message;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(message, m, std::regex("\\(([0-9]+) bytes:"))) << message;
  const int64_t minimum = std::stoll(m[1].str());
  EXPECT_NE(message.find("--mem-budget"), std::string::npos);
  // That budget runs, streaming the experts through as many slots as a token's experts of a layer.
  opt.mem_budget = minimum;
  auto model = Model::load(dir, {}, opt);
  const MemoryPlan& plan = model->memory_plan();
  EXPECT_TRUE(plan.stream_experts);
  EXPECT_EQ(plan.minimum_budget, minimum);
  EXPECT_EQ(plan.slots, 2);  // the tiny preset's 2 active experts (its DSpark stages' too)
  EXPECT_NE(plan.summary().find("streamed from disk through 2 slots"), std::string::npos) << plan.summary();
  ThreadPool pool(2);
  SequenceState s = model->new_sequence();
  EXPECT_EQ(model->forward(s, {1, 2, 3}, {}, &pool).size(), size_t(model->config().vocab_size));
  // A budget that holds everything streams nothing.
  opt.mem_budget = int64_t(64) << 30;
  EXPECT_FALSE(Model::load(dir, {}, opt)->memory_plan().stream_experts);
}

TEST(ExpertCache, MemorySizesParseWithUnitsAndRejectNonsense) {
  EXPECT_EQ(parse_memory_size("24"), int64_t(24) << 30);
  EXPECT_EQ(parse_memory_size("1.5"), int64_t(3) << 29);
  EXPECT_EQ(parse_memory_size("512M"), int64_t(512) << 20);
  EXPECT_EQ(parse_memory_size("2G"), int64_t(2) << 30);
  EXPECT_EQ(parse_memory_size("2GiB"), int64_t(2) << 30);
  EXPECT_EQ(parse_memory_size("1T"), int64_t(1) << 40);
  EXPECT_EQ(parse_memory_size("2048K"), int64_t(2) << 20);
  for (const char* bad : {"", "x", "-1", "0", "12Q", "100K", "nan", "inf", "1e30T"}) EXPECT_THROW(parse_memory_size(bad), Error) << bad;
  EXPECT_EQ(format_gib(int64_t(3) << 29), "1.50 GiB");
  EXPECT_EQ(format_gib(int64_t(5) << 20), "5.0 MiB");
  EXPECT_EQ(format_gib(int64_t(3) << 10), "3.0 KiB");
  std::string source;
  EXPECT_GE(default_memory_budget(&source), int64_t(1) << 20);
  EXPECT_NE(source.find("minus a margin"), std::string::npos);
}

}  // namespace
}  // namespace ds41
