#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>

namespace ds41 {
namespace {
// Set while this thread runs a chunk of some pool's job; a parallel_for issued from inside a
// chunk then runs inline instead of waiting for workers that are busy with the outer job.
thread_local bool t_inside_chunk = false;

struct InsideChunkScope {
  bool previous = t_inside_chunk;
  InsideChunkScope() { t_inside_chunk = true; }
  ~InsideChunkScope() { t_inside_chunk = previous; }
};

// Before a thread sleeps on a condition variable it polls: a few rounds with the CPU's pause hint
// (the next job of a decode step usually arrives within microseconds), then rounds that yield the
// CPU, so that when more threads than cores want to run (other processes, parallel tests) the
// poller steps aside instead of burning the core someone else needs.
//
// The yielding rounds last kSpinBudget, not a count: waking a sleeping thread costs far more than
// a short gap. On a 2-vCPU VM (Xeon, KVM) a count of 128 yields ran out after 16-64 us, shorter
// than a decode step's serial stretches (a layer's router and SwiGLU, the sampling between
// tokens): ~38 times per token of the small preset the worker slept, and its wake-up (a futex
// wake and an inter-processor interrupt through the hypervisor) took 16-128 us - on average a
// parallel loop started 7.6 us late on the worker. Polling for 2 ms keeps it awake through a
// step and the gap to the next one (0.55 us average start, decode 45-46 -> 48.5-50 tok/s); an
// idle pool still sleeps 2 ms after its last job.
constexpr int kPauseRounds = 64;
constexpr auto kSpinBudget = std::chrono::microseconds(2000);
constexpr int kYieldsPerClockRead = 16;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls pred() until it holds or the budget runs out; returns pred().
template <class Pred>
bool spin_until(const Pred& pred) {
  for (int i = 0; i < kPauseRounds; ++i) {
    if (pred()) return true;
    cpu_relax();
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < kYieldsPerClockRead; ++i) {
      if (pred()) return true;
      std::this_thread::yield();
    }
    if (std::chrono::steady_clock::now() - start > kSpinBudget) return pred();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  const int workers = std::max(n_threads, 1) - 1;
  piece_begin_.resize(size_t(kMaxPiecesPerThread) * size_t(workers + 1) + 1);
  workers_.reserve(size_t(workers));
  for (int w = 0; w < workers; ++w) workers_.emplace_back([this, w] { worker_main(w + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);  // ends the workers' polling at once
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int64_t ThreadPool::split_into_pieces(int64_t n, int64_t min_piece) {
  const int64_t threads = size(), max_pieces = int64_t(piece_begin_.size()) - 1;
  // A given min_piece stays at most n / threads, so that every thread taking part has a piece of
  // its own to start with (run_chunk).
  const int64_t min_size = min_piece > 0 ? std::clamp<int64_t>(n / threads, 1, min_piece)
                                         : std::max<int64_t>(1, n / (kMinPieceFraction * threads));
  int64_t pieces = 0;
  for (int64_t begin = 0; begin < n; ++pieces) {
    piece_begin_[size_t(pieces)] = begin;
    const int64_t left = n - begin;
    begin += pieces + 1 == max_pieces ? left : std::max(min_size, (left + 2 * threads - 1) / (2 * threads));
  }
  piece_begin_[size_t(pieces)] = n;
  return pieces;
}

void ThreadPool::run_piece(int64_t piece) {
  const int64_t begin = piece_begin_[size_t(piece)], end = piece_begin_[size_t(piece) + 1];
  try {
    InsideChunkScope scope;
    if (begin < end) (*job_)(begin, end);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::run_chunk(int chunk_index) {
  run_piece(chunk_index);  // every participating thread's own first piece
  for (;;) {               // then the pieces left, to whichever thread is free first
    const int64_t piece = next_piece_.fetch_add(1, std::memory_order_relaxed);
    if (piece >= job_pieces_) return;
    run_piece(piece);
  }
}

void ThreadPool::worker_main(int chunk_index) {
  uint64_t seen_generation = 0;
  for (;;) {
    // Published jobs bump generation_ with release semantics after writing job_*, so seeing the
    // new value here (acquire) makes the job fields visible without taking the mutex.
    const auto new_job = [&] { return generation_.load(std::memory_order_acquire) != seen_generation; };
    if (!spin_until(new_job)) {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_ || new_job(); });
      if (stopping_) return;
    }
    bool has_chunk = false;
    {
      // Generation and job fields change together under the mutex: read them as one snapshot (a
      // worker without a chunk is not waited for, so the next job may already be published).
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      seen_generation = generation_.load(std::memory_order_relaxed);
      // A job with fewer chunks than threads leaves the higher-numbered workers idle; pending_
      // only counts the workers that do have a chunk, so skipping is safe.
      has_chunk = chunk_index < job_chunks_;
    }
    if (!has_chunk) continue;
    run_chunk(chunk_index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);  // the caller checks pending_ under it before sleeping
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t min_piece) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1 || t_inside_chunk) {
    InsideChunkScope scope;
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  const int chunks = int(std::min<int64_t>(n, size()));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_chunks_ = chunks;
    job_pieces_ = split_into_pieces(n, min_piece);
    next_piece_.store(chunks, std::memory_order_relaxed);
    pending_.store(chunks - 1, std::memory_order_relaxed);
    error_ = nullptr;
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  run_chunk(0);
  const auto all_done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  std::exception_ptr error;
  if (!spin_until(all_done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, all_done);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

void parallel_for(ThreadPool* pool, int64_t n, const ThreadPool::RangeFn& fn, int64_t min_piece) {
  if (n <= 0) return;
  if (pool == nullptr) {
    fn(0, n);
    return;
  }
  pool->parallel_for(n, fn, min_piece);
}

}  // namespace ds41
