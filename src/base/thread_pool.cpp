#include "base/thread_pool.h"

#include <algorithm>

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
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  const int workers = std::max(n_threads, 1) - 1;
  workers_.reserve(size_t(workers));
  for (int w = 0; w < workers; ++w) workers_.emplace_back([this, w] { worker_main(w + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_chunk(int chunk_index) {
  const int64_t begin = chunk_begin(job_n_, job_chunks_, chunk_index);
  const int64_t end = chunk_begin(job_n_, job_chunks_, chunk_index + 1);
  try {
    InsideChunkScope scope;
    if (begin < end) (*job_)(begin, end);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::worker_main(int chunk_index) {
  uint64_t seen_generation = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
    if (stopping_) return;
    seen_generation = generation_;
    // A job with fewer chunks than threads leaves the higher-numbered workers idle; pending_
    // only counts the workers that do have a chunk, so skipping is safe.
    if (chunk_index >= job_chunks_) continue;
    lock.unlock();
    run_chunk(chunk_index);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn) {
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
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = chunks - 1;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  run_chunk(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

void parallel_for(ThreadPool* pool, int64_t n, const ThreadPool::RangeFn& fn) {
  if (n <= 0) return;
  if (pool == nullptr) {
    fn(0, n);
    return;
  }
  pool->parallel_for(n, fn);
}

}  // namespace ds41
