// Safetensors reader/writer: round trips, determinism, and one test per kind of corruption
// (each checks that the error names the file and says what is wrong).
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/safetensors_writer.h"
#include "proc_maps.h"

namespace ds41 {
namespace {

namespace fs = std::filesystem;

// Deterministic, tensor-specific bytes so that a mix-up between tensors is visible.
uint8_t pattern_byte(size_t i, int seed) { return uint8_t(i * 31 + size_t(seed) * 7 + 1); }

TensorToWrite pattern_tensor(std::string name, DType dtype, std::vector<int64_t> shape, int seed) {
  return {std::move(name), dtype, std::move(shape), [seed](uint8_t* dst, size_t n) {
            for (size_t i = 0; i < n; ++i) dst[i] = pattern_byte(i, seed);
          }};
}

void expect_pattern(const TensorInfo& t, int seed) {
  for (size_t i = 0; i < t.nbytes; ++i)
    ASSERT_EQ(t.data[i], pattern_byte(i, seed)) << t.name << " byte " << i;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(v >> (8 * i));
  return s;
}

// Runs `open` and checks it throws ds41::Error whose message contains every fragment.
template <class F>
void expect_error(F&& open, std::initializer_list<std::string> fragments) {
  try {
    open();
    ADD_FAILURE() << "expected ds41::Error containing '" << *fragments.begin() << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "ds41_safetensors_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // A raw safetensors file: length field (or `len` if given), header text, then `data_bytes`
  // zero bytes. Lets each test break exactly one thing.
  std::string raw_file(const std::string& name, const std::string& header, size_t data_bytes,
                       std::optional<uint64_t> len = std::nullopt) {
    std::string p = path(name);
    write_bytes(p, le64(len.value_or(header.size())) + header + std::string(data_bytes, '\0'));
    return p;
  }

  // Expects TensorStore::open(file) to fail with the file name and each fragment in the message.
  void expect_open_error(const std::string& file, std::initializer_list<std::string> fragments) {
    SCOPED_TRACE(file);
    expect_error([&] { TensorStore::open(file); }, {fs::path(file).filename().string()});
    expect_error([&] { TensorStore::open(file); }, fragments);
  }

  // A three-shard checkpoint in dir_/ckpt; returns the directory.
  std::string make_checkpoint() {
    std::vector<TensorToWrite> ts;
    for (int i = 0; i < 6; ++i)
      ts.push_back(pattern_tensor("layers." + std::to_string(i) + ".w", DType::BF16, {8, 16}, i));
    std::string d = path("ckpt");
    write_sharded_checkpoint(d, ts, 2 * 256, 1);  // 256 bytes per tensor, 2 per shard
    return d;
  }

  nlohmann::json read_index(const std::string& d) {
    return nlohmann::json::parse(read_bytes(d + "/model.safetensors.index.json"));
  }
  void write_index(const std::string& d, const nlohmann::json& j) {
    write_bytes(d + "/model.safetensors.index.json", j.dump(2));
  }

  std::string dir_;
};

// ---- writer + reader round trips --------------------------------------------------------------

TEST_F(SafetensorsTest, SingleFileRoundTrip) {
  std::string p = path("model.safetensors");
  write_safetensors(
      p,
      {pattern_tensor("wq", DType::BF16, {4, 8}, 1), pattern_tensor("bias", DType::F32, {3}, 2),
       pattern_tensor("fp8", DType::F8_E4M3, {5, 7}, 3)},
      {{"format", "pt"}, {"note", "round trip"}});

  SafetensorsFile f(p);
  EXPECT_EQ(f.path(), p);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "bias");  // sorted by name
  EXPECT_EQ(f.tensors()[1].name, "fp8");
  EXPECT_EQ(f.tensors()[2].name, "wq");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "round trip");

