#include "runtime/prefix_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/hash.h"
#include "runtime/session.h"

namespace ds41 {

namespace fs = std::filesystem;

namespace {

// The .ids file: magic, count, the ids (little-endian int32), FNV-1a of the ids' bytes. Written
// after the session file, so an .ids file always names a complete session (the session itself is
// written atomically); a torn .ids file fails its checksum and the pair is dropped.
constexpr char kIdsMagic[8] = {'D', 'S', '4', '1', 'I', 'D', 'S', '1'};

void write_ids(const std::string& path, const std::vector<int32_t>& ids) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    const uint64_t n = ids.size();
    const uint64_t sum = fnv1a64(reinterpret_cast<const uint8_t*>(ids.data()), ids.size() * 4);
    f.write(kIdsMagic, 8);
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 4));
    f.write(reinterpret_cast<const char*>(&sum), 8);
    if (!f) throw Error(tmp + ": cannot write");
  }
  fs::rename(tmp, path);
}

bool read_ids(const std::string& path, std::vector<int32_t>& ids) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  uint64_t n = 0, sum = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, kIdsMagic, 8) != 0 || !f.read(reinterpret_cast<char*>(&n), 8)) return false;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  // The count must be what the file holds: compared without forming 24 + 4 n, which a crafted
  // count wraps around (a 28-byte file once asked for 2^62 ids).
  if (ec || n == 0 || size < 24 || (size - 24) % 4 != 0 || n != (size - 24) / 4) return false;
  ids.resize(n);
  if (!f.read(reinterpret_cast<char*>(ids.data()), std::streamsize(n * 4)) || !f.read(reinterpret_cast<char*>(&sum), 8))
    return false;
  return sum == fnv1a64(reinterpret_cast<const uint8_t*>(ids.data()), ids.size() * 4);
}

std::string stem_for(const std::string& dir, const std::vector<int32_t>& ids) {
  char name[32];
  std::snprintf(name, sizeof(name), "prefix-%016llx",
                static_cast<unsigned long long>(fnv1a64(reinterpret_cast<const uint8_t*>(ids.data()), ids.size() * 4)));
  return (fs::path(dir) / name).string();
}

bool is_strict_prefix(const std::vector<int32_t>& ids, const std::vector<int32_t>& prompt) {
  return ids.size() < prompt.size() && std::equal(ids.begin(), ids.end(), prompt.begin());
}

}  // namespace

int64_t sequence_state_bytes(const SequenceState& s) {
  int64_t n = int64_t(sizeof(SequenceState));
  for (const LayerState& l : s.layers)
    n += int64_t(l.ring_codes.size() + l.ring_scales.size() + l.ckv_codes.size() + l.ckv_scales.size() +
                 l.ik_codes.size() + l.ik_scales.size()) +
         int64_t(l.group_kv.size() + l.group_score.size()) * 4;
  n += int64_t(s.token_history.size()) * 4 + int64_t(s.engram_history.size()) * 8;
  return n;
}

std::optional<SequenceState> PrefixCache::lookup(const std::vector<int32_t>& prompt) {
  for (;;) {
    auto best = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (is_strict_prefix(it->ids, prompt) && (best == entries_.end() || it->ids.size() > best->ids.size())) best = it;
    auto best_disk = disk_.end();
    const size_t in_memory = best == entries_.end() ? 0 : best->ids.size();
    for (auto it = disk_.begin(); it != disk_.end(); ++it)
      if (it->ids.size() > in_memory && is_strict_prefix(it->ids, prompt) &&
          (best_disk == disk_.end() || it->ids.size() > best_disk->ids.size()))
        best_disk = it;
    if (best_disk != disk_.end()) {
      // Load it back; a file that no longer loads (damaged, another model) is dropped and the
      // search goes on without it.
      SequenceState state;
      try {
        state = load_session(best_disk->stem + ".session", *model_);
      } catch (const Error& e) {
        std::fprintf(stderr, "ds41: prefix cache: dropping %s: %s\n", best_disk->stem.c_str(), e.what());
        ++disk_errors_;
        drop_disk(best_disk);
        continue;
      }
      if (state.pos != int64_t(best_disk->ids.size()) || state.token_history != best_disk->ids) {
        std::fprintf(stderr, "ds41: prefix cache: dropping %s: its state does not hold its ids\n", best_disk->stem.c_str());
        ++disk_errors_;
        drop_disk(best_disk);
        continue;
      }
      ++hits_;
      ++disk_hits_;
      hit_tokens_ += state.pos;
      disk_.splice(disk_.begin(), disk_, best_disk);
      std::vector<int32_t> ids = disk_.front().ids;
      insert(ids, state);
      for (Entry& e : entries_)
        if (e.ids == ids) e.on_disk = true;
      return state;
    }
    if (best == entries_.end()) {
      ++misses_;
      return std::nullopt;
    }
    ++hits_;
    hit_tokens_ += int64_t(best->ids.size());
    entries_.splice(entries_.begin(), entries_, best);
    return entries_.front().state;
  }
}

