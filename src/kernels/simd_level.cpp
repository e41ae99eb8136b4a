#include "kernels/simd_level.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "base/error.h"

namespace ds41 {
namespace {

SimdLevel detect_supported() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
  if (!avx2) return SimdLevel::Scalar;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512vnni");
  return avx512 ? SimdLevel::Avx512 : SimdLevel::Avx2;
#else
  return SimdLevel::Scalar;
#endif
}

constexpr int kUnset = -1;
std::atomic<int> g_level{kUnset};

SimdLevel cap(SimdLevel level) {
  const SimdLevel top = simd_level_supported();
  return static_cast<int>(level) > static_cast<int>(top) ? top : level;
}

}  // namespace

SimdLevel simd_level_supported() {
  static const SimdLevel supported = detect_supported();
  return supported;
}

SimdLevel simd_level() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level != kUnset) return static_cast<SimdLevel>(level);
  SimdLevel chosen = simd_level_supported();
  if (const char* env = std::getenv("DS41_SIMD"); env && *env && std::string_view(env) != "auto") {
    const std::optional<SimdLevel> parsed = parse_simd_level(env);
    if (!parsed)
      throw Error(std::string("DS41_SIMD=") + env + ": unknown kernel level (use scalar, avx2, avx512 or auto)");
    chosen = cap(*parsed);
  }
  g_level.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

SimdLevel set_simd_level(SimdLevel level) {
  const SimdLevel chosen = cap(level);
  g_level.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Scalar: return "scalar";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
  }
  return "?";
}

std::optional<SimdLevel> parse_simd_level(std::string_view name) {
  if (name == "scalar") return SimdLevel::Scalar;
  if (name == "avx2") return SimdLevel::Avx2;
  if (name == "avx512") return SimdLevel::Avx512;
  return std::nullopt;
}

}  // namespace ds41
