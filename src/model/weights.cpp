#include "model/weights.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <tuple>
#include <type_traits>
#include <variant>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/hyper_connection.h"
#include "kernels/numeric_formats.h"
#include "model/tensor_table.h"

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

// The class a pointer to member belongs to.
template <class M>
struct member_owner;
template <class T, class C>
struct member_owner<T C::*> {
  using type = C;
};

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
    uint8_t* buf = own(t.nbytes);
    std::memcpy(buf, t.data, t.nbytes);
    return reinterpret_cast<const T*>(buf);
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
    float* out = reinterpret_cast<float*>(own(t.nbytes * 2));
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
      uint8_t* copy = own(size_t(fp8_rows16_bytes(m)));
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
      uint8_t* copy = own(size_t(fp4_rows16_bytes(m)));
      copies_.push_back([m, copy] { pack_fp4_rows16(m, copy); });
      w_.fp4_copy_bytes += fp4_rows16_bytes(m);
      m.rows16 = copy;
    }
    return m;
  }
  // Zero-filled bytes that live as long as the weights; 64-byte aligned, enough for every
  // element type and vector load used here. All of them sit on huge pages: a buffer of a huge
  // page or more is a mapping of its own (base/byte_buffer.h), smaller ones are carved from
  // slabs of kSlabBytes that are. (From the heap, on 4 KiB pages, the small preset's rows16
  // copies - 256 KiB to 1 MiB each - streamed ~20 % slower: one Xeon core, the AVX2 FP8 copy
  // kernel over 96 cold 1024 x 1024 copies, 7.3-7.9 -> 8.8-9.5 GB/s on 2 MiB pages.)
  uint8_t* own(size_t bytes) {
    if (bytes >= ByteBuffer::kHugePageBytes) {
      w_.owned.emplace_back(bytes);
      return w_.owned.back().data();
    }
    // Under AddressSanitizer a poisoned line after each piece: reads past it are still reported.
    const size_t need = ((bytes + 63) & ~size_t{63}) + (kAddressSanitizer ? 64 : 0);
    if (slab_ == nullptr || slab_used_ + need > kSlabBytes) {
      if (slab_) w_.owned_unused_bytes += int64_t(kSlabBytes - slab_used_);
      w_.owned.emplace_back(kSlabBytes);
      slab_ = w_.owned.back().data();
      slab_used_ = 0;
      poison_bytes(slab_, kSlabBytes);
    }
    uint8_t* p = slab_ + slab_used_;
    unpoison_bytes(p, bytes);
    slab_used_ += need;
    return p;
  }
  // The last slab's bytes never handed out (resident accounting).
  void close_slab() {
    if (slab_) w_.owned_unused_bytes += int64_t(kSlabBytes - slab_used_);
    slab_ = nullptr;
  }

  // Writes the rows16 copies that fp8 and fp4 handed out, on up to `threads` threads. Why not
  // one by one as they are made: filling a copy is mostly the kernel zeroing its fresh pages and
  // reading the originals (on a KVM guest 85 % of a load's samples were the page clearing), work
  // that runs on every core at once; the copies are independent.
  void write_copies(int threads) {
    close_slab();  // called once the loader has handed out every buffer
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
  static constexpr size_t kSlabBytes = 4 * ByteBuffer::kHugePageBytes;
  uint8_t* slab_ = nullptr;  // the slab being carved (owned by w_.owned), and its bytes handed out
  size_t slab_used_ = 0;
};

