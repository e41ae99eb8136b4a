#include "text/bpe.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <nlohmann/json.hpp>
#include <shared_mutex>

#include "base/error.h"
#include "text/byte_level.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

constexpr uint64_t kEmptyKey = ~uint64_t(0);  // ids are non-negative int32, so no pair key has all bits set

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

}  // namespace

// Open addressing over flat arrays: one probe usually settles a lookup (a node-based map cost a
// division and two cache misses per piece, a quarter of the encode time).
struct BpeModel::Cache {
  struct Slot {
    uint64_t hash = 0;  // 0: empty (stored hashes have the low bit set)
    uint32_t key = 0, ids = 0;  // offsets in keys / ids
    uint16_t key_length = 0, id_count = 0;
  };
  static constexpr size_t kSlots = 2 * kCacheMaxEntries;
  static_assert(kCacheMaxPieceBytes <= 0xFFFF, "lengths are stored in 16 bits");

  std::shared_mutex mutex;
  std::vector<Slot> slots;  // allocated on the first insertion
  std::string keys;
  std::vector<int32_t> ids;
  size_t count = 0;

  static uint64_t hash_of(std::string_view piece) { return std::hash<std::string_view>{}(piece) | 1; }
  // The index of the slot holding `piece`, or of the empty slot where it would go.
  size_t probe(std::string_view piece, uint64_t hash) const {
    for (size_t i = (hash >> 1) & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots[i];
      if (s.hash == 0) return i;
      if (s.hash == hash && s.key_length == piece.size() &&
          std::memcmp(keys.data() + s.key, piece.data(), piece.size()) == 0) {
        return i;
      }
    }
  }
};

BpeModel::BpeModel() : cache_(std::make_unique<Cache>()) {}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

void BpeModel::MergeTable::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  size_t capacity = 16;
  shift = 60;
  while (capacity < 2 * entries.size()) {
    capacity *= 2;
    --shift;
  }
  mask = capacity - 1;
  keys.assign(capacity, kEmptyKey);
  values.assign(capacity, Merge{0, 0});
  for (const auto& [key, merge] : entries) {
    size_t slot = size_t((key * 0x9E3779B97F4A7C15ull) >> shift);
    while (keys[slot] != kEmptyKey && keys[slot] != key) slot = (slot + 1) & mask;
    keys[slot] = key;  // a later duplicate overwrites: the pair keeps its last rank, as in HF
    values[slot] = merge;
  }
}

const BpeModel::Merge* BpeModel::MergeTable::find(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  size_t slot = size_t((key * 0x9E3779B97F4A7C15ull) >> shift);
  while (true) {
    const uint64_t k = keys[slot];
    if (k == key) return &values[slot];
    if (k == kEmptyKey) return nullptr;
    slot = (slot + 1) & mask;
  }
}

