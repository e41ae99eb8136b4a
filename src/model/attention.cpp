// Latent attention of one layer over a call's tokens (spec backbone.md §5): low-rank query,
// one 512-d KV latent per token in an FP8 sliding-window ring, plus — on compressed layers — the
// top-k entries of the shared compressed KV; attention sink; inverse RoPE on the output; grouped
// low-rank output projection.
//
// The attention list of a query (what its online softmax sums, in 64-entry blocks: the block
// boundaries decide where it rounds, so the list's layout is part of the numerics):
//   [window segment][compressed entries, ascending]
// The window segment holds the query's window keys oldest first, plus empty slots (no key:
// masked to -inf, they add nothing but still occupy their place in a block). Its layout:
//  - canonical (default): W slots, keys first, empty slots after. It depends on the position
//    alone, so prefill, decode and any chunking give the same numbers; it is the reference's
//    own prefill layout for calls of at least W tokens, and its decode layout once the ring is
//    full.
//  - the reference's (ForwardOptions::reference_call_shapes): a call at position 0 lists
//    min(S, W) slots, keys first (get_window_topk_idxs' prefill rows); a later call lists the
//    whole ring oldest first, W slots with the unfilled ones first (its decode row). Rows of a
//    chunked call (S > 1 at start > 0, a shape the reference has not) are laid out like decode.
// The compressed entries' -1 padding always trails, where it cannot move a block boundary.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/numeric_formats.h"
#include "kernels/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sparse_attention.h"
#include "model/forward_context.h"

namespace ds41 {

namespace {

// The selected compressed entries are scattered over the cache (2.4 MB per layer at 8K tokens of
// the small preset, beyond L2), and each row's dequantization is too short for the out-of-order
// window to reach the next row's lines: their loads are started this many rows ahead.
constexpr int64_t kEntryPrefetchAhead = 4;

void prefetch_bytes(const void* p, int64_t n) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < n; o += 64) __builtin_prefetch(c + o);
  __builtin_prefetch(c + n - 1);
}

}  // namespace

