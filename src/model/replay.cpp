// SWA bounded replay (tech report §3.2.2; seed §4.4): rebuild the window rings of a sequence
// whose global caches are kept (compressed KV, index keys, compressor partial groups) by re-running
// only its last window_size tokens. The replayed tokens regenerate window KV only: compressors do
// not run, so the persisted caches are neither recomputed nor overwritten (their RoPE phases stay
// those of the original positions), and each layer's window starts at the replay start s — a query
// at i sees window positions max(s, i-W+1) .. i. Exact when the sequence is no longer than the
// window (the replay then starts at 0) — with the reference's index-key reading only if the
// sequence was fed in one call, since which keys a ratio-2 indexer reads there depends on the
// calls; otherwise the oldest replayed positions saw a short window, which decoding pushes out of
// the ring within window_size steps.
#include <algorithm>

#include "base/error.h"
#include "model/engram_hash.h"
#include "model/forward_context.h"

namespace ds41 {

void check_bounded_replay(const ModelPlan& plan, const SequenceState& state, int64_t end) {
  for (const LayerPlan& lp : plan.layers) {
    if (lp.is_dspark || !lp.kv_source || lp.ratio <= 0) continue;
    const LayerState& ls = state.layers[size_t(lp.id)];
    if (ls.entries != end / lp.ratio)
      throw Error("bounded replay: layer " + std::to_string(lp.id) + " holds " + std::to_string(ls.entries) +
                  " compressed entries, but a replay ending at position " + std::to_string(end) + " needs " +
                  std::to_string(end / lp.ratio) + " (the global caches must end where the replay ends)");
  }
}

void begin_bounded_replay(ForwardContext& ctx) {
  for (const LayerPlan& lp : ctx.plan.layers)
    if (!lp.is_dspark) ctx.state.layers[size_t(lp.id)].ring_start = ctx.start;
  ctx.global_cache_ready = true;
}

bool Model::replay_window_has_images(const SequenceState& state) const {
  const int64_t n = std::min<int64_t>(config_.window_size, state.pos);
  const int64_t held = int64_t(state.token_history.size());
  for (int64_t i = std::max<int64_t>(0, held - n); i < held; ++i)
    if (config_.vision_enabled() && state.token_history[size_t(i)] == config_.image_token_id) return true;
  const int64_t held_engram = int64_t(state.engram_history.size());
  for (int64_t i = std::max<int64_t>(0, held_engram - n); i < held_engram; ++i)
    if (state.engram_history[size_t(i)] == kEngramDead) return true;
  return false;
}

std::vector<float> Model::replay_window(SequenceState& state, const ForwardOptions& opt, ThreadPool* pool) const {
  const int64_t n = std::min<int64_t>(config_.window_size, state.pos);
  if (n == 0) throw Error("replay_window: the sequence is empty");
  const int64_t held = int64_t(state.token_history.size());
  if (held != state.pos - state.history_start || held < n)
    throw Error("replay_window: the sequence holds the tokens of positions " + std::to_string(state.history_start) +
                ".." + std::to_string(state.history_start + held - 1) + ", but a replay needs its last " +
                std::to_string(n) + " up to position " + std::to_string(state.pos - 1));
  // A replay re-embeds the tokens; image-span positions had other rows (the vision tower's), which
  // the sequence does not keep, so a window holding any cannot be rebuilt (save such sequences
  // exact; session.cpp refuses the compact kind for them).
  if (replay_window_has_images(state))
    throw Error("replay_window: the last " + std::to_string(n) +
                " positions include image-span positions, which a bounded replay cannot rebuild (their rows came "
                "from the vision tower): use an exact session");
  // The replay feeds the tokens again, which appends them to the histories: take them off first.
  std::vector<int32_t> tokens(state.token_history.end() - n, state.token_history.end());
  if (engram_hash_) {
    if (int64_t(state.engram_history.size()) != held)
      throw Error("replay_window: the Engram history is out of step with the token history");
    state.engram_history.resize(size_t(held - n));
  }
  state.token_history.resize(size_t(held - n));
  state.pos -= n;
  // The index-key publisher is a counter of the last call; the replay must not change it.
  const int publisher = state.index_k_publisher;
  ForwardOptions o = opt;
  o.bounded_replay = true;
  o.prefill = PrefillMode::Full;
  o.all_logits = false;
  std::vector<float> logits = forward(state, tokens, o, pool);
  state.index_k_publisher = publisher;
  return logits;
}

}  // namespace ds41