  const TensorInfo* wq = f.find("wq");
  ASSERT_NE(wq, nullptr);
  EXPECT_EQ(wq->dtype, DType::BF16);
  EXPECT_EQ(wq->shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(wq->numel(), 32);
  EXPECT_EQ(wq->nbytes, 64u);
  EXPECT_EQ(wq->file, p);
  expect_pattern(*wq, 1);
  expect_pattern(*f.find("bias"), 2);
  expect_pattern(*f.find("fp8"), 3);
  EXPECT_EQ(f.find("nope"), nullptr);

  // Data points into the mapping, not into a copy.
  EXPECT_GE(wq->data, f.tensors()[0].data);
  EXPECT_LT(wq->data, f.tensors()[0].data + f.file_size());

  // The same file through the checkpoint API: by file path and by directory.
  for (const std::string& where : {p, dir_}) {
    TensorStore s = TensorStore::open(where);
    EXPECT_EQ(s.size(), 3u);
    EXPECT_EQ(s.shard_count(), 1u);
    EXPECT_EQ(s.total_bytes(), 64u + 12u + 35u);
    EXPECT_EQ(fs::path(s.root()), fs::path(dir_));
    expect_pattern(s.get("fp8"), 3);
  }
}

// The file is mapped with offset 0 at a 2 MiB boundary (so huge page-cache folios can be mapped
// whole), read-only, the tensors read back right, and the whole of it is unmapped on close.
TEST_F(SafetensorsTest, MappingStartsOnAHugePageBoundary) {
  std::string p = path("model.safetensors");
  // Over 2 MiB of data, so that the mapping has whole 2 MiB stretches.
  write_safetensors(p, {pattern_tensor("big", DType::BF16, {1536, 1024}, 7), pattern_tensor("small", DType::F32, {3}, 8)},
                    {});
  const uint8_t* big_begin = nullptr;
  const uint8_t* big_last = nullptr;
  {
    SafetensorsFile f(p);
    const TensorInfo& big = *f.find("big");
    expect_pattern(big, 7);
    expect_pattern(*f.find("small"), 8);
    big_begin = big.data;
    big_last = big.data + big.nbytes - 1;
    for (const uint8_t* a : {big_begin, big_last}) {
      const auto region = test::region_containing(a);
      ASSERT_TRUE(region.has_value());
      EXPECT_EQ((region->begin - region->file_offset) % (uintptr_t(2) << 20), 0u)
          << std::hex << region->begin << " maps file offset " << region->file_offset;
      EXPECT_TRUE(region->has_flag("rd"));
      EXPECT_FALSE(region->has_flag("wr"));
      EXPECT_TRUE(region->has_flag("ms"));  // MAP_SHARED: the page cache itself, not a private copy
    }
  }
  EXPECT_FALSE(test::region_containing(big_begin).has_value());
  EXPECT_FALSE(test::region_containing(big_last).has_value());
}

TEST_F(SafetensorsTest, HeaderLayoutMatchesReference) {
  std::string p = path("a.safetensors");
  write_safetensors(
      p, {pattern_tensor("b", DType::U8, {3}, 1), pattern_tensor("a", DType::F32, {2}, 2)},
      {{"format", "pt"}});
  std::string bytes = read_bytes(p);
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  EXPECT_EQ(len % 8, 0u);
  std::string header = bytes.substr(8, len);
  std::string json_text = R"({"__metadata__":{"format":"pt"},)"
                          R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})";
  EXPECT_EQ(header.substr(0, json_text.size()), json_text);
  EXPECT_EQ(header.substr(json_text.size()), std::string(len - json_text.size(), ' '));
  EXPECT_EQ(bytes.size(), 8 + len + 11);
}

TEST_F(SafetensorsTest, ScalarAndEmptyTensors) {
  std::string p = path("s.safetensors");
  float value = 3.5f;
  std::vector<uint8_t> scalar(4);
  std::memcpy(scalar.data(), &value, 4);
  write_safetensors_buffers(
      p, {{"scalar", DType::F32, {}, scalar}, {"empty", DType::BF16, {3, 0, 2}, {}}});

  TensorStore s = TensorStore::open(p);
  const TensorInfo& sc = s.get("scalar");
  EXPECT_TRUE(sc.shape.empty());
  EXPECT_EQ(sc.numel(), 1);
  EXPECT_EQ(sc.nbytes, 4u);
  float back;
  std::memcpy(&back, sc.data, 4);
  EXPECT_EQ(back, 3.5f);

  const TensorInfo& e = s.get("empty");
  EXPECT_EQ(e.shape, (std::vector<int64_t>{3, 0, 2}));
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes, 0u);
  EXPECT_EQ(e.as<uint16_t>().size(), 0u);
}

