#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ds41 {
namespace {

TEST(ThreadPool, SizeCountsTheCaller) {
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool(3).size(), 3);
  EXPECT_EQ(ThreadPool(0).size(), 1);
  EXPECT_EQ(ThreadPool(-2).size(), 1);
}

TEST(ThreadPool, ChunkBoundsAreContiguousAndBalanced) {
  // 10 over 3 chunks: the first 10 % 3 = 1 chunk is one longer -> [0,4) [4,7) [7,10).
  EXPECT_EQ(chunk_begin(10, 3, 0), 0);
  EXPECT_EQ(chunk_begin(10, 3, 1), 4);
  EXPECT_EQ(chunk_begin(10, 3, 2), 7);
  EXPECT_EQ(chunk_begin(10, 3, 3), 10);
  EXPECT_EQ(chunk_begin(2, 2, 1), 1);
}

TEST(ThreadPool, EveryIndexRunsExactlyOnceInShrinkingPieces) {
  for (int threads : {1, 2, 3, 4})
    for (int64_t min_piece : {0, 1, 3}) {  // 0: the default rule
      ThreadPool pool(threads);
      for (int64_t n : {0, 1, 2, 3, 5, 17, 40, 337, 1000, 100000}) {
        std::vector<std::atomic<int>> hits(size_t(n > 0 ? n : 1));
        std::mutex m;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        pool.parallel_for(
            n,
            [&](int64_t begin, int64_t end) {
              ASSERT_LT(begin, end);
              {
                std::lock_guard<std::mutex> lock(m);
                ranges.emplace_back(begin, end);
              }
              for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
            },
            min_piece);
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[size_t(i)].load(), 1) << "n=" << n;
        std::sort(ranges.begin(), ranges.end());
        if (threads == 1 || n <= 1) {  // one thread (or one index) runs [0, n) whole
          EXPECT_EQ(ranges.size(), size_t(n > 0 ? 1 : 0)) << "threads=" << threads << " n=" << n;
          continue;
        }
        // Contiguous pieces, each at most 1/(2 threads) of what was left (rounded up) and no longer
        // than the one before: the last ones are small. At least one per thread, a bounded number.
        ASSERT_FALSE(ranges.empty());
        EXPECT_EQ(ranges.front().first, 0);
        EXPECT_EQ(ranges.back().second, n);
        const int64_t min_size =
            min_piece > 0 ? std::clamp<int64_t>(n / threads, 1, min_piece)
                          : std::max<int64_t>(1, n / (ThreadPool::kMinPieceFraction * threads));
        for (size_t p = 0; p < ranges.size(); ++p) {
          const int64_t size = ranges[p].second - ranges[p].first, left = n - ranges[p].first;
          if (p > 0) {
            EXPECT_EQ(ranges[p].first, ranges[p - 1].second);
            EXPECT_LE(size, ranges[p - 1].second - ranges[p - 1].first) << "n=" << n << " piece " << p;
          }
          EXPECT_LE(size, std::max(std::min(min_size, left), (left + 2 * threads - 1) / (2 * threads)))
              << "n=" << n << " piece " << p;
        }
        EXPECT_GE(ranges.size(), size_t(std::min<int64_t>(n, threads)));
        EXPECT_LE(ranges.size(), size_t(ThreadPool::kMaxPiecesPerThread * threads));
        const int64_t last = ranges.back().second - ranges.back().first;
        EXPECT_LE(last, min_size) << "threads=" << threads << " n=" << n;
      }
    }
}

TEST(ThreadPool, WorkersActuallyRunChunks) {
  ThreadPool pool(3);
  std::vector<std::thread::id> ids(3);
  pool.parallel_for(
      3, [&](int64_t begin, int64_t) { ids[size_t(begin)] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], std::this_thread::get_id());  // the caller takes the first chunk
  EXPECT_NE(ids[1], ids[0]);
  EXPECT_NE(ids[2], ids[0]);
  EXPECT_NE(ids[1], ids[2]);
}

// Workers poll for a while after a job, then sleep on the condition variable: a job published
// after that (here 30 ms later, well past the polling budget) must wake them, and one published
// while they still poll must be seen without waking.
TEST(ThreadPool, JobsReachPollingAndSleepingWorkers) {
  ThreadPool pool(3);
  for (int pause_ms : {0, 30, 0, 30}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    std::vector<std::thread::id> ids(3);
    pool.parallel_for(3, [&](int64_t begin, int64_t) { ids[size_t(begin)] = std::this_thread::get_id(); });
    EXPECT_EQ(ids[0], std::this_thread::get_id()) << "pause " << pause_ms << " ms";
    EXPECT_NE(ids[1], ids[0]);
    EXPECT_NE(ids[2], ids[0]);
    EXPECT_NE(ids[1], ids[2]);
  }
}

