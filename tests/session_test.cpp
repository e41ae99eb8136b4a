// Sessions on disk: exact save/restore continues bit-identically (with and without Engram); a
// compact session restores the global caches exactly and rebuilds the rings by bounded replay
// (exact within the window, measured beyond); its size is the plan's persistent bytes per token
// plus a fixed part; version-1 files still load; every kind of damaged or foreign file is refused
// with its own error, and a save killed at any instant never leaves a file that loads as a wrong
// state.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/thread_pool.h"
#include "devtools/prefill_compare.h"
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

const char* kind_name(SessionKind k) { return k == SessionKind::Exact ? "Exact" : "Compact"; }

// Continues two sequences with the same greedy tokens of the first; true if every step's logits
// are bit-identical. `kl` (if set) gets the per-step KL(a || b).
bool continue_both(const Model& ma, SequenceState& a, const Model& mb, SequenceState& b, std::vector<float> la,
                   std::vector<float> lb, int steps, std::vector<double>* kl = nullptr) {
  bool same = true;
  for (int step = 0; step < steps; ++step) {
    if (kl) kl->push_back(logits_kl(la.data(), lb.data(), int64_t(la.size())));
    const int32_t tok = argmax(la);
    la = ma.forward(a, {tok}, {}, &pool());
    lb = mb.forward(b, {tok}, {}, &pool());
    same = same && la.size() == lb.size() && std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0;
  }
  return same;
}

// ---- exact sessions ---------------------------------------------------------------------------

class SessionExact : public ::testing::TestWithParam<bool> {};

TEST_P(SessionExact, RestoredSequenceContinuesBitIdentically) {
  const bool engram = GetParam();
  const Prefilled& p = prefilled(engram);
  test::TempDir tmp;
  const std::string path = tmp / "s.ds41session";
  save_session(path, *p.model, p.state, SessionKind::Exact);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // A second model instance plays the new process: nothing is shared but the checkpoint.
  auto model2 = Model::load(test::tiny_model_dir(engram));
  SequenceState a = p.state;
  SequenceState b = load_session(path, *model2);
  ASSERT_TRUE(same_state(a, b));
  if (engram) { EXPECT_EQ(int64_t(b.engram_history.size()), b.pos); }
  EXPECT_TRUE(continue_both(*p.model, a, *model2, b, p.logits, p.logits, 20));
  EXPECT_TRUE(same_state(a, b));
}

