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
    stopping_.store(true);
    generation_.fetch_add(2, std::memory_order_release);  // ends the workers' polling at once
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
    has_error_.store(true, std::memory_order_release);
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
    // A new job: the generation moved on and is even (published). Its fields were written before
    // the release bump that made it even, so this acquire load makes them visible.
    const auto new_job = [&] {
      const uint64_t g = generation_.load(std::memory_order_acquire);
      return g != seen_generation && g % 2 == 0;
    };
    if (!spin_until(new_job)) {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_.load() || new_job(); });
    }
    if (stopping_.load()) return;
    // Which job and whether it has a chunk for this thread, read without the mutex (a seqlock
    // read, generation_ above): a worker without a chunk is not waited for, so the caller may
    // already be writing the next job, and then the generation differs and the read is redone.
    // (Taking the mutex here, and again to report the last chunk done, had each job's start and
    // end wait on the mutex's cache line moving between cores: on two Xeon vCPUs a job's chunk
    // started 1.5 us after its publication on average.)
    uint64_t g;
    bool has_chunk;
    for (;;) {
      g = generation_.load(std::memory_order_acquire);
      if (g % 2 != 0) {  // being written
        cpu_relax();
        continue;
      }
      has_chunk = chunk_index < job_chunks_.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (generation_.load(std::memory_order_relaxed) == g) break;
    }
    seen_generation = g;
    // A job with fewer chunks than threads leaves the higher-numbered workers idle; pending_ only
    // counts the workers that do have a chunk, so skipping is safe.
    if (!has_chunk) continue;
    run_chunk(chunk_index);
    // The caller reads pending_ before it sleeps (caller_sleeping_ set first, both seq_cst), so
    // either it sees 0 here or this thread sees it sleeping and wakes it.
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lock(mutex_);
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
    generation_.fetch_add(1, std::memory_order_relaxed);  // odd: the fields below are being written
    std::atomic_thread_fence(std::memory_order_release);
    job_ = &fn;
    job_chunks_.store(chunks, std::memory_order_relaxed);
    job_pieces_ = split_into_pieces(n, min_piece);
    next_piece_.store(chunks, std::memory_order_relaxed);
    pending_.store(chunks - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);  // even: published
  }
  start_cv_.notify_all();
  run_chunk(0);
  const auto all_done = [&] { return pending_.load() == 0; };
  if (!spin_until(all_done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    caller_sleeping_.store(true);
    done_cv_.wait(lock, all_done);
    caller_sleeping_.store(false);
  }
  job_ = nullptr;
  if (has_error_.load(std::memory_order_acquire)) {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error = error_;
      error_ = nullptr;
      has_error_.store(false, std::memory_order_relaxed);
    }
    std::rethrow_exception(error);
  }
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
