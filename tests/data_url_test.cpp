// data: URLs and base64: the RFC 4648 §10 test vectors, every malformation a client could send,
// and round trips of random bytes against an independent encoder written here.
#include "server/data_url.h"

#include <gtest/gtest.h>

#include <random>

#include "base/error.h"

namespace ds41 {
namespace {

std::string as_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// Encoder straight from the RFC's description (24-bit groups, '=' padding).
std::string encode(const std::vector<uint8_t>& in) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t g = uint32_t(in[i]) << 16;
    if (i + 1 < in.size()) g |= uint32_t(in[i + 1]) << 8;
    if (i + 2 < in.size()) g |= in[i + 2];
    out += a[(g >> 18) & 63];
    out += a[(g >> 12) & 63];
    out += i + 1 < in.size() ? a[(g >> 6) & 63] : '=';
    out += i + 2 < in.size() ? a[g & 63] : '=';
  }
  return out;
}

TEST(Base64, Rfc4648Vectors) {
  EXPECT_EQ(as_string(base64_decode("")), "");
  EXPECT_EQ(as_string(base64_decode("Zg==")), "f");
  EXPECT_EQ(as_string(base64_decode("Zm8=")), "fo");
  EXPECT_EQ(as_string(base64_decode("Zm9v")), "foo");
  EXPECT_EQ(as_string(base64_decode("Zm9vYg==")), "foob");
  EXPECT_EQ(as_string(base64_decode("Zm9vYmE=")), "fooba");
  EXPECT_EQ(as_string(base64_decode("Zm9vYmFy")), "foobar");
  // Unpadded and line-wrapped forms are accepted.
  EXPECT_EQ(as_string(base64_decode("Zm9vYg")), "foob");
  EXPECT_EQ(as_string(base64_decode("Zm9v\r\nYmFy\n")), "foobar");
}

TEST(Base64, RoundTripsRandomBytes) {
  std::mt19937 rng(7);
  for (int n = 0; n < 300; ++n) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n));
    for (auto& b : bytes) b = uint8_t(rng());
    EXPECT_EQ(base64_decode(encode(bytes)), bytes) << n;
  }
}

TEST(Base64, RejectsMalformedInput) {
  for (const char* bad : {"Zm9v!", "Z", "Zm9vY", "Zg=", "Zg===", "Zg==Zg==", "Zh==", "Zm9=", "Zm-_", "Zm\x80v"}) {
    EXPECT_THROW(base64_decode(bad), Error) << bad;
  }
  try {
    base64_decode("Zm9v*mFy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 4"), std::string::npos) << e.what();
  }
}

TEST(DataUrl, ParsesMediaTypeAndPayload) {
  DataUrl d = parse_data_url("data:image/PNG;base64,Zm9vYmFy");
  EXPECT_EQ(d.media_type, "image/png");
  EXPECT_EQ(as_string(d.bytes), "foobar");
  d = parse_data_url("data:image/jpeg;name=x.jpg;base64,Zg==");
  EXPECT_EQ(d.media_type, "image/jpeg");
  EXPECT_EQ(as_string(d.bytes), "f");
}

TEST(DataUrl, RejectsWhatIsNotABase64DataUrl) {
  for (const char* bad : {"http://x/y.png", "data:image/png;base64", "data:image/png,%89PNG", "data:image/png;base64,Zm9v!",
                          "dat:image/png;base64,Zg=="}) {
    EXPECT_THROW(parse_data_url(bad), Error) << bad;
  }
}

}  // namespace
}  // namespace ds41