// Loads one block-table row into the view its slot names (tensor_table.h).
void load_block_tensor(Loader& L, const BlockTensor& t, const std::string& name, bool required, BlockWeights& b,
                       ExpertWeights& expert, DSparkHeadWeights& dspark) {
  auto value = [&](auto& out) {  // out: the member the slot points at
    using T = std::remove_reference_t<decltype(out)>;
    if constexpr (std::is_same_v<T, const uint16_t*>) out = L.bf16(name);
    else if constexpr (std::is_same_v<T, const float*>)
      out = t.format == TensorFormat::Bf16 ? L.bf16_as_f32(name) : required ? L.f32(name) : L.f32_optional(name);
    else if constexpr (std::is_same_v<T, Fp8Matrix>) out = L.fp8(name, t.decode_copy);
    else if constexpr (std::is_same_v<T, Fp4Matrix>) out = L.fp4(name);
    else {
      static_assert(std::is_same_v<T, const uint8_t*>);  // an Engram table (the only raw-byte slot)
      const TensorInfo& rows = L.tensor(name + ".weight", DType::F8_E4M3);
      const TensorInfo& scales = L.tensor(name + ".scale", DType::F8_E8M0);
      out = rows.data;
      b.engram_table_scale = scales.data;
      b.engram_rows = rows.shape.at(0);
      // Engram rows are read at hash-random places of ~100 GB tables: tell the kernel not to read
      // ahead around each touched row (it would otherwise map large folios around every row and
      // the resident set would grow by megabytes per token).
      advise_random(rows.data, rows.nbytes);
      advise_random(scales.data, scales.nbytes);
    }
  };
  std::visit(
      [&](auto m) {
        using Owner = typename member_owner<decltype(m)>::type;
        if constexpr (std::is_same_v<Owner, BlockWeights>) value(b.*m);
        else if constexpr (std::is_same_v<Owner, ExpertWeights>) value(expert.*m);
        else if constexpr (std::is_same_v<Owner, SharedExpertWeights>) value(b.shared.*m);
        else value(dspark.*m);
      },
      t.slot);
}

// Loads one model-level row (all BF16; a `const float*` slot is widened to fp32).
void load_model_tensor(Loader& L, const ModelTensor& t, ModelWeights& w, VisionWeights& v) {
  std::visit(
      [&](auto m) {
        using Owner = typename member_owner<decltype(m)>::type;
        auto& out = [&]() -> auto& {
          if constexpr (std::is_same_v<Owner, ModelWeights>) return w.*m;
          else return v.*m;
        }();
        if constexpr (std::is_same_v<std::remove_reference_t<decltype(out)>, const float*>) out = L.bf16_as_f32(t.name);
        else out = L.bf16(t.name);
      },
      t.slot);
}

}  // namespace

