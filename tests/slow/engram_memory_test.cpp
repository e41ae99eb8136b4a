// The Engram tables are read from the mmap'd checkpoint row by row: a model whose tables total
// gigabytes runs with a resident set far below the table size (issue: tables served from disk).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/engram_layout.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/weight_catalogue.h"
#include "test_paths.h"

namespace ds41 {
namespace {

TEST(EngramMemory, ResidentSetStaysFarBelowTheTableSize) {
  ModelConfig c = preset_config("tiny");
  c.engram_vocab_size = 6300000;  // ~6 x 6.3 M rows of 33 bytes per layer: ~2.5 GB of tables
  c.engram_num_embeddings = compute_engram_layout(c).rows;
  int64_t table_bytes = 0;
  for (const TensorSpec& s : build_weight_catalogue(c))
    if (s.group == TensorGroup::Engram) table_bytes += s.nbytes();
  ASSERT_GT(table_bytes, int64_t(2) << 30);
  const auto space = std::filesystem::space(std::filesystem::temp_directory_path());
  if (space.available < uint64_t(table_bytes) * 2) GTEST_SKIP() << "not enough free disk for a " << table_bytes << "-byte table";

  test::TempDir tmp;
  RandomCheckpointOptions opt;
  opt.seed = 3;
  opt.min_shards = 4;
  write_random_checkpoint(c, tmp.path() + "/m", opt);
  // Drop the just-written shards from the page cache, as after a reboot: the writer left them
  // cached in large folios, and touching one byte of such a folio maps all of it, which would
  // measure the writer, not the reader.
  for (auto& e : std::filesystem::directory_iterator(tmp.path() + "/m")) {
    if (e.path().extension() != ".safetensors") continue;
    int fd = ::open(e.path().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }

  std::string tokens = "0";
  for (int i = 1; i < 64; ++i) tokens += "," + std::to_string((i * 7919) % 129280);
  const std::string cmd = test::ds41_binary() + " run -m " + tmp.path() + "/m --tokens " + tokens +
                          " --max-tokens 8 --threads 2 --json";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  ASSERT_EQ(pclose(p), 0) << out;
  auto j = nlohmann::json::parse(out);
  const int64_t rss = j["timing"]["peak_rss_bytes"].get<int64_t>();
  ASSERT_GT(rss, 0) << "no /proc/self/status";
  std::cout << "Engram tables " << table_bytes / (1 << 20) << " MiB, peak RSS of a 64+8-token run " << rss / (1 << 20)
            << " MiB\n";
  EXPECT_LT(rss, table_bytes / 8);
}

}  // namespace
}  // namespace ds41