void attention_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const uint16_t* x,
                       uint16_t* y) {
  const ModelConfig& c = ctx.cfg;
  const int S = ctx.S;
  const int64_t H = c.n_heads, Dh = c.head_dim, R = c.rope_head_dim, W = c.window_size;
  const int64_t Q = c.q_lora_rank;
  const float eps = float(c.norm_eps);
  LayerState& ls = ctx.state.layers[lp.id];
  const std::vector<float>& inv_freq = ctx.inv_freq(lp);

  // RoPE cos/sin of every position of the call: [S][half] each.
  const int half = int(inv_freq.size());
  DS41_SCRATCH(float, rope_cos, int64_t(S) * half);
  DS41_SCRATCH(float, rope_sin, int64_t(S) * half);
  for (int s = 0; s < S; ++s)
    rope_cos_sin_row(inv_freq.data(), half, ctx.pos(s), rope_cos.data() + int64_t(s) * half, rope_sin.data() + int64_t(s) * half);
  auto cos_row = [&](int64_t s) { return rope_cos.data() + s * half; };
  auto sin_row = [&](int64_t s) { return rope_sin.data() + s * half; };

  // ---- query (§5.2) -----------------------------------------------------------------------
  DS41_SCRATCH(uint16_t, qa, int64_t(S) * Q);
  DS41_SCRATCH(uint16_t, qr, int64_t(S) * Q);
  DS41_SCRATCH(uint16_t, q, int64_t(S) * H * Dh);
  // wq_a and the window's wkv read the same x: one batch (one quantization of x, one parallel
  // job instead of two, each with its wait at the end).
  DS41_SCRATCH(uint16_t, kv_raw, int64_t(S) * Dh);
  const QuantizedLinearJob from_x[] = {{x, S, &w.wq_a, nullptr, qa.data()}, {x, S, &w.wkv, nullptr, kv_raw.data()}};
  linear_quantized_batch(from_x, 2, ctx.pool);
  rmsnorm_rows(qa.data(), w.q_norm, S, Q, eps, qr.data());
  linear_fp8(qr.data(), S, w.wq_b, q.data(), ctx.pool);
  parallel_for(pool_for_work(ctx.pool, int64_t(S) * H * R * 4), S, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s)
      for (int64_t h = 0; h < H; ++h)
        rope_apply(q.data() + (s * H + h) * Dh + (Dh - R), cos_row(s), sin_row(s), int(R), false);
  });

  // ---- window KV (§5.3): normalise, rotate, FP8 QDQ over all dims --------------------------
  DS41_SCRATCH(int64_t, positions, S);
  for (int s = 0; s < S; ++s) positions[size_t(s)] = ctx.pos(s);
  DS41_SCRATCH(uint16_t, kv_n, int64_t(S) * Dh);
  DS41_SCRATCH(uint8_t, kv_codes, int64_t(S) * Dh);
  DS41_SCRATCH(float, kv_scales, int64_t(S) * (Dh / 32));
  window_kv_from_projection(c, w, kv_raw.data(), S, positions.data(), inv_freq, ctx.pool, kv_n.data(),
                            kv_codes.data(), kv_scales.data());
  // Window keys of earlier calls come from the ring (positions start-W+1 .. start-1, none before
  // the layer's ring_start).
  const int64_t window_floor = ls.ring_start;
  const int64_t prev_first = std::min(ctx.start, std::max(window_floor, ctx.start - (W - 1)));
  const int64_t n_prev = ctx.start - prev_first;
  DS41_SCRATCH_UNINIT(uint16_t, prev, n_prev * Dh, (W - 1) * Dh);  // planned: a full window
  parallel_for(ctx.pool, n_prev, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) ring_row_bf16(ls, Dh, (prev_first + i) % W, prev.data() + i * Dh);
  });
  auto window_row = [&](int64_t p) -> const uint16_t* {
    return p >= ctx.start ? kv_n.data() + (p - ctx.start) * Dh : prev.data() + (p - prev_first) * Dh;
  };
  // Write this call's tokens into the ring (later positions overwrite earlier ones).
  for (int s = 0; s < S; ++s)
    ring_store(ctx.state.journal, ls, Dh, ctx.pos(s), ctx.pos(s) % W, kv_codes.data() + s * Dh, kv_scales.data() + s * (Dh / 32));

  // ---- compressed branch (§5.4-§5.5) --------------------------------------------------------
  DS41_SCRATCH_EMPTY(int32_t, used_entries);  // union of this call's selected entries, ascending
  scratch_reserve(used_entries, size_t(S) * size_t(c.index_topk));
  DS41_SCRATCH_EMPTY(int32_t, entry_slot);  // if use_slot_table: entry id -> its index there
  bool use_slot_table = false;
  // Their dequantized main-KV rows, one per used entry, each written before it is read.
  DS41_SCRATCH_UNINIT(uint16_t, used_rows, 0, size_t(S) * size_t(c.index_topk) * size_t(Dh));
  const std::vector<std::vector<int32_t>>* topk = nullptr;
  if (lp.ratio > 0) {
    if (lp.kv_source) {
      // With the caches already holding this call's entries, the source still publishes in a call
      // where a group completes, as the compressor would have.
      const int64_t emitted = ctx.global_cache_ready ? (ctx.start + S) / lp.ratio - ctx.start / lp.ratio
                                                     : compressor_forward(ctx, lp, w, x);
      if (emitted > 0) ctx.state.index_k_publisher = lp.id;
    }
    if (lp.index_source) indexer_forward(ctx, lp, w, x, qr.data());
    topk = &ctx.topk[lp.index_source_layer];
    if (ctx.hooks && ctx.hooks->on_attention_entries)
      for (int s = 0; s < S; ++s) ctx.hooks->on_attention_entries(lp.id, s, (*topk)[size_t(s)]);
    const LayerState& src = ctx.state.layers[lp.kv_source_layer];
    // The union of the selections, ascending. A prefill's S * top-k ids cover few distinct
    // entries many times over: marking them in a table over the id range is linear, where sorting
    // them all was n log n on one thread (~0.5 % of a 2048-token prefill, more for longer ones).
    // A step with few ids against a long context sorts them instead of clearing a large table.
    int64_t max_entry = -1, selected = 0;
    for (const auto& row : *topk) {
      for (int32_t e : row) max_entry = std::max<int64_t>(max_entry, e);
      selected += int64_t(row.size());
    }
    constexpr int64_t kSlotTableSpan = 4;  // id range per selected id up to which the table pays
    use_slot_table = max_entry + 1 <= kSlotTableSpan * selected;
    if (use_slot_table) {
      constexpr int32_t kSelected = -2;
      // Room for every entry the caches were planned for (ids index them), so that steps and
      // verification calls within the plan never grow the table.
      scratch_reserve(entry_slot, std::max(size_t(max_entry) + 1, src.ckv_codes.capacity() / size_t(Dh / 2)));
      entry_slot.assign(size_t(max_entry) + 1, -1);
      for (const auto& row : *topk)
        for (int32_t e : row) entry_slot[size_t(e)] = kSelected;
      for (int64_t e = 0; e <= max_entry; ++e)
        if (entry_slot[size_t(e)] == kSelected) {
          entry_slot[size_t(e)] = int32_t(used_entries.size());
          used_entries.push_back(int32_t(e));
        }
    } else {
      for (const auto& row : *topk) used_entries.insert(used_entries.end(), row.begin(), row.end());
      std::sort(used_entries.begin(), used_entries.end());
      used_entries.erase(std::unique(used_entries.begin(), used_entries.end()), used_entries.end());
    }
    scratch_grow(used_rows, used_entries.size() * Dh);
    parallel_for(ctx.pool, int64_t(used_entries.size()), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t e = used_entries[size_t(i)];
        if (i + kEntryPrefetchAhead < i1) {
          const int64_t ahead = used_entries[size_t(i + kEntryPrefetchAhead)];
          prefetch_bytes(src.ckv_codes.data() + ahead * (Dh / 2), Dh / 2);
          prefetch_bytes(src.ckv_scales.data() + ahead * (Dh / 16), Dh / 16);
        }
        nvfp4_dequant_row(src.ckv_codes.data() + e * (Dh / 2), src.ckv_scales.data() + e * (Dh / 16), Dh,
                          used_rows.data() + i * Dh);
      }
    });
  }

  // ---- sparse attention with sink (§5.6) ----------------------------------------------------
  DS41_SCRATCH_UNINIT(uint16_t, o, int64_t(S) * H * Dh, 0);  // every (token, head) row written below
  const float softmax_scale = float(std::pow(double(Dh), -0.5));
  // Tasks are (token, head group): with fewer tokens than threads (decode) the heads are split so
  // that every thread has work. Heads are independent in the kernel, so any grouping gives the
  // same values.
  const int threads = ctx.pool ? ctx.pool->size() : 1;
  const int64_t head_groups = S >= threads ? 1 : std::min<int64_t>(H, threads);
  parallel_for(ctx.pool, S * head_groups, [&](int64_t t0, int64_t t1) {
    DS41_SCRATCH_EMPTY(const uint16_t*, rows);
    scratch_reserve(rows, size_t(W + c.index_topk));  // planned: a full window and a full top-k
    DS41_SCRATCH(float, scratch, sparse_attention_scratch_floats(Dh));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = t / head_groups, g = t % head_groups;
      const int64_t h0 = H * g / head_groups, h1 = H * (g + 1) / head_groups;
      rows.clear();
      const int64_t p = ctx.pos(int(s));
      const int64_t first = std::max(window_floor, p - (W - 1)), keys = p - first + 1;
      const bool keys_last = ctx.opt.reference_call_shapes && ctx.start > 0;
      const int64_t slots = ctx.opt.reference_call_shapes && ctx.start == 0 ? std::min<int64_t>(S, W) : W;
      const bool compressed_follow = topk && !(*topk)[s].empty();  // trailing empty slots matter only then
      if (keys_last) rows.insert(rows.end(), size_t(slots - keys), nullptr);
      for (int64_t k = first; k <= p; ++k) rows.push_back(window_row(k));
      if (!keys_last && compressed_follow) rows.insert(rows.end(), size_t(slots - keys), nullptr);
      if (topk)
        for (int32_t e : (*topk)[s]) {
          const int64_t i = use_slot_table ? entry_slot[size_t(e)]
                                           : std::lower_bound(used_entries.begin(), used_entries.end(), e) -
                                                 used_entries.begin();
          rows.push_back(used_rows.data() + i * Dh);
        }
      sparse_attention_row(q.data() + (s * H + h0) * Dh, int(h1 - h0), Dh, rows.data(), int(rows.size()),
                           w.attn_sink + h0, softmax_scale, o.data() + (s * H + h0) * Dh, scratch.data());
      for (int64_t h = h0; h < h1; ++h)  // de-rotate with the query position (§5.7 step 1)
        rope_apply(o.data() + (s * H + h) * Dh + (Dh - R), cos_row(s), sin_row(s), int(R), true);
    }
  });

  grouped_output(c, w, S, o.data(), y, ctx.pool);
}

