#include "model/weights.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <tuple>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/hyper_connection.h"
#include "kernels/numeric_formats.h"

namespace ds41 {

namespace {

// The page-aligned range covering [data, data + bytes).
std::pair<void*, size_t> page_range(const uint8_t* data, size_t bytes) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
  return {reinterpret_cast<void*>(begin), size_t(end - begin)};
}

void advise(const uint8_t* data, size_t bytes, int advice) {
  if (!data || bytes == 0) return;
  const auto [p, n] = page_range(data, bytes);
  madvise(p, n, advice);  // advisory
}

void advise_random(const uint8_t* data, size_t bytes) { advise(data, bytes, MADV_RANDOM); }

// MADV_WILLNEED over a whole range, in pieces: the kernel reads at most one read-ahead window
// (the device's read_ahead_kb, 128 KiB by default) per call and drops the rest of the range (on
// the VM with 8 MiB, one call over 64 MiB brought in 12 %). The reads are queued, not waited for.
void advise_read_ahead(const uint8_t* data, size_t bytes) {
  constexpr size_t kPiece = size_t(128) << 10;
  for (size_t offset = 0; offset < bytes; offset += kPiece) advise(data + offset, std::min(kPiece, bytes - offset), MADV_WILLNEED);
}

class Loader {
 public:
  Loader(const TensorStore& s, ModelWeights& w) : store_(s), w_(w) {}

  const TensorInfo& tensor(const std::string& name, DType dt) const {
    const TensorInfo& t = store_.get(name);
    if (t.dtype != dt)
      throw Error(t.file + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t.dtype)) + ", expected " +
                  std::string(dtype_name(dt)));
    return t;
  }
  // A pointer of the right alignment to the tensor's values: the mmap itself when aligned,
  // else an owned copy (safetensors does not promise alignment).
  template <class T>
  const T* aligned(const TensorInfo& t) {
    if (reinterpret_cast<uintptr_t>(t.data) % alignof(T) == 0) return reinterpret_cast<const T*>(t.data);
    auto& buf = own(t.nbytes);
    std::memcpy(buf.data(), t.data, t.nbytes);
    return reinterpret_cast<const T*>(buf.data());
  }
  bool fp8_rows16 = false, fp4_rows16 = false;  // give the matrices rows16 copies (fp8, fp4 below)
  const uint16_t* bf16(const std::string& name) { return aligned<uint16_t>(tensor(name, DType::BF16)); }
  const float* f32(const std::string& name) { return aligned<float>(tensor(name, DType::F32)); }
  const float* f32_optional(const std::string& name) {
    const TensorInfo* t = store_.find(name);
    return t && t->dtype == DType::F32 ? aligned<float>(*t) : nullptr;
  }
  // A BF16 tensor widened to fp32 (exact).
  const float* bf16_as_f32(const std::string& name) {
    const TensorInfo& t = tensor(name, DType::BF16);
    auto& buf = own(t.nbytes * 2);
    float* out = reinterpret_cast<float*>(buf.data());
    for (size_t i = 0; i < t.nbytes / 2; ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[i] = bf16_to_f32(h);
    }
    return out;
  }
  // With `decode_copy` (and the loader's rows16 set) the matrix gets a rows16 copy for the one-row
  // decode kernel (kernels/gemm.h).
  Fp8Matrix fp8(const std::string& base, bool decode_copy = true) {
    const TensorInfo& w = tensor(base + ".weight", DType::F8_E4M3);
    const TensorInfo& s = tensor(base + ".scale", DType::F8_E8M0);
    Fp8Matrix m{w.data, s.data, w.shape.at(0), w.shape.at(1)};
    if (decode_copy && fp8_rows16 && m.K % 32 == 0 && m.N >= 16) {
      uint8_t* copy = own(size_t(fp8_rows16_bytes(m))).data();
      copies_.push_back([m, copy] { pack_fp8_rows16(m, copy); });
      w_.fp8_copy_bytes += fp8_rows16_bytes(m);
      m.rows16 = copy;
    }
    return m;
  }
  Fp4Matrix fp4(const std::string& base) {
    const TensorInfo& w = tensor(base + ".weight", DType::I8);
    const TensorInfo& s = tensor(base + ".scale", DType::F8_E8M0);
    Fp4Matrix m{w.data, s.data, w.shape.at(0), w.shape.at(1) * 2};
    if (fp4_rows16 && m.K % 32 == 0 && m.N >= 16) {
      uint8_t* copy = own(size_t(fp4_rows16_bytes(m))).data();
      copies_.push_back([m, copy] { pack_fp4_rows16(m, copy); });
      w_.fp4_copy_bytes += fp4_rows16_bytes(m);
      m.rows16 = copy;
    }
    return m;
  }
  // Zero-filled; aligned to at least 16 bytes, enough for every element type used here. Large
  // ones start on huge pages (base/byte_buffer.h).
  ByteBuffer& own(size_t bytes) {
    w_.owned.emplace_back(bytes);
    return w_.owned.back();
  }

  // Writes the rows16 copies that fp8 and fp4 handed out, on up to `threads` threads. Why not
  // one by one as they are made: filling a copy is mostly the kernel zeroing its fresh pages and
  // reading the originals (on a KVM guest 85 % of a load's samples were the page clearing), work
  // that runs on every core at once; the copies are independent.
  void write_copies(int threads) {
    if (copies_.empty()) return;
    ThreadPool pool(int(std::min<int64_t>(threads, int64_t(copies_.size()))));
    parallel_for(&pool, int64_t(copies_.size()), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) copies_[size_t(i)]();
    });
    copies_.clear();
  }

 private:
  const TensorStore& store_;
  ModelWeights& w_;
  std::vector<std::function<void()>> copies_;  // fills of the rows16 copies handed out (write_copies)
};

}  // namespace

