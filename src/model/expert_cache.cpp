#include "model/expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <unistd.h>

#include "base/error.h"
#include "model/tensor_table.h"

namespace ds41 {

namespace {

constexpr uint64_t kAlign = DirectReader::kAlign;
uint64_t align_down(uint64_t v) { return v / kAlign * kAlign; }
uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Tensors of one expert closer than this in a file are read as one range (the gap with them).
constexpr uint64_t kMergeGap = 64 << 10;

struct Piece {  // one tensor of an expert
  int file;
  uint64_t offset, bytes;
  uint64_t* slot_offset;  // where to record its place in the slot
};

}  // namespace

ExpertCache::ExpertCache(const TensorStore& store, const ModelPlan& plan, int io_threads, const ExpertShare& share)
    : reader_(std::make_unique<DirectReader>(io_threads)) {
  experts_.resize(plan.layers.size());
  for (const LayerPlan& lp : plan.layers) {
    auto& layer = experts_[size_t(lp.id)];
    layer.resize(size_t(lp.routed_experts));
    for (int e = 0; e < lp.routed_experts; ++e) {
      if (!share.owns(e, lp.routed_experts)) continue;  // another rank's (not in a split copy)
      Expert& x = layer[size_t(e)];
      std::vector<Piece> pieces;
      for (const BlockTensor& t : block_tensors()) {
        if (t.when != TensorWhen::RoutedExpert) continue;
        const auto* slot = std::get_if<Fp4Matrix ExpertWeights::*>(&t.slot);
        if (!slot) throw Error("expert cache: a routed expert row is not an FP4 matrix (internal error)");
        Matrix& m = *slot == &ExpertWeights::w1 ? x.w1 : *slot == &ExpertWeights::w2 ? x.w2 : x.w3;
        const std::string base = expert_prefix(lp, e) + t.name;
        const TensorInfo& w = store.get(base + ".weight");
        const TensorInfo& s = store.get(base + ".scale");
        m.N = w.shape.at(0);
        m.K = w.shape.at(1) * 2;
        pieces.push_back({reader_->open(w.file), w.file_offset, w.nbytes, &m.codes});
        pieces.push_back({reader_->open(s.file), s.file_offset, s.nbytes, &m.scales});
      }
      std::sort(pieces.begin(), pieces.end(),
                [](const Piece& a, const Piece& b) { return std::tie(a.file, a.offset) < std::tie(b.file, b.offset); });
      uint64_t used = 0;
      for (size_t i = 0; i < pieces.size();) {
        // A run of pieces of one file, each starting within kMergeGap of the run's end.
        size_t j = i + 1;
        uint64_t end = pieces[i].offset + pieces[i].bytes;
        while (j < pieces.size() && pieces[j].file == pieces[i].file && pieces[j].offset <= end + kMergeGap) {
          end = std::max(end, pieces[j].offset + pieces[j].bytes);
          ++j;
        }
        const uint64_t begin = align_down(pieces[i].offset), stop = align_up(end);
        x.extents.push_back({pieces[i].file, begin, stop - begin, used});
        for (size_t k = i; k < j; ++k) *pieces[k].slot_offset = used + (pieces[k].offset - begin);
        used += stop - begin;
        i = j;
      }
      slot_bytes_ = std::max(slot_bytes_, int64_t(used));
    }
  }
}

void ExpertCache::allocate_slots(int64_t slots) {
  if (slots < 1) throw Error("expert cache: at least one slot is needed");
  if (!slot_state_.empty()) throw Error("expert cache: slots already allocated (internal error)");
  // At least a huge page: then the buffer is a 2 MiB-aligned mapping of its own (base/byte_buffer.h),
  // as O_DIRECT needs (4 KiB alignment).
  memory_ = ByteBuffer(std::max(size_t(slots * slot_bytes_), ByteBuffer::kHugePageBytes));
  slot_state_.resize(size_t(slots));
  slot_views_.resize(size_t(slots));
  taken_.reserve(size_t(slots));
}

ExpertCache::~ExpertCache() {
  reader_.reset();  // finishes the reads in flight (their callbacks use the members below)
}

ExpertWeights ExpertCache::views_in(const Expert& x, int64_t slot) const {
  const uint8_t* base = memory_.data() + slot * slot_bytes_;
  auto view = [&](const Matrix& m) { return Fp4Matrix{base + m.codes, base + m.scales, m.N, m.K}; };
  return ExpertWeights{view(x.w1), view(x.w2), view(x.w3)};
}

int64_t ExpertCache::take_slot(std::unique_lock<std::mutex>&) {
  int64_t best = -1;
  uint64_t best_asked = 0;
  for (int64_t i = 0; i < slots(); ++i) {
    const Slot& s = slot_state_[size_t(i)];
    if (s.state == SlotState::Empty) return i;
    if (s.pins != 0 || s.state == SlotState::Loading) continue;
    const uint64_t asked = policy == Policy::LeastFrequent ? expert(s.layer, s.expert).asked : 0;
    if (best < 0 || asked < best_asked ||
        (asked == best_asked && s.last_use < slot_state_[size_t(best)].last_use)) {
      best = i;
      best_asked = asked;
    }
  }
  return best;
}

void ExpertCache::start_reads(int layer, int e, int64_t slot, int pins) {
  Expert& x = expert(layer, e);
  Slot& s = slot_state_[size_t(slot)];
  if (s.layer >= 0) expert(s.layer, s.expert).slot = -1;  // evicted
  s = Slot{layer, e, SlotState::Loading, pins, int(x.extents.size()), ++tick_, "", pins == 0};
  x.slot = slot;
  slot_views_[size_t(slot)] = views_in(x, slot);
  for (const Extent& ext : x.extents) {
    stats_.bytes_read += int64_t(ext.length);
    reader_->submit(ext.file, ext.offset, ext.length, memory_.data() + slot * slot_bytes_ + ext.slot_offset,
                    [this, slot](const std::string* error) {
                      std::lock_guard<std::mutex> guard(mutex_);
                      Slot& t = slot_state_[size_t(slot)];
                      if (error && t.error.empty()) t.error = *error;
                      if (--t.pending == 0) t.state = t.error.empty() ? SlotState::Ready : SlotState::Failed;
                      changed_.notify_all();
                    });
  }
}

void ExpertCache::prefetch(int layer, const int32_t* ids, int n) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (int i = 0; i < n; ++i) {
    if (ids[i] < 0 || size_t(ids[i]) >= experts_[size_t(layer)].size() || expert(layer, ids[i]).slot >= 0) continue;
    const int64_t slot = take_slot(lock);
    if (slot < 0) return;  // every slot pinned or being read
    ++stats_.prefetched;
    start_reads(layer, ids[i], slot, 0);
  }
}