TEST_F(SafetensorsTest, NamesNeedingJsonEscapes) {
  std::string p = path("esc.safetensors");
  const std::string odd = "a\"b\\c\n\u00e9";  // quote, backslash, newline, non-ASCII
  write_safetensors(p, {pattern_tensor(odd, DType::I16, {2}, 4)}, {{"k\"", "v\\"}});
  SafetensorsFile f(p);
  ASSERT_NE(f.find(odd), nullptr);
  expect_pattern(*f.find(odd), 4);
  EXPECT_EQ(f.metadata().at("k\""), "v\\");
}

// Tens of thousands of tensors (the real checkpoint has ~10^5): writing and opening stay fast.
TEST_F(SafetensorsTest, ManyTensors) {
  std::vector<TensorToWrite> ts;
  for (int i = 0; i < 20000; ++i)
    ts.push_back(pattern_tensor("t." + std::to_string(i), DType::U8, {3}, i));
  write_sharded_checkpoint(path("many"), ts, 20000, 4);
  TensorStore s = TensorStore::open(path("many"));
  EXPECT_EQ(s.size(), 20000u);
  EXPECT_GE(s.shard_count(), 4u);
  expect_pattern(s.get("t.12345"), 12345);
}

TEST_F(SafetensorsTest, ZeroTensorFileIsValid) {
  std::string p = path("empty.safetensors");
  write_safetensors(p, {});
  EXPECT_EQ(read_bytes(p), le64(8) + "{}      ");
  SafetensorsFile f(p);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(TensorStore::open(p).size(), 0u);
}

TEST_F(SafetensorsTest, TypedViews) {
  std::string p = path("v.safetensors");
  std::vector<uint8_t> bf(8), odd(3);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = uint8_t(i);
  // "a" (3 bytes) first in name order pushes "b" to offset 3: legal, but not 2-byte aligned.
  write_safetensors_buffers(p, {{"a", DType::U8, {3}, odd}, {"b", DType::BF16, {4}, bf}});
  TensorStore s = TensorStore::open(p);
  expect_error([&] { s.get("b").as<uint16_t>(); }, {"'b'", "aligned"});
  expect_error([&] { s.get("a").as<float>(); }, {"'a'", "U8", "4-byte"});
  EXPECT_EQ(s.get("a").as<uint8_t>().size(), 3u);
  EXPECT_EQ(s.get("b").bytes()[1], 1);
}

TEST_F(SafetensorsTest, WritesAreDeterministic) {
  auto tensors = [] {
    return std::vector<TensorToWrite>{pattern_tensor("z", DType::F32, {7, 3}, 1),
                                      pattern_tensor("a", DType::I8, {5}, 2),
                                      pattern_tensor("m", DType::F8_E8M0, {9}, 3)};
  };
  write_safetensors(path("1.safetensors"), tensors(), {{"k", "v"}});
  write_safetensors(path("2.safetensors"), tensors(), {{"k", "v"}});
  EXPECT_EQ(read_bytes(path("1.safetensors")), read_bytes(path("2.safetensors")));

  write_sharded_checkpoint(path("c1"), tensors(), 8);  // 84, 5, 9 bytes: one shard each
  write_sharded_checkpoint(path("c2"), tensors(), 8);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path("c1"))) names.push_back(e.path().filename());
  ASSERT_EQ(names.size(), 4u);  // 3 shards + index
  for (const auto& n : names)
    EXPECT_EQ(read_bytes(path("c1/" + n)), read_bytes(path("c2/" + n))) << n;
}

