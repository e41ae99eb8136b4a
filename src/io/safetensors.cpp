// Safetensors reader: header validation, mmap of shards, checkpoint index. See safetensors.h.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace ds41 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndexFileName = "model.safetensors.index.json";
constexpr const char* kSingleFileName = "model.safetensors";

// Names and JSON snippets in messages come from untrusted files: escape control bytes so a
// message cannot rewrite the terminal, and cut very long names (the fuzzer makes 4 KiB ones).
std::string printable(std::string_view s, size_t max_len = 160) {
  std::string out;
  for (unsigned char c : s) {
    // Only stop at the start of a UTF-8 sequence so the message stays valid UTF-8.
    if (out.size() >= max_len && (c & 0xC0) != 0x80) {
      out += "...";
      break;
    }
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out;
}

std::string in_quotes(std::string_view s) { return "'" + printable(s) + "'"; }

[[noreturn]] void fail(const std::string& label, const std::string& what) {
  throw Error(label + ": " + what);
}

[[noreturn]] void fail_tensor(const std::string& label, std::string_view tensor,
                              const std::string& what) {
  throw Error(label + ": tensor " + in_quotes(tensor) + ": " + what);
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// A JSON integer >= 0 (nlohmann stores non-negative literals as unsigned, but "-0" as signed).
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

std::string describe_json(const json& v) {
  std::string s = v.dump();
  return printable(s, 60);
}

// Builds a JSON document from nlohmann's SAX events, adding what its plain parse() lacks:
//  * duplicate keys: parse() silently keeps the last one, which for a header would hide a tensor;
//    here every key is checked against the others of its object as it is read;
//  * nesting: nothing legitimate nests deeper than `max_depth`, and refusing early keeps a
//    megabyte of "[[[[..." from building a huge document.
// (nlohmann's callback-parser could do the first two, but it rescans the parent object at the end
// of every child object, which is quadratic in the number of tensors of a header.)
class UntrustedJsonBuilder : public nlohmann::json_sax<json> {
 public:
  UntrustedJsonBuilder(const std::string& label, size_t max_depth, const char* what,
                       const char* top_noun)
      : label_(label), max_depth_(max_depth), what_(what), top_noun_(top_noun) {}

  json take() { return std::move(root_); }
  const std::string& error() const { return error_; }

  bool null() override { return put(nullptr) != nullptr; }
  bool boolean(bool v) override { return put(v) != nullptr; }
  bool number_integer(number_integer_t v) override { return put(v) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return put(v) != nullptr; }
  bool number_float(number_float_t v, const string_t&) override { return put(v) != nullptr; }
  bool string(string_t& v) override { return put(std::move(v)) != nullptr; }
  bool binary(binary_t&) override { return false; }  // not produced by the JSON lexer
  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      if (frames_.size() == 1)
        fail(label_, std::string(top_noun_) + " " + in_quotes(k) +
                         " appears more than once in the " + what_);
      fail(label_, "key " + in_quotes(k) + " appears more than once in " + in_quotes(f.key) +
                       " of the " + what_);
    }
    key_ = k;
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix; keep the position it reports.
    std::string msg = e.what();
    if (auto pos = msg.find("] "); msg.rfind("[json.exception", 0) == 0 && pos != std::string::npos)
      msg = msg.substr(pos + 2);
    error_ = printable(msg, 300);
    return false;
  }

 private:
  struct Frame {
    json* value;
    std::string key;  // key under which this container sits in its parent, for messages
    std::unordered_set<std::string> keys;
  };

  // Stores a finished value where the parser is: the root, the pending key of the innermost
  // object, or the end of the innermost array. Containers on the stack are never moved while
  // their children are filled in, so the pointers in frames_ stay valid.
  json* put(json&& v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *frames_.back().value;
    if (parent.is_object()) return &(parent[key_] = std::move(v));
    parent.push_back(std::move(v));
    return &parent.back();
  }

  bool open(json&& container) {
    if (frames_.size() >= max_depth_)
      fail(label_, std::string(what_) + " nests deeper than " + std::to_string(max_depth_) +
                       " levels" +
                       (frames_.size() > 1 ? " (inside " + in_quotes(frames_[1].key) + ")" : ""));
    std::string key = frames_.empty() || !frames_.back().value->is_object() ? "" : key_;
    json* slot = put(std::move(container));
    frames_.push_back(Frame{slot, std::move(key), {}});
    return true;
  }

  bool close() {
    frames_.pop_back();
    return true;
  }

  const std::string& label_;
  size_t max_depth_;
  const char* what_;
  const char* top_noun_;
  json root_;
  std::vector<Frame> frames_;
  std::string key_;  // last key read in the innermost object
  std::string error_;
};

