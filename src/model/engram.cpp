// Engram (spec engram_dspark_vision.md §A.7-§A.10): before an Engram block, each position looks
// up one table row per hash column (FP8 rows with per-32 E8M0 scales, read straight from the
// mmap'd checkpoint: the released tables are ~98 GB each and only the touched rows are paged in),
// projects the concatenated rows with an FP8 linear into one key per hyper-connection copy plus
// one shared value, and adds value * gate to each copy, where the gate compares the copy with its
// key (per-copy RMS normalisation, signed square root, sigmoid).
#include <cmath>
#include <cstring>
#include <sys/mman.h>

#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/numeric_formats.h"
#include "kernels/torch_sum.h"
#include "kernels/vector_exp.h"
#include "model/forward_context.h"

namespace ds41 {

namespace {

// Ask the kernel to start reading the table rows this call needs, and their scale rows (they are
// scattered over a ~100 GB table, so sequential read-ahead does not help): every read is then in
// flight before the gather below faults on the first, where each fault would otherwise wait for
// its own. Pages already in the page cache are skipped: mincore costs a fraction of a madvise
// of a resident page (0.4 against 2.4-3.3 us on the Xeon VM; 48 rows per token on the small
// preset). Advisory only.
void prefetch_range(const uint8_t* p, int64_t bytes) {
  static const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(p), aligned = start & ~(page - 1);
  const size_t length = size_t(start + uintptr_t(bytes) - aligned);
  constexpr size_t kMaxChecked = 16;
  unsigned char resident[kMaxChecked];
  const size_t pages = (length + page - 1) / page;
  if (pages <= kMaxChecked && mincore(reinterpret_cast<void*>(aligned), length, resident) == 0) {
    bool all = true;
    for (size_t i = 0; i < pages; ++i) all = all && (resident[i] & 1);
    if (all) return;
  }
  madvise(reinterpret_cast<void*>(aligned), length, MADV_WILLNEED);
}

void prefetch_rows(const BlockWeights& w, int64_t head_dim, const int64_t* ids, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    prefetch_range(w.engram_table + ids[i] * head_dim, head_dim);
    prefetch_range(w.engram_table_scale + ids[i] * (head_dim / 32), head_dim / 32);
  }
}

// v.square().mean(-1) as the reference takes it (PyTorch's fp32 reduction order, torch_sum.h).
float mean_square(const float* v, int64_t n) { return torch_sum_squares_f32(v, n) / float(n); }

}  // namespace

void engram_gather_rows(const BlockWeights& w, int64_t head_dim, const int64_t* ids, int64_t n, uint16_t* out,
                        ThreadPool* pool) {
  prefetch_rows(w, head_dim, ids, n);
  parallel_for(pool, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* codes = w.engram_table + ids[r] * head_dim;
      const uint8_t* scales = w.engram_table_scale + ids[r] * (head_dim / 32);
      uint16_t* o = out + r * head_dim;
      for (int64_t j = 0; j < head_dim; ++j) o[j] = f32_to_bf16(kE4M3Table[codes[j]] * e8m0_to_f32(scales[j / 32]));
    }
  });
}

void engram_forward(ForwardContext& ctx, const LayerPlan& lp, const BlockWeights& w, const int64_t* row_ids,
                    int cols, uint16_t* X) {
  const ModelConfig& c = ctx.cfg;
  const int S = ctx.S, hc = c.hc_mult;
  const int64_t D = c.dim, HD = c.engram_head_dim, E = int64_t(cols) * HD;
  const float eps = float(c.norm_eps);

  // Gather and dequantize the rows: value = e4m3 * 2^(scale - 127), exact in bf16 (§A.7).
  for (int s = 0; s < S; ++s)
    for (int col = 0; col < cols; ++col) {
      const int64_t id = row_ids[int64_t(s) * cols + col];
      if (id < 0 || id >= w.engram_rows)
        throw Error("Engram layer " + std::to_string(lp.id) + ": hash row " + std::to_string(id) + " is outside its table of " +
                    std::to_string(w.engram_rows) + " rows");
    }
  DS41_SCRATCH(uint16_t, e, int64_t(S) * E);
  engram_gather_rows(w, HD, row_ids, int64_t(S) * cols, e.data(), ctx.pool);

  // kv = wkv(e): keys for the hc copies, then one shared value (§A.8).
  DS41_SCRATCH(uint16_t, kv, int64_t(S) * (hc + 1) * D);
  linear_fp8(e.data(), S, w.engram_wkv, kv.data(), ctx.pool);

  // Gate per copy and write (§A.9). q_weight * k_weight is only ever used as a product.
  DS41_SCRATCH(float, wgt, int64_t(hc) * D);
  for (int64_t i = 0; i < int64_t(hc) * D; ++i) wgt[size_t(i)] = bf16_to_f32(w.engram_q_weight[i]) * bf16_to_f32(w.engram_k_weight[i]);
  const float inv_sqrt_dim = float(std::pow(double(D), -0.5));
  const std::vector<uint8_t>* text = ctx.engram_text_mask;
  parallel_for(ctx.pool, S, [&](int64_t s0, int64_t s1) {
    DS41_SCRATCH(float, h, D);
    DS41_SCRATCH(float, k, D);
    DS41_SCRATCH(float, v, D);
    DS41_SCRATCH(float, prod, D);
    for (int64_t s = s0; s < s1; ++s) {
      const bool active = !text || (*text)[size_t(s)];
      const int64_t libm_from = ctx.opt.reference_call_shapes ? torch_scalar_tail_from(s, S, hc) : hc;
      const uint16_t* kvs = kv.data() + s * (hc + 1) * D;
      for (int64_t d = 0; d < D; ++d) v[size_t(d)] = bf16_to_f32(kvs[hc * D + d]);
      for (int ci = 0; ci < hc; ++ci) {
        uint16_t* xc = X + (s * hc + ci) * D;
        for (int64_t d = 0; d < D; ++d) {
          h[size_t(d)] = bf16_to_f32(xc[d]);
          k[size_t(d)] = bf16_to_f32(kvs[ci * D + d]);
        }
        float gate = 0.f;
        if (active) {
          const float rstd = (1.0f / std::sqrt(mean_square(h.data(), D) + eps)) * (1.0f / std::sqrt(mean_square(k.data(), D) + eps));
          // (h * weight * key).sum(-1): products rounded in fp32, summed in PyTorch's order.
          for (int64_t d = 0; d < D; ++d) prod[size_t(d)] = (h[size_t(d)] * wgt[size_t(ci * D + d)]) * k[size_t(d)];
          const float dot = (torch_sum_f32(prod.data(), D) * rstd) * inv_sqrt_dim;
          const float g = std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6f)), dot);
          // torch.sigmoid over the call's [S][hc] gates: the vector path except its scalar tail.
          gate = ci < libm_from ? torch_vec_sigmoid(g) : torch_scalar_sigmoid(g);
        }
        if (gate == 0.f) continue;  // h + 0 * value = h: the copy passes through unchanged
        for (int64_t d = 0; d < D; ++d) xc[d] = f32_to_bf16(h[size_t(d)] + gate * v[size_t(d)]);
      }
    }
  });
}

}  // namespace ds41