void window_kv_rows(const ModelConfig& c, const BlockWeights& w, const uint16_t* x, int S, const int64_t* positions,
                    const std::vector<float>& inv_freq, ThreadPool* pool, uint16_t* kv, uint8_t* codes, float* scales) {
  DS41_SCRATCH(uint16_t, raw, int64_t(S) * c.head_dim);
  linear_fp8(x, S, w.wkv, raw.data(), pool);
  window_kv_from_projection(c, w, raw.data(), S, positions, inv_freq, pool, kv, codes, scales);
}

void window_kv_from_projection(const ModelConfig& c, const BlockWeights& w, const uint16_t* raw, int S,
                               const int64_t* positions, const std::vector<float>& inv_freq, ThreadPool* pool,
                               uint16_t* kv, uint8_t* codes, float* scales) {
  const int64_t Dh = c.head_dim, R = c.rope_head_dim;
  const int half = int(inv_freq.size());
  rmsnorm_rows(raw, w.kv_norm, S, Dh, float(c.norm_eps), kv);
  // Tokens in parallel (one thread took ~0.5 % of a 512-token prefill with the others idle).
  parallel_for(pool_for_work(pool, int64_t(S) * Dh * 8), S, [&](int64_t s0, int64_t s1) {
    DS41_SCRATCH(float, rope_cos, half);
    DS41_SCRATCH(float, rope_sin, half);
    for (int64_t s = s0; s < s1; ++s) {
      uint16_t* row = kv + s * Dh;
      rope_cos_sin_row(inv_freq.data(), half, positions[s], rope_cos.data(), rope_sin.data());
      rope_apply(row + (Dh - R), rope_cos.data(), rope_sin.data(), int(R), false);
      act_quant_row(row, Dh, codes + s * Dh, scales + s * (Dh / 32));
      for (int64_t d = 0; d < Dh; ++d)  // QDQ value: e4m3 * 2^k is exact in bf16
        row[d] = f32_to_bf16(kE4M3Table[codes[s * Dh + d]] * scales[s * (Dh / 32) + d / 32]);
    }
  });
}

