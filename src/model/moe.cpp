// Mixture of experts (spec backbone.md §8.1-§8.2): sqrt(softplus) router scores, a selection bias
// (bias_vl for image-span tokens) that picks experts but does not weight them, top-k, renormalise
// (+1e-20, the training constant, not norm_eps), times route_scale; SwiGLU experts with the
// training clamps; routed outputs summed in fp32 in ascending expert order, shared expert last.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"
#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/vector_exp.h"
#include "kernels/numeric_formats.h"
#include "kernels/topk.h"
#include "model/expert_cache.h"
#include "model/expert_parallel.h"
#include "model/forward_context.h"

namespace ds41 {

namespace {

// The two halves of swiglu(), so that a row's exponentials can be taken in vectors between them:
// the gate is clamped from above only, then silu(gate) * clamp(up) with exp_neg_gate = exp(-gate).
float swiglu_gate(float gate, float limit) { return limit > 0 ? std::min(gate, limit) : gate; }
float swiglu_finish(float gate, float exp_neg_gate, float up, float limit) {
  if (limit > 0) up = std::clamp(up, -limit, limit);
  return gate / (1.f + exp_neg_gate) * up;  // silu(g) * u in fp32
}

}  // namespace

float swiglu(float gate, float up, float limit) {
  // F.silu's vector path, x / (1 + exp(-x)) with SLEEF's exp: every expert tensor it sees is
  // [rows][inter] with inter a multiple of 32, so no element falls in a scalar tail.
  const float g = swiglu_gate(gate, limit);
  return swiglu_finish(g, torch_vec_expf(-g), up, limit);
}

namespace {

enum class ScoreFunc { SqrtSoftplus, Sigmoid, Softmax };

ScoreFunc parse_score_func(const std::string& fn) {  // validated by config_problems
  return fn == "sqrtsoftplus" ? ScoreFunc::SqrtSoftplus : fn == "sigmoid" ? ScoreFunc::Sigmoid : ScoreFunc::Softmax;
}

// Router scores of one token, in place (softmax over the row, or elementwise). F.softplus runs
// over the call's [S][E] scores: exp and log1p of its vector path (SLEEF) except in the scalar
// tail, columns >= libm_from (libm; see torch_scalar_tail_from).
void apply_score_function(ScoreFunc fn, float* row, int E, int64_t libm_from) {
  switch (fn) {
    case ScoreFunc::SqrtSoftplus:
      for (int e = 0; e < E; ++e)  // F.softplus with threshold 20: linear above it
        row[e] = std::sqrt(row[e] > 20.f  ? row[e]
                           : e < libm_from ? torch_vec_log1pf(torch_vec_expf(row[e]))
                                           : std::log1p(std::exp(row[e])));
      break;
    case ScoreFunc::Sigmoid:
      for (int e = 0; e < E; ++e) row[e] = 1.f / (1.f + std::exp(-row[e]));
      break;
    case ScoreFunc::Softmax: {
      float mx = *std::max_element(row, row + E), sum = 0.f;
      for (int e = 0; e < E; ++e) sum += (row[e] = std::exp(row[e] - mx));
      for (int e = 0; e < E; ++e) row[e] /= sum;
      break;
    }
  }
}

// SwiGLU with the training clamps: up clamped both sides, gate from above only (§8.2); the
// routing weight (if any) multiplies before w2. One call takes several matrices' rows (a decode
// step's routed and shared experts), shared out as one parallel loop over all of them.
struct SwigluPart {
  const uint16_t* g;
  const uint16_t* u;
  uint16_t* h;
  int64_t rows, width;
  const float* route_w;  // per row, or nullptr
};
// An element (an expf and a few flops, ~5 ns on one Xeon core) counts as this many multiply-adds
// of work (pool_for_work): a decode step's 5 x 512 elements had taken 12 us on one thread with the
// other idle (and a 512-token prefill's rows, on one thread, ~2 % of its wall time).
constexpr int64_t kSwigluElementWork = 48;

void swiglu_parts(const SwigluPart* parts, int count, float limit, ThreadPool* pool) {
  int64_t rows = 0, elements = 0;
  for (int i = 0; i < count; ++i) {
    rows += parts[i].rows;
    elements += parts[i].rows * parts[i].width;
  }
  int64_t widest = 0;
  for (int i = 0; i < count; ++i) widest = std::max(widest, parts[i].width);
  parallel_for(pool_for_work(pool, elements * kSwigluElementWork), rows, [&](int64_t r0, int64_t r1) {
    // swiglu() row by row, its exponentials in vectors (the same values).
    DS41_SCRATCH_UNINIT(float, gate, widest, 0);
    DS41_SCRATCH_UNINIT(float, e, widest, 0);
    int i = 0;
    int64_t first = 0;  // the first row of part i
    for (int64_t r = r0; r < r1; ++r) {
      while (r >= first + parts[i].rows) first += parts[i++].rows;
      const SwigluPart& p = parts[i];
      const int64_t row = r - first, I = p.width;
      for (int64_t c = 0; c < I; ++c) {
        gate[size_t(c)] = swiglu_gate(bf16_to_f32(p.g[row * I + c]), limit);
        e[size_t(c)] = -gate[size_t(c)];
      }
      torch_vec_expf_in_place(e.data(), I);
      for (int64_t c = 0; c < I; ++c) {
        float a = swiglu_finish(gate[size_t(c)], e[size_t(c)], bf16_to_f32(p.u[row * I + c]), limit);
        if (p.route_w) a = p.route_w[row] * a;
        p.h[row * I + c] = f32_to_bf16(a);
      }
    }
  });
}

template <class Lin>
void expert_rows(const uint16_t* x, int64_t n, const Lin& w1, const Lin& w2, const Lin& w3, const float* route_w,
                 float limit, uint16_t* out, ThreadPool* pool,
                 void (*linear)(const uint16_t*, int64_t, const Lin&, uint16_t*, ThreadPool*)) {
  const int64_t I = w1.N;
  DS41_SCRATCH_UNINIT(uint16_t, g, n * I, 0);  // all three written whole before they are read
  DS41_SCRATCH_UNINIT(uint16_t, u, n * I, 0);
  DS41_SCRATCH_UNINIT(uint16_t, h, n * I, 0);
  linear(x, n, w1, g.data(), pool);
  linear(x, n, w3, u.data(), pool);
  const SwigluPart part{g.data(), u.data(), h.data(), n, I, route_w};
  swiglu_parts(&part, 1, limit, pool);
  linear(h.data(), n, w2, out, pool);
}

// Calls with at most this many (token, expert) pairs run every expert of the layer, the shared one
// included, as two batched parallel jobs (w1 and w3 of all, then w2 of all: linear_quantized_batch)
// instead of three calls per expert. Decode and speculative verification steps are this small;
// their experts' matrices are so small that per-call hand-offs were a large share of their time.
constexpr int64_t kBatchedExpertRows = 64;

// Items 0..n-1 grouped by key (a stable counting sort): group g's items, ascending, are
// order[first[g] .. first[g + 1]). Items whose key is outside [0, groups) are left out.
template <class Key>
void group_by_key(int64_t n, int64_t groups, const Key& key, std::vector<int64_t>& first, std::vector<int64_t>& order) {
  scratch_reserve(first, size_t(groups) + 1);
  first.assign(size_t(groups) + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = key(i);
    if (g >= 0 && g < groups) ++first[size_t(g) + 1];
  }
  for (int64_t g = 0; g < groups; ++g) first[size_t(g) + 1] += first[size_t(g)];
  DS41_SCRATCH_UNINIT(int64_t, next, groups, 0);
  std::copy(first.begin(), first.begin() + groups, next.begin());
  scratch_reserve(order, size_t(first[size_t(groups)]));
  order.resize(size_t(first[size_t(groups)]));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = key(i);
    if (g >= 0 && g < groups) order[size_t(next[size_t(g)]++)] = i;
  }
}

// Guesses the experts of the plan layer after `lp` from this layer's MoE input xf [S][dim] (the
// next router's top-k with its bias) and asks the cache to read them. Decode-sized calls only, and
// only when the cache holds several layers' worth of experts beside this call's.
void prefetch_next_layer(ForwardContext& ctx, const LayerPlan& lp, const float* xf, int S, ExpertCache* cache,
                         size_t in_use) {
  if (!cache->prefetch_enabled || S > 4 || size_t(lp.id) + 1 >= ctx.plan.layers.size()) return;
  const LayerPlan& next = ctx.plan.layers[size_t(lp.id) + 1];
  if (next.is_dspark != lp.is_dspark || next.routed_experts <= 0) return;
  const int En = next.routed_experts, kn = next.activated_experts;
  if (cache->slots() < int64_t(4) * int64_t(in_use + size_t(kn) * size_t(S))) return;
  const BlockWeights& nw = ctx.weights.blocks[size_t(next.id)];
  DS41_SCRATCH(float, guess_scores, int64_t(S) * En);
  linear_f32_wbf16_maybe_packed(xf, S, nw.gate_packed, guess_scores.data(), ctx.pool);
  const ScoreFunc score_func = parse_score_func(ctx.cfg.score_func);
  DS41_SCRATCH_EMPTY(int32_t, guess);
  for (int s = 0; s < S; ++s) {
    float* row = guess_scores.data() + int64_t(s) * En;
    apply_score_function(score_func, row, En, En);
    for (int e = 0; e < En; ++e) row[e] += nw.gate_bias[e];
    DS41_SCRATCH_EMPTY(int32_t, top);
    torch_topk_largest(row, En, kn, /*sorted=*/true, top);
    for (int32_t e : top)  // this rank's experts only (expert parallelism: the others are read by their owners)
      if (ctx.weights.share.owns(e, En) && std::find(guess.begin(), guess.end(), e) == guess.end()) guess.push_back(e);
  }
  cache->prefetch(next.id, guess.data(), int(guess.size()));
}

// Waits for the other ranks' expert rows once started, also when this rank's own products throw
// (their receives write into the caller's buffers: they must be complete before those go away).
struct RemoteExpertsInFlight {
  ExpertParallel* remote;
  bool started = false;
  explicit RemoteExpertsInFlight(ExpertParallel* r) : remote(r) {}
  void finish() {
    if (!started) return;
    started = false;
    remote->finish();
  }
  ~RemoteExpertsInFlight() {
    if (!started) return;
    try {
      remote->finish();
    } catch (...) {  // the first error is the one in flight
    }
  }
};

}  // namespace

