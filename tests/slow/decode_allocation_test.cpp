// No heap allocation in steady-state decode (issue #10): with the sequence's caches reserved for
// the planned length (reserve_sequence) and a few steps run to size the per-thread scratch
// buffers, further decode steps of the tiny model (Engram, compressors, indexers, candidate pool,
// MoE: every path of the forward pass) call operator new zero times, on the calling thread and
// on the thread pool's workers, at the scalar kernel level and at the best SIMD level.
//
// This binary replaces the global operator new/delete with counting forwarders to malloc/free
// (only while `g_counting` is set do they count); it is not built with sanitizers (label slow).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>

#include "base/thread_pool.h"
#include "kernels/simd_level.h"
#include "../tiny_model.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};

void* counted_alloc(std::size_t n, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align) : std::malloc(n);
  return p;
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_alloc(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = counted_alloc(n, std::size_t(a))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = counted_alloc(n, std::size_t(a))) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace ds41 {
namespace {

long allocations_in_decode_steps(const Model& m, ThreadPool* pool) {
  const int prompt_len = 150, warmup = 6, measured = 16;
  SequenceState st = m.new_sequence();
  reserve_sequence(st, m.config(), m.plan(), prompt_len + warmup + measured + 8);
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(prompt_len);
  for (auto& t : prompt) t = int32_t(rng() % 129280);
  std::vector<float> logits;
  m.forward_into(logits, st, prompt, ForwardOptions{}, pool);
  std::vector<int32_t> token(1);
  auto step = [&] {
    token[0] = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    m.forward_into(logits, st, token, ForwardOptions{}, pool);
  };
  for (int i = 0; i < warmup; ++i) step();
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < measured; ++i) step();
  g_counting = false;
  return g_allocations.load();
}

TEST(DecodeAllocations, SteadyStateDecodeAllocatesNothing) {
  auto model = Model::load(test::tiny_model_dir(true));
  ThreadPool pool(3);
  for (SimdLevel level : {SimdLevel::Scalar, simd_level_supported()}) {
    ScopedSimdLevel scoped(level);
    EXPECT_EQ(allocations_in_decode_steps(*model, &pool), 0) << simd_level_name(level);
    EXPECT_EQ(allocations_in_decode_steps(*model, nullptr), 0) << simd_level_name(level) << " without a pool";
  }
}

// The counter does count: an ordinary forward() returns a fresh logits vector.
TEST(DecodeAllocations, CounterSeesAllocations) {
  auto model = Model::load(test::tiny_model_dir(true));
  SequenceState st = model->new_sequence();
  model->forward(st, {0, 5, 9}, ForwardOptions{}, nullptr);
  g_allocations = 0;
  g_counting = true;
  model->forward(st, {11}, ForwardOptions{}, nullptr);
  g_counting = false;
  EXPECT_GT(g_allocations.load(), 0);
}

}  // namespace
}  // namespace ds41