ModelWeights load_model_weights(std::shared_ptr<TensorStore> store, const ModelConfig& config, const ModelPlan& plan,
                                const std::function<void(int64_t, int64_t)>& on_layer) {
  const int vision_layers = config.vision_n_layers;
  ModelWeights w;
  w.store = store;
  advise_model_weights(*store);  // before the first read below: the hints decide the folio sizes
  Loader L(*store, w);
  {
    const char* mode = std::getenv("DS41_DECODE_COPIES");
    const DecodeCopies copies = plan_decode_copies(
        mode ? mode : "", fp8_decode_reads_rows16() ? fp8_decode_copy_bytes(*store) : 0,
        fp4_decode_reads_rows16() ? fp4_decode_copy_bytes(*store) : 0, streamed_tensor_bytes(*store), physical_ram_bytes());
    L.fp8_rows16 = copies.fp8;
    L.fp4_rows16 = copies.fp4;
  }
  w.embed = L.bf16("embed.weight");
  w.head = L.bf16("head.weight");
  {
    // Packed once at load: the head is read whole for every token's logits.
    const TensorInfo& t = store->get("head.weight");
    const int64_t N = t.shape[0], K = t.shape[1];
    auto& buf = L.own(size_t((N / kPackedRows) * K * kPackedRows) * 2);
    pack_bf16_rows(w.head, N, K, reinterpret_cast<uint16_t*>(buf.data()), nullptr);
    w.head_packed = PackedBf16Matrix{reinterpret_cast<const uint16_t*>(buf.data()), w.head, N, K};
    advise(t.data, t.nbytes, MADV_DONTNEED);  // read through the packed copy (only its tail rows here)
  }
  w.norm = L.bf16("norm.weight");
  int64_t layers_done = 0;
  for (const LayerPlan& lp : plan.layers) {
    if (on_layer) on_layer(layers_done++, int64_t(plan.layers.size()));
    BlockWeights b;
    const std::string& p = lp.prefix;
    b.attn_norm = L.bf16(p + "attn_norm.weight");
    b.ffn_norm = L.bf16(p + "ffn_norm.weight");
    b.hc_attn_fn = L.f32(p + "hc_attn_fn");
    b.hc_attn_base = L.f32(p + "hc_attn_base");
    b.hc_attn_scale = L.f32(p + "hc_attn_scale");
    b.hc_ffn_fn = L.f32(p + "hc_ffn_fn");
    b.hc_ffn_base = L.f32(p + "hc_ffn_base");
    b.hc_ffn_scale = L.f32(p + "hc_ffn_scale");
    for (auto [fn, name, out] : {std::tuple{b.hc_attn_fn, "hc_attn_fn", &b.hc_attn_fn_t},
                                 std::tuple{b.hc_ffn_fn, "hc_ffn_fn", &b.hc_ffn_fn_t}}) {
      const TensorInfo& t = store->get(p + name);
      auto& buf = L.own(size_t(transposed_hc_projection_size(int(t.shape[0]), t.shape[1])) * sizeof(float));
      transpose_hc_projection(fn, int(t.shape[0]), t.shape[1], reinterpret_cast<float*>(buf.data()));
      *out = reinterpret_cast<const float*>(buf.data());
    }
    const std::string a = p + "attn.";
    b.wq_a = L.fp8(a + "wq_a");
    b.wq_b = L.fp8(a + "wq_b");
    b.wkv = L.fp8(a + "wkv");
    b.wo_b = L.fp8(a + "wo_b");
    b.q_norm = L.bf16(a + "q_norm.weight");
    b.kv_norm = L.bf16(a + "kv_norm.weight");
    b.attn_sink = L.f32(a + "attn_sink");
    {
      Fp8Matrix wo_a = L.fp8(a + "wo_a", false);  // read as bf16 values (below), never by the FP8 decode
      auto& buf = L.own(size_t(wo_a.N * wo_a.K) * 2);
      dequant_fp8_to_bf16(wo_a, reinterpret_cast<uint16_t*>(buf.data()));
      b.wo_a = reinterpret_cast<const uint16_t*>(buf.data());
      // Only whole 16-row blocks are packed; attention reads the packed copy only then. The FP8
      // codes when every group is whole 32-row scale blocks and the values allow it.
      const int64_t group_rows = config.o_lora_rank;
      if (group_rows % 32 == 0 && fp8_packable(wo_a)) {
        auto& packed = L.own(size_t(kPackedFp8Front + wo_a.N * wo_a.K));
        uint8_t* out = packed.data() + kPackedFp8Front;
        const int64_t scale_cols = wo_a.K / 32;
        for (int64_t r = 0; r < wo_a.N; r += group_rows)
          pack_fp8_rows(Fp8Matrix{wo_a.w + r * wo_a.K, wo_a.scale + (r / 32) * scale_cols, group_rows, wo_a.K},
                        out + r * wo_a.K, nullptr);
        b.wo_a_fp8_packed = PackedFp8Matrix{out, wo_a.scale, wo_a.N, wo_a.K};
      } else if (group_rows % kPackedRows == 0) {
        auto& packed = L.own(size_t(wo_a.N * wo_a.K) * 2);
        uint16_t* out = reinterpret_cast<uint16_t*>(packed.data());
        for (int64_t r = 0; r < wo_a.N; r += group_rows)
          pack_bf16_rows(b.wo_a + r * wo_a.K, group_rows, wo_a.K, out + r * wo_a.K, nullptr);
        b.wo_a_packed = PackedBf16Matrix{out, b.wo_a, wo_a.N, wo_a.K};
      }
    }
    if (lp.kv_source) {
      b.comp_wkv_bf16 = L.bf16(a + "compressor.wkv.weight");
      if (lp.ratio > 1) b.comp_wgate_bf16 = L.bf16(a + "compressor.wgate.weight");
      b.comp_norm = L.bf16(a + "compressor.norm.weight");
    }
    if (lp.index_source) {
      b.idx_wq_b = L.fp8(a + "indexer.wq_b");
      b.idx_weights_proj = L.bf16(a + "indexer.weights_proj.weight");
      if (lp.owns_index_k) {
        b.idx_wk = L.bf16(a + "indexer.wk.weight");
        b.idx_k_norm = L.bf16(a + "indexer.k_norm.weight");
      }
    }
    const std::string f = p + "ffn.";
    b.gate_w = L.bf16(f + "gate.weight");
    b.gate_bias = L.f32(f + "gate.bias");
    b.gate_bias_vl = L.f32_optional(f + "gate.bias_vl");
    for (int e = 0; e < lp.routed_experts; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      b.experts.push_back({L.fp4(x + "w1"), L.fp4(x + "w2"), L.fp4(x + "w3")});
    }
    b.shared = {L.fp8(f + "shared_experts.w1"), L.fp8(f + "shared_experts.w2"), L.fp8(f + "shared_experts.w3")};
    if (lp.engram) {
      const std::string e = p + "engram.";
      const TensorInfo& t = L.tensor(e + "embed.weight", DType::F8_E4M3);
      b.engram_table = t.data;
      b.engram_rows = t.shape.at(0);
      const TensorInfo& ts = L.tensor(e + "embed.scale", DType::F8_E8M0);
      b.engram_table_scale = ts.data;
      // Engram rows are read at hash-random places of ~100 GB tables: tell the kernel not to read
      // ahead around each touched row (it would otherwise map large folios around every row and
      // the resident set would grow by megabytes per token).
      advise_random(t.data, t.nbytes);
      advise_random(ts.data, ts.nbytes);
      b.engram_wkv = L.fp8(e + "wkv");
      b.engram_q_weight = L.bf16(e + "q_weight");
      b.engram_k_weight = L.bf16(e + "k_weight");
    }
    if (lp.is_dspark && lp.dspark_stage == 0) {
      w.dspark.main_proj = L.fp8(p + "main_proj");
      w.dspark.main_norm = L.bf16(p + "main_norm.weight");
    }
    if (lp.is_dspark && lp.id == int(plan.layers.size()) - 1) {  // the last stage carries the heads
      w.dspark.norm = L.bf16(p + "norm.weight");
      w.dspark.markov_embed = L.bf16(p + "markov_head.embed.weight");
      w.dspark.markov_head = L.bf16(p + "markov_head.head.weight");
      w.dspark.confidence = L.bf16_as_f32(p + "confidence_head.proj.weight");
    }
    w.blocks.push_back(std::move(b));
  }
  if (vision_layers > 0) {
    VisionWeights& v = w.vision;
    v.patch_w = L.bf16("vision.patch_embed.proj.weight");
    v.patch_b = L.bf16("vision.patch_embed.proj.bias");
    for (int i = 0; i < vision_layers; ++i) {
      const std::string p = "vision.blocks." + std::to_string(i) + ".";
      VisionBlockWeights b;
      b.norm1 = L.bf16_as_f32(p + "norm1.weight");
      b.norm2 = L.bf16_as_f32(p + "norm2.weight");
      b.wqkv = L.bf16(p + "attn.wqkv.weight");
      b.wqkv_bias = L.bf16(p + "attn.wqkv.bias");
      b.wo = L.bf16(p + "attn.wo.weight");
      b.wo_bias = L.bf16(p + "attn.wo.bias");
      b.w1 = L.bf16(p + "mlp.w1.weight");
      b.w2 = L.bf16(p + "mlp.w2.weight");
      v.blocks.push_back(b);
    }
    v.norm = L.bf16_as_f32("vision.norm.weight");
    v.aligner_w1 = L.bf16("aligner.w1.weight");
    v.aligner_b1 = L.bf16("aligner.w1.bias");
    v.aligner_w2 = L.bf16("aligner.w2.weight");
    v.aligner_b2 = L.bf16("aligner.w2.bias");
    v.image_start = L.bf16("image_start");
    v.image_end = L.bf16("image_end");
    v.image_newline = L.bf16("image_newline");
  }
  L.write_copies(int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)));
  return w;
}