INSTANTIATE_TEST_SUITE_P(Session, SessionExact, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Engram" : "NoEngram"; });

// A version-1 file (the first exact format: no history start, no window starts) is still read.
TEST(SessionVersion1, ExactFileLoads) {
  const Prefilled& p = prefilled(true);
  const SequenceState& st = p.state;
  std::vector<uint8_t> body;
  auto put = [](std::vector<uint8_t>& o, const void* v, size_t n) {
    const auto* b = static_cast<const uint8_t*>(v);
    o.insert(o.end(), b, b + n);  // the test machine is little-endian, as the format
  };
  auto put_u64 = [&](std::vector<uint8_t>& o, uint64_t v) { put(o, &v, 8); };
  auto put_arr = [&](const auto& v) {
    put_u64(body, v.size());
    put(body, v.data(), v.size() * sizeof(v[0]));
  };
  put(body, &st.pos, 8);
  put(body, &st.index_k_publisher, 4);
  const uint32_t n_layers = uint32_t(st.layers.size());
  put(body, &n_layers, 4);
  for (const LayerState& l : st.layers) {
    put(body, &l.entries, 8);
    put_arr(l.ring_codes);
    put_arr(l.ring_scales);
    put_arr(l.group_kv);
    put_arr(l.group_score);
    put_arr(l.ckv_codes);
    put_arr(l.ckv_scales);
    put_arr(l.ik_codes);
    put_arr(l.ik_scales);
  }
  put_arr(st.token_history);
  put_arr(st.engram_history);
  std::vector<uint8_t> file = {'D', 'S', '4', '1', 'S', 'E', 'S', 'S', 1, 0, 0, 0, 1, 0, 0, 0};
  put_u64(file, config_fingerprint(p.model->config()));
  put_u64(file, body.size());
  file.insert(file.end(), body.begin(), body.end());
  file.resize(file.size() + 8);
  reseal(file);
  test::TempDir tmp;
  write_bytes(tmp / "v1", file);
  EXPECT_TRUE(same_state(load_session(tmp / "v1", *p.model), st));
  file[12] = 2;  // "compact" did not exist in version 1
  reseal(file);
  write_bytes(tmp / "v1", file);
  expect_refused(tmp / "v1", *p.model, "unsupported session kind");
}

// ---- compact sessions -------------------------------------------------------------------------

class SessionCompact : public ::testing::TestWithParam<bool> {};

TEST_P(SessionCompact, WithinTheWindowRestoresExactly) {
  // One call of 101 tokens: the replay (one call too) repeats it exactly.
  const bool engram = GetParam();
  const Prefilled& p = prefilled(engram);
  SequenceState a = p.model->new_sequence();
  const auto la = p.model->forward(a, prompt_tokens(101, p.model->config().vocab_size), {}, &pool());
  test::TempDir tmp;
  save_session(tmp / "c", *p.model, a, SessionKind::Compact);
  auto model2 = Model::load(test::tiny_model_dir(engram));
  SequenceState b = load_session(tmp / "c", *model2, &pool());
  ASSERT_TRUE(same_state(a, b));
  EXPECT_TRUE(continue_both(*p.model, a, *model2, b, la, la, 10));
}

TEST_P(SessionCompact, BeyondTheWindowRestoresTheGlobalCachesAndReplaysTheWindow) {
  const bool engram = GetParam();
  const Prefilled& p = prefilled(engram);
  const Model& m = *p.model;
  const ModelConfig& c = m.config();
  test::TempDir tmp;
  save_session(tmp / "c", m, p.state, SessionKind::Compact);
  SequenceState b = load_session(tmp / "c", m, &pool());
  const SequenceState& a = p.state;
  ASSERT_EQ(b.pos, a.pos);
  EXPECT_EQ(b.index_k_publisher, a.index_k_publisher);
  const int64_t keep = compact_history_length(c, a.pos);
  EXPECT_EQ(keep, c.window_size + (engram ? c.engram_max_ngram_size - 1 : 0));
  EXPECT_EQ(b.history_start, a.pos - keep);
  EXPECT_TRUE(std::equal(b.token_history.begin(), b.token_history.end(), a.token_history.end() - keep));
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_TRUE(test::same_global_cache(a.layers[l], b.layers[l])) << l;
    if (!m.plan().layers[l].is_dspark) { EXPECT_EQ(b.layers[l].ring_start, a.pos - c.window_size) << l; }
  }
  EXPECT_TRUE(a.layers[0].ring_codes == b.layers[0].ring_codes);  // layer 0: a function of each token alone

  // Divergence from the uninterrupted run: teacher-forced KL of the next-token distributions.
  SequenceState ua = a, ub = b;
  std::vector<double> kl;
  std::vector<float> lb = m.forward(ub, {argmax(p.logits)}, {}, &pool());
  std::vector<float> la = m.forward(ua, {argmax(p.logits)}, {}, &pool());
  continue_both(m, ua, m, ub, la, lb, 20, &kl);
  double mean = 0, mx = 0;
  for (double k : kl) {
    ASSERT_TRUE(std::isfinite(k));
    mean += k / double(kl.size());
    mx = std::max(mx, k);
  }
  RecordProperty("replay_kl_mean", std::to_string(mean));
  RecordProperty("replay_kl_max", std::to_string(mx));
  std::printf("compact restore after %lld tokens (%s): KL(uninterrupted || restored) over 20 steps mean %.3g max %.3g "
              "(first %.3g, last %.3g)\n",
              (long long)a.pos, engram ? "Engram" : "no Engram", mean, mx, kl.front(), kl.back());

  // The restored sequence saves again, compact (its history now starts late) and exact.
  save_session(tmp / "c2", m, ub, SessionKind::Compact);
  save_session(tmp / "e2", m, ub, SessionKind::Exact);
  EXPECT_TRUE(same_state(load_session(tmp / "e2", m), ub));
  SequenceState again = load_session(tmp / "c2", m, &pool());
  for (size_t l = 0; l < ub.layers.size(); ++l) EXPECT_TRUE(test::same_global_cache(ub.layers[l], again.layers[l]));
}

