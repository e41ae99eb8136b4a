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

std::string inconsistent(const std::string& path) { return path + ": session is inconsistent with the model: "; }

// ---- writing -------------------------------------------------------------------------------

void put_global_cache(std::vector<uint8_t>& body, const LayerState& l) {
  put_array(body, l.group_kv);
  put_array(body, l.group_score);
  put_array(body, l.ckv_codes);
  put_array(body, l.ckv_scales);
  put_array(body, l.ik_codes);
  put_array(body, l.ik_scales);
}

void put_exact_body(std::vector<uint8_t>& body, const SequenceState& st) {
  put<int64_t>(body, st.pos);
  put<int32_t>(body, st.index_k_publisher);
  put<int64_t>(body, st.history_start);
  put<uint32_t>(body, uint32_t(st.layers.size()));
  for (const LayerState& l : st.layers) {
    put<int64_t>(body, l.entries);
    put<int64_t>(body, l.ring_start);
    put_array(body, l.ring_codes);
    put_array(body, l.ring_scales);
    put_global_cache(body, l);
  }
  put_array(body, st.token_history);
  put_array(body, st.engram_history);
}

void put_compact_body(std::vector<uint8_t>& body, const std::string& path, const Model& model, const SequenceState& st) {
  const int64_t keep = compact_history_length(model.config(), st.pos);
  const int64_t held = int64_t(st.token_history.size());
  if (held != st.pos - st.history_start || held < keep)
    throw Error(path + ": cannot save a compact session: the sequence holds the tokens of its last " + std::to_string(held) +
                " positions, the replay needs " + std::to_string(keep));
  put<int64_t>(body, st.pos);
  put<int32_t>(body, st.index_k_publisher);
  std::vector<const LayerPlan*> sources;
  for (const LayerPlan& lp : model.plan().layers)
    if (!lp.is_dspark && lp.kv_source) sources.push_back(&lp);
  put<uint32_t>(body, uint32_t(sources.size()));
  for (const LayerPlan* lp : sources) {
    const LayerState& l = st.layers[size_t(lp->id)];
    put<uint32_t>(body, uint32_t(lp->id));
    put<int64_t>(body, l.entries);
    put_global_cache(body, l);
  }
  put<int64_t>(body, st.pos - keep);
  put_array(body, std::vector<int32_t>(st.token_history.end() - keep, st.token_history.end()));
  put_array(body, model.engram_hash() ? std::vector<int64_t>(st.engram_history.end() - keep, st.engram_history.end())
                                      : std::vector<int64_t>());
}

// ---- reading -------------------------------------------------------------------------------

int64_t get_pos(Reader& r, const std::string& path, const ModelConfig& c) {
  const int64_t pos = r.get<int64_t>("pos");
  if (pos < 0 || pos > c.max_seq_len)
    throw Error(inconsistent(path) + "position " + std::to_string(pos) + " is outside 0.." + std::to_string(c.max_seq_len));
  return pos;
}

int get_publisher(Reader& r, const std::string& path, const ModelPlan& plan) {
  const int p = r.get<int32_t>("index_k_publisher");
  if (p != -1 && (p < 0 || p >= int(plan.layers.size()) || !plan.layers[size_t(p)].kv_source))
    throw Error(inconsistent(path) + "index-key publisher " + std::to_string(p) + " is not a kv-source layer");
  return p;
}

void get_global_cache(Reader& r, const std::string& L, const LayerShape& e, LayerState& l) {
  l.group_kv = r.get_array<float>(L + "compressor group kv", e.group);
  l.group_score = r.get_array<float>(L + "compressor group scores", e.group);
  l.ckv_codes = r.get_array<uint8_t>(L + "compressed KV codes", e.ckv_codes);
  l.ckv_scales = r.get_array<uint8_t>(L + "compressed KV scales", e.ckv_scales);
  l.ik_codes = r.get_array<uint8_t>(L + "index key codes", e.ik_codes);
  l.ik_scales = r.get_array<uint8_t>(L + "index key scales", e.ik_scales);
}