WeightUse weight_use(const std::string& name) {
  if (name.find(".ffn.experts.") != std::string::npos) return WeightUse::RoutedExpert;
  if (name.find(".engram.embed.") != std::string::npos) return WeightUse::EngramTable;
  if (name == "embed.weight") return WeightUse::Embedding;
  return WeightUse::Always;
}

bool routed_expert_huge_pages(int64_t expert_tensor_bytes, int64_t streamed_bytes, int64_t ram_bytes) {
  return streamed_bytes <= ram_bytes / 2 || expert_tensor_bytes >= (int64_t(4) << 20);
}

namespace {

// The rule for memory load adds beside the tensors read whole (copies, read-ahead tables): all of
// it together within half the RAM, the rest left to the page cache and the program.
bool fits_beside_streamed(int64_t extra_bytes, int64_t streamed_bytes, int64_t ram_bytes) {
  return streamed_bytes + extra_bytes <= ram_bytes / 2;
}

}  // namespace

bool engram_tables_read_ahead(int64_t table_bytes, int64_t streamed_bytes, int64_t ram_bytes) {
  return table_bytes > 0 && fits_beside_streamed(table_bytes, streamed_bytes, ram_bytes);
}

bool decode_copies_fit(int64_t copy_bytes, int64_t streamed_bytes, int64_t ram_bytes) {
  return fits_beside_streamed(copy_bytes, streamed_bytes, ram_bytes);
}