TEST_F(SafetensorsTest, ShardedCheckpointRoundTrip) {
  std::string d = make_checkpoint();
  for (int i = 1; i <= 3; ++i) EXPECT_TRUE(fs::exists(d + "/" + shard_file_name(i, 3)));
  EXPECT_EQ(shard_file_name(2, 48), "model-00002-of-00048.safetensors");

  nlohmann::json index = read_index(d);
  EXPECT_EQ(index["metadata"]["total_size"], 6 * 256);
  EXPECT_EQ(index["weight_map"]["layers.0.w"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layers.3.w"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layers.5.w"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(read_bytes(d + "/model.safetensors.index.json"), index.dump(2) + "\n");
  EXPECT_EQ(SafetensorsFile(d + "/model-00001-of-00003.safetensors").metadata().at("format"), "pt");

  // Open by directory and by index path; the store survives being moved.
  TensorStore opened = TensorStore::open(d + "/model.safetensors.index.json");
  TensorStore s = std::move(opened);
  EXPECT_EQ(s.size(), 6u);
  EXPECT_EQ(s.shard_count(), 3u);
  EXPECT_EQ(s.total_bytes(), 6u * 256u);
  EXPECT_EQ(fs::path(s.root()), fs::path(d));
  for (int i = 0; i < 6; ++i) {
    const TensorInfo& t = s.get("layers." + std::to_string(i) + ".w");
    EXPECT_EQ(t.dtype, DType::BF16);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{8, 16}));
    EXPECT_EQ(fs::path(t.file).filename(), shard_file_name(i / 2 + 1, 3));
    expect_pattern(t, i);
  }
  for (size_t i = 1; i < s.tensors().size(); ++i)
    EXPECT_LT(s.tensors()[i - 1].name, s.tensors()[i].name);
  EXPECT_EQ(s.find("layers.9.w"), nullptr);
  expect_error([&] { s.get("layers.9.w"); }, {"'layers.9.w'", "not found", d});
  EXPECT_EQ(TensorStore::open(d).size(), 6u);
}

TEST_F(SafetensorsTest, ShardPlanning) {
  auto sized = [](std::vector<int64_t> bytes) {
    std::vector<TensorToWrite> ts;
    for (size_t i = 0; i < bytes.size(); ++i)
      ts.push_back({"t" + std::to_string(i), DType::U8, {bytes[i]}, {}});
    return ts;
  };
  // Greedy in order; the 100-byte tensor is over the budget and sits alone.
  ShardPlan p = plan_shards(sized({10, 20, 15, 100, 5, 5}), 40);
  EXPECT_EQ(p.shards, (std::vector<std::vector<size_t>>{{0, 1}, {2}, {3}, {4, 5}}));
  EXPECT_EQ(p.shard_bytes, (std::vector<uint64_t>{30, 15, 100, 10}));
  EXPECT_EQ(p.total_bytes, 155u);

  // min_shards lowers the budget until there are enough shards.
  ShardPlan m = plan_shards(sized({10, 10, 10, 10, 10, 10}), 1000, 3);
  EXPECT_EQ(m.shards.size(), 3u);
  EXPECT_EQ(m.budget, 29u);
  EXPECT_EQ(m.shard_bytes, (std::vector<uint64_t>{20, 20, 20}));

  expect_error([&] { plan_shards(sized({1, 2}), 1000, 3); }, {"2 tensors", "3 shards"});
  expect_error([&] { plan_shards(sized({1}), 1000, 0); }, {"min_shards"});

  // And through the writer.
  write_sharded_checkpoint(path("m"), sized({10, 10, 10, 10, 10, 10}), 1u << 30, 3);
  TensorStore s = TensorStore::open(path("m"));
  EXPECT_EQ(s.shard_count(), 3u);
  EXPECT_EQ(s.total_bytes(), 60u);
}