ModelWeights load_model_weights(std::shared_ptr<TensorStore> store, const ModelConfig& config, const ModelPlan& plan,
                                const std::function<void(int64_t, int64_t)>& on_layer,
                                const WeightLoadOptions& options) {
  ModelWeights w;
  w.store = store;
  const int64_t memory = options.memory_bytes > 0 ? options.memory_bytes : physical_ram_bytes();
  advise_model_weights(*store, memory, options.experts_streamed);  // before the first read below: the hints decide the folio sizes
  Loader L(*store, w);
  {
    // With the experts streamed from disk the budget is better spent on expert slots than on
    // decode copies (the disk, not the kernels, sets the speed then).
    const char* mode = options.experts_streamed ? "none" : std::getenv("DS41_DECODE_COPIES");
    const DecodeCopies copies = plan_decode_copies(
        mode ? mode : "", fp8_decode_reads_rows16() ? fp8_decode_copy_bytes(*store) : 0,
        fp4_decode_reads_rows16() && !options.experts_streamed ? fp4_decode_copy_bytes(*store) : 0,
        streamed_tensor_bytes(*store, options.experts_streamed), memory);
    L.fp8_rows16 = copies.fp8;
    L.fp4_rows16 = copies.fp4;
  }
  w.share = options.share;
  const bool experts_only = options.share.experts_only;
  if (experts_only) {
    // A follower rank of expert parallelism: its routed experts, nothing else.
    for (const LayerPlan& lp : plan.layers) {
      if (on_layer) on_layer(lp.id, int64_t(plan.layers.size()));
      BlockWeights b;
      b.experts.resize(size_t(lp.routed_experts));
      for (const BlockTensor& t : block_tensors()) {
        if (t.when != TensorWhen::RoutedExpert || !block_has(t, config, lp)) continue;
        DSparkHeadWeights unused_dspark;
        for (int e = 0; e < lp.routed_experts; ++e)
          if (w.share.owns(e, lp.routed_experts))
            load_block_tensor(L, t, expert_prefix(lp, e) + t.name, true, b, b.experts[size_t(e)], unused_dspark);
      }
      w.blocks.push_back(std::move(b));
    }
    L.write_copies(int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)));
    return w;
  }
  for (const ModelTensor& t : text_model_tensors()) load_model_tensor(L, t, w, w.vision);
  {
    // Packed once at load: the head is read whole for every token's logits.
    const TensorInfo& t = store->get(kHeadTensor);
    const int64_t N = t.shape[0], K = t.shape[1];
    auto* packed = reinterpret_cast<uint16_t*>(L.own(size_t((N / kPackedRows) * K * kPackedRows) * 2));
    pack_bf16_rows(w.head, N, K, packed, nullptr);
    w.head_packed = PackedBf16Matrix{packed, w.head, N, K};
    advise(t.data, t.nbytes, MADV_DONTNEED);  // read through the packed copy (only its tail rows here)
  }
  int64_t layers_done = 0;
  for (const LayerPlan& lp : plan.layers) {
    if (on_layer) on_layer(layers_done++, int64_t(plan.layers.size()));
    BlockWeights b;
    b.experts.resize(size_t(lp.routed_experts));
    for (const BlockTensor& t : block_tensors()) {
      if (!block_has(t, config, lp)) continue;
      if (t.when == TensorWhen::RoutedExpert) {
        for (int e = 0; e < lp.routed_experts; ++e)
          if (w.share.owns(e, lp.routed_experts))
            load_block_tensor(L, t, expert_prefix(lp, e) + t.name, true, b, b.experts[size_t(e)], w.dspark);
        continue;
      }
      ExpertWeights no_expert;  // a row that is not an expert's has no expert slot
      load_block_tensor(L, t, lp.prefix + t.name, block_requires(t, config, lp), b, no_expert, w.dspark);
    }
    {
      // One-row products of these read a packed copy (two Xeon cores at `avx2`: the compressor's
      // 512 x 1024 through the register-transposed row kernel ~10 GB/s per core, packed ~17).
      const auto packed = [&](const uint16_t* W, int64_t N, int64_t K) {
        if (W == nullptr || N < kPackedRows) return PackedBf16Matrix{nullptr, W, N, K};
        auto* out = reinterpret_cast<uint16_t*>(L.own(size_t((N / kPackedRows) * K * kPackedRows) * 2));
        pack_bf16_rows(W, N, K, out, nullptr);
        return PackedBf16Matrix{out, W, N, K};
      };
      b.comp_wkv_packed = packed(b.comp_wkv_bf16, config.head_dim, config.dim);
      b.comp_wgate_packed = packed(b.comp_wgate_bf16, config.head_dim, config.dim);
      b.gate_packed = packed(b.gate_w, lp.routed_experts, config.dim);
    }
    // The mix projections transposed for the SIMD mix dot products (hyper_connection.h).
    const int mixes = (2 + config.hc_mult) * config.hc_mult;
    const int64_t hc_dim = int64_t(config.hc_mult) * config.dim;
    for (auto [fn, out] : {std::pair{b.hc_attn_fn, &b.hc_attn_fn_t}, std::pair{b.hc_ffn_fn, &b.hc_ffn_fn_t}}) {
      auto* fn_t = reinterpret_cast<float*>(L.own(size_t(transposed_hc_projection_size(mixes, hc_dim)) * sizeof(float)));
      transpose_hc_projection(fn, mixes, hc_dim, fn_t);
      *out = fn_t;
    }
    {
      const Fp8Matrix& wo_a = b.wo_a_fp8;  // read as bf16 values (below), never by the FP8 decode
      auto* wo_a_bf16 = reinterpret_cast<uint16_t*>(L.own(size_t(wo_a.N * wo_a.K) * 2));
      dequant_fp8_to_bf16(wo_a, wo_a_bf16);
      b.wo_a = wo_a_bf16;
      // Only whole 16-row blocks are packed; attention reads the packed copy only then. The FP8
      // codes when every group is whole 32-row scale blocks and the values allow it.
      const int64_t group_rows = config.o_lora_rank;
      if (group_rows % 32 == 0 && fp8_packable(wo_a)) {
        uint8_t* out = L.own(size_t(kPackedFp8Front + wo_a.N * wo_a.K)) + kPackedFp8Front;
        const int64_t scale_cols = wo_a.K / 32;
        for (int64_t r = 0; r < wo_a.N; r += group_rows)
          pack_fp8_rows(Fp8Matrix{wo_a.w + r * wo_a.K, wo_a.scale + (r / 32) * scale_cols, group_rows, wo_a.K},
                        out + r * wo_a.K, nullptr);
        b.wo_a_fp8_packed = PackedFp8Matrix{out, wo_a.scale, wo_a.N, wo_a.K};
      } else if (group_rows % kPackedRows == 0) {
        auto* out = reinterpret_cast<uint16_t*>(L.own(size_t(wo_a.N * wo_a.K) * 2));
        for (int64_t r = 0; r < wo_a.N; r += group_rows)
          pack_bf16_rows(b.wo_a + r * wo_a.K, group_rows, wo_a.K, out + r * wo_a.K, nullptr);
        b.wo_a_packed = PackedBf16Matrix{out, b.wo_a, wo_a.N, wo_a.K};
      }
    }
    w.blocks.push_back(std::move(b));
  }
  if (config.vision_enabled()) {
    for (const ModelTensor& t : vision_tensors()) load_model_tensor(L, t, w, w.vision);
    for (int i = 0; i < config.vision_n_layers; ++i) {
      VisionBlockWeights vb;
      for (const VisionBlockTensor& t : vision_block_tensors()) {
        const std::string name = vision_block_prefix(i) + t.name;
        std::visit(
            [&](auto m) {
              if constexpr (std::is_same_v<decltype(vb.*m), const float*&>) vb.*m = L.bf16_as_f32(name);
              else vb.*m = L.bf16(name);
            },
            t.slot);
      }
      w.vision.blocks.push_back(vb);
    }
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
      bytes += int64_t(t.nbytes) + int64_t(t.nbytes) / 512;  // the codes, then a flag per 16 x 32 block
  return bytes;
}

