// Sessions on disk: exact save/restore continues bit-identically (with and without Engram), every
// kind of damaged or foreign file is refused with its own error, and a save killed at any instant
// never leaves a file that loads as a wrong state.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/thread_pool.h"
#include "runtime/session.h"
#include "state_compare.h"
#include "tiny_model.h"

namespace ds41 {
namespace {

constexpr int kPromptLen = 151;  // odd: a ratio-2 compressor holds a partial group; > window: ring wrapped

std::vector<int32_t> prompt_tokens(int n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((int64_t(i) * 7919 + 13) % vocab));
  return t;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

using test::same_state;

// One loaded model and its state after the prompt, per Engram setting (prefill shared by tests).
struct Prefilled {
  std::unique_ptr<Model> model;
  SequenceState state;
  std::vector<float> logits;
};

ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

const Prefilled& prefilled(bool engram) {
  static std::map<bool, Prefilled> cache;
  auto it = cache.find(engram);
  if (it != cache.end()) return it->second;
  Prefilled p;
  p.model = Model::load(test::tiny_model_dir(engram));
  p.state = p.model->new_sequence();
  p.logits = p.model->forward(p.state, prompt_tokens(kPromptLen, p.model->config().vocab_size), {}, &pool());
  return cache.emplace(engram, std::move(p)).first->second;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// Re-seals a file after a deliberate edit, so the test reaches the checks behind the checksum.
void reseal(std::vector<uint8_t>& b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i + 8 < b.size(); ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  for (int i = 0; i < 8; ++i) b[b.size() - 8 + size_t(i)] = uint8_t(h >> (8 * i));
}

// Expects load_session to refuse the file with a message containing `what` and the file name.
void expect_refused(const std::string& path, const Model& m, const std::string& what) {
  try {
    load_session(path, m);
    ADD_FAILURE() << "loaded a bad session; expected: " << what;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
}

class SessionExact : public ::testing::TestWithParam<bool> {};

TEST_P(SessionExact, RestoredSequenceContinuesBitIdentically) {
  const bool engram = GetParam();
  const Prefilled& p = prefilled(engram);
  test::TempDir tmp;
  const std::string path = tmp / "s.ds41session";
  save_session(path, *p.model, p.state);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // A second model instance plays the new process: nothing is shared but the checkpoint.
  auto model2 = Model::load(test::tiny_model_dir(engram));
  SequenceState a = p.state;
  SequenceState b = load_session(path, *model2);
  ASSERT_TRUE(same_state(a, b));
  if (engram) EXPECT_EQ(int64_t(b.engram_history.size()), b.pos);

  std::vector<float> la = p.logits, lb = p.logits;
  for (int step = 0; step < 20; ++step) {
    const int32_t tok = argmax(la);
    la = p.model->forward(a, {tok}, {}, &pool());
    lb = model2->forward(b, {tok}, {}, &pool());
    ASSERT_EQ(la.size(), lb.size());
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "logits differ at step " << step;
  }
  EXPECT_TRUE(same_state(a, b));
}

INSTANTIATE_TEST_SUITE_P(Session, SessionExact, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Engram" : "NoEngram"; });

class SessionFile : public ::testing::Test {
 protected:
  void SetUp() override {
    p_ = &prefilled(false);
    path_ = tmp_ / "s.ds41session";
    save_session(path_, *p_->model, p_->state);
    good_ = read_bytes(path_);
    ASSERT_GT(good_.size(), 64u);
  }
  const Model& model() const { return *p_->model; }
  const Prefilled* p_ = nullptr;
  test::TempDir tmp_;
  std::string path_;
  std::vector<uint8_t> good_;
};

TEST_F(SessionFile, TruncatedFileIsRefused) {
  std::vector<uint8_t> b(good_.begin(), good_.end() - 100);
  write_bytes(path_, b);
  expect_refused(path_, model(), "truncated");
  // Every cut, down to an empty file, is an error and never a crash or a wrong state.
  for (size_t n : {size_t(0), size_t(4), size_t(8), size_t(20), size_t(32), size_t(40), good_.size() / 2, good_.size() - 1}) {
    write_bytes(path_, std::vector<uint8_t>(good_.begin(), good_.begin() + long(n)));
    EXPECT_THROW(load_session(path_, model()), Error) << "cut at " << n;
  }
}

TEST_F(SessionFile, TrailingBytesAreRefused) {
  std::vector<uint8_t> b = good_;
  b.push_back(0);
  write_bytes(path_, b);
  expect_refused(path_, model(), "trailing bytes");
}

TEST_F(SessionFile, FlippedByteFailsTheChecksum) {
  std::vector<uint8_t> b = good_;
  b[b.size() / 2] ^= 0x10;
  write_bytes(path_, b);
  expect_refused(path_, model(), "checksum mismatch");
  // Random single-byte damage anywhere: always an error, whichever check catches it.
  std::mt19937 rng(7);
  for (int i = 0; i < 64; ++i) {
    std::vector<uint8_t> d = good_;
    d[rng() % d.size()] ^= uint8_t(1u << (rng() % 8));
    write_bytes(path_, d);
    EXPECT_THROW(load_session(path_, model()), Error);
  }
}

TEST_F(SessionFile, WrongMagicIsRefused) {
  std::vector<uint8_t> b = good_;
  b[0] = 'X';
  write_bytes(path_, b);
  expect_refused(path_, model(), "not a ds41 session file");
}

TEST_F(SessionFile, NewerVersionIsRefused) {
  std::vector<uint8_t> b = good_;
  b[8] = uint8_t(kSessionFormatVersion + 1);
  write_bytes(path_, b);
  expect_refused(path_, model(), "written by a newer ds41");
}

TEST_F(SessionFile, UnknownKindIsRefused) {
  std::vector<uint8_t> b = good_;
  b[12] = 0;  // flags: not exact
  reseal(b);
  write_bytes(path_, b);
  expect_refused(path_, model(), "unsupported session kind");
}

TEST_F(SessionFile, ForeignModelIsRefused) {
  // A different seed keeps the config (and so the fingerprint); a different index_topk does not,
  // while leaving every state shape the same — exactly the case only the fingerprint can catch.
  ModelConfig c = test::tiny_config(false);
  c.index_topk = c.index_topk / 2;
  test::TempDir other;
  RandomCheckpointOptions opt;
  opt.seed = 99;
  write_random_checkpoint(c, other.path(), opt);
  auto foreign = Model::load(other.path());
  expect_refused(path_, *foreign, "belongs to another model");
  // And the Engram model refuses a backbone-only session.
  expect_refused(path_, *prefilled(true).model, "belongs to another model");
}

TEST_F(SessionFile, InconsistentContentsAreRefusedEvenUnderAValidChecksum) {
  constexpr size_t body = 32;  // magic, version, flags, fingerprint, body length
  {
    std::vector<uint8_t> b = good_;
    b[body] ^= 1;  // pos 151 -> 150: entries and histories no longer match
    reseal(b);
    write_bytes(path_, b);
    expect_refused(path_, model(), "inconsistent with the model");
  }
  {
    std::vector<uint8_t> b = good_;
    std::memset(&b[body + 8], 0, 4);  // publisher = layer 0, a window-only layer
    reseal(b);
    write_bytes(path_, b);
    expect_refused(path_, model(), "is not a kv-source layer");
  }
  {
    std::vector<uint8_t> b = good_;
    b[body + 12] += 1;  // layer count
    reseal(b);
    write_bytes(path_, b);
    expect_refused(path_, model(), "layers, expected");
  }
  {
    std::vector<uint8_t> b = good_;
    b[body + 16 + 8 + 7] = 0x10;  // layer 0 ring-code count: absurdly large, must not allocate
    reseal(b);
    write_bytes(path_, b);
    expect_refused(path_, model(), "window ring codes");
  }
}

TEST_F(SessionFile, MissingFileIsAnError) {
  expect_refused(tmp_ / "nope.ds41session", model(), "cannot open");
}

TEST_F(SessionFile, FailedSaveLeavesThePreviousFileIntact) {
  // A directory where the temp file should go makes the save fail before anything is renamed.
  std::filesystem::create_directory(path_ + ".tmp");
  EXPECT_THROW(save_session(path_, model(), p_->state), Error);
  EXPECT_EQ(read_bytes(path_), good_);
  EXPECT_TRUE(same_state(load_session(path_, model()), p_->state));
}

TEST_F(SessionFile, KilledSaveNeverLeavesAWrongState) {
  // Two known states; a child saves them alternately until it is SIGKILLed at a random moment.
  // Whatever the moment, the file must be absent or load as exactly one of the two.
  const SequenceState& a = p_->state;
  SequenceState b = a;
  p_->model->forward(b, {argmax(p_->logits)}, {}, &pool());
  std::filesystem::remove(path_);
  std::mt19937 rng(12345);
  int loaded = 0;
  for (int iter = 0; iter < 12; ++iter) {
    if (iter == 6) std::filesystem::remove(path_);  // also cover "killed before the first save"
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        for (;;) {
          save_session(path_, model(), a);
          save_session(path_, model(), b);
        }
      } catch (...) {
      }
      _exit(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "the saving child stopped by itself (a save failed)";
    if (!std::filesystem::exists(path_)) continue;
    SequenceState got = load_session(path_, model());  // must not throw: never a partial file
    EXPECT_TRUE(same_state(got, a) || same_state(got, b)) << "iteration " << iter;
    ++loaded;
  }
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace ds41