// ---- writer errors -----------------------------------------------------------------------------

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  std::string p = path("bad.safetensors");
  expect_error(
      [&] {
        write_safetensors(
            p, {pattern_tensor("x", DType::U8, {1}, 0), pattern_tensor("x", DType::U8, {2}, 0)});
      },
      {"bad.safetensors", "'x'", "twice"});
  expect_error(
      [&] {
        write_safetensors(p, {pattern_tensor("x", DType::U8, {2, -1}, 0)});
      },
      {"bad.safetensors", "'x'", "[2, -1]"});
  expect_error([&] { write_safetensors(p, {pattern_tensor("__metadata__", DType::U8, {1}, 0)}); },
               {"reserved"});
  expect_error([&] { write_safetensors(p, {pattern_tensor("\xff\xfe", DType::U8, {1}, 0)}); },
               {"UTF-8"});
  expect_error(
      [&] {
        write_safetensors_buffers(p, {{"y", DType::F32, {2}, std::vector<uint8_t>(7)}});
      },
      {"bad.safetensors", "'y'", "7 bytes given", "needs 8"});
  expect_error(
      [&] {
        write_sharded_checkpoint(
            path("d"),
            {pattern_tensor("x", DType::U8, {1}, 0), pattern_tensor("x", DType::U8, {1}, 0)}, 1);
      },
      {"'x'", "twice"});
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST_F(SafetensorsTest, FailedFillLeavesNoFile) {
  std::string p = path("partial.safetensors");
  TensorToWrite bad{
      "boom", DType::U8, {16}, [](uint8_t*, size_t) { throw std::runtime_error("fill failed"); }};
  EXPECT_THROW(write_safetensors(p, {pattern_tensor("a", DType::U8, {4}, 0), bad}),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

// A write that runs out of space must be reported, naming the file. RLIMIT_FSIZE makes write()
// fail with EFBIG past a size, standing in for a full disk without needing a tiny file system.
TEST_F(SafetensorsTest, FailedWriteIsReported) {
  std::string p = path("big.safetensors");
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &previous), 0);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    write_safetensors(p, {pattern_tensor("t", DType::U8, {1 << 16}, 0)});
  } catch (const Error& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  sigaction(SIGXFSZ, &previous, nullptr);
  EXPECT_NE(message.find("big.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("write failed"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

// ---- corrupt single files ----------------------------------------------------------------------

const std::string kGoodEntry = R"({"w":{"dtype":"BF16","shape":[2,4],"data_offsets":[0,16]}})";

TEST_F(SafetensorsTest, RawGoodFileOpens) {
  // The helper itself produces valid files (so the failures below are about the one change).
  TensorStore s = TensorStore::open(raw_file("good.safetensors", kGoodEntry, 16));
  EXPECT_EQ(s.get("w").nbytes, 16u);
}

TEST_F(SafetensorsTest, TruncatedShard) {
  std::string p = path("model.safetensors");
  write_safetensors(
      p, {pattern_tensor("a", DType::F32, {64}, 0), pattern_tensor("b", DType::F32, {64}, 1)});
  fs::resize_file(p, fs::file_size(p) - 100);  // cut inside tensor "b"
  expect_open_error(p, {"tensor 'b'", "truncated"});
}

TEST_F(SafetensorsTest, EmptyAndTinyFiles) {
  expect_open_error(raw_file("empty.safetensors", "", 0, 0), {"header length is 0"});
  write_bytes(path("zero.safetensors"), "");
  expect_open_error(path("zero.safetensors"), {"empty"});
  write_bytes(path("tiny.safetensors"), "abc");
  expect_open_error(path("tiny.safetensors"), {"only 3 bytes"});
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFile) {
  expect_open_error(raw_file("long.safetensors", kGoodEntry, 16, 1000),
                    {"header length 1000", "truncated"});
}

TEST_F(SafetensorsTest, HeaderLengthZero) {
  expect_open_error(raw_file("zero_len.safetensors", kGoodEntry, 16, 0), {"header length is 0"});
}

TEST_F(SafetensorsTest, HeaderLengthHuge) {
  expect_open_error(raw_file("huge.safetensors", kGoodEntry, 16, ~0ull),
                    {"exceeds the 100 MiB limit"});
  expect_open_error(raw_file("huge2.safetensors", kGoodEntry, 16, (100ull << 20) + 1), {"100 MiB"});
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  expect_open_error(raw_file("notjson.safetensors", R"({"w": {"dtype": BF16}})", 0),
                    {"not valid JSON"});
  expect_open_error(raw_file("notutf8.safetensors", "{\"w\xff\": 1}", 0), {"not valid JSON"});
  expect_open_error(raw_file("trailing.safetensors", kGoodEntry + std::string(3, '\0'), 16),
                    {"not valid JSON"});
}

TEST_F(SafetensorsTest, HeaderNotObject) {
  expect_open_error(raw_file("array.safetensors", "[1, 2]", 0), {"header is a JSON array"});
  expect_open_error(raw_file("entry.safetensors", R"({"w": [1, 2]})", 0),
                    {"tensor 'w'", "entry is a JSON array"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_open_error(
      raw_file("dtype.safetensors", R"({"w":{"dtype":"F12","shape":[2],"data_offsets":[0,2]}})", 2),
      {"tensor 'w'", "unknown dtype 'F12'", "BF16"});
  expect_open_error(
      raw_file("dtype2.safetensors", R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,2]}})", 2),
      {"tensor 'w'", "dtype is 7"});
}

TEST_F(SafetensorsTest, ShapeBytesMismatch) {
  expect_open_error(
      raw_file(
          "model-00002-of-00048.safetensors",
          R"({"layers.3.attn.wkv.weight":{"dtype":"F8_E4M3","shape":[512,5120],"data_offsets":[0,100]}})",
          100),
      {"tensor 'layers.3.attn.wkv.weight': data_offsets [0, 100] give 100 bytes but shape [512, "
       "5120] of "
       "F8_E4M3 needs 2621440 bytes"});
  // Element count overflowing 64 bits is a shape error, not a wrap-around.
  expect_open_error(
      raw_file("overflow.safetensors",
               R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})",
               0),
      {"tensor 'w'", "too many elements"});
}

