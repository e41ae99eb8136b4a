#include "model/engram_layout.h"

#include <set>

#include "model/config.h"

namespace ds41 {

namespace {
uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) { return uint64_t((unsigned __int128)a * b % m); }
uint64_t pow_mod(uint64_t a, uint64_t e, uint64_t m) {
  uint64_t r = 1;
  a %= m;
  for (; e; e >>= 1, a = mul_mod(a, a, m))
    if (e & 1) r = mul_mod(r, a, m);
  return r;
}
}  // namespace

// Deterministic Miller-Rabin: these witnesses are exact for every 64-bit n.
bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) { d >>= 1; ++s; }
  for (uint64_t a : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    uint64_t x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s; ++r) {
      x = mul_mod(x, x, n);
      if (x == n - 1) { composite = false; break; }
    }
    if (composite) return false;
  }
  return true;
}

EngramLayout compute_engram_layout(const ModelConfig& c) {
  EngramLayout out;
  out.columns_per_layer = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  std::set<int64_t> used;
  for (size_t li = 0; li < c.engram_layer_ids.size(); ++li) {
    std::vector<int64_t> primes, offsets;
    int64_t running = 0;
    for (int n = 2; n <= c.engram_max_ngram_size; ++n) {
      // The search restarts below the start point for every (layer, order) but skips primes
      // already handed out, so all buckets get distinct primes.
      int64_t current = c.engram_vocab_size - 1;
      for (int h = 0; h < c.engram_n_heads; ++h) {
        do { ++current; } while (!is_prime_u64(uint64_t(current)) || used.count(current));
        used.insert(current);
        primes.push_back(current);
        offsets.push_back(running);
        running += current;
      }
    }
    out.primes.push_back(std::move(primes));
    out.offsets.push_back(std::move(offsets));
    out.rows.push_back(running);
  }
  return out;
}

}  // namespace ds41