INSTANTIATE_TEST_SUITE_P(Session, SessionCompact, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Engram" : "NoEngram"; });

TEST(SessionCompactSize, IsThePlansPersistentBytesPerTokenPlusAFixedPart) {
  const Prefilled& p = prefilled(true);
  const Model& m = *p.model;
  const ModelConfig& c = m.config();
  const ModelPlan& plan = m.plan();
  SequenceState st = m.new_sequence();
  const std::vector<int32_t> toks = prompt_tokens(220, c.vocab_size);
  test::TempDir tmp;
  std::vector<std::pair<int64_t, uintmax_t>> sizes;
  int64_t done = 0;
  for (int64_t n : {140, 180, 220}) {  // even: every ratio divides them; all beyond the kept history
    m.forward(st, std::vector<int32_t>(toks.begin() + done, toks.begin() + n), {}, &pool());
    done = n;
    save_session(tmp / "c", m, st, SessionKind::Compact);
    sizes.push_back({n, std::filesystem::file_size(tmp / "c")});
  }
  // The fixed part, from the layout in session.h: header + checksum, pos, publisher, kv-source
  // count; per kv source its id, entry count, 6 array counts and the fp32 partial group (ratio >
  // 1); the history start, and the token and Engram tails with their counts.
  const int64_t T = c.window_size + c.engram_max_ngram_size - 1;
  int64_t fixed = 32 + 8 + 8 + 4 + 4 + 8 + (8 + 4 * T) + (8 + 8 * T);
  for (const LayerPlan& lp : plan.layers) {
    if (lp.is_dspark || !lp.kv_source) continue;
    fixed += 4 + 8 + 6 * 8;
    if (lp.ratio > 1) fixed += 2 * int64_t(lp.ratio) * c.head_dim * 4;
  }
  for (auto [n, size] : sizes) {
    // Length-proportional part: exactly the plan's packed main KV + index K bytes per token.
    EXPECT_EQ(double(int64_t(size) - fixed), double(n) * plan.kv_bytes_per_token) << n;
    std::printf("compact session at %lld tokens: %ju bytes = %lld fixed + %lld x %.1f B/token\n", (long long)n, size,
                (long long)fixed, (long long)n, plan.kv_bytes_per_token);
  }
  EXPECT_EQ(double(sizes[2].second - sizes[0].second), 80 * plan.kv_bytes_per_token);
  // The exact kind adds the rings of every layer and the whole history.
  save_session(tmp / "e", m, st, SessionKind::Exact);
  EXPECT_GT(std::filesystem::file_size(tmp / "e"), sizes[2].second + uintmax_t(plan.swa_bytes_per_sequence) / 2);
}

// ---- damaged, foreign and interrupted files, both kinds ---------------------------------------

class SessionFile : public ::testing::TestWithParam<SessionKind> {
 protected:
  void SetUp() override {
    p_ = &prefilled(false);
    path_ = tmp_ / "s.ds41session";
    save_session(path_, *p_->model, p_->state, GetParam());
    good_ = read_bytes(path_);
    ASSERT_GT(good_.size(), 64u);
  }
  const Model& model() const { return *p_->model; }
  SequenceState load(const std::string& path) const { return load_session(path, model(), &pool()); }
  const Prefilled* p_ = nullptr;
  test::TempDir tmp_;
  std::string path_;
  std::vector<uint8_t> good_;
};

// Every kind of damage is refused with its own message (one test per kind: each test process
// pays for a checkpoint and a prefill).
TEST_P(SessionFile, DamagedFilesAreRefused) {
  // Truncated: every cut, down to an empty file, is an error and never a crash or a wrong state.
  write_bytes(path_, std::vector<uint8_t>(good_.begin(), good_.end() - 100));
  expect_refused(path_, model(), "truncated");
  for (size_t n : {size_t(0), size_t(4), size_t(8), size_t(20), size_t(32), size_t(40), good_.size() / 2, good_.size() - 1}) {
    write_bytes(path_, std::vector<uint8_t>(good_.begin(), good_.begin() + long(n)));
    EXPECT_THROW(load_session(path_, model()), Error) << "cut at " << n;
  }
  std::vector<uint8_t> b = good_;
  b.push_back(0);
  write_bytes(path_, b);
  expect_refused(path_, model(), "trailing bytes");

  b = good_;
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

  b = good_;
  b[0] = 'X';
  write_bytes(path_, b);
  expect_refused(path_, model(), "not a ds41 session file");

  b = good_;
  b[8] = uint8_t(kSessionFormatVersion + 1);
  write_bytes(path_, b);
  expect_refused(path_, model(), "written by a newer ds41");

  for (uint8_t kind : {0, 3}) {
    b = good_;
    b[12] = kind;
    reseal(b);
    write_bytes(path_, b);
    expect_refused(path_, model(), "unsupported session kind");
  }

  expect_refused(tmp_ / "nope.ds41session", model(), "cannot open");
}

TEST(SessionForeign, ModelIsRefused) {
  // A different seed keeps the config (and so the fingerprint); a different index_topk does not,
  // while leaving every state shape the same — exactly the case only the fingerprint can catch.
  const Prefilled& p = prefilled(false);
  ModelConfig c = test::tiny_config(false);
  c.index_topk = c.index_topk / 2;
  test::TempDir other;
  RandomCheckpointOptions opt;
  opt.seed = 99;
  write_random_checkpoint(c, other.path(), opt);
  auto foreign = Model::load(other.path());
  for (SessionKind kind : {SessionKind::Exact, SessionKind::Compact}) {
    save_session(other / "s", *p.model, p.state, kind);
    expect_refused(other / "s", *foreign, "belongs to another model");
  }
}

TEST_P(SessionFile, SavesAreAtomic) {
  // A directory where the temp file should go makes the save fail before anything is renamed.
  std::filesystem::create_directory(path_ + ".tmp");
  EXPECT_THROW(save_session(path_, model(), p_->state, GetParam()), Error);
  EXPECT_EQ(read_bytes(path_), good_);
  std::filesystem::remove(path_ + ".tmp");

  // Two known states; a child saves them alternately until it is SIGKILLed at a random moment.
  // Whatever the moment, the file must be absent or hold exactly one of the two complete files
  // (so the previous good file survives an interrupted save), and a leftover temp file must never
  // load as anything but one of them either.
  const SequenceState& a = p_->state;
  SequenceState b = a;
  p_->model->forward(b, {argmax(p_->logits)}, {}, &pool());
  save_session(tmp_ / "a", model(), a, GetParam());
  save_session(tmp_ / "b", model(), b, GetParam());
  const std::vector<uint8_t> file_a = read_bytes(tmp_ / "a"), file_b = read_bytes(tmp_ / "b");
  // Kill moments spread over about three saves: time one save in a child first (the machine may be
  // loaded; a fixed range could end before the first save does).
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t probe = fork();
  ASSERT_GE(probe, 0);
  if (probe == 0) {
    try {
      save_session(tmp_ / "probe", model(), a, GetParam());
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
  int probe_status = 0;
  waitpid(probe, &probe_status, 0);
  ASSERT_TRUE(WIFEXITED(probe_status) && WEXITSTATUS(probe_status) == 0);
  const auto one_save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  std::mt19937 rng(12345);
  int present = 0, partial_tmp = 0;
  for (int iter = 0; iter < 12; ++iter) {
    // The previous good file is there, except in a few rounds: "killed before the first save".
    if (iter % 4 == 3) std::filesystem::remove(path_);
    else if (!std::filesystem::exists(path_)) write_bytes(path_, file_a);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        for (;;) {
          save_session(path_, model(), a, GetParam());
          save_session(path_, model(), b, GetParam());
        }
      } catch (...) {
      }
      _exit(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % uint64_t(3 * one_save_us.count() + 1)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "the saving child stopped by itself (a save failed)";
    if (std::filesystem::exists(path_ + ".tmp")) {
      const std::vector<uint8_t> t = read_bytes(path_ + ".tmp");
      if (t != file_a && t != file_b) {
        ++partial_tmp;
        EXPECT_THROW(load_session(path_ + ".tmp", model()), Error) << "a partial temp file loaded, iteration " << iter;
      }
    }
    if (!std::filesystem::exists(path_)) continue;
    const std::vector<uint8_t> got = read_bytes(path_);
    EXPECT_TRUE(got == file_a || got == file_b) << "iteration " << iter;
    ++present;
  }
  EXPECT_GE(present, 9);  // every round that started with a good file still has one
  // The file that survives loads (one full load per kind is enough: the bytes are a known file).
  if (std::filesystem::exists(path_)) { EXPECT_NO_THROW(load(path_)); }
  std::printf("killed saves (one save %lld us): file present %d/12 times, partial temp file %d times\n",
              (long long)one_save_us.count(), present, partial_tmp);
}

INSTANTIATE_TEST_SUITE_P(Session, SessionFile, ::testing::Values(SessionKind::Exact, SessionKind::Compact),
                         [](const auto& info) { return kind_name(info.param); });

// Edits behind a valid checksum: every field is checked against the model and the counters.
class SessionFields : public ::testing::Test {
 protected:
  void SetUp() override { p_ = &prefilled(false); }
  // Saves, applies `edit` to the bytes, reseals, and expects `what` in the refusal.
  void expect_edit_refused(SessionKind kind, const std::function<void(std::vector<uint8_t>&)>& edit,
                           const std::string& what) {
    save_session(path(), *p_->model, p_->state, kind);
    std::vector<uint8_t> b = read_bytes(path());
    edit(b);
    reseal(b);
    write_bytes(path(), b);
    expect_refused(path(), *p_->model, what);
  }
  std::string path() const { return tmp_ / "s.ds41session"; }
  static constexpr size_t kBody = 32;  // magic, version, kind, fingerprint, body length
  const Prefilled* p_ = nullptr;
  test::TempDir tmp_;
};

TEST_F(SessionFields, InconsistentContentsAreRefusedEvenUnderAValidChecksum) {
  const auto E = SessionKind::Exact;
  // pos 151 -> 150: entries and histories no longer match
  expect_edit_refused(E, [](auto& b) { b[kBody] ^= 1; }, "inconsistent with the model");
  // publisher = layer 0, a window-only layer
  expect_edit_refused(E, [](auto& b) { std::memset(&b[kBody + 8], 0, 4); }, "is not a kv-source layer");
  // history start beyond pos
  expect_edit_refused(E, [](auto& b) { b[kBody + 12 + 7] = 0x01; }, "history start");
  expect_edit_refused(E, [](auto& b) { b[kBody + 20] += 1; }, "layers, expected");  // layer count
  // layer 0: window start beyond pos
  expect_edit_refused(E, [](auto& b) { b[kBody + 24 + 8 + 6] = 0x01; }, "window start");
  // layer 0 ring-code count: absurdly large, must not allocate
  expect_edit_refused(E, [](auto& b) { b[kBody + 24 + 16 + 7] = 0x10; }, "window ring codes");

  const auto C = SessionKind::Compact;
  expect_edit_refused(C, [](auto& b) { b[kBody] ^= 1; }, "inconsistent with the model");
  expect_edit_refused(C, [](auto& b) { std::memset(&b[kBody + 8], 0, 4); }, "is not a kv-source layer");
  expect_edit_refused(C, [](auto& b) { b[kBody + 12] += 1; }, "kv-source layers, expected");
  expect_edit_refused(C, [](auto& b) { b[kBody + 16] = 3; }, "kv-source layer 3 where layer 2");
  expect_edit_refused(C, [](auto& b) { b[kBody + 20] += 1; }, "compressed entries");
  // The history start sits after the caches: 16 bytes before the token tail's count + data.
  const int64_t T = compact_history_length(p_->model->config(), p_->state.pos);
  expect_edit_refused(C, [&](auto& b) { b[b.size() - 8 - (8 + 8 * 0) - (8 + 4 * T) - 8] += 1; }, "history starts");
  // A token tail with an id outside the vocabulary.
  expect_edit_refused(C, [&](auto& b) { std::memset(&b[b.size() - 8 - 8 - 4], 0xff, 4); }, "outside the vocabulary");
}

}  // namespace
}  // namespace ds41
