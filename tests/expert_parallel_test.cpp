// Expert parallelism (model/expert_parallel.h) without MPI: rank 0's model hands the rows of
// the other ranks' experts to follower models in the same process (loaded with only their share,
// as `mpirun` followers are), and every output - prefill logits of every position, chunked
// prefill, decode, a batched step, DSpark drafts - equals the one-process model's bit for bit, for
// 2, 3 and 5 ranks, with the followers' experts in RAM or streamed through one slot. The MPI
// transport itself runs under mpirun in tests/dist/mpi_test.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/expert_parallel.h"
#include "model/model.h"
#include "model/split_checkpoint.h"
#include "model_transcript.h"
#include "state_compare.h"
#include "test_paths.h"
#include "tiny_model.h"

namespace ds41 {
namespace {

// Followers in this process. start() only records the call; finish() computes the followers'
// rows (after rank 0 has computed its own, as over MPI).
class LoopbackExperts final : public ExpertParallel {
 public:
  // Follower r loads dirs[r] (or dirs[0] when there is one directory for every rank).
  LoopbackExperts(const std::vector<std::string>& dirs, int ranks, int64_t follower_slots) : ranks_(ranks) {
    for (int r = 1; r < ranks; ++r) {
      Model::LoadOptions o;
      o.share = ExpertShare{r, ranks, /*experts_only=*/true};
      o.expert_slots = follower_slots;
      followers_.push_back(Model::load(dirs.size() > 1 ? dirs[size_t(r)] : dirs[0], {}, o));
    }
  }
  int ranks() const override { return ranks_; }
  void begin_load(const FollowerLoad&) override { ++loads_; }
  void end_load(uint64_t fingerprint) override {
    for (const auto& f : followers_) EXPECT_EQ(f->checkpoint_fingerprint(), fingerprint);
  }
  void start(int layer, int64_t dim, const uint16_t* x, const int64_t* first, int E, const int* toks,
             const float* route_w, uint16_t* out) override {
    pending_ = Call{layer, dim, x, std::vector<int64_t>(first, first + E + 1), E, toks, route_w, out};
  }
  void finish() override {
    const Call& c = pending_;
    for (int r = 1; r < ranks_; ++r) {
      std::vector<int32_t> ids;
      std::vector<int64_t> starts;
      int64_t r0 = -1, r1 = -1;
      for (int e = 0; e < c.E; ++e) {
        if (expert_owner(e, c.E, ranks_) != r) continue;
        if (r0 < 0) r0 = c.first[size_t(e)];
        r1 = c.first[size_t(e) + 1];
        if (c.first[size_t(e) + 1] == c.first[size_t(e)]) continue;
        ids.push_back(e);
        starts.push_back(c.first[size_t(e)]);
      }
      if (ids.empty()) continue;
      for (int64_t& s : starts) s -= r0;
      starts.push_back(r1 - r0);
      std::vector<uint16_t> xin(size_t((r1 - r0) * c.dim));
      for (int64_t row = r0; row < r1; ++row)
        std::copy_n(c.x + int64_t(c.toks[row]) * c.dim, c.dim, xin.begin() + (row - r0) * c.dim);
      followers_[size_t(r - 1)]->expert_products(c.layer, ids.data(), int(ids.size()), starts.data(), xin.data(),
                                                 c.route_w + r0, c.out + r0 * c.dim, &pool_);
      rows_ += r1 - r0;
    }
  }
  int64_t rows() const { return rows_; }
  int loads() const { return loads_; }
  const Model& follower(int r) const { return *followers_[size_t(r - 1)]; }