void get_entries(Reader& r, const std::string& path, const std::string& L, const LayerShape& e, int64_t pos,
                 LayerState& l) {
  l.entries = r.get<int64_t>("layer entries");
  if (l.entries != e.entries)
    throw Error(inconsistent(path) + L + "has " + std::to_string(l.entries) + " compressed entries, expected " +
                std::to_string(e.entries) + " at position " + std::to_string(pos));
}

// Histories of positions history_start..pos-1: token ids in the vocabulary, and on Engram models
// one compressed id per position that must be the map's id of that token (or the image marker),
// otherwise the n-gram hashes would silently differ.
void get_histories(Reader& r, const std::string& path, const Model& model, SequenceState& st) {
  const uint64_t n = uint64_t(st.pos - st.history_start);
  st.token_history = r.get_array<int32_t>("token history", n);
  for (int32_t t : st.token_history)
    if (t < 0 || t >= model.config().vocab_size)
      throw Error(inconsistent(path) + "token id " + std::to_string(t) + " is outside the vocabulary");
  const std::vector<int32_t>& cv = model.compressed_vocab();
  st.engram_history = r.get_array<int64_t>("Engram history", cv.empty() ? 0 : n);
  for (size_t p = 0; p < st.engram_history.size(); ++p) {
    const int64_t v = st.engram_history[p];
    if (v != kEngramDead && v != cv[size_t(st.token_history[p])])
      throw Error(inconsistent(path) + "Engram history at position " + std::to_string(st.history_start + int64_t(p)) +
                  " does not match its token");
  }
}

SequenceState get_exact_body(Reader& r, const std::string& path, const Model& model, uint32_t version) {
  const ModelConfig& c = model.config();
  const ModelPlan& plan = model.plan();
  SequenceState st;
  st.pos = get_pos(r, path, c);
  st.index_k_publisher = get_publisher(r, path, plan);
  st.history_start = version >= 2 ? r.get<int64_t>("history start") : 0;
  if (st.history_start < 0 || st.history_start > st.pos)
    throw Error(inconsistent(path) + "history start " + std::to_string(st.history_start) + " is outside 0.." +
                std::to_string(st.pos));
  const uint32_t n_layers = r.get<uint32_t>("layer count");
  if (n_layers != plan.layers.size())
    throw Error(inconsistent(path) + std::to_string(n_layers) + " layers, expected " + std::to_string(plan.layers.size()));
  st.layers.resize(n_layers);
  for (const LayerPlan& lp : plan.layers) {
    const LayerShape e = expected_shape(c, lp, st.pos);
    LayerState& l = st.layers[size_t(lp.id)];
    const std::string L = "layer " + std::to_string(lp.id) + " ";
    get_entries(r, path, L, e, st.pos, l);
    if (version >= 2) {
      l.ring_start = r.get<int64_t>("ring start");
      if (l.ring_start < 0 || l.ring_start > st.pos)
        throw Error(inconsistent(path) + L + "window start " + std::to_string(l.ring_start) + " is outside 0.." +
                    std::to_string(st.pos));
    }
    l.ring_codes = r.get_array<uint8_t>(L + "window ring codes", e.ring_codes);
    l.ring_scales = r.get_array<uint8_t>(L + "window ring scales", e.ring_scales);
    get_global_cache(r, L, e, l);
  }
  get_histories(r, path, model, st);
  return st;
}

SequenceState get_compact_body(Reader& r, const std::string& path, const Model& model) {
  const ModelConfig& c = model.config();
  const ModelPlan& plan = model.plan();
  SequenceState st = model.new_sequence();
  st.pos = get_pos(r, path, c);
  st.index_k_publisher = get_publisher(r, path, plan);
  std::vector<const LayerPlan*> sources;
  for (const LayerPlan& lp : plan.layers)
    if (!lp.is_dspark && lp.kv_source) sources.push_back(&lp);
  const uint32_t n_sources = r.get<uint32_t>("kv-source count");
  if (n_sources != sources.size())
    throw Error(inconsistent(path) + std::to_string(n_sources) + " kv-source layers, expected " +
                std::to_string(sources.size()));
  for (const LayerPlan* lp : sources) {
    const uint32_t id = r.get<uint32_t>("kv-source layer id");
    if (id != uint32_t(lp->id))
      throw Error(inconsistent(path) + "kv-source layer " + std::to_string(id) + " where layer " + std::to_string(lp->id) +
                  " was expected");
    const LayerShape e = expected_shape(c, *lp, st.pos);
    LayerState& l = st.layers[size_t(lp->id)];
    const std::string L = "layer " + std::to_string(lp->id) + " ";
    get_entries(r, path, L, e, st.pos, l);
    get_global_cache(r, L, e, l);
  }
  st.history_start = r.get<int64_t>("history start");
  const int64_t keep = compact_history_length(c, st.pos);
  if (st.history_start != st.pos - keep)
    throw Error(inconsistent(path) + "its history starts at position " + std::to_string(st.history_start) +
                ", a compact session keeps positions " + std::to_string(st.pos - keep) + ".." + std::to_string(st.pos - 1));
  get_histories(r, path, model, st);
  return st;
}

