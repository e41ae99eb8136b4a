// Safetensors writer. See safetensors_writer.h.
#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "io/safetensors.h"

namespace ds41 {
namespace {

namespace fs = std::filesystem;

// A file written under "<path>.tmp" and renamed to <path> by commit(). If commit() is not
// reached (an exception from a write or from a fill callback), the destructor removes the
// temporary file, so readers only ever see complete files.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create " + tmp_, errno);
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  void write(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      // Linux moves at most ~2 GiB per call; loop over short writes.
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail("write failed after " + std::to_string(written_) + " bytes", errno);
      if (w == 0) fail("write made no progress after " + std::to_string(written_) + " bytes", EIO);
      p += w;
      n -= size_t(w);
      written_ += uint64_t(w);
    }
  }

  void commit() {
    // fsync before rename: otherwise a crash can leave the new name pointing at missing data.
    // It is also where delayed write errors (quota, network file systems) surface.
    if (::fsync(fd_) != 0) fail("fsync failed", errno);
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("close failed", errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename " + tmp_ + " to it", errno);
    committed_ = true;
  }

 private:
  [[noreturn]] void fail(const std::string& what, int err) const {
    throw Error(path_ + ": " + what + ": " + std::strerror(err));
  }

  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

uint64_t checked_nbytes(const TensorToWrite& t, const std::string& path) {
  std::optional<uint64_t> n = shape_nbytes(t.dtype, t.shape);
  if (!n)
    throw Error(path + ": tensor '" + t.name + "': shape " + format_shape(t.shape) +
                " has a negative dimension or too many elements");
  return *n;
}

// Header names must be unique and must not collide with the reserved metadata key.
void check_names(const std::vector<const TensorToWrite*>& sorted, const std::string& path) {
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& name = sorted[i]->name;
    if (name.empty()) throw Error(path + ": a tensor has an empty name");
    if (name == "__metadata__")
      throw Error(path + ": '__metadata__' is reserved and cannot be a tensor name");
    if (i > 0 && sorted[i - 1]->name == name)
      throw Error(path + ": tensor '" + name + "' is given twice");
  }
}

// A JSON string literal for `s`. nlohmann does the escaping, and refuses invalid UTF-8, which we
// turn into a message about our input.
std::string json_string(const std::string& s, const std::string& path) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": a tensor name or metadata string is not valid UTF-8 (" +
                std::string(e.what()) + ")");
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  check_names(sorted, path);

  // The header text is assembled by hand rather than through a JSON object: it fixes the layout
  // to the reference one ("__metadata__" first, then tensors in data order, each as dtype, shape,
  // data_offsets) and stays linear in the tensor count (nlohmann's ordered_json looks keys up
  // linearly, quadratic for the ~10^5 tensors of a full checkpoint).
  std::string text = "{";
  const char* member_sep = "";
  if (!metadata.empty()) {
    text += "\"__metadata__\":{";
    const char* sep = "";
    for (const auto& [k, v] : metadata) {
      text += sep + json_string(k, path) + ":" + json_string(v, path);
      sep = ",";
    }
    text += "}";
    member_sep = ",";
  }
  std::vector<uint64_t> sizes;
  uint64_t offset = 0, largest = 0;
  for (const TensorToWrite* t : sorted) {
    uint64_t n = checked_nbytes(*t, path);
    uint64_t begin = offset;
    if (__builtin_add_overflow(offset, n, &offset))
      throw Error(path + ": tensors add up to more than 2^64 bytes");
    std::string dims;
    for (int64_t d : t->shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    text += member_sep + json_string(t->name, path) + ":{\"dtype\":\"" +
            std::string(dtype_name(t->dtype)) + "\",\"shape\":[" + dims + "],\"data_offsets\":[" +
            std::to_string(begin) + "," + std::to_string(offset) + "]}";
    member_sep = ",";
    sizes.push_back(n);
    largest = std::max(largest, n);
  }
  text += "}";
  // Pad with spaces so the data area starts 8-byte aligned (as the reference writer does); JSON
  // allows trailing whitespace, so every reader accepts it.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxSafetensorsHeaderBytes)
    throw Error(path + ": header would be " + std::to_string(text.size()) +
                " bytes, over the limit readers accept");

  AtomicFile out(path);
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.write(len_bytes, 8);
  out.write(text.data(), text.size());

  // One buffer, sized for the largest tensor, reused for all: memory stays bounded by one
  // tensor however big the file is. Uninitialized allocation; each tensor's span is zeroed before
  // its fill so a sloppy fill cannot make the output depend on leftovers.
  std::unique_ptr<uint8_t[]> buffer(largest ? new uint8_t[size_t(largest)] : nullptr);
  for (size_t i = 0; i < sorted.size(); ++i) {
    size_t n = size_t(sizes[i]);
    if (n == 0) continue;
    std::memset(buffer.get(), 0, n);
    if (sorted[i]->fill) sorted[i]->fill(buffer.get(), n);
    out.write(buffer.get(), n);
  }
  out.commit();
}