void PrefixCache::insert(const std::vector<int32_t>& ids, const SequenceState& state) {
  if (capacity_ <= 0 || ids.empty()) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->ids == ids) {
      bytes_ -= it->bytes;
      entries_.erase(it);
      break;
    }
  Entry e{ids, state, 0, false};
  e.bytes = sequence_state_bytes(state) + int64_t(ids.size()) * 4;
  if (e.bytes > capacity_) {
    spill(e);
    return;
  }
  evict_to(capacity_ - e.bytes);
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
}

void PrefixCache::evict_to(int64_t limit) {
  while (!entries_.empty() && bytes_ > limit) {
    if (!entries_.back().on_disk) spill(entries_.back());
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

void PrefixCache::enable_disk(const Model& model, const std::string& dir, int64_t disk_bytes) {
  model_ = &model;
  dir_ = dir;
  disk_capacity_ = disk_bytes;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error("prefix cache directory " + dir + ": cannot create it (" + ec.message() + ")");
  // Index what a previous run left: pairs of .ids and .session files, oldest last.
  std::vector<std::pair<fs::file_time_type, DiskEntry>> found;
  std::vector<fs::path> leftovers;  // removed after the listing
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const fs::path p = f.path();
    const std::string name = p.filename().string();
    if (name.rfind("prefix-", 0) != 0) continue;
    // A write that a crash interrupted (session_save and write_ids write NAME.tmp, then rename).
    if (p.extension() == ".tmp") {
      leftovers.push_back(p);
      continue;
    }
    if (p.extension() != ".ids") continue;
    DiskEntry d;
    d.stem = (p.parent_path() / p.stem()).string();
    std::error_code e2;
    const auto session_bytes = fs::file_size(d.stem + ".session", e2);
    if (e2 || !read_ids(p.string(), d.ids)) {  // torn, truncated or foreign: dropped, with a word
      std::fprintf(stderr, "ds41: prefix cache: dropping %s: %s\n", p.string().c_str(),
                   e2 ? "its session file is missing" : "not a valid .ids file (truncated or damaged)");
      ++disk_errors_;
      leftovers.push_back(p);
      leftovers.push_back(d.stem + ".session");
      continue;
    }
    d.bytes = int64_t(session_bytes) + int64_t(fs::file_size(p));
    found.emplace_back(fs::last_write_time(p, e2), std::move(d));
  }
  if (ec) throw Error("prefix cache directory " + dir + ": cannot list it (" + ec.message() + ")");
  for (const fs::path& p : leftovers) fs::remove(p, ec);
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [t, d] : found) {
    disk_bytes_ += d.bytes;
    disk_.push_back(std::move(d));
  }
  evict_disk_to(disk_capacity_);
}

void PrefixCache::spill(const Entry& e) {
  if (!model_ || disk_capacity_ <= 0) return;
  for (auto it = disk_.begin(); it != disk_.end(); ++it)
    if (it->ids == e.ids) {  // already there: just the most recent now
      disk_.splice(disk_.begin(), disk_, it);
      return;
    }
  DiskEntry d{e.ids, stem_for(dir_, e.ids), 0};
  try {
    save_session(d.stem + ".session", *model_, e.state, SessionKind::Exact);
    write_ids(d.stem + ".ids", e.ids);
    d.bytes = int64_t(fs::file_size(d.stem + ".session")) + int64_t(fs::file_size(d.stem + ".ids"));
  } catch (const std::exception& ex) {  // a full disk costs the cache entry, never the request
    std::fprintf(stderr, "ds41: prefix cache: cannot spill to %s: %s\n", dir_.c_str(), ex.what());
    ++disk_errors_;
    std::error_code ec;
    fs::remove(d.stem + ".session", ec);
    fs::remove(d.stem + ".ids", ec);
    return;
  }
  if (d.bytes > disk_capacity_) {  // larger than the whole tier
    std::error_code ec;
    fs::remove(d.stem + ".ids", ec);
    fs::remove(d.stem + ".session", ec);
    return;
  }
  evict_disk_to(disk_capacity_ - d.bytes);
  disk_bytes_ += d.bytes;
  disk_.push_front(std::move(d));
}

void PrefixCache::flush_to_disk() {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)  // oldest first: the newest ends up most recent
    if (!it->on_disk) {
      spill(*it);
      it->on_disk = true;
    }
}

void PrefixCache::drop_disk(std::list<DiskEntry>::iterator it) {
  std::error_code ec;
  fs::remove(it->stem + ".ids", ec);  // the index entry first: a crash between leaves no orphan pair
  fs::remove(it->stem + ".session", ec);
  for (Entry& e : entries_)
    if (e.ids == it->ids) e.on_disk = false;
  disk_bytes_ -= it->bytes;
  disk_.erase(it);
}

void PrefixCache::evict_disk_to(int64_t limit) {
  while (!disk_.empty() && disk_bytes_ > limit) drop_disk(std::prev(disk_.end()));
}

}  // namespace ds41