void ExpertCache::acquire(int layer, const int32_t* ids, int n, const ExpertWeights** out) {
  if (n > slots()) throw Error("expert cache: " + std::to_string(n) + " experts asked for at once, " +
                               std::to_string(slots()) + " slots (internal error)");
  std::unique_lock<std::mutex> lock(mutex_);
  stats_.requests += n;
  std::vector<int64_t>& taken = taken_;  // reserved for slots(): no allocation per call
  taken.assign(size_t(n), -1);
  for (int i = 0; i < n; ++i) {
    Expert& x = expert(layer, ids[i]);
    ++x.asked;
    if (x.slot >= 0 && slot_state_[size_t(x.slot)].state == SlotState::Failed && slot_state_[size_t(x.slot)].pins == 0) {
      slot_state_[size_t(x.slot)] = Slot{};  // a failed read ahead: read again below
      x.slot = -1;
    }
    if (x.slot >= 0) {
      Slot& s = slot_state_[size_t(x.slot)];
      ++s.pins;
      s.last_use = ++tick_;
      ++stats_.hits;
      if (s.prefetched) {
        ++stats_.prefetch_used;
        s.prefetched = false;
      }
      taken[size_t(i)] = x.slot;
      continue;
    }
    const int64_t slot = take_slot(lock);
    if (slot < 0) throw Error("expert cache: every slot is pinned (more experts asked for at once than it holds)");
    ++stats_.reads;
    start_reads(layer, ids[i], slot, 1);
    taken[size_t(i)] = slot;
  }
  const auto t0 = std::chrono::steady_clock::now();
  changed_.wait(lock, [&] {
    for (int64_t slot : taken)
      if (slot_state_[size_t(slot)].state == SlotState::Loading) return false;
    return true;
  });
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string failure;
  for (int i = 0; i < n; ++i) {
    Slot& s = slot_state_[size_t(taken[size_t(i)])];
    if (s.state == SlotState::Failed && failure.empty()) failure = s.error;
  }
  if (!failure.empty()) {
    // Nothing of this call stays pinned; a failed slot is emptied so that a later call reads again.
    for (int i = 0; i < n; ++i) {
      Slot& s = slot_state_[size_t(taken[size_t(i)])];
      --s.pins;
      if (s.state == SlotState::Failed) {
        expert(s.layer, s.expert).slot = -1;
        s = Slot{};
      }
    }
    throw Error("reading a routed expert from disk failed: " + failure);
  }
  for (int i = 0; i < n; ++i) out[i] = &slot_views_[size_t(taken[size_t(i)])];
}

