// The prefix cache's disk tier: entries evicted from memory are written as exact session files and
// come back bit-identical (state compared field by field), a restarted cache finds them again, a
// damaged file is dropped (a miss, never a crash), and the disk bound evicts the oldest.
#include "runtime/prefix_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "state_compare.h"
#include "tiny_model.h"

namespace ds41 {
namespace {

namespace fs = std::filesystem;

struct Fed {
  std::vector<int32_t> ids;
  SequenceState state;
};

class PrefixCacheDisk : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(test::tiny_model_dir(false)).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static Fed fed(std::vector<int32_t> ids) {
    static ThreadPool pool(2);
    Fed f{std::move(ids), model_->new_sequence()};
    model_->forward(f.state, f.ids, {}, &pool);
    return f;
  }
  static std::vector<std::string> files(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  static Model* model_;
};
Model* PrefixCacheDisk::model_ = nullptr;

TEST_F(PrefixCacheDisk, EvictedEntriesComeBackExactlyAndSurviveARestart) {
  test::TempDir dir;
  const Fed a = fed({0, 5, 9, 13, 17, 21, 3}), b = fed({0, 7, 7, 7, 2});
  const int64_t one = sequence_state_bytes(a.state) + 64 * 4;  // memory for one entry
  {
    PrefixCache cache(one);
    cache.enable_disk(*model_, dir.path(), int64_t(1) << 30);
    cache.insert(a.ids, a.state);
    cache.insert(b.ids, b.state);  // evicts a to disk
    EXPECT_EQ(cache.entries(), 1u);
    EXPECT_EQ(cache.disk_entries(), 1u);
    std::vector<int32_t> prompt = a.ids;
    prompt.push_back(4);
    auto hit = cache.lookup(prompt);
    ASSERT_TRUE(hit);
    EXPECT_TRUE(test::same_state(*hit, a.state));
    EXPECT_EQ(cache.disk_hits(), 1);
    // a is back in memory (b spilled in turn): both now on disk, a served from memory next.
    EXPECT_EQ(cache.disk_entries(), 2u);
    ASSERT_TRUE(cache.lookup(prompt));
    EXPECT_EQ(cache.disk_hits(), 1);
  }
  EXPECT_EQ(files(dir.path()).size(), 4u);  // two .ids + two .session
  // A new cache on the same directory finds both.
  PrefixCache again(one);
  again.enable_disk(*model_, dir.path(), int64_t(1) << 30);
  EXPECT_EQ(again.disk_entries(), 2u);
  auto hit = again.lookup({0, 7, 7, 7, 2, 8});
  ASSERT_TRUE(hit);
  EXPECT_TRUE(test::same_state(*hit, b.state));
  EXPECT_FALSE(again.lookup({1, 2, 3}));
}

TEST_F(PrefixCacheDisk, ADamagedFileIsDroppedAndTheDiskBoundHolds) {
  test::TempDir dir;
  const Fed a = fed({0, 5, 9, 13}), b = fed({0, 6, 6}), c = fed({0, 8, 1, 2});
  PrefixCache cache(sequence_state_bytes(a.state) + 64 * 4);
  cache.enable_disk(*model_, dir.path(), int64_t(1) << 30);
  cache.insert(a.ids, a.state);
  cache.insert(b.ids, b.state);  // a to disk
  // Damage a's session file: the lookup drops the pair and misses.
  std::string session;
  for (const auto& f : files(dir.path()))
    if (f.size() > 8 && f.substr(f.size() - 8) == ".session") session = dir / f;
  ASSERT_FALSE(session.empty());
  {
    std::fstream f(session, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  EXPECT_FALSE(cache.lookup({0, 5, 9, 13, 1}));
  EXPECT_EQ(cache.disk_errors(), 1);
  EXPECT_EQ(cache.disk_entries(), 0u);
  EXPECT_TRUE(files(dir.path()).empty());

  // A disk tier that holds one file keeps the most recent spill.
  test::TempDir small;
  PrefixCache bounded(sequence_state_bytes(a.state) + 64 * 4);
  int64_t file_bytes = 0;
  {
    PrefixCache probe(sequence_state_bytes(a.state) + 64 * 4);
    test::TempDir d;
    probe.enable_disk(*model_, d.path(), int64_t(1) << 30);
    probe.insert(a.ids, a.state);
    probe.insert(b.ids, b.state);
    file_bytes = probe.disk_bytes();
  }
  bounded.enable_disk(*model_, small.path(), file_bytes + file_bytes / 2);
  bounded.insert(a.ids, a.state);
  bounded.insert(b.ids, b.state);  // a spilled
  bounded.insert(c.ids, c.state);  // b spilled, a's files removed
  EXPECT_EQ(bounded.disk_entries(), 1u);
  EXPECT_LE(bounded.disk_bytes(), file_bytes + file_bytes / 2);
  EXPECT_FALSE(bounded.lookup({0, 5, 9, 13, 1}));
  EXPECT_TRUE(bounded.lookup({0, 6, 6, 1}));
  EXPECT_EQ(files(small.path()).size(), 2u);
}

// What a crash or a hostile file leaves in the directory never stops a server from starting:
// a crafted count (28 bytes claiming 2^62 ids; it used to throw vector::_M_default_append), a
// truncated .ids and an .ids without its session are dropped and removed, interrupted writes
// (*.tmp) are cleaned up, and the memory tier is written out at shutdown (flush_to_disk) so a
// restart starts warm.
TEST_F(PrefixCacheDisk, CraftedTruncatedAndLeftoverFilesAreDroppedAndMemoryIsFlushed) {
  test::TempDir dir;
  const Fed a = fed({0, 5, 9, 13, 17, 21, 3});
  {
    PrefixCache cache(int64_t(1) << 30);
    cache.enable_disk(*model_, dir.path(), int64_t(1) << 30);
    cache.insert(a.ids, a.state);
    EXPECT_EQ(cache.disk_entries(), 0u);  // in memory only, until the flush
    cache.flush_to_disk();
    EXPECT_EQ(cache.disk_entries(), 1u);
  }
  const std::vector<std::string> good = files(dir.path());
  ASSERT_EQ(good.size(), 2u);  // its .ids and .session
  {
    std::ofstream crafted(dir / "prefix-crafted.ids", std::ios::binary);
    const uint64_t n = (uint64_t(1) << 62) + 1;  // 24 + 4 n wraps to 28
    crafted.write("DS41IDS1", 8);  // the real magic: only the count is wrong
    crafted.write(reinterpret_cast<const char*>(&n), 8);
    crafted.write("\0\0\0\0\0\0\0\0\0\0\0\0", 12);
  }
  std::ofstream(dir / "prefix-crafted.session") << "x";
  {
    std::ifstream in(dir / good[0], std::ios::binary);  // a real .ids, cut short
    std::string bytes(std::istreambuf_iterator<char>(in), {});
    std::ofstream(dir / "prefix-cut.ids", std::ios::binary) << bytes.substr(0, bytes.size() - 5);
    std::ofstream(dir / "prefix-cut.session") << "x";
  }
  std::ofstream(dir / "prefix-orphan.ids") << "DS41IDS1";
  std::ofstream(dir / "prefix-interrupted.session.tmp") << "half";
  std::ofstream(dir / "unrelated.txt") << "kept";
  PrefixCache again(int64_t(1) << 30);
  EXPECT_NO_THROW(again.enable_disk(*model_, dir.path(), int64_t(1) << 30));
  EXPECT_EQ(again.disk_entries(), 1u);
  EXPECT_GE(again.disk_errors(), 3);
  std::vector<std::string> expected = good;
  expected.push_back("unrelated.txt");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(files(dir.path()), expected);
  std::vector<int32_t> prompt = a.ids;
  prompt.push_back(4);
  auto hit = again.lookup(prompt);
  ASSERT_TRUE(hit);
  EXPECT_TRUE(test::same_state(*hit, a.state));
}

TEST_F(PrefixCacheDisk, AnUncreatableDirectoryIsAClearError) {
  PrefixCache cache(1 << 20);
  test::TempDir dir;
  std::ofstream(dir / "file") << "x";
  EXPECT_THROW(cache.enable_disk(*model_, dir / "file/sub", 1 << 20), Error);
}

}  // namespace
}  // namespace ds41
