// A small fixed-size thread pool for data-parallel loops over an index range.
//
// Determinism contract: parallel_for only decides *which thread* runs which contiguous part of
// [0, n); it never changes what is computed for an index. Kernels built on it compute every
// output element with the same arithmetic in the same order whatever the thread count, so the
// engine's numbers do not depend on the machine it runs on (the goldens' tolerances take the
// run-to-run noise, 1 vs 2 threads included, to be zero: shared/goldens/*/case.json).
//
// The caller thread takes part (it runs the first chunk), so ThreadPool(n) starts n - 1 worker
// threads. A call allocates nothing: the job is published through a pointer to the caller's
// std::function and counters, written under one mutex and read by polling workers without it
// (lambdas are wrapped by reference, see below).
// A decode step issues hundreds of short parallel loops, so waking sleeping threads through the
// kernel for each one cost more than some loops themselves: workers and the caller first poll
// atomics (pause hints, then yielding rounds for up to 2 ms), and only then sleep on the
// condition variables.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ds41 {

class ThreadPool {
 public:
  // fn(begin, end) processes indices [begin, end).
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;

  // n_threads counts the caller; values below 1 are treated as 1 (no worker threads).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Total threads that run chunks of a parallel_for, caller included.
  int size() const { return int(workers_.size()) + 1; }

  // Splits [0, n) into contiguous pieces that shrink towards the end ("guided"): each takes
  // 1/(2 size()) of the indices not yet given out, but at least n/(kMinPieceFraction size()) and at
  // least one. Each of the first min(n, size()) threads (the caller first) runs the piece of its
  // own number, then takes the pieces left in order as it becomes free: a thread that started
  // late or runs slower (a woken worker, a busier core) leaves its share to the others, and the
  // last pieces, small, leave little to wait for (equal quarters had the caller of a decode
  // step's batched MoE job, 40 tiles, waiting ~18 us of its 190 on the worker's last piece; over
  // a small-preset decode the callers' waits fell from 0.6-1.2 to 0.5 ms per token, decode
  // +1-3 %). Which thread computes an index never changes its value. The first exception thrown
  // by fn is rethrown here after every piece has finished. A call made from inside a running
  // piece (nesting) runs inline on that thread, and concurrent calls from different threads are
  // serialised; neither can deadlock.
  void parallel_for(int64_t n, const RangeFn& fn) { parallel_for(n, fn, 0); }
  // min_piece > 0 replaces the smallest piece's rule (n / (kMinPieceFraction size()), at least
  // one) for loops whose every index is a long stretch of work, where a piece of 1/64 of the loop
  // left one thread waiting up to that long at its end: the LM head's 337 items (groups of 384
  // rows) finished with pieces of 5 items, ~0.2 ms each at decode, and one thread waited ~0.1 ms
  // a token on average (two Xeon vCPUs; pieces of one item: ~15 us). Loops of short indices keep
  // the default: finer pieces everywhere cost the decode 1-4 % (more piece hand-offs and streams
  // cut short).
  void parallel_for(int64_t n, const RangeFn& fn, int64_t min_piece);
  static constexpr int kMinPieceFraction = 32;
  static constexpr int kMaxPiecesPerThread = 48;  // bounds the pieces of any n (ln-like growth)

  // Same for any callable (lambdas): wrapped by reference, so the std::function fits its
  // small-object buffer and the call allocates nothing however much the lambda captures.
  template <class F>
  void parallel_for(int64_t n, const F& fn) {
    const RangeFn by_reference = [&fn](int64_t begin, int64_t end) { fn(begin, end); };
    parallel_for(n, by_reference, 0);
  }

 private:
  void worker_main(int chunk_index);
  void run_chunk(int chunk_index);
  void run_piece(int64_t piece);
  int64_t split_into_pieces(int64_t n, int64_t min_piece);  // fills piece_begin_, returns the piece count

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one job at a time
  std::mutex mutex_;       // held while a job is written, for error_ and for the condition variables
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // Odd while the caller writes a job's fields, even once it is published (two bumps per job,
  // both under mutex_): a worker reads job_chunks_ without the mutex, as a seqlock reader (the
  // generation before and after the read equal and even).
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  const RangeFn* job_ = nullptr;
  std::atomic<int> job_chunks_{0};     // threads taking part (each starts with its own piece)
  int64_t job_pieces_ = 0;
  std::vector<int64_t> piece_begin_;    // piece p is [piece_begin_[p], piece_begin_[p + 1])
  std::atomic<int64_t> next_piece_{0};  // the first piece nobody has taken yet
  std::atomic<int> pending_{0};  // worker chunks of the current job not finished yet
  // Set (under mutex_) while the caller sleeps on done_cv_: only then does the worker finishing
  // the last chunk take the mutex to wake it.
  std::atomic<bool> caller_sleeping_{false};
  std::exception_ptr error_;                // under mutex_
  std::atomic<bool> has_error_{false};      // error_ is set: the caller takes the mutex only then
};

// Bounds of part c when [0, n) is split into `chunks` contiguous parts of near-equal length (the
// first n % chunks one longer): how callers cut work into a fixed number of items.
inline int64_t chunk_begin(int64_t n, int64_t chunks, int64_t c) {
  const int64_t base = n / chunks;
  const int64_t extra = n % chunks;
  return c * base + (c < extra ? c : extra);
}

// Below this much work (multiply-adds, or element operations of similar cost) a job runs on the
// caller alone: waking workers costs more than the work. Which thread computes an element never
// changes its value, so this is speed only.
constexpr int64_t kMinParallelWork = int64_t{1} << 16;

inline ThreadPool* pool_for_work(ThreadPool* pool, int64_t work) {
  return work < kMinParallelWork ? nullptr : pool;
}

// nullptr or a one-thread pool runs fn(0, n) inline on the caller. min_piece: ThreadPool's.
void parallel_for(ThreadPool* pool, int64_t n, const ThreadPool::RangeFn& fn, int64_t min_piece = 0);

template <class F>
void parallel_for(ThreadPool* pool, int64_t n, const F& fn, int64_t min_piece = 0) {
  const ThreadPool::RangeFn by_reference = [&fn](int64_t begin, int64_t end) { fn(begin, end); };
  parallel_for(pool, n, by_reference, min_piece);
}

}  // namespace ds41
