// Engram n-gram hashing (spec engram_dspark_vision.md §A.4-§A.6) and the NumPy default_rng port
// that produces its multipliers.
#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/config.h"
#include "model/engram_hash.h"
#include "model/presets.h"

namespace ds41 {
namespace {

using json = nlohmann::json;

constexpr int64_t kReleasedPad = 2;  // §A.6 assumes the compressed id of raw token 2 is 2

// §A.6: the design doc's example sequence of compressed ids.
const std::vector<int64_t> kDocExample = {5231, 887, 40211, 96, 7712, 330};

std::vector<int64_t> hash_all(const EngramHashParams& p, const std::vector<int64_t>& history) {
  std::vector<int64_t> out(history.size() * size_t(p.n_layers) * size_t(p.columns));
  engram_hash_positions(p, history.data(), 0, int(history.size()), out.data());
  return out;
}

// Row ids of one position and layer out of an [n][layers][columns] result.
std::vector<int64_t> ids_at(const EngramHashParams& p, const std::vector<int64_t>& all, int64_t pos, int layer) {
  auto first = all.begin() + (pos * p.n_layers + layer) * p.columns;
  return {first, first + p.columns};
}

TEST(EngramHash, ReleasedMultipliersMatchTheSpecTable) {
  EXPECT_EQ(engram_multiplier_bound(99092), 46539438283891);
  EngramHashParams p = make_engram_hash_params(released_config(), kReleasedPad);
  ASSERT_EQ(p.n_layers, 2);
  ASSERT_EQ(p.max_ngram_size, 4);
  ASSERT_EQ(p.columns, 24);
  // §A.4 table: layer 1 (seed 10007) and layer 14 (seed 140098).
  const std::array<int64_t, 4> layer1 = {76632096046245, 4839876093313, 35959672319349, 73987337458391};
  const std::array<int64_t, 4> layer14 = {67716810739261, 51510806800915, 30921347202721, 82619226485591};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(p.layer_multipliers(0)[k], layer1[size_t(k)]) << "k=" << k;
    EXPECT_EQ(p.layer_multipliers(1)[k], layer14[size_t(k)]) << "k=" << k;
  }
  // Fewer orders draw a prefix of the same stream.
  EXPECT_EQ(engram_layer_multipliers(14, 2, 99092), (std::vector<int64_t>{layer14[0], layer14[1]}));
}

TEST(EngramHash, DesignDocExampleLookbackAndRollingHashes) {
  EngramHashParams p = make_engram_hash_params(released_config(), kReleasedPad);
  int64_t t[4], r[3];
  // §A.6 corrected values: R1 / R2 / R3 are the 2-, 3- and 4-gram hashes (the design doc's list is
  // shifted by one).
  engram_lookback_tokens(p, kDocExample.data(), 4, t);
  EXPECT_EQ(std::vector<int64_t>(t, t + 4), (std::vector<int64_t>{7712, 96, 40211, 887}));
  engram_rolling_hashes(p, 0, t, r);
  EXPECT_EQ(std::vector<int64_t>(r, r + 3),
            (std::vector<int64_t>{590602499734174400, 2027499245574773359, 2074533117092600990}));
  engram_rolling_hashes(p, 1, t, r);
  EXPECT_EQ(std::vector<int64_t>(r, r + 3),
            (std::vector<int64_t>{517568965154384512, 1616682054493866099, 1687655208543955458}));

  engram_lookback_tokens(p, kDocExample.data(), 0, t);  // before the start: pad
  EXPECT_EQ(std::vector<int64_t>(t, t + 4), (std::vector<int64_t>{5231, 2, 2, 2}));
  engram_rolling_hashes(p, 0, t, r);
  EXPECT_EQ(std::vector<int64_t>(r, r + 3),
            (std::vector<int64_t>{400871619381077129, 400943461391662691, 401076970305936333}));
  engram_rolling_hashes(p, 1, t, r);
  EXPECT_EQ(std::vector<int64_t>(r, r + 3),
            (std::vector<int64_t>{354142307732235349, 354116083588126999, 354241735226769337}));
}

TEST(EngramHash, DesignDocExampleRowIds) {
  EngramHashParams p = make_engram_hash_params(released_config(), kReleasedPad);
  std::vector<int64_t> all = hash_all(p, kDocExample);
  // §A.6 table, 24 row ids (cols 0..23) per (layer, position).
  EXPECT_EQ(
      ids_at(p, all, 4, 0),
      (std::vector<int64_t>{8264676,   16730195,  32156052,  60226870,  72547671,  87911952,  103704897, 123344130,
                            134840050, 150641106, 169071798, 185892426, 205763263, 211119839, 239431612, 247221767,
                            269445064, 273058720, 288485192, 313073981, 329790643, 339351431, 354783518, 371650938}));
  EXPECT_EQ(
      ids_at(p, all, 0, 0),
      (std::vector<int64_t>{1020694,   23229291,  42778052,  55618403,  68382145,  83704345,  107440742, 112371144,
                            134971012, 156740780, 163494131, 181429384, 194158884, 217200495, 228608208, 248849383,
                            267674868, 272003523, 294827388, 314408723, 322192148, 341961489, 363117376, 380957861}));
  EXPECT_EQ(
      ids_at(p, all, 4, 1),
      (std::vector<int64_t>{5604914,   16490843,  39687974,  55476200,  79467864,  91599439,  111453486, 115345211,
                            142154267, 153771003, 169106827, 177703602, 201383262, 221750886, 232788498, 254994301,
                            263011284, 286376889, 296836056, 306681227, 325506280, 340981994, 367232981, 371271894}));
  EXPECT_EQ(
      ids_at(p, all, 0, 1),
      (std::vector<int64_t>{3433227,   21826515,  47463766,  59443103,  73499425,  89026187,  111696466, 116375847,
                            133271081, 144456954, 167545859, 190216405, 205909100, 213167225, 227255830, 253839647,
                            262075331, 275474987, 297184019, 318083086, 326228440, 343900823, 356543967, 371923090}));
  // Every id lies inside its column's bucket range of that layer's table.
  for (int64_t pos = 0; pos < int64_t(kDocExample.size()); ++pos)
    for (int l = 0; l < 2; ++l)
      for (int col = 0; col < 24; ++col) {
        int64_t id = ids_at(p, all, pos, l)[size_t(col)];
        EXPECT_GE(id, p.layout.offsets[size_t(l)][size_t(col)]);
        EXPECT_LT(id, p.layout.offsets[size_t(l)][size_t(col)] + p.layout.primes[size_t(l)][size_t(col)]);
      }
}

TEST(EngramHash, PositionsBeforeTheSequenceStartReadAsPad) {
  EngramHashParams p = make_engram_hash_params(released_config(), kReleasedPad);
  // Position 1 of [x, y] sees y, x, pad, pad - the same tokens as position 3 of [pad, pad, x, y].
  std::vector<int64_t> a = hash_all(p, {4242, 77});
  std::vector<int64_t> b = hash_all(p, {kReleasedPad, kReleasedPad, 4242, 77});
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(ids_at(p, a, 1, l), ids_at(p, b, 3, l));
    EXPECT_NE(ids_at(p, a, 0, l), ids_at(p, a, 1, l));
  }
}

