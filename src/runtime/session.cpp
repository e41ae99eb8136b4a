#include "runtime/session.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/hash.h"
#include "model/model.h"

namespace ds41 {

namespace {

constexpr char kMagic[8] = {'D', 'S', '4', '1', 'S', 'E', 'S', 'S'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;
constexpr size_t kChecksumBytes = 8;


// Little-endian encoding of one trivially-copyable scalar (integers and float via their bits).
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) std::reverse(b, b + sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

template <typename T>
void put_array(std::vector<uint8_t>& out, const std::vector<T>& v) {
  put<uint64_t>(out, uint64_t(v.size()));
  if constexpr (std::endian::native == std::endian::little) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(T));
  } else {
    for (const T& x : v) put(out, x);
  }
}

// Bounds-checked reader over the file bytes: every read first checks that the bytes exist, so a
// length field that lies (even under a valid checksum) can never read past the buffer or trigger
// a huge allocation.
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* p, size_t n) : path_(path), p_(p), n_(n) {}
  size_t offset() const { return off_; }
  size_t remaining() const { return n_ - off_; }

  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    uint8_t b[sizeof(T)];
    std::memcpy(b, p_ + off_, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(b, b + sizeof(T));
    off_ += sizeof(T);
    T v;
    std::memcpy(&v, b, sizeof(T));
    return v;
  }

  // Reads an array whose element count must equal `expected` (known from the model and the
  // counters), so the count is validated before anything is allocated.
  template <typename T>
  std::vector<T> get_array(const std::string& what, uint64_t expected) {
    const uint64_t count = get<uint64_t>(what.c_str());
    if (count != expected)
      throw Error(path_ + ": session is inconsistent with the model: " + what + " has " + std::to_string(count) +
                  " elements, expected " + std::to_string(expected));
    if (count > remaining() / sizeof(T)) need(remaining() + 1, what.c_str());
    std::vector<T> v(static_cast<size_t>(count));
    if constexpr (std::endian::native == std::endian::little) {
      if (count) std::memcpy(v.data(), p_ + off_, size_t(count) * sizeof(T));
      off_ += size_t(count) * sizeof(T);
    } else {
      for (auto& x : v) x = get<T>(what.c_str());
    }
    return v;
  }

 private:
  void need(size_t bytes, const char* what) const {
    if (bytes > remaining())
      throw Error(path_ + ": session file is truncated or corrupt (ends inside " + std::string(what) + ")");
  }
  const std::string& path_;
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
};

std::vector<uint8_t> read_whole_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open session file (" + std::strerror(errno) + ")");
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size < 0) throw Error(path + ": cannot read session file");
  f.seekg(0, std::ios::beg);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (size > 0 && !f.read(reinterpret_cast<char*>(bytes.data()), size)) throw Error(path + ": cannot read session file");
  return bytes;
}

// write(2) until done: a short write (signal, full disk) must not silently truncate the file.
void write_all(int fd, const uint8_t* p, size_t n, const std::string& tmp) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(tmp + ": cannot write session file (" + std::strerror(errno) + ")");
    }
    p += w;
    n -= size_t(w);
  }
}

// Element counts every array of layer `lp` must have for a sequence at `pos`: the same rules
// make_sequence_state and the compressor follow.
struct LayerShape {
  uint64_t ring_codes, ring_scales, group, ckv_codes, ckv_scales, ik_codes, ik_scales;
  int64_t entries;
};

LayerShape expected_shape(const ModelConfig& c, const LayerPlan& lp, int64_t pos) {
  LayerShape s{};
  s.ring_codes = uint64_t(c.window_size) * uint64_t(c.head_dim);
  s.ring_scales = uint64_t(c.window_size) * uint64_t(c.head_dim / 32);
  s.group = lp.kv_source && lp.ratio > 1 ? uint64_t(lp.ratio) * uint64_t(c.head_dim) : 0;
  // A kv source emits one entry per completed group of `ratio` positions.
  s.entries = lp.kv_source && lp.ratio > 0 ? pos / lp.ratio : 0;
  const auto e = uint64_t(s.entries);
  s.ckv_codes = e * uint64_t(c.head_dim / 2);
  s.ckv_scales = e * uint64_t(c.head_dim / 16);
  s.ik_codes = lp.owns_index_k ? e * uint64_t(c.index_head_dim / 2) : 0;
  s.ik_scales = lp.owns_index_k ? e * uint64_t(c.index_head_dim / 32) : 0;
  return s;
}

}  // namespace