void ring_row_bf16(const LayerState& ls, int64_t Dh, int64_t slot, uint16_t* out) {
  fp8_dequant_row(ls.ring_codes.data() + slot * Dh, ls.ring_scales.data() + slot * (Dh / 32), Dh, out);
}

void ring_store(StateJournal* journal, LayerState& ls, int64_t Dh, int64_t pos, int64_t slot, const uint8_t* codes,
                const float* scales) {
  uint8_t* dst_codes = ls.ring_codes.data() + slot * Dh;
  uint8_t* dst_scales = ls.ring_scales.data() + slot * (Dh / 32);
  if (journal) {
    journal->record(pos, dst_codes, size_t(Dh));
    journal->record(pos, dst_scales, size_t(Dh / 32));
  }
  std::memcpy(dst_codes, codes, size_t(Dh));
  for (int64_t b = 0; b < Dh / 32; ++b) dst_scales[b] = f32_to_e8m0(scales[b]);
}

void grouped_output(const ModelConfig& c, const BlockWeights& w, int S, const uint16_t* o, uint16_t* y, ThreadPool* pool) {
  const int64_t H = c.n_heads, Dh = c.head_dim;
  const int64_t G = c.o_groups, Rk = c.o_lora_rank, K = H * Dh / G;
  DS41_SCRATCH(uint16_t, u, int64_t(S) * G * Rk);
  // A decode row reads the groups' rows from the packed copy (one stream per 128 rows, the same
  // sums; FP8 codes where they give the bf16 values), all groups in one parallel call; several
  // rows lay the weights out per call instead (gemm.h).
  if (S < kPackedMaxRows && (w.wo_a_fp8_packed.blocks || w.wo_a_packed.blocks)) {
    DS41_SCRATCH(float, in_f32, G * S * K);  // [g][s][k]
    DS41_SCRATCH(float, out_f32, G * S * Rk);
    for (int64_t g = 0; g < G; ++g)
      for (int s = 0; s < S; ++s)
        for (int64_t k = 0; k < K; ++k)
          in_f32[size_t((g * S + s) * K + k)] = bf16_to_f32(o[s * H * Dh + g * K + k]);
    const auto x_of = [&](int64_t g) { return in_f32.data() + g * S * K; };
    const auto y_of = [&](int64_t g) { return out_f32.data() + g * S * Rk; };
    if (const PackedFp8Matrix& wa = w.wo_a_fp8_packed; wa.blocks) {
      DS41_SCRATCH_EMPTY(PackedFp8LinearJob, jobs);
      scratch_reserve(jobs, size_t(G));
      for (int64_t g = 0; g < G; ++g) {
        const PackedFp8Matrix group{wa.blocks + g * Rk * K, wa.scale + (g * Rk / 32) * (K / 32), Rk, K};
        jobs.push_back(PackedFp8LinearJob{x_of(g), group, y_of(g)});
      }
      linear_f32_wfp8_packed_batch(jobs.data(), int(G), S, pool);
    } else {
      DS41_SCRATCH_EMPTY(PackedLinearJob, jobs);
      scratch_reserve(jobs, size_t(G));
      for (int64_t g = 0; g < G; ++g) {
        const PackedBf16Matrix group{w.wo_a_packed.blocks + g * Rk * K, w.wo_a + g * Rk * K, Rk, K};
        jobs.push_back(PackedLinearJob{x_of(g), group, y_of(g)});
      }
      linear_f32_wbf16_packed_batch(jobs.data(), int(G), S, pool);
    }
    for (int64_t g = 0; g < G; ++g)
      for (int s = 0; s < S; ++s)
        for (int64_t r = 0; r < Rk; ++r)
          u[size_t((s * G + g) * Rk + r)] = f32_to_bf16(out_f32[size_t((g * S + s) * Rk + r)]);
  } else {
    DS41_SCRATCH(uint16_t, group_in, int64_t(S) * K);
    DS41_SCRATCH(uint16_t, group_out, int64_t(S) * Rk);
    ThreadPool* copy_pool = pool_for_work(pool, int64_t(S) * K);
    for (int64_t g = 0; g < G; ++g) {
      parallel_for(copy_pool, S, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) std::memcpy(group_in.data() + s * K, o + s * H * Dh + g * K, size_t(K) * 2);
      });
      linear_bf16(group_in.data(), S, w.wo_a + g * Rk * K, Rk, K, group_out.data(), pool);
      parallel_for(copy_pool, S, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s)
          std::memcpy(u.data() + (s * G + g) * Rk, group_out.data() + s * Rk, size_t(Rk) * 2);
      });
    }
  }
  linear_fp8(u.data(), S, w.wo_b, y, pool);
}

}  // namespace ds41
