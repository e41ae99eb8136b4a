// Engram n-gram hashing (spec engram_dspark_vision.md §A.4-§A.6): per token position and Engram
// layer, the (max_ngram_size - 1) * n_heads table row ids that the Engram block looks up.
//
// The hash multipliers of the reference come from NumPy's `default_rng(10007 * layer_id)`, so this
// file also carries a from-scratch re-implementation of the few NumPy pieces involved (SeedSequence,
// PCG64, Generator.integers) that reproduces NumPy's draws bit for bit (§A.4).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/engram_layout.h"

namespace ds41 {

struct ModelConfig;

// NumPy's `np.random.default_rng(seed)` = Generator(PCG64(SeedSequence(seed))), restricted to the
// calls Engram needs. Same seed, same calls, same order => the same numbers as NumPy.
class NumpyDefaultRng {
 public:
  // A non-negative integer seed (NumPy splits it into little-endian uint32 words).
  explicit NumpyDefaultRng(uint64_t seed);
  // The seed given directly as its little-endian uint32 words, for seeds of any size (2^128 and
  // above exercise SeedSequence's extra mixing loop). Must not be empty (seed 0 is {0}).
  explicit NumpyDefaultRng(std::span<const uint32_t> entropy_words);

  // Generator.integers(low, high, dtype=int64): uniform in [low, high); throws ds41::Error if
  // high <= low (NumPy raises ValueError there).
  int64_t integers(int64_t low, int64_t high);

  // PCG64 raw outputs (`bit_generator.random_raw()` and NumPy's internal next_uint32, which hands
  // out the two halves of one 64-bit output, low half first).
  uint64_t next_uint64();
  uint32_t next_uint32();

  // SeedSequence internals, exposed so a test can localise a mismatch.
  static std::vector<uint32_t> seed_sequence_pool(std::span<const uint32_t> entropy_words);
  static std::vector<uint64_t> seed_sequence_state_u64(std::span<const uint32_t> entropy_words, int n_words);

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 increment_ = 0;
  bool has_buffered_u32_ = false;  // NumPy's bitgen has_uint32 / uinteger pair
  uint32_t buffered_u32_ = 0;
};

// Little-endian uint32 words of a non-negative seed, as NumPy's SeedSequence sees it.
std::vector<uint32_t> numpy_seed_words(uint64_t seed);

// §A.4: the multipliers are 2*v + 1 with v < this bound, which keeps every product of a compressed
// id (< compressed_vocab) with a multiplier below 2^63: floor(floor((2^63 - 1) / V) / 2).
int64_t engram_multiplier_bound(int64_t compressed_vocab);

// §A.4: the `max_ngram_size` odd multipliers of one Engram layer (index = lookback distance).
std::vector<int64_t> engram_layer_multipliers(int layer_id, int max_ngram_size, int64_t compressed_vocab);

// Everything the per-position hash needs, built once at load.
struct EngramHashParams {
  int n_layers = 0;        // Engram layers (entries of engram_layer_ids)
  int max_ngram_size = 0;  // n-grams of order 2..max_ngram_size
  int n_heads = 0;         // hash heads per order
  int columns = 0;         // (max_ngram_size - 1) * n_heads row ids per token and layer
  int64_t compressed_vocab = 0;
  int64_t pad_id = 0;                // compressed id of the raw pad token (§A.2), stands in for blocked tokens
  std::vector<int64_t> multipliers;  // [layer][max_ngram_size]
  std::vector<uint64_t> primes;      // [layer][columns], flattened copy of layout.primes
  std::vector<int64_t> offsets;      // [layer][columns], flattened copy of layout.offsets
  EngramLayout layout;

  const int64_t* layer_multipliers(int layer) const { return multipliers.data() + size_t(layer) * max_ngram_size; }
};

// `pad_compressed_id` = map[engram_pad_id] of the compressed token map (§A.2); throws ds41::Error
// if the config has no Engram layers or the pad is not a valid compressed id.
EngramHashParams make_engram_hash_params(const ModelConfig& c, int64_t pad_compressed_id);

// History marker for image-span positions (§A.5 step 1): blocks every n-gram that reaches it.
inline constexpr int64_t kEngramDead = -1;

// §A.5 step 3: the tokens t_0..t_{max-1} an n-gram ending at absolute position `pos` sees (t_s at
// lookback distance s; pad once blocked by the sequence start or a DEAD position). history[i] holds
// position history_base + i; a look-back before history_base is an error (a sequence restored
// from a compact session holds only its last positions).
void engram_lookback_tokens(const EngramHashParams& p, const int64_t* history, int64_t pos, int64_t* t,
                            int64_t history_base = 0);
// §A.5 step 4: R_1..R_{max-1} (R_{n-1} is the n-gram hash) of one layer for lookback tokens t.
void engram_rolling_hashes(const EngramHashParams& p, int layer, const int64_t* t, int64_t* r);

// §A.5: row ids for positions start_pos .. start_pos + n_positions - 1. `history` holds the
// compressed ids from absolute position history_base on (kEngramDead for image positions) and must
// already contain every position up to start_pos + n_positions - 1 (a chunk writes all its tokens
// before hashing, §A.12). out: [n_positions][n_layers][columns], row ids local to each layer's table.
// Throws ds41::Error on a history entry outside [0, compressed_vocab) that is not kEngramDead.
void engram_hash_positions(const EngramHashParams& p, const int64_t* history, int64_t start_pos, int n_positions,
                           int64_t* out, int64_t history_base = 0);

}  // namespace ds41