uint64_t config_fingerprint(const ModelConfig& c) {
  const std::string s = config_to_flat_json(c).dump();
  return fnv1a64(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

void save_session(const std::string& path, const Model& model, const SequenceState& st) {
  const ModelConfig& c = model.config();
  const ModelPlan& plan = model.plan();
  if (st.layers.size() != plan.layers.size())
    throw Error(path + ": cannot save: the sequence does not belong to this model (layer count differs)");

  std::vector<uint8_t> body;
  put<int64_t>(body, st.pos);
  put<int32_t>(body, st.index_k_publisher);
  put<uint32_t>(body, uint32_t(st.layers.size()));
  for (const LayerState& l : st.layers) {
    put<int64_t>(body, l.entries);
    put_array(body, l.ring_codes);
    put_array(body, l.ring_scales);
    put_array(body, l.group_kv);
    put_array(body, l.group_score);
    put_array(body, l.ckv_codes);
    put_array(body, l.ckv_scales);
    put_array(body, l.ik_codes);
    put_array(body, l.ik_scales);
  }
  put_array(body, st.token_history);
  put_array(body, st.engram_history);

  std::vector<uint8_t> file;
  file.reserve(kHeaderBytes + body.size() + kChecksumBytes);
  file.insert(file.end(), kMagic, kMagic + 8);
  put<uint32_t>(file, kSessionFormatVersion);
  put<uint32_t>(file, kSessionFlagExact);
  put<uint64_t>(file, config_fingerprint(c));
  put<uint64_t>(file, uint64_t(body.size()));
  file.insert(file.end(), body.begin(), body.end());
  put<uint64_t>(file, fnv1a64(file.data(), file.size()));

  // Temp file + fsync + rename: rename is atomic, so a reader (or a crash at any instant) sees
  // the old file or the complete new one, never a partial write under the final name.
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(tmp + ": cannot create session file (" + std::strerror(errno) + ")");
  try {
    write_all(fd, file.data(), file.size(), tmp);
    if (::fsync(fd) != 0) throw Error(tmp + ": cannot flush session file to disk (" + std::strerror(errno) + ")");
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw Error(tmp + ": cannot close session file (" + std::strerror(errno) + ")");
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(path + ": cannot move the session file into place (" + std::strerror(errno) + ")");
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename itself lives in the directory: without this fsync a power loss could forget it.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    // Some file systems refuse fsync on directories (EINVAL); the data itself is already durable.
    if (rc != 0 && err != EINVAL) throw Error(dir.string() + ": cannot flush directory (" + std::strerror(err) + ")");
  }
}

SequenceState load_session(const std::string& path, const Model& model) {
  const ModelConfig& c = model.config();
  const ModelPlan& plan = model.plan();
  const std::vector<uint8_t> bytes = read_whole_file(path);

  // Header checks come in the order that gives the most useful message: what the file is, which
  // version wrote it, whether it is complete, whether it is intact, and only then whose it is.
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw Error(path + ": not a ds41 session file (bad magic)");
  Reader h(path, bytes.data(), bytes.size());
  h.get<uint64_t>("magic");
  const uint32_t version = h.get<uint32_t>("header");
  if (version > kSessionFormatVersion)
    throw Error(path + ": session file was written by a newer ds41 (format version " + std::to_string(version) +
                ", this build reads up to " + std::to_string(kSessionFormatVersion) + ")");
  if (version == 0) throw Error(path + ": session file is corrupt (format version 0)");
  const uint32_t flags = h.get<uint32_t>("header");
  const uint64_t fingerprint = h.get<uint64_t>("header");
  const uint64_t body_len = h.get<uint64_t>("header");
  if (body_len > bytes.size() || kHeaderBytes + body_len + kChecksumBytes > bytes.size())
    throw Error(path + ": session file is truncated (" + std::to_string(bytes.size()) + " bytes, header announces " +
                std::to_string(kHeaderBytes + body_len + kChecksumBytes) + ")");
  if (kHeaderBytes + body_len + kChecksumBytes < bytes.size())
    throw Error(path + ": session file has " + std::to_string(bytes.size() - kHeaderBytes - body_len - kChecksumBytes) +
                " unexpected trailing bytes");
  const size_t sum_at = kHeaderBytes + size_t(body_len);
  Reader tail(path, bytes.data() + sum_at, kChecksumBytes);
  if (tail.get<uint64_t>("checksum") != fnv1a64(bytes.data(), sum_at))
    throw Error(path + ": session file is corrupt (checksum mismatch)");
  if (fingerprint != config_fingerprint(c))
    throw Error(path + ": session belongs to another model (its config fingerprint differs from this checkpoint's)");
  if (flags != kSessionFlagExact)
    throw Error(path + ": unsupported session kind (flags " + std::to_string(flags) + "; only exact sessions are supported)");

  // Body: every length is checked against what the model and the counters imply, so a restored
  // state is one that forward() could have produced.
  Reader r(path, bytes.data() + kHeaderBytes, size_t(body_len));
  SequenceState st;
  st.pos = r.get<int64_t>("pos");
  if (st.pos < 0 || st.pos > c.max_seq_len)
    throw Error(path + ": session is inconsistent with the model: position " + std::to_string(st.pos) +
                " is outside 0.." + std::to_string(c.max_seq_len));
  st.index_k_publisher = r.get<int32_t>("index_k_publisher");
  if (st.index_k_publisher != -1) {
    const int p = st.index_k_publisher;
    if (p < 0 || p >= int(plan.layers.size()) || !plan.layers[size_t(p)].kv_source)
      throw Error(path + ": session is inconsistent with the model: index-key publisher " + std::to_string(p) +
                  " is not a kv-source layer");
  }
  const uint32_t n_layers = r.get<uint32_t>("layer count");
  if (n_layers != plan.layers.size())
    throw Error(path + ": session is inconsistent with the model: " + std::to_string(n_layers) + " layers, expected " +
                std::to_string(plan.layers.size()));
  st.layers.resize(n_layers);
  for (const LayerPlan& lp : plan.layers) {
    const LayerShape e = expected_shape(c, lp, st.pos);
    LayerState& l = st.layers[size_t(lp.id)];
    const std::string L = "layer " + std::to_string(lp.id) + " ";
    l.entries = r.get<int64_t>("layer entries");
    if (l.entries != e.entries)
      throw Error(path + ": session is inconsistent with the model: " + L + "has " + std::to_string(l.entries) +
                  " compressed entries, expected " + std::to_string(e.entries) + " at position " + std::to_string(st.pos));
    l.ring_codes = r.get_array<uint8_t>(L + "window ring codes", e.ring_codes);
    l.ring_scales = r.get_array<uint8_t>(L + "window ring scales", e.ring_scales);
    l.group_kv = r.get_array<float>(L + "compressor group kv", e.group);
    l.group_score = r.get_array<float>(L + "compressor group scores", e.group);
    l.ckv_codes = r.get_array<uint8_t>(L + "compressed KV codes", e.ckv_codes);
    l.ckv_scales = r.get_array<uint8_t>(L + "compressed KV scales", e.ckv_scales);
    l.ik_codes = r.get_array<uint8_t>(L + "index key codes", e.ik_codes);
    l.ik_scales = r.get_array<uint8_t>(L + "index key scales", e.ik_scales);
  }
  st.token_history = r.get_array<int32_t>("token history", uint64_t(st.pos));
  for (int32_t t : st.token_history)
    if (t < 0 || t >= c.vocab_size)
      throw Error(path + ": session is inconsistent with the model: token id " + std::to_string(t) +
                  " is outside the vocabulary");
  // Engram models keep one compressed id per position; it must be the map's id of that token
  // (or the image marker), otherwise the n-gram hashes would silently differ.
  const std::vector<int32_t>& cv = model.compressed_vocab();
  st.engram_history = r.get_array<int64_t>("Engram history", cv.empty() ? 0 : uint64_t(st.pos));
  for (size_t p = 0; p < st.engram_history.size(); ++p) {
    const int64_t v = st.engram_history[p];
    if (v != kEngramDead && v != cv[size_t(st.token_history[p])])
      throw Error(path + ": session is inconsistent with the model: Engram history at position " + std::to_string(p) +
                  " does not match its token");
  }
  if (r.remaining() != 0)
    throw Error(path + ": session is inconsistent: " + std::to_string(r.remaining()) + " unused bytes after the data");
  return st;
}

}  // namespace ds41