// ---- atomic write --------------------------------------------------------------------------

void write_atomically(const std::string& path, const std::vector<uint8_t>& file) {
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

}  // namespace

uint64_t config_fingerprint(const ModelConfig& c) {
  const std::string s = config_to_flat_json(c).dump();
  return fnv1a64(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

int64_t compact_history_length(const ModelConfig& c, int64_t pos) {
  const int64_t lookback = c.engram_layer_ids.empty() ? 0 : c.engram_max_ngram_size - 1;
  return std::min<int64_t>(pos, c.window_size + lookback);
}

void save_session(const std::string& path, const Model& model, const SequenceState& st, SessionKind kind) {
  if (st.layers.size() != model.plan().layers.size())
    throw Error(path + ": cannot save: the sequence does not belong to this model (layer count differs)");
  // A compact session is restored by a bounded replay of its last window, which cannot rebuild
  // image-span positions (their rows came from the vision tower, not from the token ids).
  if (kind == SessionKind::Compact && model.replay_window_has_images(st))
    throw Error(path + ": cannot save a compact session: the last window of the sequence holds image-span positions, "
                       "which a bounded replay cannot rebuild; save it exact (--exact)");
  std::vector<uint8_t> body;
  if (kind == SessionKind::Exact) put_exact_body(body, st);
  else put_compact_body(body, path, model, st);

  std::vector<uint8_t> file;
  file.reserve(kHeaderBytes + body.size() + kChecksumBytes);
  file.insert(file.end(), kMagic, kMagic + 8);
  put<uint32_t>(file, kSessionFormatVersion);
  put<uint32_t>(file, uint32_t(kind));
  put<uint64_t>(file, config_fingerprint(model.config()));
  put<uint64_t>(file, uint64_t(body.size()));
  file.insert(file.end(), body.begin(), body.end());
  put<uint64_t>(file, fnv1a64(file.data(), file.size()));
  write_atomically(path, file);
}

SequenceState load_session(const std::string& path, const Model& model, ThreadPool* pool,
                           const ForwardOptions& replay_options, std::vector<float>* replay_logits) {
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
  const uint32_t kind = h.get<uint32_t>("header");
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
  if (fingerprint != config_fingerprint(model.config()))
    throw Error(path + ": session belongs to another model (its config fingerprint differs from this checkpoint's)");
  const bool exact = kind == uint32_t(SessionKind::Exact);
  if (!exact && !(kind == uint32_t(SessionKind::Compact) && version >= 2))
    throw Error(path + ": unsupported session kind " + std::to_string(kind) + " in format version " +
                std::to_string(version) + " (known: 1 = exact, 2 = compact)");

  // Body: every length is checked against what the model and the counters imply, so a restored
  // state is one that forward() could have produced.
  Reader r(path, bytes.data() + kHeaderBytes, size_t(body_len));
  SequenceState st = exact ? get_exact_body(r, path, model, version) : get_compact_body(r, path, model);
  if (r.remaining() != 0)
    throw Error(path + ": session is inconsistent: " + std::to_string(r.remaining()) + " unused bytes after the data");
  std::vector<float> logits;
  if (!exact && st.pos > 0) logits = model.replay_window(st, replay_options, pool);
  if (replay_logits) *replay_logits = std::move(logits);
  return st;
}

}  // namespace ds41