TEST(EngramHash, ImagePositionsBlockTheNgram) {
  EngramHashParams p = make_engram_hash_params(released_config(), kReleasedPad);
  const int64_t D = kEngramDead;
  // Text after an image span hashes exactly like the start of a fresh sequence: tokens before the
  // span never leak into the n-gram.
  std::vector<int64_t> with_image = hash_all(p, {11, 12, 13, D, D, 21, 22, 23, 24});
  std::vector<int64_t> other_prefix = hash_all(p, {98000, 5, D, D, D, 21, 22, 23, 24});
  std::vector<int64_t> fresh = hash_all(p, {21, 22, 23, 24});
  std::vector<int64_t> pad_only = hash_all(p, {kReleasedPad});
  for (int l = 0; l < 2; ++l) {
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(ids_at(p, with_image, 5 + k, l), ids_at(p, fresh, k, l)) << "k=" << k;
      EXPECT_EQ(ids_at(p, other_prefix, 5 + k, l), ids_at(p, fresh, k, l)) << "k=" << k;
    }
    // A DEAD current token blocks at s = 0: all lookbacks are pad (its gate is zero anyway).
    EXPECT_EQ(ids_at(p, with_image, 3, l), ids_at(p, pad_only, 0, l));
    EXPECT_EQ(ids_at(p, with_image, 4, l), ids_at(p, pad_only, 0, l));
  }
  int64_t t[4];
  std::vector<int64_t> h = {11, 12, D, 13, 14, 15, 16};
  engram_lookback_tokens(p, h.data(), 4, t);
  EXPECT_EQ(std::vector<int64_t>(t, t + 4), (std::vector<int64_t>{14, 13, 2, 2}));
  engram_lookback_tokens(p, h.data(), 6, t);  // the span is exactly out of reach
  EXPECT_EQ(std::vector<int64_t>(t, t + 4), (std::vector<int64_t>{16, 15, 14, 13}));
}

