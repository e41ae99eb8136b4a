// Typed views of a checkpoint's tensors, organised by the layer plan. Quantized weights stay in
// the mmap (zero-copy); the few tensors the reference transforms at load are materialised here:
// wo_a is dequantized to bf16 (convert.py does this; spec §2.4 step 3), ratio>1 compressor weights
// and the router weights are widened to fp32 (the reference runs them in fp32, exact widening),
// and F32/BF16 tensors that happen to be misaligned in the file are copied to aligned storage.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/byte_buffer.h"
#include "io/safetensors.h"
#include "kernels/gemm.h"
#include "model/config.h"
#include "model/expert_parallel.h"
#include "model/layer_plan.h"

namespace ds41 {

struct ExpertWeights {
  Fp4Matrix w1, w2, w3;
};
class ExpertCache;
struct SharedExpertWeights {
  Fp8Matrix w1, w2, w3;
};

struct BlockWeights {
  const uint16_t* attn_norm = nullptr;
  const uint16_t* ffn_norm = nullptr;
  const float* hc_attn_fn = nullptr;
  const float* hc_attn_base = nullptr;
  const float* hc_attn_scale = nullptr;
  const float* hc_ffn_fn = nullptr;
  const float* hc_ffn_base = nullptr;
  const float* hc_ffn_scale = nullptr;
  // hc_attn_fn / hc_ffn_fn transposed at load ([hc*D][mixes]: a position's weights of all mixes
  // adjacent) for the SIMD mix dot products (hyper_connection.h); owned by ModelWeights.
  const float* hc_attn_fn_t = nullptr;
  const float* hc_ffn_fn_t = nullptr;
  // attention
  Fp8Matrix wq_a{}, wq_b{}, wkv{}, wo_b{};
  const uint16_t* q_norm = nullptr;
  const uint16_t* kv_norm = nullptr;
  Fp8Matrix wo_a_fp8{};            // the checkpoint's codes, read once at load to make wo_a
  const uint16_t* wo_a = nullptr;  // bf16 [o_groups * o_lora_rank, n_heads * head_dim / o_groups]
  // The same rows packed for one-row (decode) products (gemm.h), each output group's o_lora_rank
  // rows packed on their own, so group g starts at value g * o_lora_rank * K.
  PackedBf16Matrix wo_a_packed;
  // Or, where the codes give the bf16 values exactly (gemm.h fp8_packable: always for checkpoints
  // as released), the FP8 codes packed the same way with the checkpoint's scales: half the bytes
  // per decode step, the same products. Then wo_a_packed is empty.
  PackedFp8Matrix wo_a_fp8_packed;
  const float* attn_sink = nullptr;
  // compressor (kv sources)
  const uint16_t* comp_wkv_bf16 = nullptr;    // bf16 projection
  const uint16_t* comp_wgate_bf16 = nullptr;  // ratio > 1: the gate projection
  const uint16_t* comp_norm = nullptr;
  // The bf16 projections a decode row reads whole (compressor, router) with their copies packed
  // at load as the head is (gemm.h PackedBf16Matrix; blocks null where the matrix has fewer than
  // 16 rows, rows null where it is absent): linear_f32_wbf16_maybe_packed reads the packed copy for
  // decode-sized calls, the row-major originals for prefill.
  PackedBf16Matrix comp_wkv_packed, comp_wgate_packed, gate_packed;
  // indexer (index sources)
  Fp8Matrix idx_wq_b{};
  const uint16_t* idx_weights_proj = nullptr;  // bf16 [index_n_heads, dim]
  const uint16_t* idx_wk = nullptr;            // bf16 [index_head_dim, head_dim] (kv sources)
  const uint16_t* idx_k_norm = nullptr;
  // MoE
  const uint16_t* gate_w = nullptr;            // bf16 [E, dim]; widened on use
  const float* gate_bias = nullptr;
  const float* gate_bias_vl = nullptr;         // nullptr when absent
  std::vector<ExpertWeights> experts;
  SharedExpertWeights shared{};
  // Engram (Engram layers)
  const uint8_t* engram_table = nullptr;       // F8_E4M3 [rows, head_dim]
  const uint8_t* engram_table_scale = nullptr; // E8M0 [rows, head_dim / 32]
  int64_t engram_rows = 0;
  Fp8Matrix engram_wkv{};
  const uint16_t* engram_q_weight = nullptr;   // bf16 [hc, dim]
  const uint16_t* engram_k_weight = nullptr;
};

// The DSpark draft head's stage-specific tensors (spec engram_dspark_vision.md §B.2): the input
// projection of the first stage and the heads of the last one.
struct DSparkHeadWeights {
  Fp8Matrix main_proj{};                   // [dim, n_targets * dim]
  const uint16_t* main_norm = nullptr;     // bf16 [dim]
  const uint16_t* norm = nullptr;          // bf16 [dim], before the shared head
  const uint16_t* markov_embed = nullptr;  // bf16 [vocab, markov_rank] (W1, previous token)
  const uint16_t* markov_head = nullptr;   // bf16 [vocab, markov_rank] (W2, logit bias)
  const float* confidence = nullptr;       // [dim + markov_rank], widened to fp32 (the reference holds fp32)
};

// The vision tower (spec engram_dspark_vision.md §C.4-§C.7), all BF16 in the checkpoint. The ViT
// RMSNorm gains are fp32 parameters in the reference (loaded from bf16, exact widening).
struct VisionBlockWeights {
  const float* norm1 = nullptr;
  const float* norm2 = nullptr;
  const uint16_t* wqkv = nullptr;       // [3 * vision_dim, vision_dim]
  const uint16_t* wqkv_bias = nullptr;  // [3 * vision_dim]
  const uint16_t* wo = nullptr;         // [vision_dim, vision_dim]
  const uint16_t* wo_bias = nullptr;
  const uint16_t* w1 = nullptr;         // [2 * vision_inter_dim, vision_dim]: gate rows, then up rows
  const uint16_t* w2 = nullptr;         // [vision_dim, vision_inter_dim]
};

struct VisionWeights {
  const uint16_t* patch_w = nullptr;  // [vision_dim, 3 * patch^2]
  const uint16_t* patch_b = nullptr;
  std::vector<VisionBlockWeights> blocks;
  const float* norm = nullptr;
  const uint16_t* aligner_w1 = nullptr;  // [dim, vision_dim * ratio^2]
  const uint16_t* aligner_b1 = nullptr;
  const uint16_t* aligner_w2 = nullptr;  // [dim, dim]
  const uint16_t* aligner_b2 = nullptr;
  const uint16_t* image_start = nullptr;  // [dim] learned span delimiters
  const uint16_t* image_end = nullptr;
  const uint16_t* image_newline = nullptr;
};

struct ModelWeights {
  const uint16_t* embed = nullptr;  // bf16 [vocab, dim]
  const uint16_t* head = nullptr;   // bf16 [vocab, dim]
  PackedBf16Matrix head_packed;     // the head repacked for the dense kernels (gemm.h), owned below
  const uint16_t* norm = nullptr;   // bf16 [dim]
  std::vector<BlockWeights> blocks; // one per plan layer (backbone then DSpark stages)
  DSparkHeadWeights dspark;         // set when the plan has DSpark stages
  VisionWeights vision;             // filled when the config enables vision (vision_n_layers > 0)

