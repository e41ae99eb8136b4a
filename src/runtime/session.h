// Sessions on disk: one sequence's state saved to a file and restored, possibly in another
// process, so that decoding continues where it stopped. Two kinds:
//
// - exact: every cache the forward pass reads — the FP8 window rings, the compressors' partial
//   groups, the packed compressed KV and index keys, counters and histories — so a restored
//   sequence produces bit-identical logits to the one that was saved;
// - compact (the default; tech report §3.2.1-§3.2.2, seed §3-§4.4, §7): only what cannot be
//   recomputed cheaply — the packed compressed KV and index keys of every kv source (the
//   length-proportional part: ModelPlan::kv_bytes_per_token per token, 890 B on the release),
//   the compressors' partial groups, the counters, the last window_size tokens and the Engram
//   look-back before them. The window rings are rebuilt on load by a bounded replay of the last
//   window (Model::replay_window): exact for sequences no longer than the window (fed in one
//   call, or with corrected index keys), approximate beyond (the oldest ring entries saw a
//   truncated window; decoding pushes them out). Sampler penalties see only the kept tokens.
//   The DSpark draft rings are not stored either and must be rebuilt after a restore.
//
// File layout (all integers little-endian):
//   magic "DS41SESS" | u32 format version | u32 kind (1 = exact, 2 = compact) |
//   u64 config fingerprint | u64 body length | body | u64 FNV-1a 64 checksum of every byte before it
// Arrays are a u64 element count followed by the elements. Version 2 bodies:
//   exact:   i64 pos | i32 index_k_publisher | i64 history_start | u32 layer count |
//            per layer: i64 entries, i64 ring_start, 8 arrays (ring codes, ring scales, group kv,
//            group score, ckv codes, ckv scales, ik codes, ik scales) |
//            token history (i32, positions history_start..pos-1) | Engram history (i64, same)
//   compact: i64 pos | i32 index_k_publisher | u32 kv-source count |
//            per kv source, ascending: u32 layer id, i64 entries, 6 arrays (group kv, group score,
//            ckv codes, ckv scales, ik codes, ik scales) |
//            i64 history_start | token tail (i32) | Engram tail (i64; empty without Engram)
//            where the tails hold the last min(pos, window_size + engram_max_ngram_size - 1)
//            positions (window_size alone without Engram).
// Version 1 (read only) had exact bodies without history_start and ring_start (both 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "model/sequence_state.h"

namespace ds41 {

class ThreadPool;

inline constexpr uint32_t kSessionFormatVersion = 2;

enum class SessionKind : uint32_t { Exact = 1, Compact = 2 };

// FNV-1a 64 of the canonical flat JSON of the config: a session is only valid for a model whose
// every hyperparameter matches (weights are not hashed — same-shaped checkpoints are accepted).
uint64_t config_fingerprint(const ModelConfig& c);

// Positions of history a compact session keeps: the replayed window plus the Engram look-back.
int64_t compact_history_length(const ModelConfig& c, int64_t pos);

// Writes atomically: the data goes to `path + ".tmp"`, is fsynced, renamed over `path`, and the
// directory is fsynced, so after a crash `path` holds either the previous file or the new one.
// Throws ds41::Error (the temp file removed, any previous file left intact) on failure.
void save_session(const std::string& path, const Model& model, const SequenceState& state,
                  SessionKind kind = SessionKind::Compact);

// Reads and fully validates a session for `model`; throws ds41::Error naming the file and the
// problem (not a session, newer version, another model, truncated, corrupt, inconsistent). A
// compact session's rings are rebuilt by a bounded replay on `pool` with `replay_options`'
// numerics (corrected_index_keys); `replay_logits` (if set) receives the replay's logits of the
// last position (left empty for an exact session, which has none).
SequenceState load_session(const std::string& path, const Model& model, ThreadPool* pool = nullptr,
                           const ForwardOptions& replay_options = {}, std::vector<float>* replay_logits = nullptr);

}  // namespace ds41