DecodeCopies plan_decode_copies(const std::string& mode, int64_t fp8_bytes, int64_t fp4_bytes, int64_t streamed_bytes,
                                int64_t ram_bytes) {
  if (!mode.empty() && mode != "auto" && mode != "fp8" && mode != "none")
    throw Error("DS41_DECODE_COPIES=" + mode + ": unknown value (use auto, fp8 or none)");
  DecodeCopies c;
  if (mode == "none") return c;
  // The FP8 copies first (every token reads those matrices), then the experts' if they fit too.
  c.fp8 = fp8_bytes > 0 && decode_copies_fit(fp8_bytes, streamed_bytes, ram_bytes);
  c.fp4 = mode != "fp8" && fp4_bytes > 0 &&
          decode_copies_fit((c.fp8 ? fp8_bytes : 0) + fp4_bytes, streamed_bytes, ram_bytes);
  return c;
}

int64_t fp8_decode_copy_bytes(const TensorStore& store) {
  int64_t bytes = 0;
  for (const TensorInfo& t : store.tensors())
    if (t.dtype == DType::F8_E4M3 && weight_use(t.name) == WeightUse::Always &&
        t.name.find(".attn.wo_a.") == std::string::npos)
      bytes += int64_t(t.nbytes);
  return bytes;
}

