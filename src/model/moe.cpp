// Mixture of experts (spec backbone.md §8.1-§8.2): sqrt(softplus) router scores, a selection bias
// (bias_vl for image-span tokens) that picks experts but does not weight them, top-k, renormalise
// (+1e-20, the training constant, not norm_eps), times route_scale; SwiGLU experts with the
// training clamps; routed outputs summed in fp32 in ascending expert order, shared expert last.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/numeric_formats.h"
#include "kernels/topk.h"
#include "model/forward_context.h"

namespace ds41 {

float swiglu(float gate, float up, float limit) {
  if (limit > 0) {
    up = std::clamp(up, -limit, limit);
    gate = std::min(gate, limit);
  }
  return gate / (1.f + std::exp(-gate)) * up;  // silu(g) * u in fp32
}

namespace {

enum class ScoreFunc { SqrtSoftplus, Sigmoid, Softmax };

ScoreFunc parse_score_func(const std::string& fn) {  // validated by config_problems
  return fn == "sqrtsoftplus" ? ScoreFunc::SqrtSoftplus : fn == "sigmoid" ? ScoreFunc::Sigmoid : ScoreFunc::Softmax;
}

// Router scores of one token, in place (softmax over the row, or elementwise).
void apply_score_function(ScoreFunc fn, float* row, int E) {
  switch (fn) {
    case ScoreFunc::SqrtSoftplus:
      for (int e = 0; e < E; ++e)  // F.softplus with threshold 20: linear above it
        row[e] = std::sqrt(row[e] > 20.f ? row[e] : std::log1p(std::exp(row[e])));
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
// routing weight (if any) multiplies before w2.
void swiglu_rows(const uint16_t* g, const uint16_t* u, int64_t n, int64_t I, const float* route_w, float limit,
                 uint16_t* h) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < I; ++i) {
      float a = swiglu(bf16_to_f32(g[r * I + i]), bf16_to_f32(u[r * I + i]), limit);
      if (route_w) a = route_w[r] * a;
      h[r * I + i] = f32_to_bf16(a);
    }
}

template <class Lin>
void expert_rows(const uint16_t* x, int64_t n, const Lin& w1, const Lin& w2, const Lin& w3, const float* route_w,
                 float limit, uint16_t* out, ThreadPool* pool,
                 void (*linear)(const uint16_t*, int64_t, const Lin&, uint16_t*, ThreadPool*)) {
  const int64_t I = w1.N;
  DS41_SCRATCH(uint16_t, g, n * I);
  DS41_SCRATCH(uint16_t, u, n * I);
  DS41_SCRATCH(uint16_t, h, n * I);
  linear(x, n, w1, g.data(), pool);
  linear(x, n, w3, u.data(), pool);
  swiglu_rows(g.data(), u.data(), n, I, route_w, limit, h.data());
  linear(h.data(), n, w2, out, pool);
}

// Calls with at most this many (token, expert) pairs run every expert of the layer, the shared one
// included, as two batched parallel jobs (w1 and w3 of all, then w2 of all: linear_quantized_batch)
// instead of three calls per expert. Decode and speculative verification steps are this small;
// their experts' matrices are so small that per-call hand-offs were a large share of their time.
constexpr int64_t kBatchedExpertRows = 64;

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
  linear_f32_wbf16(xf.data(), S, w.gate_w, E, D, scores.data(), ctx.pool);
  const ScoreFunc score_func = parse_score_func(c.score_func);
  DS41_SCRATCH(int32_t, ids, int64_t(S) * k);
  DS41_SCRATCH(float, weights, int64_t(S) * k);
  for (int s = 0; s < S; ++s) {
    float* row = scores.data() + int64_t(s) * E;
    if (c.gate_temp != 1.0)
      for (int e = 0; e < E; ++e) row[e] /= float(c.gate_temp);
    apply_score_function(score_func, row, E);
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
  DS41_SCRATCH(float, acc, int64_t(S) * D);
  DS41_SCRATCH_EMPTY(uint16_t, xin);
  DS41_SCRATCH_EMPTY(uint16_t, out);
  DS41_SCRATCH_EMPTY(float, rw);
  DS41_SCRATCH_EMPTY(int, toks);
  DS41_SCRATCH_EMPTY(int64_t, first);  // per expert: its first row in toks / rw / xin / out
  first.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) {
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < k; ++j)
        if (ids[int64_t(s) * k + j] == e) {
          toks.push_back(s);
          rw.push_back(weights[int64_t(s) * k + j]);
        }
    first[size_t(e) + 1] = int64_t(toks.size());
  }
  const int64_t R = int64_t(toks.size());
  xin.resize(size_t(R) * D);
  out.resize(size_t(R) * D);
  for (int64_t r = 0; r < R; ++r) std::copy(x + int64_t(toks[r]) * D, x + int64_t(toks[r] + 1) * D, xin.data() + r * D);
  DS41_SCRATCH(uint16_t, shared, int64_t(S) * D);  // shared expert (FP8, no routing weight)
  if (R <= kBatchedExpertRows) {
    // Rows of the routed experts first (width I), then the shared expert's S rows (width Is).
    int64_t I = 0;  // every routed expert of a layer has the same width
    for (int e = 0; e < E && I == 0; ++e)
      if (first[size_t(e) + 1] > first[size_t(e)]) I = w.experts[size_t(e)].w1.N;
    const int64_t Is = w.shared.w1.N, H = R * I + S * Is;
    DS41_SCRATCH(uint16_t, g, H);
    DS41_SCRATCH(uint16_t, u, H);
    DS41_SCRATCH(uint16_t, h, H);
    DS41_SCRATCH_EMPTY(QuantizedLinearJob, jobs);
    for (int e = 0; e < E; ++e) {
      const int64_t r0 = first[size_t(e)], n = first[size_t(e) + 1] - r0;
      if (n == 0) continue;
      const ExpertWeights& ew = w.experts[size_t(e)];
      jobs.push_back({xin.data() + r0 * D, n, nullptr, &ew.w1, g.data() + r0 * I});
      jobs.push_back({xin.data() + r0 * D, n, nullptr, &ew.w3, u.data() + r0 * I});
    }
    jobs.push_back({x, S, &w.shared.w1, nullptr, g.data() + R * I});
    jobs.push_back({x, S, &w.shared.w3, nullptr, u.data() + R * I});
    linear_quantized_batch(jobs.data(), int(jobs.size()), ctx.pool);
    swiglu_rows(g.data(), u.data(), R, I, rw.data(), limit, h.data());
    swiglu_rows(g.data() + R * I, u.data() + R * I, S, Is, nullptr, limit, h.data() + R * I);
    jobs.clear();
    for (int e = 0; e < E; ++e) {
      const int64_t r0 = first[size_t(e)], n = first[size_t(e) + 1] - r0;
      if (n > 0) jobs.push_back({h.data() + r0 * I, n, nullptr, &w.experts[size_t(e)].w2, out.data() + r0 * D});
    }
    jobs.push_back({h.data() + R * I, S, &w.shared.w2, nullptr, shared.data()});
    linear_quantized_batch(jobs.data(), int(jobs.size()), ctx.pool);
  } else {
    for (int e = 0; e < E; ++e) {
      const int64_t r0 = first[size_t(e)], n = first[size_t(e) + 1] - r0;
      if (n == 0) continue;
      const ExpertWeights& ew = w.experts[size_t(e)];
      expert_rows<Fp4Matrix>(xin.data() + r0 * D, n, ew.w1, ew.w2, ew.w3, rw.data() + r0, limit, out.data() + r0 * D,
                             ctx.pool, &linear_fp4);
    }
    expert_rows<Fp8Matrix>(x, S, w.shared.w1, w.shared.w2, w.shared.w3, nullptr, limit, shared.data(), ctx.pool,
                           &linear_fp8);
  }
  // Rows are grouped by ascending expert, so this adds each token's contributions in that order.
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) acc[int64_t(toks[r]) * D + d] += bf16_to_f32(out[r * D + d]);
  for (int64_t i = 0; i < int64_t(S) * D; ++i) y[i] = f32_to_bf16(acc[i] + bf16_to_f32(shared[i]));
}

}  // namespace ds41
