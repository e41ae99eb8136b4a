#include "model/engram_hash.h"

#include <limits>
#include <string>

#include "base/error.h"
#include "model/config.h"

namespace ds41 {

namespace {

// ---- NumPy SeedSequence (§A.4 step 1) --------------------------------------------------------
// All arithmetic is uint32 (mod 2^32), which unsigned types give for free.
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;  // NumPy's DEFAULT_POOL_SIZE

// Enough for any sensible config; lets the per-position hash scratch live on the stack.
constexpr int kMaxNgram = 32;

// `hash_const` runs across every hashmix call of one mixing phase, so it is passed by reference.
uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

std::vector<uint32_t> mix_entropy(std::span<const uint32_t> entropy) {
  if (entropy.empty()) throw Error("SeedSequence entropy needs at least one word (seed 0 is {0})");
  std::vector<uint32_t> pool(kPoolSize);
  uint32_t hash_const = kInitA;
  // Missing entropy words count as 0, so a one-word seed still fills the whole pool.
  for (int i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < int(entropy.size()) ? entropy[i] : 0u, hash_const);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  // Words beyond the pool (seeds >= 2^128) are folded into every pool entry.
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
  return pool;
}

std::vector<uint32_t> generate_state_u32(const std::vector<uint32_t>& pool, int n_words) {
  std::vector<uint32_t> out(static_cast<size_t>(n_words));
  uint32_t hash_const = kInitB;
  for (int i = 0; i < n_words; ++i) {
    uint32_t w = pool[size_t(i) % pool.size()] ^ hash_const;
    hash_const *= kMultB;
    w *= hash_const;
    w ^= w >> kXShift;
    out[size_t(i)] = w;
  }
  return out;
}

// ---- PCG64 (XSL-RR 128/64, §A.4 step 2) -----------------------------------------------------
using u128 = unsigned __int128;
constexpr u128 kPcgMultiplier = (u128(2549297995355413924ull) << 64) | u128(4865540595714422341ull);

inline uint64_t rotr64(uint64_t v, unsigned rot) { return (v >> rot) | (v << ((64u - rot) & 63u)); }

}  // namespace

std::vector<uint32_t> numpy_seed_words(uint64_t seed) {
  // NumPy emits at least one word (seed 0 -> {0}) and no leading-zero high words.
  std::vector<uint32_t> w{uint32_t(seed)};
  for (seed >>= 32; seed != 0; seed >>= 32) w.push_back(uint32_t(seed));
  return w;
}

std::vector<uint32_t> NumpyDefaultRng::seed_sequence_pool(std::span<const uint32_t> entropy_words) {
  return mix_entropy(entropy_words);
}

std::vector<uint64_t> NumpyDefaultRng::seed_sequence_state_u64(std::span<const uint32_t> entropy_words, int n_words) {
  // generate_state(n, uint64) makes 2n uint32 words and reads them as little-endian uint64 pairs.
  std::vector<uint32_t> w32 = generate_state_u32(mix_entropy(entropy_words), 2 * n_words);
  std::vector<uint64_t> out(static_cast<size_t>(n_words));
  for (int k = 0; k < n_words; ++k) out[size_t(k)] = uint64_t(w32[2 * k]) | (uint64_t(w32[2 * k + 1]) << 32);
  return out;
}

NumpyDefaultRng::NumpyDefaultRng(uint64_t seed) : NumpyDefaultRng(std::span<const uint32_t>(numpy_seed_words(seed))) {}

NumpyDefaultRng::NumpyDefaultRng(std::span<const uint32_t> entropy_words) {
  std::vector<uint64_t> s = seed_sequence_state_u64(entropy_words, 4);
  // Words 0,1 are the initial state (high, low), words 2,3 the stream selector (high, low); PCG's
  // srandom: the increment must be odd, and the state is stepped around the addition of the seed.
  u128 initial_state = (u128(s[0]) << 64) | s[1];
  u128 sequence = (u128(s[2]) << 64) | s[3];
  increment_ = (sequence << 1) | 1u;
  state_ = 0;
  state_ = state_ * kPcgMultiplier + increment_;
  state_ += initial_state;
  state_ = state_ * kPcgMultiplier + increment_;
}

uint64_t NumpyDefaultRng::next_uint64() {
  // Step first, then output from the new state (XSL-RR: xor-fold the halves, rotate by the top 6 bits).
  state_ = state_ * kPcgMultiplier + increment_;
  return rotr64(uint64_t(state_ >> 64) ^ uint64_t(state_), unsigned(state_ >> 122));
}

uint32_t NumpyDefaultRng::next_uint32() {
  // NumPy's bit generator splits one 64-bit output into two 32-bit ones (low half now, high half
  // on the next 32-bit request); the buffer survives across integers() calls and is untouched by
  // 64-bit draws in between.
  if (has_buffered_u32_) {
    has_buffered_u32_ = false;
    return buffered_u32_;
  }
  uint64_t v = next_uint64();
  has_buffered_u32_ = true;
  buffered_u32_ = uint32_t(v >> 32);
  return uint32_t(v);
}

int64_t NumpyDefaultRng::integers(int64_t low, int64_t high) {
  if (high <= low)
    throw Error("integers(low=" + std::to_string(low) + ", high=" + std::to_string(high) + "): high must exceed low");
  // NumPy works with the inclusive range rng = high - 1 - low and an offset; both wrap mod 2^64.
  const uint64_t rng = uint64_t(high) - uint64_t(low) - 1u;
  const uint64_t off = uint64_t(low);
  uint64_t draw;
  if (rng == 0) {
    draw = 0;  // a single possible value: NumPy consumes no randomness
  } else if (rng <= 0xFFFFFFFFull) {
    // Ranges that fit 32 bits use 32-bit draws (halves of the 64-bit outputs, see next_uint32).
    if (rng == 0xFFFFFFFFull) {
      draw = next_uint32();  // the full 32-bit range needs no rejection
    } else {
      // Lemire's multiply-shift with rejection of the biased low products (32-bit variant).
      const uint32_t n = uint32_t(rng) + 1u;
      uint64_t m = uint64_t(next_uint32()) * n;
      uint32_t leftover = uint32_t(m);
      if (leftover < n) {  // n bounds the threshold, so the modulo is only paid in this rare case
        const uint32_t threshold = (0xFFFFFFFFu - uint32_t(rng)) % n;
        while (leftover < threshold) {
          m = uint64_t(next_uint32()) * n;
          leftover = uint32_t(m);
        }
      }
      draw = m >> 32;
    }
  } else {
    // 64-bit Lemire (§A.4 step 3). rng == 2^64 - 1 cannot occur for an int64 range.
    const uint64_t n = rng + 1u;
    u128 m = u128(next_uint64()) * n;
    uint64_t leftover = uint64_t(m);
    if (leftover < n) {
      const uint64_t threshold = (~uint64_t(0) - rng) % n;
      while (leftover < threshold) {
        m = u128(next_uint64()) * n;
        leftover = uint64_t(m);
      }
    }
    draw = uint64_t(m >> 64);
  }
  return int64_t(off + draw);  // modular conversion (C++20), as NumPy's uint64 -> int64 view
}

// ---- Engram multipliers (§A.4) ---------------------------------------------------------------

int64_t engram_multiplier_bound(int64_t compressed_vocab) {
  if (compressed_vocab <= 0)
    throw Error("engram_compressed_vocab_size must be positive, got " + std::to_string(compressed_vocab));
  int64_t bound = std::numeric_limits<int64_t>::max() / compressed_vocab / 2;
  if (bound < 1)
    throw Error("engram_compressed_vocab_size " + std::to_string(compressed_vocab) +
                " is too large for 64-bit n-gram hashes");
  return bound;
}

std::vector<int64_t> engram_layer_multipliers(int layer_id, int max_ngram_size, int64_t compressed_vocab) {
  if (layer_id < 0) throw Error("Engram layer id must be non-negative, got " + std::to_string(layer_id));
  const int64_t bound = engram_multiplier_bound(compressed_vocab);
  NumpyDefaultRng rng(uint64_t(10007) * uint64_t(layer_id));  // the reference seeds per layer id
  std::vector<int64_t> m(static_cast<size_t>(max_ngram_size));
  // Odd multipliers below floor((2^63-1)/V) keep id * multiplier < 2^63 for every id < V.
  for (auto& x : m) x = 2 * rng.integers(0, bound) + 1;
  return m;
}

EngramHashParams make_engram_hash_params(const ModelConfig& c, int64_t pad_compressed_id) {
  if (c.engram_layer_ids.empty()) throw Error("the model has no Engram layers (engram_layer_ids is empty)");
  if (c.engram_max_ngram_size < 2 || c.engram_max_ngram_size > kMaxNgram || c.engram_n_heads < 1)
    throw Error("Engram hashing needs 2 <= engram_max_ngram_size <= " + std::to_string(kMaxNgram) +
                " and engram_n_heads >= 1");
  if (pad_compressed_id < 0 || pad_compressed_id >= c.engram_compressed_vocab_size)
    throw Error("Engram pad id " + std::to_string(pad_compressed_id) +
                " is not a compressed id below engram_compressed_vocab_size " +
                std::to_string(c.engram_compressed_vocab_size) + "; check the compressed token map");
  EngramHashParams p;
  p.n_layers = int(c.engram_layer_ids.size());
  p.max_ngram_size = c.engram_max_ngram_size;
  p.n_heads = c.engram_n_heads;
  p.columns = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  p.compressed_vocab = c.engram_compressed_vocab_size;
  p.pad_id = pad_compressed_id;
  p.layout = compute_engram_layout(c);
  for (int l = 0; l < p.n_layers; ++l) {
    std::vector<int64_t> m =
        engram_layer_multipliers(c.engram_layer_ids[size_t(l)], p.max_ngram_size, p.compressed_vocab);
    p.multipliers.insert(p.multipliers.end(), m.begin(), m.end());
    for (int col = 0; col < p.columns; ++col) {
      p.primes.push_back(uint64_t(p.layout.primes[size_t(l)][size_t(col)]));
      p.offsets.push_back(p.layout.offsets[size_t(l)][size_t(col)]);
    }
  }
  return p;
}

// ---- Per-position hashing (§A.5) -------------------------------------------------------------

namespace {

[[noreturn]] void bad_history_entry(int64_t pos, int64_t value, int64_t vocab) {
  throw Error("Engram history position " + std::to_string(pos) + " holds " + std::to_string(value) +
              ", which is neither a compressed id in [0, " + std::to_string(vocab) + ") nor the image marker -1");
}

}  // namespace

void engram_lookback_tokens(const EngramHashParams& p, const int64_t* history, int64_t pos, int64_t* t,
                            int64_t history_base) {
  // An n-gram never crosses the sequence start or an image span: once a lookback is blocked, every
  // longer one is too, and blocked slots read as pad (§A.5 step 3). A DEAD current token blocks
  // already at s = 0.
  bool blocked = false;
  for (int s = 0; s < p.max_ngram_size; ++s) {
    if (!blocked) {
      if (pos < s) {
        blocked = true;
      } else {
        if (pos - s < history_base)
          throw Error("Engram history starts at position " + std::to_string(history_base) + ": position " +
                      std::to_string(pos - s) + " (the n-gram context of position " + std::to_string(pos) +
                      ") is not held");
        const int64_t src = history[pos - s - history_base];
        if (src == kEngramDead) {
          blocked = true;
        } else {
          if (uint64_t(src) >= uint64_t(p.compressed_vocab)) bad_history_entry(pos - s, src, p.compressed_vocab);
          t[s] = src;
        }
      }
    }
    if (blocked) t[s] = p.pad_id;
  }
}

void engram_rolling_hashes(const EngramHashParams& p, int layer, const int64_t* t, int64_t* r) {
  // P_s = t_s * m_s < 2^63 (§A.4 bound), so no product overflows; the XOR chain of non-negative
  // values stays non-negative, which makes the later modulo the plain one (§A.5 step 4).
  const int64_t* m = p.layer_multipliers(layer);
  int64_t rolling = t[0] * m[0];
  for (int s = 1; s < p.max_ngram_size; ++s) {
    rolling ^= t[s] * m[s];
    r[s - 1] = rolling;
  }
}

void engram_hash_positions(const EngramHashParams& p, const int64_t* history, int64_t start_pos, int n_positions,
                           int64_t* out, int64_t history_base) {
  if (start_pos < 0 || n_positions < 0)
    throw Error("engram_hash_positions: start_pos and n_positions must be non-negative");
  if (p.max_ngram_size > kMaxNgram)
    throw Error("engram_max_ngram_size " + std::to_string(p.max_ngram_size) + " exceeds the supported " +
                std::to_string(kMaxNgram));
  int64_t t[kMaxNgram];
  int64_t r[kMaxNgram];
  for (int i = 0; i < n_positions; ++i) {
    engram_lookback_tokens(p, history, start_pos + i, t, history_base);  // shared by all layers
    for (int l = 0; l < p.n_layers; ++l) {
      engram_rolling_hashes(p, l, t, r);
      const size_t base = size_t(l) * size_t(p.columns);
      const uint64_t* primes = p.primes.data() + base;
      const int64_t* offsets = p.offsets.data() + base;
      int64_t* dst = out + (size_t(i) * size_t(p.n_layers) + size_t(l)) * size_t(p.columns);
      // Column order is order-major, head-minor: col = (n - 2) * n_heads + h (§A.3); each column has
      // its own prime bucket count and its rows start at that column's offset in the layer table.
      for (int n = 2; n <= p.max_ngram_size; ++n) {
        const uint64_t hash = uint64_t(r[n - 2]);
        for (int h = 0; h < p.n_heads; ++h) {
          const int col = (n - 2) * p.n_heads + h;
          dst[col] = int64_t(hash % primes[col]) + offsets[col];
        }
      }
    }
  }
}

}  // namespace ds41
