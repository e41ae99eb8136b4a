// Sessions on disk: one sequence's complete state (SequenceState) saved to a file and restored,
// possibly in another process, so that decoding continues exactly where it stopped.
//
// Only the "exact" kind exists so far: it stores every cache the forward pass reads — the FP8
// window rings, the compressors' partial groups, the packed compressed KV and index keys, the
// index-key publisher and both histories — so a restored sequence produces bit-identical logits
// to the one that was saved. (A compact kind that drops the rings and re-prefills the window is a
// possible later flag; the format reserves a flags word for it.)
//
// File layout (all integers little-endian):
//   magic "DS41SESS" | u32 format version | u32 flags (bit 0 = exact) | u64 config fingerprint |
//   u64 body length | body | u64 FNV-1a 64 checksum of every byte before it
// body:
//   i64 pos | i32 index_k_publisher | u32 layer count |
//   per layer: i64 entries, then 8 arrays (ring codes, ring scales, group kv, group score,
//              ckv codes, ckv scales, ik codes, ik scales), each u64 element count + elements |
//   token_history (u64 count + i32) | engram_history (u64 count + i64)
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/sequence_state.h"

namespace ds41 {

class Model;

inline constexpr uint32_t kSessionFormatVersion = 1;
inline constexpr uint32_t kSessionFlagExact = 1;

// FNV-1a 64 of the canonical flat JSON of the config: a session is only valid for a model whose
// every hyperparameter matches (weights are not hashed — same-shaped checkpoints are accepted).
uint64_t config_fingerprint(const ModelConfig& c);

// Writes atomically: the data goes to `path + ".tmp"`, is fsynced, renamed over `path`, and the
// directory is fsynced, so after a crash `path` holds either the previous file or the new one.
// Throws ds41::Error (the temp file removed, any previous file left intact) on failure.
void save_session(const std::string& path, const Model& model, const SequenceState& state);

// Reads and fully validates a session for `model`; throws ds41::Error naming the file and the
// problem (not a session, newer version, another model, truncated, corrupt, inconsistent).
SequenceState load_session(const std::string& path, const Model& model);

}  // namespace ds41