 private:
  struct Call {
    int layer = 0;
    int64_t dim = 0;
    const uint16_t* x = nullptr;
    std::vector<int64_t> first;
    int E = 0;
    const int* toks = nullptr;
    const float* route_w = nullptr;
    uint16_t* out = nullptr;
  };
  int ranks_;
  std::vector<std::unique_ptr<Model>> followers_;
  Call pending_;
  int64_t rows_ = 0;
  int loads_ = 0;
  ThreadPool pool_{1};
};

TEST(ExpertParallel, OwnershipIsContiguousBalancedBlocks) {
  for (int E : {1, 4, 7, 16, 384})
    for (int N : {1, 2, 3, 4, 5, 8}) {
      std::vector<int> count(size_t(N), 0);
      for (int e = 0; e < E; ++e) {
        const int r = expert_owner(e, E, N);
        ASSERT_GE(r, 0);
        ASSERT_LT(r, N);
        if (e > 0) ASSERT_GE(r, expert_owner(e - 1, E, N)) << "blocks are contiguous and ascending";
        ++count[size_t(r)];
      }
      const auto [lo, hi] = std::minmax_element(count.begin(), count.end());
      EXPECT_LE(*hi - *lo, 1) << E << " experts over " << N << " ranks";
      EXPECT_EQ(expert_owner(0, E, N), 0) << "rank 0 holds expert 0 (what bench reads for shapes)";
    }
}

TEST(ExpertParallel, SplitAcrossRanksGivesTheOneProcessOutputsBitForBit) {
  ThreadPool pool(2);
  const std::string dir = test::tiny_model_dir(true);
  auto whole = Model::load(dir);
  const auto want = test::transcript(*whole, &pool);
  for (const auto& [ranks, follower_slots] : {std::pair{2, 0}, std::pair{3, 1}, std::pair{5, 0}}) {
    SCOPED_TRACE(testing::Message() << ranks << " ranks, follower slots " << follower_slots);
    auto remote = std::make_shared<LoopbackExperts>(std::vector<std::string>{dir}, ranks, follower_slots);
    Model::LoadOptions o;
    o.share = ExpertShare{0, ranks, false};
    o.expert_parallel = remote;
    auto rank0 = Model::load(dir, {}, o);
    EXPECT_EQ(remote->loads(), 1);
    // Each holds only its block: rank 0's and the followers' expert bytes add up to the whole.
    int64_t held = rank0->memory_plan().expert_bytes;
    for (int r = 1; r < ranks; ++r) {
      held += remote->follower(r).memory_plan().expert_bytes;
      // Resident: its experts' decode copies only (slab bytes never handed out aside), no mapped
      // tensor of the dense part.
      int64_t copies = -remote->follower(r).weights().owned_unused_bytes;
      for (const ByteBuffer& b : remote->follower(r).weights().owned) copies += int64_t(b.size());
      EXPECT_EQ(remote->follower(r).memory_plan().resident_bytes, copies);
      EXPECT_EQ(remote->follower(r).weights().head, nullptr);
    }
    EXPECT_EQ(held, whole->memory_plan().expert_bytes);
    EXPECT_LT(rank0->memory_plan().expert_bytes, whole->memory_plan().expert_bytes);
    const auto got = test::transcript(*rank0, &pool);
    EXPECT_GT(remote->rows(), 0) << "no row went to another rank";
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(test::same_bits(got[i], want[i])) << "output " << i;
  }
}

// Per-host copies (`ds41 split`): each rank loads a directory holding only what it reads, and the
// outputs are still the one-process model's; a copy is refused by the wrong rank and outside a job.
TEST(ExpertParallel, SplitCopiesPerRankGiveTheSameOutputs) {
  ThreadPool pool(2);
  const std::string dir = test::tiny_model_dir(true);
  const auto want = test::transcript(*Model::load(dir), &pool);
  test::TempDir tmp;
  constexpr int kRanks = 3;
  std::vector<std::string> dirs;
  int64_t written = 0;
  for (int r = 0; r < kRanks; ++r) {
    dirs.push_back(tmp.path() + "/rank" + std::to_string(r));
    written += write_split_checkpoint(dir, kRanks, r, dirs.back(), 1 << 20);
  }
  // Together the copies hold each tensor of the checkpoint exactly once.
  const TensorStore whole = TensorStore::open(dir);
  int64_t whole_bytes = 0;
  for (const TensorInfo& t : whole.tensors()) whole_bytes += int64_t(t.nbytes);
  EXPECT_EQ(written, whole_bytes);
  const TensorStore follower_copy = TensorStore::open(dirs[1]);
  for (const TensorInfo& t : follower_copy.tensors())
    EXPECT_NE(t.name.find(".ffn.experts."), std::string::npos) << t.name << " in a follower's copy";

  auto remote = std::make_shared<LoopbackExperts>(dirs, kRanks, 0);
  Model::LoadOptions o;
  o.share = ExpertShare{0, kRanks, false};
  o.expert_parallel = remote;
  auto rank0 = Model::load(dirs[0], {}, o);
  EXPECT_EQ(rank0->checkpoint_fingerprint(), Model::load(dir)->checkpoint_fingerprint());
  const auto got = test::transcript(*rank0, &pool);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(test::same_bits(got[i], want[i])) << "output " << i;

  Model::LoadOptions wrong;
  wrong.share = ExpertShare{2, kRanks, true};
  try {
    Model::load(dirs[1], {}, wrong);
    ADD_FAILURE() << "rank 2 loaded rank 1's copy";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("split for rank 1 of 3, but it was given to rank 2 of 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Model::load(dirs[0]), Error) << "a copy for a job loaded in one process";
  EXPECT_THROW(write_split_checkpoint(dir, kRanks, 0, dirs[0], 1 << 20), Error) << "over an existing copy";
}

TEST(ExpertParallel, AFollowerRefusesExpertsItDoesNotHold) {
  const std::string dir = test::tiny_model_dir(false);
  Model::LoadOptions o;
  o.share = ExpertShare{1, 2, true};
  auto follower = Model::load(dir, {}, o);
  const int E = follower->plan().layers[0].routed_experts;
  const int64_t D = follower->config().dim;
  std::vector<uint16_t> x(static_cast<size_t>(D)), out(static_cast<size_t>(D));
  const float w = 1.f;
  const int64_t first[] = {0, 1};
  const int32_t mine = E - 1, theirs = 0;
  ThreadPool pool(1);
  EXPECT_NO_THROW(follower->expert_products(0, &mine, 1, first, x.data(), &w, out.data(), &pool));
  EXPECT_THROW(follower->expert_products(0, &theirs, 1, first, x.data(), &w, out.data(), &pool), Error);
  EXPECT_THROW(follower->expert_products(99, &mine, 1, first, x.data(), &w, out.data(), &pool), Error);
}

}  // namespace
}  // namespace ds41