  // Bytes of the rows16 copies load made for the one-row decode kernels (plan_decode_copies).
  int64_t fp8_copy_bytes = 0, fp4_copy_bytes = 0;

  // Set when the routed experts are streamed from disk (model larger than the memory budget,
  // model/expert_cache.h): the MoE reads them through it, never through `blocks[l].experts`.
  std::shared_ptr<ExpertCache> expert_cache;

  // Expert parallelism (model/expert_parallel.h): the routed experts this process holds (every
  // one, in a single process), and on rank 0 of a job the transport to the others'.
  ExpertShare share;
  std::shared_ptr<ExpertParallel> expert_parallel;

  // Owns the checkpoint mapping and every materialised buffer.
  std::shared_ptr<TensorStore> store;
  std::vector<ByteBuffer> owned;
  int64_t owned_unused_bytes = 0;  // of `owned`, slab bytes never handed out (and never touched)
};

// Opens nothing itself: `store` must already be checked against the catalogue.
// `on_layer(done, total)` is called before each plan layer is prepared (progress display). The
// vision tower's tensors are loaded when the config has vision layers.
// Applies the residency hints of advise_model_weights, and MADV_DONTNEED on the head's mapping
// once it is packed.
// `memory_bytes`: what the load's memory decisions (decode copies) count as the machine's memory
// (0: physical RAM); `experts_streamed`: the routed experts will be read through an ExpertCache, so
// they get no huge-page advice (nothing reads their mapping), and no decode copies are made (the
// budget goes to expert slots: the disk sets the speed then). `share`: only the routed experts it
// owns are loaded (the others' views stay empty), and with experts_only nothing else (a follower
// rank of expert parallelism).
struct WeightLoadOptions {
  int64_t memory_bytes = 0;
  bool experts_streamed = false;
  ExpertShare share;
};
ModelWeights load_model_weights(std::shared_ptr<TensorStore> store, const ModelConfig& config, const ModelPlan& plan,
                                const std::function<void(int64_t, int64_t)>& on_layer = {},
                                const WeightLoadOptions& options = {});

// How the checkpoint's tensors are used, for memory hints (issue #10). Every token reads the
// "always" tensors; a routed expert is read when the router picks it; Engram table rows are read
// at hash-random places and the embedding one row per token.
enum class WeightUse { Always, RoutedExpert, EngramTable, Embedding };
WeightUse weight_use(const std::string& tensor_name);

// madvise hints, applied at load before any tensor is read: MADV_HUGEPAGE on the tensors every
// token reads and on the routed experts (see below), MADV_RANDOM on Engram tables (set where they
// are loaded) and the embedding. MADV_HUGEPAGE makes a page fault read 2 MiB page-cache folios
// (plus 2 MiB ahead) and map each with one page-table entry, the shard mapping being 2 MiB-aligned
// (io/safetensors.h): decode then misses the TLB once per 2 MiB of weights instead of once per
// 4 KiB. No MADV_WILLNEED on those: its read-ahead fills the page cache with 4 KiB folios, which the
// kernel then maps 4 KiB at a time for as long as they stay cached. Hash-random rows get no huge
// pages: a 2 MiB read per 256-byte Engram row would multiply what an SSD-streamed table costs.
// The embedding is also read ahead whole (MADV_WILLNEED: queued at load, read in the background;
// 4 KiB folios suit its one-row reads): otherwise each token whose row is not cached yet waits on
// the disk in the middle of a step (a fresh page cache, small preset: ~1 such fault per 6 tokens,
// decode at context 0 54.7-54.9 tok/s against 56.6-59.3 read ahead). It is 0.4 % of the released
// checkpoint (1.85 GB) and most of it ends up cached anyway once text has used its tokens. So are
// the Engram tables where they fit (engram_tables_read_ahead).
// (The buffers materialised at load are advised MADV_HUGEPAGE when allocated,
// base/byte_buffer.h; the small ones share slabs that are, weights.cpp.) Advisory: failures are
// ignored.
// `ram`: the memory the decisions count with (the budget, or physical RAM); `experts_streamed`:
// the routed experts are read through an ExpertCache (their mapping gets no advice).
void advise_model_weights(const TensorStore& store, int64_t ram, bool experts_streamed = false);

// Bytes of the tensors read whole (every token's and the routed experts): what advise_model_weights
// puts on 2 MiB pages where it can.
int64_t streamed_tensor_bytes(const TensorStore& store, bool experts_streamed = false);

// Whether routed experts get MADV_HUGEPAGE: when every tensor read whole (every token's and the
// experts, `streamed_bytes`) fits in half the machine's RAM, each is read from disk once and huge
// pages only save TLB misses; when it does not, experts are paged in and out as the router picks
// them, and a fault reading 4 MiB for a smaller expert tensor would multiply the disk traffic -
// so then only expert tensors of at least 4 MiB (the released model's: 5.9 MB) get them.
bool routed_expert_huge_pages(int64_t expert_tensor_bytes, int64_t streamed_bytes, int64_t ram_bytes);

// Whether the Engram tables (`table_bytes`, rows and scales) are read ahead at load: when they and
// every tensor read whole fit in half the machine's RAM, as the small preset's 333 MB do. Their
// rows are read at hash-random places, 24 per token on the small preset, so a cold page cache
// otherwise puts a disk read in most steps; the released model's 189 GiB need ~950 GiB of RAM.
bool engram_tables_read_ahead(int64_t table_bytes, int64_t streamed_bytes, int64_t ram_bytes);

// Whether rows16 copies (kernels/gemm.h) for the one-row decode kernels, `copy_bytes` of them, are
// made at load: when they and every tensor read whole (`streamed_bytes`) fit in half the machine's
// RAM. The copies are anonymous memory, kept beside the mapped originals (prefill reads those);
// where the model does not fit, that memory is better left to the page cache of the routed
// experts. The FP8 copies are decided first (fp8_decode_copy_bytes: every token reads them), then
// the FP4 ones (fp4_decode_copy_bytes) on top of those.
bool decode_copies_fit(int64_t copy_bytes, int64_t streamed_bytes, int64_t ram_bytes);
// Which rows16 copies load makes. `mode` is DS41_DECODE_COPIES: "auto" (or empty: as
// decode_copies_fit allows), "fp8" (the FP8 ones only, where they fit) or "none" (load stays a
// mapping, at the decode's cost; the copies' fresh pages are most of a load's time on a VM that
// hands freed memory back to its host). A byte count of 0 means the kernels read no such copy.
// Throws Error on another mode.
struct DecodeCopies {
  bool fp8 = false, fp4 = false;
};
DecodeCopies plan_decode_copies(const std::string& mode, int64_t fp8_bytes, int64_t fp4_bytes, int64_t streamed_bytes,
                                int64_t ram_bytes);
// Bytes of the rows16 copies of the FP8 weights that would get them: every token's FP8 matrices
// except wo_a (read as bf16 values), each at most its bytes plus a flag byte per 512.
int64_t fp8_decode_copy_bytes(const TensorStore& store);
// Bytes of the rows16 copies the FP4 weights (the experts, routed and the draft head's) would get:
// at most their codes, a scale code per 16 bytes and a flag per 16 rows.
int64_t fp4_decode_copy_bytes(const TensorStore& store);
// Bytes of the buffers load_model_weights makes besides the rows16 decode copies (the packed head,
// wo_a widened to bf16 and packed, the packed compressor and router projections, the transposed
// mix projections), an upper bound: what a memory
// plan counts before loading.
int64_t load_buffer_bytes_estimate(const TensorStore& store);
// The machine's physical memory (sysconf).
int64_t physical_ram_bytes();

// mlock(2) of the mapped tensors every token reads and of the routed experts (not the Engram
// tables, whose touched rows are few and which can be far larger than RAM). Returns the bytes
// locked; throws ds41::Error when the kernel refuses (with what to do about it).
int64_t lock_model_weights(const ModelWeights& w);

}  // namespace ds41