TEST_F(SafetensorsTest, OffsetsOutsideFile) {
  expect_open_error(raw_file("outside.safetensors", kGoodEntry, 15),
                    {"tensor 'w'", "[0, 16]", "truncated"});
  expect_open_error(
      raw_file(
          "far.safetensors",
          R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551610,18446744073709551614]}})",
          4),
      {"tensor 'w'", "file has only"});
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  expect_open_error(raw_file("overlap.safetensors",
                             R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
                             10),
                    {"tensor 'b'", "overlap tensor 'a'"});
  // A tensor inside a larger one that is not its predecessor in offset order.
  expect_open_error(raw_file("nested.safetensors",
                             R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                             R"("c":{"dtype":"U8","shape":[2],"data_offsets":[5,7]}})",
                             10),
                    {"overlap tensor 'a'"});
  // Empty tensors own no bytes: anywhere is fine, and gaps are allowed.
  TensorStore ok =
      TensorStore::open(raw_file("gaps.safetensors",
                                 R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                 R"("e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                                 R"("b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                                 8));
  EXPECT_EQ(ok.size(), 3u);
}

TEST_F(SafetensorsTest, DuplicateTensorName) {
  expect_open_error(raw_file("dup.safetensors",
                             R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                             4),
                    {"tensor 'w' appears more than once"});
  expect_open_error(
      raw_file("dupkey.safetensors",
               R"({"w":{"dtype":"U8","dtype":"I8","shape":[2],"data_offsets":[0,2]}})", 2),
      {"'dtype' appears more than once", "'w'"});
}

TEST_F(SafetensorsTest, NegativeShape) {
  expect_open_error(
      raw_file("neg.safetensors", R"({"w":{"dtype":"U8","shape":[2,-5],"data_offsets":[0,0]}})", 0),
      {"tensor 'w'", "dimension 1 is -5", "non-negative"});
  expect_open_error(raw_file("float.safetensors",
                             R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,0]}})", 0),
                    {"tensor 'w'", "dimension 0 is 2.5"});
  expect_open_error(raw_file("shape.safetensors",
                             R"({"w":{"dtype":"U8","shape":"2x2","data_offsets":[0,4]}})", 4),
                    {"tensor 'w'", "shape is \"2x2\""});
}

TEST_F(SafetensorsTest, WrongOffsetsType) {
  for (const char* offsets : {R"("0-4")", "[0]", "[0,4,8]", "[0,4.0]", "[-1,3]", "null"}) {
    SCOPED_TRACE(offsets);
    expect_open_error(
        raw_file("offsets.safetensors",
                 std::string(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":)") + offsets + "}}",
                 8),
        {"tensor 'w'", "expected [begin, end]"});
  }
  expect_open_error(raw_file("reversed.safetensors",
                             R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 8),
                    {"tensor 'w'", "begin is after end"});
}

