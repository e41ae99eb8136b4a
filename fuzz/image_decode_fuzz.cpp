// libFuzzer target: decode_image must turn any byte string into either an RGB image or a
// ds41::Error (never a crash, hang or sanitizer report), and a decoded image must go through the
// rest of the preprocessing (plan, Pillow-exact letterbox, patches) the same way. The pixel cap is
// lowered so that inputs claiming large sizes are cheap to refuse or decode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "base/error.h"
#include "model/config.h"
#include "vision/image_decode.h"
#include "vision/image_preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ds41::ModelConfig config = [] {
    ds41::ModelConfig c;  // small vision geometry: cheap letterboxes whatever the image size
    c.vision_n_layers = 1;
    c.vision_min_pixels = 4000;
    c.vision_max_n_token = 24;
    return c;
  }();
  try {
    ds41::RgbImage img = ds41::decode_image(data, size, "fuzz", int64_t(1) << 20);
    if (img.width < 1 || img.height < 1 || img.rgb.size() != size_t(img.width * img.height * 3)) std::abort();
    ds41::PreparedImage p = ds41::prepare_image(img, config);
    if (p.patches.size() != size_t(p.grid.n_patches() * 3 * 14 * 14)) std::abort();
  } catch (const ds41::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
