#include "server/stop_matcher.h"

#include <gtest/gtest.h>

namespace ds41 {
namespace {

// Feeds `text` split at every possible pair of cut points and checks the released text is
// always the same as one-shot.
std::pair<std::string, bool> run_split(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  std::string out;
  for (const auto& p : pieces) out += m.feed(p);
  out += m.flush();
  return {out, m.stopped()};
}

TEST(StopMatcher, CutsAtTheFirstMatchAcrossAnySplit) {
  const std::string text = "Hello wor<END>ld and more";
  const std::vector<std::string> stops = {"<END>", "more"};
  for (size_t a = 0; a <= text.size(); ++a)
    for (size_t b = a; b <= text.size(); ++b) {
      auto [out, stopped] = run_split(stops, {text.substr(0, a), text.substr(a, b - a), text.substr(b)});
      EXPECT_EQ(out, "Hello wor") << a << "," << b;
      EXPECT_TRUE(stopped);
    }
}

TEST(StopMatcher, HoldsBackOnlyPossiblePrefixesAndFlushesThem) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.feed("abcST"), "abc");
  EXPECT_EQ(m.feed("x"), "STx");  // not a stop after all
  EXPECT_EQ(m.feed("ST"), "");
  EXPECT_EQ(m.flush(), "ST");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestMatchWinsAndLaterInputIsIgnored) {
  StopMatcher m({"bc", "ab"});
  EXPECT_EQ(m.feed("xabc"), "x");
  EXPECT_EQ(m.matched(), "ab");
  EXPECT_EQ(m.feed("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, NoStopsPassEverything) {
  auto [out, stopped] = run_split({}, {"a", "b", ""});
  EXPECT_EQ(out, "ab");
  EXPECT_FALSE(stopped);
}

}  // namespace
}  // namespace ds41