int64_t fp4_decode_copy_bytes(const TensorStore& store) {
  int64_t bytes = 0;
  for (const TensorInfo& t : store.tensors())
    if (t.dtype == DType::I8) bytes += int64_t(t.nbytes);  // the packed FP4 codes (their scales are E8M0)
  return bytes;
}

int64_t physical_ram_bytes() { return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE)); }

int64_t streamed_tensor_bytes(const TensorStore& store) {
  int64_t bytes = 0;
  for (const TensorInfo& t : store.tensors()) {
    const WeightUse use = weight_use(t.name);
    if (use == WeightUse::Always || use == WeightUse::RoutedExpert) bytes += int64_t(t.nbytes);
  }
  return bytes;
}

void advise_model_weights(const TensorStore& store) {
  const int64_t streamed = streamed_tensor_bytes(store);
  const int64_t ram = physical_ram_bytes();
  int64_t table_bytes = 0;
  for (const TensorInfo& t : store.tensors())
    if (weight_use(t.name) == WeightUse::EngramTable) table_bytes += int64_t(t.nbytes);
  const bool tables_ahead = engram_tables_read_ahead(table_bytes, streamed, ram);
  for (const TensorInfo& t : store.tensors()) {
    const WeightUse use = weight_use(t.name);
    if (use == WeightUse::Always ||
        (use == WeightUse::RoutedExpert && routed_expert_huge_pages(int64_t(t.nbytes), streamed, ram)))
      advise(t.data, t.nbytes, MADV_HUGEPAGE);
    else if (use == WeightUse::Embedding) {
      advise(t.data, t.nbytes, MADV_RANDOM);
      advise_read_ahead(t.data, t.nbytes);
    } else if (use == WeightUse::EngramTable && tables_ahead) {
      advise_read_ahead(t.data, t.nbytes);
    }
  }
}

int64_t lock_model_weights(const ModelWeights& w) {
  int64_t locked = 0;
  if (!w.store) return 0;
  for (const TensorInfo& t : w.store->tensors()) {
    const WeightUse use = weight_use(t.name);
    if (use != WeightUse::Always && use != WeightUse::RoutedExpert) continue;
    if (!t.data || t.nbytes == 0) continue;
    const auto [p, n] = page_range(t.data, t.nbytes);
    if (mlock(p, n) != 0) {
      const int err = errno;
      throw Error("--mlock: locking " + std::to_string(n >> 20) + " MiB of '" + t.name + "' failed after " +
                  std::to_string(locked >> 20) + " MiB (" + std::strerror(err) +
                  "); raise the locked-memory limit (ulimit -l, or LimitMEMLOCK for a service) or run without --mlock");
    }
    locked += int64_t(n);
  }
  for (const auto& buf : w.owned) {
    if (buf.empty()) continue;
    if (mlock(buf.data(), buf.size()) != 0)
      throw Error(std::string("--mlock: locking the weights materialised at load failed (") + std::strerror(errno) +
                  "); raise the locked-memory limit (ulimit -l) or run without --mlock");
    locked += int64_t(buf.size());
  }
  return locked;
}

}  // namespace ds41
