// No heap allocation in steady-state decode (issue #10): with the sequence's caches reserved for
// the planned length (reserve_sequence) and a few steps run to size the per-thread scratch
// buffers, further decode steps of the tiny model (Engram, compressors, indexers, candidate pool,
// MoE: every path of the forward pass) call operator new zero times, on the calling thread and
// on the thread pool's workers, at the scalar kernel level and at the best SIMD level. The same
// holds for the loops around it: sampling with every filter and penalty (Generation), and
// speculative cycles (draft, journaled verify, acceptance, rollback, draft-ring commit).
//
// This binary replaces the global operator new/delete with counting forwarders to malloc/free
// (only while `g_counting` is set do they count); it is not built with sanitizers (label slow).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <cstdlib>
#include <new>
#include <random>

#include "base/thread_pool.h"
#include "kernels/simd_level.h"
#include "runtime/generation.h"
#include "runtime/speculative.h"
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

std::vector<int32_t> counting_prompt(int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[size_t(i)] = int32_t(7 * i + 3);
  return p;
}

// `operator new` calls during 16 steps of a Generation with `so` and `fo`, after 6 warm-up
// steps; `screened`: whether the warm steps' logits came from the head screen (-inf outside the top).
struct GenerationAllocations {
  int64_t allocations = 0;
  bool screened = false;
};
GenerationAllocations generation_allocations(const SamplerOptions& so, const ForwardOptions& fo = {}) {
  auto model = Model::load(test::tiny_model_dir(true));
  ThreadPool pool(2);
  SequenceState st = model->new_sequence();
  reserve_sequence(st, model->config(), model->plan(), 200);
  Generation g(*model, std::move(st), Sampler(so), &pool, fo);
  g.feed(counting_prompt(100));
  GenerationAllocations r;
  for (int i = 0; i < 6; ++i)
    if (!g.next_token()) {
      ADD_FAILURE() << "the context filled during the warm-up";
      r.allocations = -1;
      return r;
    }
  const auto& logits = g.last_logits();
  r.screened = std::count(logits.begin(), logits.end(), -std::numeric_limits<float>::infinity()) > 0;
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 16; ++i) g.next_token();
  g_counting = false;
  r.allocations = g_allocations.load();
  return r;
}

// The generation loop as `ds41 run` and the server drive it, sampling included: every filter and
// penalty on (their buffers live in the Generation's SamplerScratch once warm).
TEST(DecodeAllocations, SampledGenerationAllocatesNothing) {
  SamplerOptions so;
  so.temperature = 0.8;
  so.top_k = 40;
  so.top_p = 0.9;
  so.min_p = 0.01;
  so.repetition_penalty = 1.1;
  so.presence_penalty = 0.2;
  so.frequency_penalty = 0.1;
  so.seed = 5;
  const GenerationAllocations r = generation_allocations(so);
  EXPECT_FALSE(r.screened);
  EXPECT_EQ(r.allocations, 0);
}

// Top-k sampling without penalties asked to take the LM head screen (as greedy steps do).
TEST(DecodeAllocations, TopKSampledGenerationWithTheHeadScreenAllocatesNothing) {
  SamplerOptions so;
  so.temperature = 0.8;
  so.top_k = 40;
  so.top_p = 0.9;
  so.min_p = 0.01;
  so.seed = 5;
  ForwardOptions fo;
  fo.head_top_k = 40;
  const GenerationAllocations r = generation_allocations(so, fo);
  EXPECT_TRUE(r.screened) << "the screen did not run";
  EXPECT_EQ(r.allocations, 0);
}

// Greedy generation, whose steps take the LM head screen (model/head_screen.h): its candidate
// count changes from step to step, its buffers are sized for the most it accepts.
TEST(DecodeAllocations, GreedyGenerationWithTheHeadScreenAllocatesNothing) {
  const GenerationAllocations r = generation_allocations(SamplerOptions{});
  EXPECT_TRUE(r.screened) << "the screen did not run";
  EXPECT_EQ(r.allocations, 0);
}

// Speculative cycles (draft, journaled verify, accept, rollback, ring commit) with drafts forced
// to be right for 0..γ tokens in turn, so that every acceptance count and rollback length occurs
// while counting (each also once in the warm-up), and with sampled verification (penalties and
// filters on, drafts from the drafter).
TEST(DecodeAllocations, SpeculativeCyclesAllocateNothing) {
  auto model = Model::load(test::tiny_model_dir(true));
  ASSERT_TRUE(model->has_dspark());
  ThreadPool pool(2);
  const std::vector<int32_t> prompt = counting_prompt(100);
  const int gamma = int(model->config().dspark_block_size);
  const int warmup = gamma + 2, measured = 2 * (gamma + 1);

  // Plain greedy decoding gives the right drafts: sequence[p] = the token at position p.
  std::vector<int32_t> sequence = prompt;
  {
    SequenceState st = model->new_sequence();
    Generation plain(*model, std::move(st), Sampler(SamplerOptions{}), &pool);
    plain.feed(prompt);
    for (int i = 0; i < (warmup + measured) * (gamma + 1) + 2; ++i) sequence.push_back(*plain.next_token());
  }

  for (const bool sampled : {false, true}) {
    SpeculativeOptions opt;
    int cycle = 0;
    if (sampled) {
      opt.sampling.temperature = 0.8;
      opt.sampling.top_k = 40;
      opt.sampling.top_p = 0.9;
      opt.sampling.repetition_penalty = 1.1;
      opt.sampling.seed = 3;
    } else {
      opt.override_drafts = [&](int64_t pos, std::vector<int32_t>& drafts) {
        const int right = cycle++ % (gamma + 1);
        for (size_t i = 0; i < drafts.size(); ++i) {
          const int32_t truth = sequence[size_t(pos) + i];
          drafts[i] = int(i) < right ? truth : (truth + 1) % 1000;
        }
      };
    }
    SequenceState st = model->new_sequence();
    reserve_sequence(st, model->config(), model->plan(), int64_t(sequence.size()) + 16);
    SpeculativeDecoder dec(*model, st, opt, &pool);
    const std::vector<float> first = dec.prefill(prompt);
    int32_t tok = argmax_token(first.data(), model->config().vocab_size);
    std::vector<int32_t> out;
    std::vector<float> rows;
    auto run = [&](int cycles) {
      for (int i = 0; i < cycles; ++i) {
        dec.step_into(out, tok, 64, &rows);
        ASSERT_FALSE(out.empty());
        tok = out.back();
      }
    };
    run(warmup);
    const int64_t accepted_before = dec.stats().accepted;
    g_allocations = 0;
    g_counting = true;
    run(measured);
    g_counting = false;
    EXPECT_EQ(g_allocations.load(), 0) << (sampled ? "sampled" : "greedy, forced drafts");
    if (!sampled) {  // each acceptance count 0..γ twice
      EXPECT_EQ(dec.stats().accepted - accepted_before, int64_t(gamma * (gamma + 1)));
    }
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