BpeModel BpeModel::from_json(const json& model, const std::string& label) {
  if (!model.is_object()) throw Error(label + ": \"model\" is missing or not an object");
  const std::string type = model.value("type", "");
  if (type != "BPE") {
    throw Error(label + ": model type is \"" + (type.empty() ? std::string("(none)") : type) +
                "\"; only byte-level BPE tokenizers are supported");
  }
  auto is_set = [&](const char* key) {
    auto it = model.find(key);
    return it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty());
  };
  if (is_set("dropout") && !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    throw Error(label + ": BPE dropout is set; only deterministic BPE (dropout null) is supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (is_set(key)) throw Error(label + std::string(": BPE ") + key + " is set; byte-level BPE does not use it");
  }

  BpeModel m;
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object() || vocab->empty()) {
    throw Error(label + ": model.vocab is missing, empty or not an object");
  }
  Vocabulary& v = m.vocab_;
  for (const auto& [spelling, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 31) - 1) {
      throw Error(label + ": model.vocab entry \"" + spelling + "\" has an invalid id " + id.dump());
    }
    const auto i = size_t(id.get<int32_t>());
    if (i >= v.begin.size()) {
      v.begin.resize(i + 1, 0);
      v.length.resize(i + 1, Vocabulary::kAbsent);
    }
    if (v.length[i] != Vocabulary::kAbsent) {
      throw Error(label + ": model.vocab has two entries with id " + std::to_string(i) + " (\"" +
                  v.arena.substr(v.begin[i], v.length[i]) + "\" and \"" + spelling + "\")");
    }
    v.begin[i] = uint32_t(v.arena.size());
    v.length[i] = uint32_t(spelling.size());
    v.arena += spelling;
    ++v.entries;
  }
  size_t capacity = 16;
  while (capacity < 2 * v.entries) capacity *= 2;
  v.mask = capacity - 1;
  v.slots.assign(capacity, -1);
  for (size_t i = 0; i < v.begin.size(); ++i) {
    if (v.length[i] == Vocabulary::kAbsent) continue;
    const std::string_view s(v.arena.data() + v.begin[i], v.length[i]);
    size_t slot = std::hash<std::string_view>{}(s) & v.mask;
    while (v.slots[slot] >= 0) slot = (slot + 1) & v.mask;  // keys are distinct: the JSON object's
    v.slots[slot] = int32_t(i);
  }
  // Every byte must have its own token: then no piece can contain an unknown symbol (which HF
  // would silently drop, there being no unk token in these files).
  for (int b = 0; b < 256; ++b) {
    const std::string s = byte_level_encode(std::string(1, char(b)));
    const int32_t id = v.find(s);
    if (id < 0) {
      throw Error(label + ": model.vocab has no token for byte " + std::to_string(b) + " (spelled \"" + s +
                  "\"); not a byte-level BPE vocabulary");
    }
    m.byte_id_[size_t(b)] = id;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) throw Error(label + ": model.merges is missing or not an array");
  std::vector<std::pair<uint64_t, Merge>> entries;
  entries.reserve(merges->size());
  std::string left, right;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& e = (*merges)[rank];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        throw Error(label + ": model.merges[" + std::to_string(rank) + "] \"" + s +
                    "\" is not two tokens separated by one space");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      throw Error(label + ": model.merges[" + std::to_string(rank) + "] is neither \"a b\" nor [\"a\", \"b\"]: " +
                  e.dump());
    }
    auto find = [&](const std::string& t) {
      const int32_t id = v.find(t);
      if (id < 0) {
        throw Error(label + ": model.merges[" + std::to_string(rank) + "] uses \"" + t +
                    "\", which is not in model.vocab");
      }
      return id;
    };
    const int32_t a = find(left), b = find(right), merged = find(left + right);
    entries.emplace_back(pair_key(a, b), Merge{uint32_t(rank), merged});
  }
  m.merges_.build(entries);
  m.merge_count_ = entries.size();
  if (auto it = model.find("ignore_merges"); it != model.end() && it->is_boolean()) m.ignore_merges_ = it->get<bool>();
  return m;
}

int32_t BpeModel::Vocabulary::find(std::string_view spelling) const {
  size_t slot = std::hash<std::string_view>{}(spelling) & mask;
  for (int32_t id; (id = slots[slot]) >= 0; slot = (slot + 1) & mask) {
    if (spelling == std::string_view(arena.data() + begin[size_t(id)], length[size_t(id)])) return id;
  }
  return -1;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view spelling) const {
  const int32_t id = vocab_.find(spelling);
  if (id < 0) return std::nullopt;
  return id;
}

std::optional<std::string_view> BpeModel::spelling(int32_t id) const {
  if (id < 0 || size_t(id) >= vocab_.begin.size() || vocab_.length[size_t(id)] == Vocabulary::kAbsent) {
    return std::nullopt;
  }
  return std::string_view(vocab_.arena.data() + vocab_.begin[size_t(id)], vocab_.length[size_t(id)]);
}

void BpeModel::encode_piece_uncached(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    // HF: with ignore_merges, a piece that is itself a vocabulary entry is that one token.
    if (const int32_t id = vocab_.find(byte_level_encode(bytes)); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (bytes.size() == 1) {
    out.push_back(byte_id_[uint8_t(bytes[0])]);
    return;
  }
  if (bytes.size() <= kScanMaxPieceBytes) {
    merge_by_scan(bytes, out);
  } else {
    merge_by_tree(bytes, out);
  }
}

// Short pieces: find the lowest (rank, position) pair by a linear scan, merge it, repeat.
// Quadratic, but the arrays stay in registers and L1 for the few bytes of a typical word.
void BpeModel::merge_by_scan(std::string_view bytes, std::vector<int32_t>& out) const {
  constexpr uint32_t kNone = ~uint32_t(0);
  int32_t ids[kScanMaxPieceBytes];
  uint32_t ranks[kScanMaxPieceBytes];  // ranks[i]: merge rank of (ids[i], ids[i + 1]), kNone if none
  int32_t merged[kScanMaxPieceBytes];  // its result
  size_t n = bytes.size();
  for (size_t i = 0; i < n; ++i) ids[i] = byte_id_[uint8_t(bytes[i])];
  auto update = [&](size_t i) {
    const Merge* m = merges_.find(ids[i], ids[i + 1]);
    ranks[i] = m ? m->rank : kNone;
    merged[i] = m ? m->new_id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) update(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == kNone) break;
    ids[best] = merged[best];
    // Remove symbol best + 1 and pair best + 1.
    for (size_t i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) update(best - 1);
    if (best + 1 < n) update(best);
  }
  out.insert(out.end(), ids, ids + n);
}