void moe_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x, uint16_t* y) {
  const ModelConfig& c = ctx.cfg;
  const int S = ctx.S, E = lp.routed_experts, k = lp.activated_experts;
  const int64_t D = c.dim;
  const float limit = float(c.swiglu_limit);

  // Router in fp32: scores = fp32(x) . fp32(Wg)^T / gate_temp.
  DS41_SCRATCH(float, xf, int64_t(S) * D);
  DS41_SCRATCH(float, scores, int64_t(S) * E);
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  linear_f32_wbf16_maybe_packed(xf.data(), S, w.gate_packed, scores.data(), ctx.pool);
  const ScoreFunc score_func = parse_score_func(c.score_func);
  DS41_SCRATCH(int32_t, ids, int64_t(S) * k);
  DS41_SCRATCH(float, weights, int64_t(S) * k);
  for (int s = 0; s < S; ++s) {
    float* row = scores.data() + int64_t(s) * E;
    if (c.gate_temp != 1.0)
      for (int e = 0; e < E; ++e) row[e] /= float(c.gate_temp);
    apply_score_function(score_func, row, E, ctx.opt.reference_call_shapes ? torch_scalar_tail_from(s, S, E) : E);
    const bool image = ctx.image_mask && (*ctx.image_mask)[s] && w.gate_bias_vl && !lp.is_dspark;
    const float* bias = image ? w.gate_bias_vl : w.gate_bias;
    int32_t* sel = ids.data() + int64_t(s) * k;
    bool pinned = ctx.hooks && ctx.hooks->pin_experts && ctx.hooks->pin_experts(lp.id, s, sel);
    if (!pinned) {
      // (scores + bias).topk(k): torch's CPU selection, including its order (kernels/topk.h).
      DS41_SCRATCH(float, biased, E);
      for (int e = 0; e < E; ++e) biased[size_t(e)] = row[e] + bias[e];
      DS41_SCRATCH_EMPTY(int32_t, order);
      torch_topk_largest(biased.data(), E, k, /*sorted=*/true, order);
      std::copy(order.begin(), order.end(), sel);
    }
    float* wt = weights.data() + int64_t(s) * k;
    float sum = 0.f;
    for (int j = 0; j < k; ++j) sum += (wt[j] = row[sel[j]]);
    if (c.norm_topk_prob && k > 1)
      for (int j = 0; j < k; ++j) wt[j] /= (sum + 1e-20f);
    for (int j = 0; j < k; ++j) wt[j] *= float(c.route_scale);
    if (ctx.hooks && ctx.hooks->on_experts) ctx.hooks->on_experts(lp.id, s, sel, k);
  }

  // Routed experts, ascending id; each token's contributions summed in that order in fp32.
  // Rows grouped by expert, within an expert by token then by rank (one pass over the selections
  // instead of one per expert); ids outside [0, E) select nothing.
  DS41_SCRATCH_EMPTY(int64_t, first);      // per expert: its first row in toks / rw / xin / out
  DS41_SCRATCH_EMPTY(int64_t, selection);  // per row: its index s * k + j in ids / weights
  group_by_key(int64_t(S) * k, E, [&](int64_t i) { return int64_t(ids[size_t(i)]); }, first, selection);
  const int64_t R = first[size_t(E)];
  DS41_SCRATCH_UNINIT(int, toks, R, 0);
  DS41_SCRATCH_UNINIT(float, rw, R, 0);
  for (int64_t r = 0; r < R; ++r) {
    toks[size_t(r)] = int(selection[size_t(r)] / k);
    rw[size_t(r)] = weights[size_t(selection[size_t(r)])];
  }
  // Each expert's input rows. One token (decode) reads x itself: every expert's row is the
  // same, and the batched product below then quantizes it once for all of them instead of once
  // per expert. (Not when a pinned selection names an expert twice: its rows would run past x.)
  bool one_token = S == 1;
  for (int e = 0; e < E && one_token; ++e) one_token = first[size_t(e) + 1] - first[size_t(e)] <= 1;
  DS41_SCRATCH_UNINIT(uint16_t, xin, one_token ? 0 : R * D, 0);  // written whole before they are read
  DS41_SCRATCH_UNINIT(uint16_t, out, R * D, 0);
  if (!one_token)
    parallel_for(pool_for_work(ctx.pool, R * D), R, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::copy(x + int64_t(toks[r]) * D, x + int64_t(toks[r] + 1) * D, xin.data() + r * D);
    });
  const auto expert_input = [&](int64_t r0) { return one_token ? x : xin.data() + r0 * D; };
  DS41_SCRATCH_UNINIT(uint16_t, shared, int64_t(S) * D, 0);  // shared expert (FP8, no routing weight)
  // The experts the rows use, ascending. With routed experts streamed from disk (the model is
  // larger than the memory budget, model/expert_cache.h) they run in waves of at most the cache's
  // slots: a wave's missing experts are read together, then its products run on views into the
  // slots. Every expert's rows are its own, so waves change no value.
  // With expert parallelism (model/expert_parallel.h) the other ranks' experts go out first and
  // run there while this rank computes its own; their rows come back into `out` before the sums.
  ExpertCache* cache = ctx.weights.expert_cache.get();
  ExpertParallel* remote = ctx.weights.expert_parallel.get();
  DS41_SCRATCH_EMPTY(int32_t, used);
  scratch_reserve(used, size_t(E));
  for (int e = 0; e < E; ++e)
    if (first[size_t(e) + 1] > first[size_t(e)] && ctx.weights.share.owns(e, E)) used.push_back(e);
  RemoteExpertsInFlight in_flight(remote);
  if (remote) {
    remote->start(lp.id, D, x, first.data(), E, toks.data(), rw.data(), out.data());
    in_flight.started = true;
  }
  DS41_SCRATCH_UNINIT(const ExpertWeights*, view, E, 0);
  for (int e = 0; e < E; ++e) view[size_t(e)] = &w.experts[size_t(e)];
  DS41_SCRATCH_UNINIT(const ExpertWeights*, fetched, E, 0);
  const size_t wave_max = cache ? size_t(cache->slots()) : std::max<size_t>(1, used.size());
  const bool batched = R <= kBatchedExpertRows;
  // Every routed expert of a layer has the same width.
  const int64_t I = used.empty() ? 0 : w.experts[size_t(used[0])].w1.N;
  const int64_t Is = w.shared.w1.N, H = R * I + S * Is;
  DS41_SCRATCH_UNINIT(uint16_t, g, batched ? H : 0, 0);  // all three written whole before they are read
  DS41_SCRATCH_UNINIT(uint16_t, u, batched ? H : 0, 0);
  DS41_SCRATCH_UNINIT(uint16_t, h, batched ? H : 0, 0);
  DS41_SCRATCH_EMPTY(QuantizedLinearJob, jobs);
  if (batched) {
    // Room for the most any routing of these S rows can ask for (w1 and w3 of every expert and
    // the shared one): how the rows fall on the experts changes from call to call, and a decode
    // call must not allocate (a verification call of several rows included).
    scratch_reserve(jobs, size_t(2 * E + 2));
    const int64_t widest = std::max({D, I, Is});
    reserve_quantized_batch(2 * E + 2, int64_t(S) * (k + 1), widest, widest);
  }
  for (size_t u0 = 0;;) {
    const size_t u1 = std::min(used.size(), u0 + wave_max);
    const bool with_shared = u0 == 0;
    if (cache && u1 > u0) {
      cache->acquire(lp.id, used.data() + u0, int(u1 - u0), fetched.data());
      for (size_t i = u0; i < u1; ++i) view[size_t(used[i])] = fetched[i - u0];
      // While this layer computes, the next layer's likely experts are read: its router applied
      // to this layer's input (the residual stream changes little from one layer to the next).
      // A guess only: acquire() reads whatever the next router really picks.
      if (u0 == 0) prefetch_next_layer(ctx, lp, xf.data(), S, cache, used.size());
    }
    if (batched) {
      // The wave's routed rows (contiguous: its experts are consecutive in ascending order), then
      // in the first wave the shared expert's S rows (width Is).
      const int64_t rb = u1 > u0 ? first[size_t(used[u0])] : 0, re = u1 > u0 ? first[size_t(used[u1 - 1]) + 1] : 0;
      // The shared expert's (FP8) products first: the batch's last tiles are then the routed
      // experts' FP4 ones, about half as long, and the threads finish closer together (the
      // pool's last pieces are single tiles). Only the order of the work changes.
      jobs.clear();
      if (with_shared) {
        jobs.push_back({x, S, &w.shared.w1, nullptr, g.data() + R * I});
        jobs.push_back({x, S, &w.shared.w3, nullptr, u.data() + R * I});
      }
      for (size_t i = u0; i < u1; ++i) {
        const int e = used[i];
        const int64_t r0 = first[size_t(e)], n = first[size_t(e) + 1] - r0;
        jobs.push_back({expert_input(r0), n, nullptr, &view[size_t(e)]->w1, g.data() + r0 * I});
        jobs.push_back({expert_input(r0), n, nullptr, &view[size_t(e)]->w3, u.data() + r0 * I});
      }
      linear_quantized_batch(jobs.data(), int(jobs.size()), ctx.pool);
      const SwigluPart parts[] = {
          {g.data() + rb * I, u.data() + rb * I, h.data() + rb * I, re - rb, I, rw.data() + rb},
          {g.data() + R * I, u.data() + R * I, h.data() + R * I, with_shared ? S : 0, Is, nullptr}};
      swiglu_parts(parts, 2, limit, ctx.pool);
      jobs.clear();
      if (with_shared) jobs.push_back({h.data() + R * I, S, &w.shared.w2, nullptr, shared.data()});
      for (size_t i = u0; i < u1; ++i) {
        const int e = used[i];
        const int64_t r0 = first[size_t(e)], n = first[size_t(e) + 1] - r0;
        jobs.push_back({h.data() + r0 * I, n, nullptr, &view[size_t(e)]->w2, out.data() + r0 * D});
      }
      linear_quantized_batch(jobs.data(), int(jobs.size()), ctx.pool);
    } else {
      for (size_t i = u0; i < u1; ++i) {
        const int e = used[i];
        const int64_t r0 = first[size_t(e)], n = first[size_t(e) + 1] - r0;
        const ExpertWeights& ew = *view[size_t(e)];
        expert_rows<Fp4Matrix>(expert_input(r0), n, ew.w1, ew.w2, ew.w3, rw.data() + r0, limit, out.data() + r0 * D,
                               ctx.pool, &linear_fp4);
      }
      if (with_shared)
        expert_rows<Fp8Matrix>(x, S, w.shared.w1, w.shared.w2, w.shared.w3, nullptr, limit, shared.data(), ctx.pool,
                               &linear_fp8);
    }
    if (cache && u1 > u0) cache->release(lp.id, used.data() + u0, int(u1 - u0));
    u0 = u1;
    if (u0 >= used.size()) break;
  }
  in_flight.finish();
  // Each token's rows in ascending row order, which is ascending expert: its contributions are
  // added in that order (from 0.0f), then the shared expert's. Tokens in parallel.
  DS41_SCRATCH_EMPTY(int64_t, token_first);
  DS41_SCRATCH_EMPTY(int64_t, token_rows);
  group_by_key(R, S, [&](int64_t r) { return int64_t(toks[size_t(r)]); }, token_first, token_rows);
  parallel_for(pool_for_work(ctx.pool, (R + S) * D), S, [&](int64_t s0, int64_t s1) {
    DS41_SCRATCH_UNINIT(float, acc, D, 0);
    for (int64_t s = s0; s < s1; ++s) {
      std::fill(acc.begin(), acc.begin() + D, 0.0f);
      for (int64_t i = token_first[size_t(s)]; i < token_first[size_t(s) + 1]; ++i) {
        const uint16_t* o = out.data() + token_rows[size_t(i)] * D;
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += bf16_to_f32(o[d]);
      }
      for (int64_t d = 0; d < D; ++d) y[s * D + d] = f32_to_bf16(acc[size_t(d)] + bf16_to_f32(shared[size_t(s * D + d)]));
    }
  });
}

}  // namespace ds41