std::vector<int64_t> random_history(int n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int64_t> h(static_cast<size_t>(n));
  for (int i = 0; i < n;) {
    if (gen() % 10 == 0) {  // an image span of 1..6 positions
      for (int k = int(gen() % 6) + 1; k > 0 && i < n; --k) h[size_t(i++)] = kEngramDead;
    } else {
      h[size_t(i++)] = int64_t(gen() % uint64_t(vocab));
    }
  }
  return h;
}

TEST(EngramHash, ChunkedHashingEqualsOneShot) {
  EngramHashParams p = make_engram_hash_params(released_config(), kReleasedPad);
  const int n = 300;
  std::vector<int64_t> tokens = random_history(n, 99092, 7);
  std::vector<int64_t> one_shot = hash_all(p, tokens);

  // Like a serving loop: each chunk writes its tokens into the history first, then hashes them.
  // Positions not written yet hold a value that would throw if it were ever read.
  std::vector<int64_t> history(size_t(n), int64_t(1) << 40);
  std::vector<int64_t> chunked(one_shot.size(), -7);
  const int chunk_sizes[] = {1, 1, 5, 17, 1, 64, 3, 128};
  int pos = 0;
  for (int c = 0; pos < n; ++c) {
    int len = std::min(chunk_sizes[c % 8], n - pos);
    for (int i = pos; i < pos + len; ++i) history[size_t(i)] = tokens[size_t(i)];
    engram_hash_positions(p, history.data(), pos, len, chunked.data() + size_t(pos) * 2 * 24);
    pos += len;
  }
  EXPECT_EQ(chunked, one_shot);
}

// §A.5 restated independently of the implementation: 128-bit products, XOR over the first n
// lookbacks, blocking from the first lookback that is before the start or DEAD.
int64_t reference_row_id(const EngramHashParams& p, const std::vector<int64_t>& history, int64_t pos, int layer, int n,
                         int h) {
  int first_blocked = p.max_ngram_size;
  for (int s = 0; s < p.max_ngram_size; ++s)
    if (pos - s < 0 || history[size_t(pos - s)] == kEngramDead) {
      first_blocked = s;
      break;
    }
  unsigned __int128 hash = 0;
  for (int s = 0; s < n; ++s) {
    int64_t tok = s < first_blocked ? history[size_t(pos - s)] : p.pad_id;
    unsigned __int128 product = (unsigned __int128)tok * (unsigned __int128)p.layer_multipliers(layer)[s];
    EXPECT_LT(product, (unsigned __int128)1 << 63);  // §A.4: products never overflow int64
    hash ^= product;
  }
  const int col = (n - 2) * p.n_heads + h;
  const int64_t prime = p.layout.primes[size_t(layer)][size_t(col)];
  return int64_t(hash % (unsigned __int128)prime) + p.layout.offsets[size_t(layer)][size_t(col)];
}

TEST(EngramHash, GeneralConfigMatchesAStraightforwardRestatement) {
  // Not the released shape: 3 layers, n-grams up to 5, 3 heads, another pad and vocabulary.
  ModelConfig c = released_config();
  c.engram_layer_ids = {2, 5, 9};
  c.engram_max_ngram_size = 5;
  c.engram_n_heads = 3;
  c.engram_vocab_size = 1000;
  c.engram_compressed_vocab_size = 5000;
  EngramHashParams p = make_engram_hash_params(c, 7);
  ASSERT_EQ(p.columns, 12);
  for (int l = 0; l < 3; ++l)
    for (int k = 0; k < 5; ++k) EXPECT_EQ(p.layer_multipliers(l)[k] % 2, 1);
  std::vector<int64_t> history = random_history(200, 5000, 11);
  std::vector<int64_t> all = hash_all(p, history);
  for (int64_t pos = 0; pos < 200; ++pos)
    for (int l = 0; l < 3; ++l)
      for (int n = 2; n <= 5; ++n)
        for (int h = 0; h < 3; ++h)
          ASSERT_EQ(ids_at(p, all, pos, l)[size_t((n - 2) * 3 + h)], reference_row_id(p, history, pos, l, n, h))
              << "pos=" << pos << " layer=" << l << " n=" << n << " h=" << h;
}

