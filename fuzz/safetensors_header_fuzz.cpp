// libFuzzer target: parse_safetensors_header must turn any byte string into either a header or a
// ds41::Error. Any other exception escapes and aborts the run; crashes and sanitizer reports are
// bugs. The input is the whole "file" (length field + header + data).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ds41::SafetensorsHeader h = ds41::parse_safetensors_header(data, size, "fuzz.safetensors");
    // Everything the parser accepted must describe bytes inside the input; touch the first and
    // last byte of each tensor so ASan flags any range the validation let through by mistake.
    volatile uint8_t sink = 0;
    for (const auto& e : h.entries) {
      if (e.end > e.begin) {
        sink = sink ^ data[h.data_start + e.begin] ^ data[h.data_start + e.end - 1];
      }
      if (ds41::shape_nbytes(e.dtype, e.shape).value_or(~0ull) != e.end - e.begin) std::abort();
    }
  } catch (const ds41::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
