// CSA² indexer (spec backbone.md §5.5): a small side attention that scores every visible
// compressed entry for each query and keeps the best index_topk. Scores are computed in bf16 as
// the reference does (bf16 dot products, ReLU, times bf16 head weights, bf16 head sum), so ties
// are common; ties are broken exactly as the reference's CPU torch.topk does (kernels/topk.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/error.h"
#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/indexer_score.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "kernels/topk.h"
#include "model/forward_context.h"

namespace ds41 {

std::vector<int32_t> select_topk_row(const float* scores, int64_t width, int64_t count, int k) {
  std::vector<int32_t> out;
  select_topk_row(scores, width, count, k, out);
  return out;
}

void select_topk_row(const float* scores, int64_t width, int64_t count, int k, std::vector<int32_t>& out) {
  // torch.topk(sorted=False) tie behaviour (kernels/topk.h), then ascending like the reference.
  DS41_SCRATCH_EMPTY(int32_t, picked);
  scratch_reserve(picked, size_t(std::max(k, 0)));  // rows hold up to k ids: planned
  scratch_reserve(out, size_t(std::max(k, 0)));
  torch_topk_largest(scores, width, std::min<int64_t>(k, width), /*sorted=*/false, picked);
  out.clear();
  for (int32_t e : picked)
    if (e < count) out.push_back(e);  // unreachable picks become -1 in the reference
  std::sort(out.begin(), out.end());
}

void indexer_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x,
                     const uint16_t* qr) {
  const ModelConfig& c = ctx.cfg;
  const int S = ctx.S, m = lp.ratio;
  const int64_t D = c.dim, NH = c.index_n_heads, IH = c.index_head_dim, R = c.rope_head_dim;
  const int64_t total = (ctx.start + S) / m;  // entries that exist after this call's writes
  auto& out = ctx.topk[lp.id];
  out.resize(size_t(S));  // rows keep their capacity from earlier calls
  for (auto& row : out) row.clear();
  if (total == 0) {  // the reference skips the indexer while nothing is compressed
    if (ctx.hooks && ctx.hooks->on_topk)
      for (int s = 0; s < S; ++s) ctx.hooks->on_topk(lp.id, s, out[s]);
    return;
  }

  // Which layer's index keys each row reads: the kv source (corrected), or whatever was last
  // published — for the whole call in a prefill, row by row as in decode otherwise — and how many
  // of that layer's rows it sees (entries it had at that point; the rest read as zeros, like the
  // reference's zeroed buffer).
  DS41_SCRATCH(int, row_key_layer, S);
  DS41_SCRATCH(int64_t, row_key_rows, S);
  for (int s = 0; s < S; ++s) {
    int l = lp.kv_source_layer;
    if (!ctx.opt.corrected_index_keys) {
      const int pub = ctx.publisher_before_row.empty()
                          ? ctx.state.index_k_publisher
                          : reference_publisher_at(ctx.plan, ctx.publisher_before_row[size_t(s)], ctx.pos(s), lp.id);
      if (pub >= 0) l = pub;
    }
    row_key_layer[size_t(s)] = l;
    const LayerState& keys = ctx.state.layers[size_t(l)];
    int64_t rows = keys.entries;
    if (!ctx.publisher_before_row.empty()) {
      const int64_t m_l = ctx.plan.layers[size_t(l)].ratio, p = ctx.pos(s);
      // l's entries in p's decode call, as far as the row reads them (its visible count)
      const int64_t decode_rows = std::min((l <= lp.id ? p + 1 : p) / m_l, (p + 1) / m);
      if (decode_rows > keys.entries)
        throw Error("indexer: layer " + std::to_string(lp.id) + " needs index keys of layer " + std::to_string(l) +
                    " not yet written in this call (the call should have been split)");
      rows = decode_rows;
    }
    row_key_rows[size_t(s)] = std::min<int64_t>(rows, total);
  }
  // Keys as bf16, one block of `total` rows per layer read (usually one): rows the layer never
  // wrote read as zeros. Rows that grow with the context are sized for the planned sequence
  // (reserve_sequence). A decode call (one row, or fewer rows than threads) scores each key once:
  // the scoring kernel reads the packed keys itself (indexer_scores_mxfp4) and no block is built.
  const int threads = ctx.pool ? ctx.pool->size() : 1;
  const bool score_packed = S == 1 || S < threads;
  const int64_t planned = std::max<int64_t>(total, ctx.state.reserved_tokens / m);
  DS41_SCRATCH(int, key_block, ctx.plan.layers.size());  // layer -> block index + 1 (0: not read)
  int n_blocks = 0;
  for (int s = 0; s < S && !score_packed; ++s)
    if (key_block[size_t(row_key_layer[size_t(s)])] == 0) key_block[size_t(row_key_layer[size_t(s)])] = ++n_blocks;
  // Every row read is written below; a decode call reserves nothing (it reads no block).
  DS41_SCRATCH_UNINIT(uint16_t, K, n_blocks * total * IH, score_packed ? 0 : planned * IH);
  const bool pool_source = lp.candidate_source;
  const bool pool_restricted = lp.uses_candidates && ctx.candidates_built;
  for (size_t l = 0; l < key_block.size(); ++l) {
    if (key_block[l] == 0) continue;
    const LayerState& keys = ctx.state.layers[l];
    uint16_t* block = K.data() + (key_block[l] - 1) * total * IH;
    const int64_t written = std::min<int64_t>(total, keys.entries);
    // Rows are stored back to back and their MXFP4 blocks are independent: a range of rows
    // dequantizes as one row.
    parallel_for(ctx.pool, written, [&](int64_t t0, int64_t t1) {
      mxfp4_dequant_row(keys.ik_codes.data() + t0 * (IH / 2), keys.ik_scales.data() + t0 * (IH / 32), (t1 - t0) * IH,
                        block + t0 * IH);
    });
    std::fill(block + written * IH, block + total * IH, uint16_t{0});
  }

  // Queries: FP8 projection of qr, RoPE on the tail, MXFP4 QDQ per head.
  DS41_SCRATCH(uint16_t, qi, int64_t(S) * NH * IH);
  linear_fp8(qr, S, w.idx_wq_b, qi.data(), ctx.pool);
  const std::vector<float>& f = ctx.inv_freq(lp);
  // Tokens in parallel (one thread took ~1 % of a 512-token prefill with the others idle).
  parallel_for(pool_for_work(ctx.pool, int64_t(S) * NH * IH * 8), S, [&](int64_t s0, int64_t s1) {
    DS41_SCRATCH(float, cs, f.size());
    DS41_SCRATCH(float, sn, f.size());
    for (int64_t s = s0; s < s1; ++s) {
      rope_cos_sin_row(f.data(), int(f.size()), ctx.pos(int(s)), cs.data(), sn.data());
      for (int64_t h = 0; h < NH; ++h) {
        uint16_t* row = qi.data() + (s * NH + h) * IH;
        rope_apply(row + (IH - R), cs.data(), sn.data(), int(R), false);
        mxfp4_qdq_row(row, IH);
      }
    }
  });
  // Head weights: bf16(weights_proj(x)) * (IH^-1/2 * NH^-1/2), rounded to bf16 again.
  DS41_SCRATCH(uint16_t, wts, int64_t(S) * NH);
  linear_bf16(x, S, w.idx_weights_proj, NH, D, wts.data(), ctx.pool);
  const float wscale = float(std::pow(double(IH), -0.5) * std::pow(double(NH), -0.5));
  for (auto& v : wts) v = f32_to_bf16(bf16_to_f32(v) * wscale);

  if (pool_source) {
    ctx.candidates.resize(size_t(S));
    ctx.candidates_built = true;
  }
  // One query row: scores of the visible keys (by `score_runs`, over runs [t0, t1) of keys), then
  // the candidate pool and top-k.
  //
  // A layer restricted to the candidate pool scores only the pool's entries: every other score
  // would be replaced by -inf, and each key's score is its own, so the row is the same as
  // scoring all of them and masking. In the decoder (one entry per token) that is what keeps a
  // long context cheap: the released model's pool holds 2048 blocks of 8 entries, so at 64K
  // tokens these layers score a quarter of the keys (32 heads x 128 dims each).
  // (The plan never restricts the pool's source layer: uses_candidates needs a later layer.)
  const int64_t max_runs = pool_restricted ? int64_t(c.candidate_topk_blocks) + 1 : 1;
  auto select_row = [&](int64_t s, float* score, const auto& score_runs) {
    const int64_t count = (ctx.pos(int(s)) + 1) / m;  // entries whose whole group is visible
    // Canonical row width = the entries this query can see. The reference's decode call has
    // exactly this row; its prefill pads the row with -inf up to the chunk's entry count, which
    // only changes how exact ties are broken. Using the visible width in every call shape keeps
    // prefill, decode and chunked calls identical and equal to the reference's decode.
    // A row that sees only the first key_rows keys reads zeros beyond: relu(0) * weight sums to 0.
    const int key_layer = row_key_layer[size_t(s)];
    const int64_t scored = std::min(count, row_key_rows[size_t(s)]);
    DS41_SCRATCH_CAP(int64_t, runs, 0, 2 * max_runs);  // [t0, t1) pairs
    if (pool_restricted) {
      const std::vector<uint8_t>& keep = ctx.candidates[s];
      for (int64_t t = 0; t < count; ++t) score[t] = keep[size_t(t)] ? 0.f : -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < scored;) {
        if (!keep[size_t(t)]) {
          ++t;
          continue;
        }
        const int64_t t0 = t;
        while (t < scored && keep[size_t(t)]) ++t;
        runs.push_back(t0);
        runs.push_back(t);
      }
    } else {
      for (int64_t t = scored; t < count; ++t) score[t] = 0.f;
      if (scored > 0) runs.insert(runs.end(), {int64_t{0}, scored});
    }
    score_runs(qi.data() + s * NH * IH, wts.data() + s * NH, key_layer, runs, score);
    if (pool_source)
      candidate_pool_row(score, count, count, c.candidate_topk_blocks, c.candidate_block_size, ctx.candidates[s],
                         planned);
    // A pinned choice replaces only the top-k list: the scores and the candidate pool above are
    // still the engine's own, so a pin at the pool's source leaves the pool's decision alone.
    if (ctx.hooks && ctx.hooks->pin_topk) {
      if (auto pinned = ctx.hooks->pin_topk(lp.id, int(s))) {
        out[s] = *pinned;
        return;
      }
    }
    select_topk_row(score, count, count, c.index_topk, out[s]);
  };
  if (!score_packed) {  // rows in parallel
    parallel_for(ctx.pool, S, [&](int64_t s0, int64_t s1) {
      DS41_SCRATCH_CAP(float, score, total, planned);
      torch_topk_reserve(planned);
      for (int64_t s = s0; s < s1; ++s)
        select_row(s, score.data(),
                   [&](const uint16_t* q, const uint16_t* wq, int key_layer, const std::vector<int64_t>& runs,
                       float* sc) {
                     const uint16_t* Ks = K.data() + (key_block[size_t(key_layer)] - 1) * total * IH;
                     for (size_t r = 0; r < runs.size(); r += 2)
                       indexer_scores(q, wq, int(NH), IH, Ks + runs[r] * IH, runs[r + 1] - runs[r], sc + runs[r]);
                   });
    });
  } else {  // decode: each row's keys split across the threads (every key's score is its own)
    DS41_SCRATCH_CAP(float, score, total, planned);
    torch_topk_reserve(planned);
    for (int64_t s = 0; s < S; ++s)
      select_row(s, score.data(),
                 [&](const uint16_t* q, const uint16_t* wq, int key_layer, const std::vector<int64_t>& runs,
                     float* sc) {
                   const LayerState& keys = ctx.state.layers[size_t(key_layer)];
                   int64_t n = 0;  // keys in all runs; thread p takes keys [n p / T, n (p + 1) / T) of them
                   for (size_t r = 0; r < runs.size(); r += 2) n += runs[r + 1] - runs[r];
                   parallel_for(ctx.pool, threads, [&](int64_t p0, int64_t p1) {
                     for (int64_t p = p0; p < p1; ++p) {
                       const int64_t k0 = n * p / threads, k1 = n * (p + 1) / threads;
                       int64_t before = 0;  // keys in the runs before run r
                       for (size_t r = 0; r < runs.size() && before < k1; r += 2) {
                         const int64_t len = runs[r + 1] - runs[r];
                         const int64_t a = std::max(k0, before), b = std::min(k1, before + len);
                         if (b > a) {
                           const int64_t t0 = runs[r] + (a - before);
                           indexer_scores_mxfp4(q, wq, int(NH), IH, keys.ik_codes.data() + t0 * (IH / 2),
                                                keys.ik_scales.data() + t0 * (IH / 32), b - a, sc + t0);
                         }
                         before += len;
                       }
                     }
                   });
                 });
  }
  if (ctx.hooks && ctx.hooks->on_topk)
    for (int s = 0; s < S; ++s) ctx.hooks->on_topk(lp.id, s, out[s]);
  if (pool_source && ctx.hooks && ctx.hooks->on_candidates)
    for (int s = 0; s < S; ++s) ctx.hooks->on_candidates(lp.id, s, ctx.candidates[size_t(s)]);
}

}  // namespace ds41
