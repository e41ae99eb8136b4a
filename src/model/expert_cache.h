// Routed experts read from disk on demand: what runs a checkpoint larger than the memory budget.
//
// The released checkpoint is 475 GiB, 259 of them routed experts, of which a token uses 6 of 384
// per layer. Everything else (attention, dense and shared weights, the head: ~25 GiB) stays
// mapped and resident; the routed experts go through this cache of fixed-size slots, each holding
// one expert's w1/w2/w3 codes and scales. When a layer's router has chosen, the MoE asks for the
// experts its rows use (MoeExperts below): the missing ones are read all at once (one read per
// expert where its tensors are adjacent in the file, as in the released shards, on a pool of
// I/O threads: an SSD needs a deep queue), then the layer runs on views into the slots. Slots
// are reused least-frequently-asked first (see Policy); the experts of the call in progress are
// pinned.
//
// The values are the checkpoint's bytes, so every output is bit-identical to the all-in-RAM run
// (tests/expert_cache_test.cpp: plain, batched and DSpark decoding, chunked prefill, both
// replacement policies).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/byte_buffer.h"
#include "io/direct_reader.h"
#include "io/safetensors.h"
#include "model/layer_plan.h"
#include "model/weights.h"

namespace ds41 {

struct ExpertCacheStats {
  int64_t requests = 0;    // experts asked for
  int64_t hits = 0;        // of those, already in a slot (or being read for an earlier request)
  int64_t reads = 0;       // experts read from disk
  int64_t bytes_read = 0;  // bytes read (aligned ranges)
  double wait_seconds = 0; // time the forward pass waited for reads
  // Reads ahead (prefetch): experts read before their layer asked, and of those the ones its
  // router then chose (each counted once, when first asked for).
  int64_t prefetched = 0, prefetch_used = 0;
  double hit_rate() const { return requests ? double(hits) / double(requests) : 0.0; }
  double prefetch_precision() const { return prefetched ? double(prefetch_used) / double(prefetched) : 0.0; }
};

class ExpertCache {
 public:
  // The routed experts of every layer of `plan` in `store`: where each expert's reads go. No slots
  // yet: their size (slot_bytes) decides how many a budget holds; then allocate_slots().
  // With expert parallelism only the experts of `share`'s rank.
  ExpertCache(const TensorStore& store, const ModelPlan& plan, int io_threads, const ExpertShare& share = {});
  ~ExpertCache();
  void allocate_slots(int64_t slots);  // once, >= 1

  int64_t slots() const { return int64_t(slot_state_.size()); }
  // Whether the MoE reads the next layer's likely experts ahead (moe.cpp); on by default,
  // DS41_EXPERT_PREFETCH=off at load turns it off (for measuring what it gives).
  bool prefetch_enabled = true;
  // Which unpinned slot a new expert takes: the one whose expert was asked for least often since
  // load, ties to the least recently used (default: it read 1.5 % fewer bytes and ran 3-6 % faster
  // than plain LRU in the measurement of docs/memory.md), or the least recently used.
  // DS41_EXPERT_POLICY=lru at load selects the second.
  enum class Policy { LeastRecent, LeastFrequent };
  Policy policy = Policy::LeastFrequent;
  int64_t slot_bytes() const { return slot_bytes_; }  // the largest expert's aligned reads

  // Views of experts ids[0 .. n) of plan layer `layer` (n <= slots(), ids distinct), read where
  // missing: all reads in flight together, then waits for them. They stay valid and pinned until
  // release() of the same ids. Throws Error when a read fails (naming the file).
  void acquire(int layer, const int32_t* ids, int n, const ExpertWeights** out);
  void release(int layer, const int32_t* ids, int n);
  // Starts reading experts ids[0 .. n) of `layer` that are not in a slot, into free or least
  // recently used unpinned slots, without waiting and without pinning: a guess at what a later
  // acquire() will ask for. Never fails (a failed read is read again when asked for).
  void prefetch(int layer, const int32_t* ids, int n);

  ExpertCacheStats stats() const;
  void reset_stats();

 private:
  struct Extent {  // one aligned read into a slot
    int file;
    uint64_t offset, length, slot_offset;
  };
  struct Matrix {  // one of w1, w2, w3: where its codes and scales land in the slot
    uint64_t codes = 0, scales = 0;
    int64_t N = 0, K = 0;
  };
  struct Expert {
    std::vector<Extent> extents;
    Matrix w1, w2, w3;
    int64_t slot = -1;
    uint64_t asked = 0;  // acquire() requests since load (Policy::LeastFrequent)
  };
  enum class SlotState { Empty, Loading, Ready, Failed };
  struct Slot {
    int layer = -1, expert = -1;
    SlotState state = SlotState::Empty;
    int pins = 0;
    int pending = 0;  // reads in flight
    uint64_t last_use = 0;
    std::string error;
    bool prefetched = false;  // read by prefetch() and not asked for since
  };

  Expert& expert(int layer, int e) { return experts_[size_t(layer)][size_t(e)]; }
  int64_t take_slot(std::unique_lock<std::mutex>& lock);  // a free or least recently used unpinned slot; -1 if none
  // Puts expert `e` of `layer` into `slot` (evicting what it held) and starts its reads.
  void start_reads(int layer, int e, int64_t slot, int pins);
  ExpertWeights views_in(const Expert& x, int64_t slot) const;

  std::vector<std::vector<Expert>> experts_;  // [plan layer][expert]
  int64_t slot_bytes_ = 0;
  ByteBuffer memory_;  // slots() * slot_bytes_, 4 KiB aligned
  std::vector<Slot> slot_state_;
  std::vector<ExpertWeights> slot_views_;  // the views of each slot's expert
  std::vector<int64_t> taken_;             // acquire's slots of the call in progress
  std::unique_ptr<DirectReader> reader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t tick_ = 0;
  ExpertCacheStats stats_;
};

// How a checkpoint is held within a memory budget (Model::load). Decided from the tensor sizes:
// the resident part is every mapped tensor a token reads (everything but the routed experts and
// the Engram tables, whose rows are read at hash-random places from the page cache) plus the
// buffers made at load.
struct MemoryPlan {
  int64_t budget = 0;
  std::string budget_source;    // how the budget was chosen, for the load message
  int64_t resident_bytes = 0;   // mapped tensors every token reads + buffers made at load
  int64_t expert_bytes = 0;     // every routed expert's codes and scales
  int64_t engram_bytes = 0;     // the Engram tables (outside the budget: read from the page cache)
  bool stream_experts = false;  // the routed experts go through an ExpertCache
  int64_t slot_bytes = 0, slots = 0;
  int64_t minimum_budget = 0;   // the smallest budget that runs this checkpoint
  std::string summary() const;  // one line for the load message
};

// The budget when none is given: the memory the kernel reports available (MemAvailable) minus a
// margin for the caches of the sequences and the program (1/16 of it, at least 512 MiB).
int64_t default_memory_budget(std::string* source);
// Parses a --mem-budget value: a number of GiB ("24", "1.5") or with a unit ("512M", "2G",
// "100K", "1T"); throws Error on anything else or a value below 1 MiB.
int64_t parse_memory_size(const std::string& text);
std::string format_gib(int64_t bytes);  // "23.40 GiB" (MiB below 1 GiB, KiB below 1 MiB)

}  // namespace ds41