TEST_F(SafetensorsTest, EntryFieldsAndMetadata) {
  expect_open_error(raw_file("missing.safetensors", R"({"w":{"dtype":"U8","shape":[4]}})", 4),
                    {"tensor 'w'", "missing 'data_offsets'"});
  expect_open_error(
      raw_file("extra.safetensors",
               R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"align":8}})", 4),
      {"tensor 'w'", "unexpected key 'align'"});
  expect_open_error(raw_file("meta.safetensors", R"({"__metadata__":{"step":5}})", 0),
                    {"'__metadata__' entry 'step'", "must be strings"});
  expect_open_error(raw_file("meta2.safetensors", R"({"__metadata__":"pt"})", 0),
                    {"'__metadata__' is a JSON string"});
  expect_open_error(
      raw_file("deep.safetensors", R"({"w":{"dtype":"U8","shape":[[4]],"data_offsets":[0,4]}})", 4),
      {"nests deeper", "'w'"});
  // Control characters in names are escaped in messages.
  expect_open_error(raw_file("ctrl.safetensors",
                             R"({"a\u0007b":{"dtype":"U8","shape":[1],"data_offsets":[0,2]}})", 2),
                    {"tensor 'a\\x07b'"});
}

TEST_F(SafetensorsTest, NotAFile) {
  expect_error([&] { SafetensorsFile f(dir_); }, {dir_, "is a directory"});
  expect_error([&] { SafetensorsFile f(path("missing.safetensors")); },
               {"missing.safetensors", "no such file"});
  expect_error([&] { TensorStore::open(path("nothing-here")); },
               {"nothing-here", "no such file or directory"});
  // A directory without a checkpoint: say what was looked for.
  fs::create_directory(path("empty_dir"));
  write_bytes(path("empty_dir/model-00001-of-00002.safetensors"), le64(2) + "{}");
  expect_error([&] { TensorStore::open(path("empty_dir")); },
               {"no checkpoint found", "model.safetensors.index.json", "model.safetensors ",
                "1 .safetensors file"});
}

TEST_F(SafetensorsTest, UnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  std::string p = raw_file("secret.safetensors", kGoodEntry, 16);
  ::chmod(p.c_str(), 0);
  expect_open_error(p, {"permission denied"});
}

// ---- corrupt checkpoints (index) ---------------------------------------------------------------

TEST_F(SafetensorsTest, IndexMissingShard) {
  std::string d = make_checkpoint();
  fs::remove(d + "/model-00002-of-00003.safetensors");
  expect_open_error(d, {"model.safetensors.index.json", "1 of 3 shards are missing",
                        "'model-00002-of-00003.safetensors'", "2 tensors"});
}

// A partial download: every missing shard is named in the one error, with what they hold.
TEST_F(SafetensorsTest, IndexNamesEveryMissingShard) {
  std::string d = make_checkpoint();
  fs::remove(d + "/model-00001-of-00003.safetensors");
  fs::remove(d + "/model-00003-of-00003.safetensors");
  expect_open_error(d, {"2 of 3 shards are missing", "'model-00001-of-00003.safetensors', 'model-00003-of-00003.safetensors'",
                        "in them"});
}

TEST_F(SafetensorsTest, IndexTensorInWrongShard) {
  std::string d = make_checkpoint();
  nlohmann::json j = read_index(d);
  j["weight_map"]["layers.0.w"] = "model-00003-of-00003.safetensors";
  write_index(d, j);
  expect_open_error(d, {"model.safetensors.index.json",
                        "tensor 'layers.0.w' in 'model-00003-of-00003.safetensors'",
                        "stored in 'model-00001-of-00003.safetensors'"});
}

TEST_F(SafetensorsTest, IndexTensorAbsentFromIndex) {
  std::string d = make_checkpoint();
  nlohmann::json j = read_index(d);
  j["weight_map"].erase("layers.4.w");
  write_index(d, j);
  expect_open_error(d, {"tensor 'layers.4.w' is in shard 'model-00003-of-00003.safetensors'",
                        "not listed in weight_map"});
}

TEST_F(SafetensorsTest, IndexTensorInNoShard) {
  std::string d = make_checkpoint();
  nlohmann::json j = read_index(d);
  j["weight_map"]["layers.9.w"] = "model-00001-of-00003.safetensors";
  write_index(d, j);
  expect_open_error(d, {"tensor 'layers.9.w' is listed in weight_map", "no shard contains it"});
}