TEST(EngramHash, RejectsBadIdsWithAClearError) {
  EXPECT_THROW(make_engram_hash_params(released_config(), 99092), Error);
  EXPECT_THROW(make_engram_hash_params(released_config(), -1), Error);
  ModelConfig no_engram = released_config();
  no_engram.engram_layer_ids.clear();
  EXPECT_THROW(make_engram_hash_params(no_engram, 2), Error);
  EXPECT_THROW(engram_multiplier_bound(0), Error);

  EngramHashParams p = make_engram_hash_params(released_config(), kReleasedPad);
  std::vector<int64_t> out(48);
  for (int64_t bad : {int64_t(99092), int64_t(-2)}) {
    std::vector<int64_t> h = {1, bad, 3};
    EXPECT_THROW(engram_hash_positions(p, h.data(), 2, 1, out.data()), Error) << bad;
    EXPECT_NO_THROW(engram_hash_positions(p, h.data() + 2, 0, 1, out.data()));  // never reads it
  }
}

// ---- NumPy default_rng port against draws recorded from real NumPy -----------------------------

json load_numpy_draws() {
  const std::string path = std::string(DS41_SOURCE_DIR) + "/tests/data/numpy_rng_draws.json";
  std::ifstream f(path);
  if (!f) throw Error("cannot open " + path);
  return json::parse(f);
}

TEST(EngramHash, NumpySeedWordsAreLittleEndianUint32) {
  EXPECT_EQ(numpy_seed_words(0), (std::vector<uint32_t>{0}));
  EXPECT_EQ(numpy_seed_words(10007), (std::vector<uint32_t>{10007}));
  EXPECT_EQ(numpy_seed_words((uint64_t(1) << 40) + 7), (std::vector<uint32_t>{7, 256}));
  EXPECT_EQ(numpy_seed_words(uint64_t(1) << 32), (std::vector<uint32_t>{0, 1}));
}

TEST(EngramHash, NumpyPortMatchesRecordedNumpyDraws) {
  json data = load_numpy_draws();
  ASSERT_GE(data.at("cases").size(), 4u);
  for (const json& cs : data.at("cases")) {
    const std::string seed = cs.at("seed").get<std::string>();
    SCOPED_TRACE("seed " + seed);
    const std::vector<uint32_t> words = cs.at("entropy_words").get<std::vector<uint32_t>>();
    // Layer by layer, so a failure says which stage of the port is wrong.
    EXPECT_EQ(NumpyDefaultRng::seed_sequence_pool(words), cs.at("pool").get<std::vector<uint32_t>>());
    EXPECT_EQ(NumpyDefaultRng::seed_sequence_state_u64(words, 4), cs.at("state_u64").get<std::vector<uint64_t>>());
    NumpyDefaultRng raw(words);
    for (uint64_t expected : cs.at("raw_u64").get<std::vector<uint64_t>>()) EXPECT_EQ(raw.next_uint64(), expected);

    // The recorded calls run in order on one generator (the 32-bit half-word buffer carries over).
    NumpyDefaultRng rng(words);
    size_t n_checked = 0;
    for (const json& call : cs.at("calls")) {
      const int64_t high = call.at("high").get<int64_t>();
      const std::vector<int64_t> expected = call.at("values").get<std::vector<int64_t>>();
      for (size_t i = 0; i < expected.size(); ++i, ++n_checked)
        ASSERT_EQ(rng.integers(0, high), expected[i]) << "high=" << high << " draw " << i;
    }
    EXPECT_GT(n_checked, 100u);

    // Seeds that fit 64 bits give the same stream through the integer constructor.
    if (words.size() <= 2) {
      uint64_t s = std::stoull(seed);
      EXPECT_EQ(numpy_seed_words(s), words);
      NumpyDefaultRng a(s), b(words);
      for (int i = 0; i < 8; ++i) EXPECT_EQ(a.next_uint64(), b.next_uint64());
    }
  }
}

TEST(EngramHash, NumpyIntegersRejectsAnEmptyRange) {
  NumpyDefaultRng rng(uint64_t(1));
  EXPECT_THROW(rng.integers(5, 5), Error);
  EXPECT_EQ(rng.integers(5, 6), 5);
}

}  // namespace
}  // namespace ds41