json parse_untrusted_json(const uint8_t* p, size_t n, const std::string& label, size_t max_depth,
                          const char* what, const char* top_noun) {
  // nlohmann stops at a NUL byte as if the input ended there, which would let anything after
  // it pass unchecked. A raw NUL is never valid JSON (not even inside a string), so reject it.
  if (const void* nul = std::memchr(p, 0, n))
    fail(label, std::string(what) + " is not valid JSON: NUL byte at offset " +
                    std::to_string(static_cast<const uint8_t*>(nul) - p));
  UntrustedJsonBuilder builder(label, max_depth, what, top_noun);
  bool ok;
  try {
    ok = json::sax_parse(p, p + n, &builder, nlohmann::detail::input_format_t::json,
                         /*strict=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {  // not expected (errors go to parse_error), but be safe
    fail(label, std::string(what) + " is not valid JSON: " + printable(e.what(), 300));
  }
  if (!ok) fail(label, std::string(what) + " is not valid JSON: " + builder.error());
  return builder.take();
}

[[noreturn]] void fail_file_too_small(const std::string& label, size_t file_size) {
  fail(label, file_size == 0
                  ? std::string("file is empty (0 bytes); a safetensors file starts with an "
                                "8-byte header length")
                  : "file is only " + std::to_string(file_size) +
                        " bytes; a safetensors file starts with an 8-byte header length");
}

std::map<std::string, std::string> parse_metadata(const json& v, const std::string& label) {
  if (!v.is_object())
    fail(label, std::string("'__metadata__' is a JSON ") + v.type_name() +
                    "; it must be an object mapping strings to strings");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      fail(label, "'__metadata__' entry " + in_quotes(key) + " is a JSON " + value.type_name() +
                      " (" + describe_json(value) + "); metadata values must be strings");
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

SafetensorsHeader::Entry parse_entry(const std::string& name, const json& v,
                                     const std::string& label, uint64_t data_start,
                                     uint64_t file_size) {
  if (!v.is_object())
    fail_tensor(label, name,
                std::string("entry is a JSON ") + v.type_name() +
                    "; expected an object with dtype, shape and data_offsets");
  for (const auto& [key, value] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail_tensor(label, name,
                  "unexpected key " + in_quotes(key) +
                      " (an entry has exactly 'dtype', 'shape' and 'data_offsets')");
  auto field = [&](const char* key) -> const json& {
    auto it = v.find(key);
    if (it == v.end()) fail_tensor(label, name, std::string("missing '") + key + "'");
    return *it;
  };

  SafetensorsHeader::Entry e;
  e.name = name;

  const json& dtype = field("dtype");
  if (!dtype.is_string())
    fail_tensor(label, name, "dtype is " + describe_json(dtype) + ", expected a string");
  std::optional<DType> dt = parse_dtype(dtype.get_ref<const std::string&>());
  if (!dt) {
    std::string known;
    for (DType t : kAllDTypes) known += (known.empty() ? "" : ", ") + std::string(dtype_name(t));
    fail_tensor(label, name,
                "unknown dtype " + in_quotes(dtype.get_ref<const std::string&>()) +
                    " (known: " + known + ")");
  }
  e.dtype = *dt;

  const json& shape = field("shape");
  if (!shape.is_array())
    fail_tensor(
        label, name,
        "shape is " + describe_json(shape) + ", expected an array of non-negative integers");
  for (size_t i = 0; i < shape.size(); ++i) {
    std::optional<uint64_t> d = as_u64(shape[i]);
    if (!d || *d > uint64_t(std::numeric_limits<int64_t>::max()))
      fail_tensor(label, name,
                  "shape " + describe_json(shape) + ": dimension " + std::to_string(i) + " is " +
                      describe_json(shape[i]) + "; dimensions must be non-negative integers");
    e.shape.push_back(int64_t(*d));
  }
  std::optional<uint64_t> need = shape_nbytes(e.dtype, e.shape);
  if (!need)
    fail_tensor(label, name,
                "shape " + format_shape(e.shape) + " has too many elements to address");

  const json& offsets = field("data_offsets");
  std::optional<uint64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = as_u64(offsets[0]);
    end = as_u64(offsets[1]);
  }
  if (!begin || !end)
    fail_tensor(label, name,
                "data_offsets is " + describe_json(offsets) +
                    ", expected [begin, end] with two non-negative integers");
  e.begin = *begin;
  e.end = *end;
  if (e.begin > e.end)
    fail_tensor(label, name,
                "data_offsets " + offsets_str(e.begin, e.end) + ": begin is after end");
  if (e.end - e.begin != *need)
    fail_tensor(label, name,
                "data_offsets " + offsets_str(e.begin, e.end) + " give " +
                    std::to_string(e.end - e.begin) + " bytes but shape " + format_shape(e.shape) +
                    " of " + std::string(dtype_name(e.dtype)) + " needs " + std::to_string(*need) +
                    " bytes");
  // data_start <= file_size was checked by the caller, so the subtraction cannot wrap.
  if (e.end > file_size - data_start)
    fail_tensor(label, name,
                "data_offsets " + offsets_str(e.begin, e.end) + " end at file byte " +
                    std::to_string(data_start) + " + " + std::to_string(e.end) +
                    " but the file has only " + std::to_string(file_size) +
                    " bytes (truncated file?)");
  return e;
}

// Tensors may leave gaps (nothing requires the data area to be fully covered) but must not share
// bytes: a writer bug that aliased two tensors would otherwise load silently. Empty tensors own
// no bytes and so cannot overlap anything.
void check_no_overlap(const std::vector<SafetensorsHeader::Entry>& entries,
                      const std::string& label) {
  std::vector<const SafetensorsHeader::Entry*> order;
  for (const auto& e : entries)
    if (e.end > e.begin) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const SafetensorsHeader::Entry* reach = nullptr;  // earlier tensor that ends last
  for (const auto* e : order) {
    if (reach && e->begin < reach->end)
      fail_tensor(label, e->name,
                  "data_offsets " + offsets_str(e->begin, e->end) + " overlap tensor " +
                      in_quotes(reach->name) + " at " + offsets_str(reach->begin, reach->end));
    if (!reach || e->end > reach->end) reach = e;
  }
}

// Closes a file descriptor on every path out of a function.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` for reading and checks it is a regular file; the messages say which of the usual
// mistakes (missing, directory, permissions) it is.
int open_regular_file(const std::string& path, struct stat* st) {
  // O_NONBLOCK: opening a FIFO by mistake must fail below instead of hanging forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) fail(path, "no such file");
    if (err == EACCES) fail(path, "permission denied (the file is not readable by this user)");
    fail(path, std::string("cannot open: ") + std::strerror(err));
  }
  if (::fstat(fd, st) != 0) {
    int err = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    fail(path, S_ISDIR(st->st_mode) ? "is a directory, not a file" : "is not a regular file");
  }
  return fd;
}

std::string read_whole_file(const std::string& path, size_t max_bytes) {
  struct stat st;
  FdCloser fd{open_regular_file(path, &st)};
  if (uint64_t(st.st_size) > max_bytes)
    fail(path, "file is " + std::to_string(st.st_size) + " bytes; refusing to read more than " +
                   std::to_string(max_bytes));
  std::string out(size_t(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd.fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, std::string("read failed: ") + std::strerror(errno));
    if (n == 0) break;  // shrank while reading; parse what we got
    done += size_t(n);
  }
  out.resize(done);
  return out;
}

bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

// ---- small helpers -----------------------------------------------------------------------------

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::optional<uint64_t> shape_nbytes(DType dtype, const std::vector<int64_t>& shape) {
  constexpr uint64_t kMax = uint64_t(std::numeric_limits<int64_t>::max());
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(numel, uint64_t(d), &numel) || numel > kMax) return std::nullopt;
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(dtype)), &bytes) || bytes > kMax)
    return std::nullopt;
  return bytes;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated at load: cannot overflow
  return n;
}

void TensorInfo::check_view(size_t elem_size, size_t elem_align) const {
  if (elem_size != dtype_size(dtype))
    throw Error(file + ": tensor " + in_quotes(name) + " is " + std::string(dtype_name(dtype)) +
                " (" + std::to_string(dtype_size(dtype)) + "-byte elements); cannot view it as " +
                std::to_string(elem_size) + "-byte elements");
  if (reinterpret_cast<uintptr_t>(data) % elem_align != 0)
    throw Error(file + ": tensor " + in_quotes(name) + " data is not " +
                std::to_string(elem_align) +
                "-byte aligned in the file; copy it before viewing it as typed elements");
}

// ---- header ------------------------------------------------------------------------------------

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t file_size,
                                           const std::string& label) {
  if (file_size < 8) fail_file_too_small(label, file_size);
  uint64_t len = 0;  // little endian regardless of the host, and no unaligned load
  for (int i = 0; i < 8; ++i) len |= uint64_t(bytes[i]) << (8 * i);
  if (len == 0) fail(label, "header length is 0; a safetensors header is at least '{}'");
  if (len > kMaxSafetensorsHeaderBytes)
    fail(label, "header length " + std::to_string(len) + " exceeds the " +
                    std::to_string(kMaxSafetensorsHeaderBytes >> 20) +
                    " MiB limit (not a safetensors file, or a corrupt length field)");
  if (len > file_size - 8)
    fail(label, "header length " + std::to_string(len) + " needs " + std::to_string(8 + len) +
                    " bytes but the file has only " + std::to_string(file_size) +
                    " (truncated file?)");

  // Depth 3: top object > tensor entry > shape / data_offsets array.
  json doc = parse_untrusted_json(bytes + 8, size_t(len), label, 3, "header", "tensor");
  if (!doc.is_object())
    fail(label, std::string("header is a JSON ") + doc.type_name() +
                    ", expected an object mapping tensor names to entries");

  SafetensorsHeader h;
  h.data_start = 8 + len;
  for (const auto& [name, value] : doc.items()) {  // nlohmann objects iterate sorted by key
    if (name == "__metadata__") {
      h.metadata = parse_metadata(value, label);
      continue;
    }
    h.entries.push_back(parse_entry(name, value, label, h.data_start, file_size));
  }
  check_no_overlap(h.entries, label);
  return h;
}

// ---- SafetensorsFile ---------------------------------------------------------------------------

SafetensorsFile::Mapping::Mapping(Mapping&& o) noexcept
    : data(std::exchange(o.data, nullptr)), size(std::exchange(o.size, 0)) {}

SafetensorsFile::Mapping& SafetensorsFile::Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (data) ::munmap(const_cast<uint8_t*>(data), size);
    data = std::exchange(o.data, nullptr);
    size = std::exchange(o.size, 0);
  }
  return *this;
}

SafetensorsFile::Mapping::~Mapping() {
  if (data) ::munmap(const_cast<uint8_t*>(data), size);
}

namespace {

// A read-only shared mapping of the whole file placed at an address that is a multiple of 2 MiB,
// so that every 2 MiB-aligned stretch of the file falls on a 2 MiB-aligned stretch of memory.
// Only then can the kernel map a huge page-cache folio with one page-table entry (where the
// model layer asks for it with MADV_HUGEPAGE, model/weights.h): decode streams hundreds of MB of
// weights per token, and on 4 KiB mappings the Xeon VM's decode ran 10-14 % slower. The kernel's
// own placement does not promise that alignment (recent kernels happen to give it to large file
// mappings). Reserving 2 MiB more than needed and mapping the file over the aligned part of the
// reservation does.
void* map_file_huge_aligned(int fd, size_t size) {
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t mapped = (size + page - 1) / page * page;
  void* reserved = ::mmap(nullptr, mapped + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return MAP_FAILED;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(reserved);
  const uintptr_t aligned = (begin + kHuge - 1) & ~(kHuge - 1);
  void* m = ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
  if (m == MAP_FAILED) {
    const int err = errno;
    ::munmap(reserved, mapped + kHuge);
    errno = err;
    return MAP_FAILED;
  }
  // Give back the parts of the reservation on either side of the file.
  if (aligned > begin) ::munmap(reserved, aligned - begin);
  const uintptr_t reserved_end = begin + mapped + kHuge;
  if (reserved_end > aligned + mapped)
    ::munmap(reinterpret_cast<void*>(aligned + mapped), reserved_end - (aligned + mapped));
  return m;
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  struct stat st;
  FdCloser fd{open_regular_file(path_, &st)};
  size_t size = size_t(st.st_size);
  if (size < 8) fail_file_too_small(path_, size);  // also avoids mmap of 0 bytes (EINVAL)

  // MAP_SHARED + PROT_READ: pages come straight from the page cache and are shared by every
  // process that maps the checkpoint; nothing is copied or counted as private memory.
  void* m = map_file_huge_aligned(fd.fd, size);
  if (m == MAP_FAILED)
    fail(path_, "mmap of " + std::to_string(size) + " bytes failed: " + std::strerror(errno));
  map_.data = static_cast<const uint8_t*>(m);
  map_.size = size;
  // The mapping keeps the file referenced; the descriptor is closed by FdCloser.

  SafetensorsHeader h = parse_safetensors_header(map_.data, map_.size, path_);
  metadata_ = std::move(h.metadata);
  tensors_.reserve(h.entries.size());
  for (auto& e : h.entries) {
    TensorInfo t;
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.data = map_.data + h.data_start + e.begin;
    t.nbytes = size_t(e.end - e.begin);
    t.file = path_;
    t.file_offset = h.data_start + e.begin;
    tensors_.push_back(std::move(t));
  }
  // Entries come sorted by name from the parser, so find() can binary search.
}

namespace {
const TensorInfo* find_sorted(const std::vector<TensorInfo>& v, std::string_view name) {
  auto it = std::lower_bound(v.begin(), v.end(), name, [](const TensorInfo& t, std::string_view n) {
    return std::string_view(t.name) < n;
  });
  return it != v.end() && it->name == name ? &*it : nullptr;
}
}  // namespace

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  return find_sorted(tensors_, name);
}

// ---- TensorStore -------------------------------------------------------------------------------

TensorStore TensorStore::open(const std::string& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found)
    throw Error(path + ": no such file or directory (expected a checkpoint directory, a " +
                kIndexFileName + " or a .safetensors file)");
  if (ec) throw Error(path + ": cannot access: " + ec.message());

  if (fs::is_directory(st)) {
    fs::path index = fs::path(path) / kIndexFileName;
    fs::path single = fs::path(path) / kSingleFileName;
    if (fs::exists(index, ec)) return open_index(index.string());
    if (fs::exists(single, ec)) return open_single(single.string());
    size_t shards = 0;
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.path().extension() == ".safetensors") ++shards;
    throw Error(path + ": no checkpoint found: looked for " + index.string() + " and " +
                single.string() +
                (shards ? " (the directory has " + std::to_string(shards) +
                              " .safetensors files but no index to tie them together)"
                        : ""));
  }
  if (fs::path(path).extension() == ".json") return open_index(path);
  return open_single(path);
}

TensorStore TensorStore::open_single(const std::string& file) {
  TensorStore s;
  s.source_ = file;
  fs::path parent = fs::path(file).parent_path();
  s.root_ = parent.empty() ? "." : parent.string();
  s.files_.push_back(std::make_unique<SafetensorsFile>(file));
  s.finish();
  return s;
}

TensorStore TensorStore::open_index(const std::string& index_path) {
  // The real index is ~7 MiB; 1 GiB means something else was passed.
  std::string text = read_whole_file(index_path, 1ull << 30);
  // Depth 3 leaves room for the usual {"metadata": {...}, "weight_map": {...}} plus one level of
  // extra metadata some tools add; duplicate names in weight_map are rejected by the parser.
  json doc = parse_untrusted_json(reinterpret_cast<const uint8_t*>(text.data()), text.size(),
                                  index_path, 3, "index", "key");
  if (!doc.is_object())
    fail(index_path, std::string("index is a JSON ") + doc.type_name() + ", expected an object");
  auto wm = doc.find("weight_map");
  if (wm == doc.end() || !wm->is_object())
    fail(index_path, "index needs a 'weight_map' object mapping tensor names to shard files");

  std::optional<uint64_t> total_size;
  if (auto md = doc.find("metadata"); md != doc.end()) {
    if (!md->is_object()) fail(index_path, "'metadata' must be an object");
    if (auto ts = md->find("total_size"); ts != md->end()) {
      total_size = as_u64(*ts);
      if (!total_size)
        fail(index_path, "metadata.total_size is " + describe_json(*ts) +
                             ", expected a non-negative integer (bytes)");
    }
  }

  // tensor name -> shard, and shard -> how many tensors the index expects in it.
  std::unordered_map<std::string, std::string> weight_map;
  std::map<std::string, size_t> shard_counts;  // sorted: shards open in a stable order
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string())
      fail(index_path, "weight_map entry for tensor " + in_quotes(name) + " is " +
                           describe_json(shard) + ", expected a shard file name");
    const auto& file = shard.get_ref<const std::string&>();
    // Shards must sit next to the index: a name with a path could read any file on the machine.
    if (!is_plain_file_name(file))
      fail(index_path, "weight_map sends tensor " + in_quotes(name) + " to " + in_quotes(file) +
                           ", which is not a plain file name (no directories or '..' allowed)");
    weight_map.emplace(name, file);
    ++shard_counts[file];
  }

  TensorStore s;
  s.source_ = index_path;
  fs::path parent = fs::path(index_path).parent_path();
  s.root_ = parent.empty() ? "." : parent.string();

  // Every missing shard in one message (a partial download: what remains to fetch).
  std::vector<std::string> missing_shards;
  int64_t missing_tensors = 0;
  for (const auto& [shard, count] : shard_counts) {
    std::error_code ec;
    if (!fs::exists(fs::path(s.root_) / shard, ec)) {
      missing_shards.push_back(shard);
      missing_tensors += int64_t(count);
    }
  }
  if (!missing_shards.empty()) {
    std::string list;
    for (size_t i = 0; i < missing_shards.size(); ++i) list += (i ? ", " : "") + in_quotes(missing_shards[i]);
    const bool one = missing_shards.size() == 1;
    fail(index_path, std::to_string(missing_shards.size()) + " of " + std::to_string(shard_counts.size()) + " shard" +
                         (shard_counts.size() == 1 ? " is" : "s are") + " missing from " + s.root_ + ": " + list +
                         " (weight_map puts " + std::to_string(missing_tensors) + " tensor" +
                         (missing_tensors == 1 ? "" : "s") + " in " + (one ? "it" : "them") + ")");
  }
  for (const auto& [shard, count] : shard_counts)
    s.files_.push_back(std::make_unique<SafetensorsFile>((fs::path(s.root_) / shard).string()));

  // Every tensor stored in a shard must be listed, in that shard, exactly once across shards.
  std::unordered_map<std::string_view, const SafetensorsFile*> stored_in;
  for (const auto& f : s.files_) {
    std::string shard = fs::path(f->path()).filename().string();
    for (const TensorInfo& t : f->tensors()) {
      auto [it, fresh] = stored_in.emplace(t.name, f.get());
      if (!fresh)
        fail(index_path, "tensor " + in_quotes(t.name) + " is stored in two shards: " +
                             in_quotes(fs::path(it->second->path()).filename().string()) + " and " +
                             in_quotes(shard));
      auto listed = weight_map.find(t.name);
      if (listed == weight_map.end())
        fail(index_path, "tensor " + in_quotes(t.name) + " is in shard " + in_quotes(shard) +
                             " but not listed in weight_map");
      if (listed->second != shard)
        fail(index_path, "weight_map puts tensor " + in_quotes(t.name) + " in " +
                             in_quotes(listed->second) + " but it is stored in " +
                             in_quotes(shard));
    }
  }
  // ... and every listed tensor must be stored (the loop above matched shards for stored ones).
  if (stored_in.size() != weight_map.size()) {
    std::vector<std::string_view> missing;
    for (const auto& [name, shard] : weight_map)
      if (!stored_in.count(name)) missing.push_back(name);
    std::sort(missing.begin(), missing.end());  // report the same one every time
    fail(
        index_path,
        "tensor " + in_quotes(missing.front()) + " is listed in weight_map (shard " +
            in_quotes(weight_map.at(std::string(missing.front()))) + ") but no shard contains it" +
            (missing.size() > 1 ? " (" + std::to_string(missing.size()) + " tensors missing in all)"
                                : ""));
  }

  s.finish();
  if (total_size && *total_size != s.total_bytes_)
    fail(index_path, "metadata.total_size is " + std::to_string(*total_size) +
                         " but the tensors in the shards hold " + std::to_string(s.total_bytes_) +
                         " bytes");
  return s;
}

void TensorStore::finish() {
  size_t n = 0;
  for (const auto& f : files_) n += f->tensors().size();
  tensors_.reserve(n);
  total_bytes_ = 0;
  for (const auto& f : files_)
    for (const TensorInfo& t : f->tensors()) {
      tensors_.push_back(t);  // copies the description only; data stays in the mapping
      total_bytes_ += t.nbytes;
    }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
}

const TensorInfo* TensorStore::find(std::string_view name) const {
  return find_sorted(tensors_, name);
}

const TensorInfo& TensorStore::get(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  throw Error("tensor " + in_quotes(name) + " not found in checkpoint " + source_ + " (" +
              std::to_string(tensors_.size()) + " tensors)");
}

}  // namespace ds41