namespace ds41 {

void routed_expert_products(const ModelConfig& c, const BlockWeights& w, ExpertCache* cache, int layer,
                            const int32_t* ids, int n, const int64_t* first, const uint16_t* xin, const float* route_w,
                            uint16_t* out, ThreadPool* pool) {
  const int64_t D = c.dim, R = first[n];
  const float limit = float(c.swiglu_limit);
  if (n <= 0 || R <= 0) return;
  const int64_t I = w.experts[size_t(ids[0])].w1.N;
  const bool batched = R <= kBatchedExpertRows;  // the same choice and kernels as moe_forward's
  DS41_SCRATCH_UNINIT(uint16_t, g, batched ? R * I : 0, 0);
  DS41_SCRATCH_UNINIT(uint16_t, u, batched ? R * I : 0, 0);
  DS41_SCRATCH_UNINIT(uint16_t, h, batched ? R * I : 0, 0);
  DS41_SCRATCH_EMPTY(QuantizedLinearJob, jobs);
  DS41_SCRATCH_UNINIT(const ExpertWeights*, view, n, 0);
  for (int i = 0; i < n; ++i) view[size_t(i)] = &w.experts[size_t(ids[i])];
  if (batched) {
    scratch_reserve(jobs, size_t(2 * n));
    reserve_quantized_batch(2 * n, R, std::max(D, I), std::max(D, I));
  }
  const int wave_max = cache ? int(cache->slots()) : n;
  for (int i0 = 0; i0 < n; i0 += wave_max) {
    const int i1 = std::min(n, i0 + wave_max);
    if (cache) cache->acquire(layer, ids + i0, i1 - i0, view.data() + i0);
    if (batched) {
      jobs.clear();
      for (int i = i0; i < i1; ++i) {
        const int64_t r0 = first[i], m = first[i + 1] - r0;
        jobs.push_back({xin + r0 * D, m, nullptr, &view[size_t(i)]->w1, g.data() + r0 * I});
        jobs.push_back({xin + r0 * D, m, nullptr, &view[size_t(i)]->w3, u.data() + r0 * I});
      }
      linear_quantized_batch(jobs.data(), int(jobs.size()), pool);
      const int64_t rb = first[i0], re = first[i1];
      const SwigluPart part{g.data() + rb * I, u.data() + rb * I, h.data() + rb * I, re - rb, I, route_w + rb};
      swiglu_parts(&part, 1, limit, pool);
      jobs.clear();
      for (int i = i0; i < i1; ++i) {
        const int64_t r0 = first[i], m = first[i + 1] - r0;
        jobs.push_back({h.data() + r0 * I, m, nullptr, &view[size_t(i)]->w2, out + r0 * D});
      }
      linear_quantized_batch(jobs.data(), int(jobs.size()), pool);
    } else {
      for (int i = i0; i < i1; ++i) {
        const int64_t r0 = first[i], m = first[i + 1] - r0;
        const ExpertWeights& ew = *view[size_t(i)];
        expert_rows<Fp4Matrix>(xin + r0 * D, m, ew.w1, ew.w2, ew.w3, route_w + r0, limit, out + r0 * D, pool,
                               &linear_fp4);
      }
    }
    if (cache) cache->release(layer, ids + i0, i1 - i0);
  }
}

void Model::expert_products(int layer, const int32_t* ids, int n, const int64_t* first, const uint16_t* xin,
                            const float* route_w, uint16_t* out, ThreadPool* pool) const {
  if (layer < 0 || layer >= int(plan_.layers.size())) throw Error("expert products: no plan layer " + std::to_string(layer));
  const LayerPlan& lp = plan_.layers[size_t(layer)];
  for (int i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= lp.routed_experts || !weights_.share.owns(ids[i], lp.routed_experts) ||
        (i > 0 && ids[i] <= ids[i - 1]) || first[i + 1] < first[i])
      throw Error("expert products: layer " + std::to_string(layer) + " expert " + std::to_string(ids[i]) +
                  " is not held by rank " + std::to_string(weights_.share.rank) + " (or the list is not ascending)");
  routed_expert_products(config_, weights_.blocks[size_t(layer)], weights_.expert_cache.get(), layer, ids, n, first,
                         xin, route_w, out, pool);
}

}  // namespace ds41