void write_safetensors_buffers(const std::string& path, const std::vector<TensorBuffer>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<TensorToWrite> list;
  list.reserve(tensors.size());
  for (const TensorBuffer& b : tensors) {
    std::optional<uint64_t> need = shape_nbytes(b.dtype, b.shape);
    if (need && *need != b.bytes.size())
      throw Error(path + ": tensor '" + b.name + "': " + std::to_string(b.bytes.size()) +
                  " bytes given but shape " + format_shape(b.shape) + " of " +
                  std::string(dtype_name(b.dtype)) + " needs " + std::to_string(*need));
    // A bad shape (need == nullopt) is reported by write_safetensors.
    list.push_back({b.name, b.dtype, b.shape,
                    [&b](uint8_t* dst, size_t n) { std::memcpy(dst, b.bytes.data(), n); }});
  }
  write_safetensors(path, list, metadata);
}

namespace {

// Next-fit packing with a byte budget; see ShardPlan.
ShardPlan pack(const std::vector<uint64_t>& sizes, uint64_t budget) {
  ShardPlan plan;
  plan.budget = budget;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // An open shard always holds at least one tensor, so a tensor over the budget sits alone.
    if (plan.shards.empty() || plan.shard_bytes.back() + sizes[i] > budget) {
      plan.shards.emplace_back();
      plan.shard_bytes.push_back(0);
    }
    plan.shards.back().push_back(i);
    plan.shard_bytes.back() += sizes[i];
    plan.total_bytes += sizes[i];
  }
  return plan;
}

}  // namespace

ShardPlan plan_shards(const std::vector<TensorToWrite>& tensors, uint64_t max_shard_bytes,
                      int min_shards) {
  if (min_shards < 1) throw Error("plan_shards: min_shards must be at least 1");
  if (tensors.size() < size_t(min_shards))
    throw Error("cannot split " + std::to_string(tensors.size()) + " tensors into " +
                std::to_string(min_shards) + " shards");
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const auto& t : tensors) {
    sizes.push_back(checked_nbytes(t, "checkpoint"));
    if (__builtin_add_overflow(total, sizes.back(), &total))
      throw Error("checkpoint: tensors add up to more than 2^64 bytes");
  }
  ShardPlan plan = pack(sizes, max_shard_bytes);
  if (plan.shards.size() >= size_t(min_shards)) return plan;

  // Next fit never uses fewer shards with a smaller budget, so binary search the largest budget
  // that still gives min_shards. Budget 0 puts every non-empty tensor in its own shard.
  if (pack(sizes, 0).shards.size() < size_t(min_shards))
    throw Error("cannot split the tensors into " + std::to_string(min_shards) +
                " shards: too many of them are empty");
  uint64_t lo = 0, hi = max_shard_bytes;  // pack(lo) is enough, pack(hi) is not
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    (pack(sizes, mid).shards.size() >= size_t(min_shards) ? lo : hi) = mid;
  }
  return pack(sizes, lo);
}

std::string shard_file_name(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", index, count);
  return buf;
}

void write_sharded_checkpoint(const std::string& dir, std::vector<TensorToWrite> tensors,
                              uint64_t max_shard_bytes, int min_shards) {
  // Names must be unique across the checkpoint, not only within a shard.
  std::set<std::string_view> names;
  for (const auto& t : tensors)
    if (!names.insert(t.name).second) throw Error(dir + ": tensor '" + t.name + "' is given twice");

  ShardPlan plan = plan_shards(tensors, max_shard_bytes, min_shards);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create directory: " + ec.message());

  const int count = int(plan.shards.size());
  nlohmann::json weight_map = nlohmann::json::object();  // json (not ordered): keys sorted
  for (int s = 0; s < count; ++s) {
    std::string file = shard_file_name(s + 1, count);
    std::vector<TensorToWrite> shard;
    for (size_t i : plan.shards[size_t(s)]) {
      weight_map[tensors[i].name] = file;
      shard.push_back(std::move(tensors[i]));
    }
    // "format": "pt" is what Hugging Face loaders expect to find in a shard's metadata.
    write_safetensors((fs::path(dir) / file).string(), shard, {{"format", "pt"}});
  }

  nlohmann::json index = {{"metadata", {{"total_size", plan.total_bytes}}},
                          {"weight_map", std::move(weight_map)}};
  std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    throw Error(index_path + ": a tensor name is not valid UTF-8 (" + std::string(e.what()) + ")");
  }
  AtomicFile out(index_path);
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace ds41