TEST(ThreadPool, FreeThreadsTakeTheSlowThreadsShare) {
  ThreadPool pool(2);
  std::mutex m;
  std::vector<std::thread::id> owner(8);
  int64_t first_piece = 0;
  pool.parallel_for(8, [&](int64_t begin, int64_t end) {
    if (begin == 0) {  // the caller's own piece
      first_piece = end;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::lock_guard<std::mutex> lock(m);
    for (int64_t i = begin; i < end; ++i) owner[size_t(i)] = std::this_thread::get_id();
  });
  int by_caller = 0;
  for (const auto& id : owner) by_caller += id == std::this_thread::get_id();
  EXPECT_GE(first_piece, 1);
  EXPECT_LT(first_piece, 8);
  EXPECT_EQ(by_caller, first_piece);  // only its first piece: the worker took the others meanwhile
}

TEST(ThreadPool, NullOrSingleThreadPoolRunsInline) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  parallel_for(nullptr, 7, [&](int64_t b, int64_t e) { ranges.push_back({b, e}); });
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], std::make_pair(int64_t{0}, int64_t{7}));
  ThreadPool single(1);
  ranges.clear();
  parallel_for(&single, 7, [&](int64_t b, int64_t e) { ranges.push_back({b, e}); });
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], std::make_pair(int64_t{0}, int64_t{7}));
}

TEST(ThreadPool, NestedCallsRunInlineInsteadOfDeadlocking) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t ib, int64_t ie) { total.fetch_add(ie - ib); });
  });
  EXPECT_EQ(total.load(), 40);
}

TEST(ThreadPool, FirstExceptionIsRethrownAfterAllChunksFinish) {
  ThreadPool pool(3);
  std::atomic<int> finished{0};
  EXPECT_THROW(pool.parallel_for(3,
                                 [&](int64_t b, int64_t) {
                                   if (b == 1) throw std::runtime_error("chunk 1 failed");
                                   finished.fetch_add(1);
                                 }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 2);
  // The pool stays usable afterwards.
  std::atomic<int> count{0};
  pool.parallel_for(6, [&](int64_t b, int64_t e) { count.fetch_add(int(e - b)); });
  EXPECT_EQ(count.load(), 6);
}

TEST(ThreadPool, ConcurrentCallersAreSerialised) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto job = [&] {
    for (int rep = 0; rep < 50; ++rep)
      pool.parallel_for(100, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
  };
  std::thread other(job);
  job();
  other.join();
  EXPECT_EQ(total.load(), 2 * 50 * 100);
}

// Many back-to-back short jobs, most with fewer chunks than threads: the workers spin between
// jobs and an idle worker may still be looking at one job when the next is published. Every
// index must run exactly once per job, never twice and never skipped.
TEST(ThreadPool, BackToBackShortJobsRunEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(5);
  int64_t expected = 0;
  for (int job = 0; job < 10000; ++job) {
    const int64_t n = 1 + job % 5;
    expected += n;
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1, std::memory_order_relaxed);
    });
    if (job % 2500 == 2499) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let workers sleep
  }
  int64_t total = 0;
  for (int i = 0; i < 5; ++i) total += hits[size_t(i)].load();
  EXPECT_EQ(total, expected);
  // Index i runs in every job with n > i: 10000 jobs cycle n = 1..5 evenly.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(hits[size_t(i)].load(), 2000 * (5 - i)) << i;
}

// Failing jobs among short ones: each failure is rethrown by its own call only (the error is
// taken and cleared by the caller), and the calls after it run normally.
TEST(ThreadPool, FailuresAmongShortJobsStayWithTheirCall) {
  ThreadPool pool(3);
  std::atomic<int64_t> ran{0};
  int64_t expected = 0;
  for (int job = 0; job < 3000; ++job) {
    const int64_t n = 1 + job % 4;
    const bool fail = job % 7 == 3;
    const auto body = [&](int64_t b, int64_t e) {
      if (fail && b <= n - 1 && n - 1 < e) throw std::runtime_error("index n - 1 failed");
      ran.fetch_add(e - b, std::memory_order_relaxed);
    };
    if (fail) {
      EXPECT_THROW(pool.parallel_for(n, body), std::runtime_error) << "job " << job;
    } else {
      EXPECT_NO_THROW(pool.parallel_for(n, body)) << "job " << job;
      expected += n;
    }
  }
  // Failing jobs run their other pieces too; count only what the passing jobs must have run.
  EXPECT_GE(ran.load(), expected);
}

}  // namespace
}  // namespace ds41