void ExpertCache::release(int layer, const int32_t* ids, int n) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < n; ++i) {
    const Expert& x = expert(layer, ids[i]);
    if (x.slot < 0) continue;
    Slot& s = slot_state_[size_t(x.slot)];
    if (s.pins > 0) --s.pins;
    s.last_use = ++tick_;
  }
}

ExpertCacheStats ExpertCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void ExpertCache::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = ExpertCacheStats{};
}

// ---- budgets -------------------------------------------------------------------------------------

std::string format_gib(int64_t bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  if (bytes >= (int64_t(1) << 30)) {
    os.precision(2);
    os << double(bytes) / double(int64_t(1) << 30) << " GiB";
  } else if (bytes >= (1 << 20)) {
    os.precision(1);
    os << double(bytes) / double(1 << 20) << " MiB";
  } else {
    os.precision(1);
    os << double(bytes) / 1024.0 << " KiB";
  }
  return os.str();
}

std::string MemoryPlan::summary() const {
  std::string s = "memory budget " + format_gib(budget) + " (" + budget_source + "): ";
  if (!stream_experts)
    return s + "the model's weights fit (" + format_gib(resident_bytes + expert_bytes) + " read whole" +
           (engram_bytes ? ", Engram tables " + format_gib(engram_bytes) + " read by row" : "") + ")";
  return s + format_gib(resident_bytes) + " resident, routed experts (" + format_gib(expert_bytes) +
         ") streamed from disk through " + std::to_string(slots) + " slots of " + format_gib(slot_bytes) + " (" +
         format_gib(slots * slot_bytes) + ")";
}

int64_t default_memory_budget(std::string* source) {
  int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (meminfo >> key >> value) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      available = value * 1024;
      break;
    }
  }
  if (available < 0) {  // no /proc/meminfo: physical memory
    available = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
    if (source) *source = "physical memory " + format_gib(available) + " minus a margin";
  } else if (source) {
    *source = "available memory " + format_gib(available) + " minus a margin";
  }
  const int64_t margin = std::max<int64_t>(int64_t(512) << 20, available / 16);
  return std::max<int64_t>(available - margin, int64_t(1) << 20);
}

int64_t parse_memory_size(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return Error("--mem-budget " + text + ": " + why + " (give GiB, e.g. 24 or 1.5, or a size with a unit: 512M, 2G)");
  };
  if (text.empty()) throw bad("empty");
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad("not a number");
  }
  std::string unit = text.substr(used);
  double scale = double(int64_t(1) << 30);
  if (unit == "K" || unit == "KiB" || unit == "k") scale = 1024.0;
  else if (unit == "M" || unit == "MiB") scale = double(1 << 20);
  else if (unit == "G" || unit == "GiB" || unit.empty()) scale = double(int64_t(1) << 30);
  else if (unit == "T" || unit == "TiB") scale = double(int64_t(1) << 40);
  else throw bad("unknown unit '" + unit + "'");
  if (!std::isfinite(v) || v <= 0) throw bad("must be positive");
  const double bytes = v * scale;
  if (bytes < double(1 << 20)) throw bad("below 1 MiB");
  if (bytes > 9.0e18) throw bad("too large");
  return int64_t(bytes);
}

}  // namespace ds41