int64_t fp4_decode_copy_bytes(const TensorStore& store) {
  int64_t bytes = 0;
  for (const TensorInfo& t : store.tensors())
    if (t.dtype == DType::I8)  // the packed FP4 codes [N, K / 2], a scale code per 16 bytes, a flag per 16 rows
      bytes += int64_t(t.nbytes) + int64_t(t.nbytes) / 16 + (t.shape.empty() ? 0 : t.shape[0] / 16);
  return bytes;
}

int64_t load_buffer_bytes_estimate(const TensorStore& store) {
  int64_t bytes = 0;
  for (const TensorInfo& t : store.tensors()) {
    const int64_t n = int64_t(t.nbytes);
    if (t.name == kHeadTensor) bytes += n;  // the packed copy
    else if (t.name.find(".attn.wo_a.weight") != std::string::npos) bytes += 4 * n;  // bf16 values, then packed
    else if (t.name.find(".attn.compressor.wkv.weight") != std::string::npos ||
             t.name.find(".attn.compressor.wgate.weight") != std::string::npos || t.name.ends_with(".ffn.gate.weight"))
      bytes += n;  // the packed copy for decode
    else if ((t.name.find("hc_attn_fn") != std::string::npos || t.name.find("hc_ffn_fn") != std::string::npos) &&
             t.shape.size() == 2)
      bytes += transposed_hc_projection_size(int(t.shape[0]), t.shape[1]) * int64_t(sizeof(float));
    else if (t.dtype == DType::BF16 && t.name.find("confidence_head") != std::string::npos) bytes += 2 * n;
    else if (t.dtype == DType::BF16 && t.name.find("vision.") == 0 && t.name.find("norm") != std::string::npos) bytes += 2 * n;
    // Values the file does not align for their type are copied (Loader::aligned).
    const uintptr_t at = reinterpret_cast<uintptr_t>(t.data);
    if ((t.dtype == DType::BF16 && at % 2) || (t.dtype == DType::F32 && at % 4)) bytes += n;
  }
  return bytes;
}

int64_t physical_ram_bytes() { return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE)); }

int64_t streamed_tensor_bytes(const TensorStore& store, bool experts_streamed) {
  int64_t bytes = 0;
  for (const TensorInfo& t : store.tensors()) {
    const WeightUse use = weight_use(t.name);
    if (use == WeightUse::Always || (use == WeightUse::RoutedExpert && !experts_streamed)) bytes += int64_t(t.nbytes);
  }
  return bytes;
}

void advise_model_weights(const TensorStore& store, int64_t ram, bool experts_streamed) {
  const int64_t streamed = streamed_tensor_bytes(store, experts_streamed);
  int64_t table_bytes = 0;
  for (const TensorInfo& t : store.tensors())
    if (weight_use(t.name) == WeightUse::EngramTable) table_bytes += int64_t(t.nbytes);
  const bool tables_ahead = engram_tables_read_ahead(table_bytes, streamed, ram);
  for (const TensorInfo& t : store.tensors()) {
    const WeightUse use = weight_use(t.name);
    if (use == WeightUse::Always ||
        (use == WeightUse::RoutedExpert && !experts_streamed && routed_expert_huge_pages(int64_t(t.nbytes), streamed, ram)))
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
    if (use != WeightUse::Always && (use != WeightUse::RoutedExpert || w.expert_cache)) continue;
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