TEST_F(SafetensorsTest, IndexDuplicateAcrossShards) {
  std::string d = path("dup");
  fs::create_directory(d);
  write_safetensors(d + "/one.safetensors", {pattern_tensor("a", DType::U8, {2}, 0),
                                             pattern_tensor("x", DType::U8, {2}, 0)});
  write_safetensors(d + "/two.safetensors", {pattern_tensor("b", DType::U8, {2}, 0),
                                             pattern_tensor("x", DType::U8, {2}, 1)});
  write_index(d,
              {{"weight_map",
                {{"a", "one.safetensors"}, {"b", "two.safetensors"}, {"x", "one.safetensors"}}}});
  expect_open_error(
      d, {"tensor 'x' is stored in two shards", "'one.safetensors'", "'two.safetensors'"});
}

TEST_F(SafetensorsTest, IndexBadJson) {
  std::string d = make_checkpoint();
  write_bytes(d + "/model.safetensors.index.json", R"({"weight_map": {"a": "b",})");
  expect_open_error(d, {"model.safetensors.index.json", "not valid JSON"});
  write_bytes(d + "/model.safetensors.index.json", R"({"weight_map": ["a"]})");
  expect_open_error(d, {"'weight_map' object"});
  write_bytes(d + "/model.safetensors.index.json", R"({"weight_map": {"a": 1}})");
  expect_open_error(d, {"tensor 'a'", "expected a shard file name"});
  write_bytes(
      d + "/model.safetensors.index.json",
      R"({"weight_map": {"a": "model-00001-of-00003.safetensors", "a": "model-00002-of-00003.safetensors"}})");
  expect_open_error(d, {"'a' appears more than once", "weight_map"});
}

TEST_F(SafetensorsTest, IndexPathTraversal) {
  std::string d = make_checkpoint();
  for (const char* shard :
       {"../model-00001-of-00003.safetensors", "sub/x.safetensors", "..", "/etc/passwd"}) {
    SCOPED_TRACE(shard);
    nlohmann::json j = read_index(d);
    j["weight_map"]["layers.0.w"] = shard;
    write_index(d, j);
    expect_open_error(d, {"tensor 'layers.0.w'", "not a plain file name"});
  }
}

TEST_F(SafetensorsTest, IndexTotalSizeMismatch) {
  std::string d = make_checkpoint();
  nlohmann::json j = read_index(d);
  j["metadata"]["total_size"] = 6 * 256 + 1;
  write_index(d, j);
  expect_open_error(d, {"metadata.total_size is 1537", "hold 1536 bytes"});
  j["metadata"]["total_size"] = "1536";
  write_index(d, j);
  expect_open_error(d, {"metadata.total_size", "non-negative integer"});
}

TEST_F(SafetensorsTest, IndexShardErrorsNameTheShard) {
  std::string d = make_checkpoint();
  std::string shard = d + "/model-00002-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  expect_error([&] { TensorStore::open(d); },
               {"model-00002-of-00003.safetensors", "tensor 'layers.3.w'", "truncated"});
}

// ---- the golden checkpoint ---------------------------------------------------------------------

std::optional<std::string> shared_dir() {
  std::error_code ec;
  std::string beside = std::string(DS41_SOURCE_DIR) + "/../shared";
  if (fs::is_directory(beside, ec)) return beside;
  if (const char* env = std::getenv("DS41_SHARED_DIR"); env && fs::is_directory(env, ec))
    return std::string(env);
  return std::nullopt;
}

TEST_F(SafetensorsTest, GoldenCheckpointOpens) {
  std::optional<std::string> shared = shared_dir();
  if (!shared || !fs::exists(*shared + "/goldens/backbone-a/model"))
    GTEST_SKIP() << "shared/goldens not found beside the source tree and DS41_SHARED_DIR not set";
  TensorStore s = TensorStore::open(*shared + "/goldens/backbone-a/model");
  EXPECT_EQ(s.size(), 706u);
  EXPECT_EQ(s.shard_count(), 3u);
  EXPECT_EQ(s.total_bytes(), 2921936u);
  const TensorInfo& embed = s.get("embed.weight");
  EXPECT_EQ(embed.dtype, DType::BF16);
  EXPECT_EQ(embed.shape, (std::vector<int64_t>{512, 128}));
  EXPECT_EQ(embed.nbytes, 512u * 128u * 2u);
  EXPECT_EQ(fs::path(embed.file).filename(), "model-00001-of-00003.safetensors");
}

}  // namespace
}  // namespace ds41