// Long pieces (runs of spaces, of one character, ...): the same rule with a min segment tree over
// positions, O(n log n) and cache-friendly (the updates after a merge touch neighbouring leaves).
// Leaf i holds (rank << 32 | i) of the pair starting at symbol i, or kNone; the root is the
// lowest rank, leftmost on ties. HF's lazily-invalidated heap picks the same pair every step: its
// stale entries are exactly those whose position no longer starts the same pair.
void BpeModel::merge_by_tree(std::string_view bytes, std::vector<int32_t>& out) const {
  constexpr uint64_t kNone = ~uint64_t(0);
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<uint64_t> tree;
  const auto n = int32_t(bytes.size());
  size_t leaves = 1;
  while (leaves < size_t(n)) leaves *= 2;
  symbols.resize(size_t(n));
  tree.assign(2 * leaves, kNone);
  for (int32_t i = 0; i < n; ++i) symbols[size_t(i)] = {byte_id_[uint8_t(bytes[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1};
  auto pair_value = [&](int32_t i) {
    const int32_t next = symbols[size_t(i)].next;
    if (next < 0) return kNone;
    const Merge* m = merges_.find(symbols[size_t(i)].id, symbols[size_t(next)].id);
    return m ? uint64_t(m->rank) << 32 | uint32_t(i) : kNone;
  };
  for (int32_t i = 0; i + 1 < n; ++i) tree[leaves + size_t(i)] = pair_value(i);
  for (size_t j = leaves - 1; j >= 1; --j) tree[j] = std::min(tree[2 * j], tree[2 * j + 1]);
  auto set = [&](int32_t i, uint64_t v) {
    size_t j = leaves + size_t(i);
    tree[j] = v;
    for (j /= 2; j >= 1; j /= 2) {
      const uint64_t m = std::min(tree[2 * j], tree[2 * j + 1]);
      if (tree[j] == m) break;  // nothing above changes
      tree[j] = m;
    }
  };
  while (tree[1] != kNone) {
    const auto pos = int32_t(uint32_t(tree[1]));
    Symbol& cur = symbols[size_t(pos)];
    const int32_t right = cur.next;
    cur.id = merges_.find(cur.id, symbols[size_t(right)].id)->new_id;
    cur.next = symbols[size_t(right)].next;
    if (cur.next >= 0) symbols[size_t(cur.next)].prev = pos;
    set(right, kNone);
    set(pos, pair_value(pos));
    if (cur.prev >= 0) set(cur.prev, pair_value(cur.prev));
  }
  for (int32_t i = 0; i >= 0; i = symbols[size_t(i)].next) out.push_back(symbols[size_t(i)].id);
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.size() >= kCacheMaxPieceBytes) {
    encode_piece_uncached(bytes, out);
    return;
  }
  Cache& cache = *cache_;
  const uint64_t hash = Cache::hash_of(bytes);
  {
    std::shared_lock lock(cache.mutex);
    if (!cache.slots.empty()) {
      const Cache::Slot& s = cache.slots[cache.probe(bytes, hash)];
      if (s.hash != 0) {
        out.insert(out.end(), cache.ids.begin() + s.ids, cache.ids.begin() + s.ids + s.id_count);
        return;
      }
    }
  }
  const size_t first = out.size();
  encode_piece_uncached(bytes, out);
  std::unique_lock lock(cache.mutex);
  if (cache.count >= kCacheMaxEntries) return;
  if (cache.slots.empty()) cache.slots.resize(Cache::kSlots);
  Cache::Slot& slot = cache.slots[cache.probe(bytes, hash)];
  if (slot.hash != 0) return;  // another thread was first
  slot.hash = hash;
  slot.key = uint32_t(cache.keys.size());
  slot.key_length = uint16_t(bytes.size());
  slot.ids = uint32_t(cache.ids.size());
  slot.id_count = uint16_t(out.size() - first);
  cache.keys.append(bytes);
  cache.ids.insert(cache.ids.end(), out.begin() + std::ptrdiff_t(first), out.end());
  ++cache.count;
}

}  // namespace ds41
