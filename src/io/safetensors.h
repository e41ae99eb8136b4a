// Reading safetensors checkpoints without copying tensor data.
//
// A safetensors file is: 8 bytes little-endian u64 N, N bytes of JSON header, then the data area.
// The header maps tensor name -> {"dtype", "shape", "data_offsets": [begin, end]} (offsets are
// relative to the start of the data area) plus an optional "__metadata__" string->string map.
// A checkpoint is either one such file or several shards tied together by
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {name: shard}}).
//
// Everything read from disk is untrusted: parse_safetensors_header() checks every field before
// any pointer into the file is formed, and every failure is a ds41::Error that names the file and
// (where there is one) the tensor. Files are mapped read-only with MAP_SHARED, so a 475 GiB
// checkpoint costs address space, not memory, and tensor data is never copied by the reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "io/dtype.h"

namespace ds41 {

// The reference implementation refuses headers above 100 MB; a DeepSeek shard header is a few
// hundred KiB, so anything near this limit is a corrupt length field, not a real header.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// "[512, 5120]" — the spelling used in every error message about shapes.
std::string format_shape(const std::vector<int64_t>& shape);

// Bytes needed by a tensor of this dtype and shape; nullopt when a dimension is negative or the
// element count (or byte count) does not fit in int64. Shape [] is a scalar (1 element).
std::optional<uint64_t> shape_nbytes(DType dtype, const std::vector<int64_t>& shape);

// One tensor of an open file or checkpoint. `data` points into the file mapping owned by the
// SafetensorsFile / TensorStore it came from and is valid as long as that object lives.
struct TensorInfo {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // path of the .safetensors file holding the data
  uint64_t file_offset = 0;  // where the data starts in that file (for reads that bypass the mapping)

  int64_t numel() const;
  std::span<const uint8_t> bytes() const { return {data, nbytes}; }

  // Typed view of the data. Throws Error when sizeof(T) differs from the dtype's element size or
  // the data is not aligned for T (safetensors does not promise alignment: an odd-sized tensor
  // earlier in the data area shifts every later one).
  template <class T>
  std::span<const T> as() const {
    check_view(sizeof(T), alignof(T));
    return {reinterpret_cast<const T*>(data), nbytes / sizeof(T)};
  }

 private:
  void check_view(size_t elem_size, size_t elem_align) const;
};

// The validated content of a safetensors header.
struct SafetensorsHeader {
  struct Entry {
    std::string name;
    DType dtype = DType::U8;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // offsets relative to data_start
    uint64_t end = 0;
  };
  std::vector<Entry> entries;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
};

// Parses and validates the header of a safetensors file whose first `file_size` bytes are at
// `bytes` (only the first 8 + header-length bytes are read). Validates the length field, the
// JSON, every entry (dtype, shape, offsets, byte count), that all data lies inside the file, that
// no two tensors overlap and that no name appears twice. Throws Error("<file_label>: ...").
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t file_size,
                                           const std::string& file_label);

// One memory-mapped .safetensors file. The mapping lives as long as the object (moves keep it).
// It starts at a 2 MiB-aligned address (file offset 0 there), so huge page-cache folios can be
// mapped whole where madvise(MADV_HUGEPAGE) asks for them (model/weights.h).
// Note: if another process truncates the file while it is mapped, touching the lost pages raises
// SIGBUS; that cannot be detected up front and is outside what a reader can guard against.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile() = default;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return map_.size; }

 private:
  // Owns the mapping so that a constructor that throws after mmap still unmaps, and so that the
  // defaulted moves transfer ownership.
  struct Mapping {
    const uint8_t* data = nullptr;
    size_t size = 0;
    Mapping() = default;
    Mapping(Mapping&& o) noexcept;
    Mapping& operator=(Mapping&& o) noexcept;
    ~Mapping();
  };

  std::string path_;
  Mapping map_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A whole checkpoint: one file, or the shards of a model.safetensors.index.json.
class TensorStore {
 public:
  // `path` may be a directory (model.safetensors.index.json is used if present, else
  // model.safetensors), an index .json file, or a single .safetensors file.
  static TensorStore open(const std::string& path);

  const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  const TensorInfo& get(std::string_view name) const;                  // throws Error if absent
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  size_t size() const { return tensors_.size(); }
  size_t shard_count() const { return files_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }
  const std::string& root() const { return root_; }  // directory holding the shards

 private:
  TensorStore() = default;
  static TensorStore open_single(const std::string& file);
  static TensorStore open_index(const std::string& index_path);
  void finish();  // collects and sorts tensors_, computes total_bytes_

  std::string root_;
  std::string source_;  // what open() was given, for error messages
  // unique_ptr: the TensorInfo pointers must survive moves of the store (and of the vector).
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<TensorInfo> tensors_;
  uint64_t total_bytes_ = 0;
};

}  // namespace ds41
