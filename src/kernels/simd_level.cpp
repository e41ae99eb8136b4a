#include "kernels/simd_level.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace ds41 {
namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// XCR0: which register states the OS saves on context switches (AVX and AVX-512 need both the
// CPU feature and the OS enabling its state).
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}
#endif

// AMX-TILE and AMX-INT8 in the CPU, their tile state enabled by the OS in XCR0, and - on Linux,
// which enables the large tile-data state only for processes that ask - the permission granted
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, once per process, for all its threads).
bool amx_usable(uint32_t cpuid7_edx, uint64_t xcr0) {
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
  const bool tile = cpuid7_edx & (1u << 24), int8 = cpuid7_edx & (1u << 25);
  if (!tile || !int8 || (xcr0 & 0x60000) != 0x60000) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  (void)cpuid7_edx;
  (void)xcr0;
  return false;
#endif
}

struct CpuLevels {
  SimdLevel best;
  bool avx_vnni;  // AVX-VNNI (CPUID 7.1 EAX bit 4), with AVX2's requirements met
};

CpuLevels detect_levels() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned a = 0, b = 0, c = 0, d = 0;
  constexpr CpuLevels kScalar{SimdLevel::Scalar, false};
  if (!__get_cpuid(1, &a, &b, &c, &d)) return kScalar;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!osxsave || !avx || !fma || !f16c) return kScalar;
  const uint64_t xcr0 = read_xcr0();
  if ((xcr0 & 0x6) != 0x6) return kScalar;  // XMM and YMM state
  unsigned max_leaf7 = 0;
  if (!__get_cpuid_count(7, 0, &max_leaf7, &b, &c, &d)) return kScalar;
  const bool avx2 = b & (1u << 5), bmi1 = b & (1u << 3), bmi2 = b & (1u << 8);
  if (!avx2 || !bmi1 || !bmi2) return kScalar;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const bool avx_vnni = max_leaf7 >= 1 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 4));
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31)) &&  // F DQ BW VL
                      (c & (1u << 11)) &&                                                            // VNNI
                      (xcr0 & 0xe0) == 0xe0;  // opmask and ZMM state
  if (!avx512) return {avx_vnni ? SimdLevel::Avx2Vnni : SimdLevel::Avx2, avx_vnni};
  const bool vbmi = c & (1u << 1);
  if (!vbmi) return {SimdLevel::Avx512, avx_vnni};
  return {amx_usable(d, xcr0) ? SimdLevel::Amx : SimdLevel::Avx512Vbmi, avx_vnni};
#else
  return {SimdLevel::Scalar, false};
#endif
}

const CpuLevels& cpu_levels() {
  static const CpuLevels levels = detect_levels();
  return levels;
}

constexpr int kUnset = -1;
std::atomic<int> g_level{kUnset};

SimdLevel cap(SimdLevel level) {
  const SimdLevel top = simd_level_supported();
  if (static_cast<int>(level) > static_cast<int>(top)) return top;
  return simd_level_available(level) ? level : SimdLevel::Avx2;  // avx2vnni without AVX-VNNI
}

}  // namespace

SimdLevel simd_level_supported() { return cpu_levels().best; }

bool simd_level_available(SimdLevel level) {
  if (static_cast<int>(level) > static_cast<int>(simd_level_supported())) return false;
  return level != SimdLevel::Avx2Vnni || cpu_levels().avx_vnni;
}

SimdLevel simd_level() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level != kUnset) return static_cast<SimdLevel>(level);
  SimdLevel chosen = simd_level_supported();
  if (const char* env = std::getenv("DS41_SIMD"); env && *env && std::string_view(env) != "auto") {
    const std::optional<SimdLevel> parsed = parse_simd_level(env);
    if (!parsed)
      throw Error(std::string("DS41_SIMD=") + env + ": unknown kernel level (use scalar, avx2, avx2vnni, avx512, avx512vbmi, amx or auto)");
    chosen = cap(*parsed);
  }
  subnormal_inputs_slow();  // DS41_SUBNORMAL_INPUTS is read (and a bad value refused) here too
  g_level.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

SimdLevel set_simd_level(SimdLevel level) {
  const SimdLevel chosen = cap(level);
  g_level.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

namespace {
constexpr int kSubnormalUnset = -1;
std::atomic<int> g_subnormal_slow{kSubnormalUnset};

bool cpu_vendor_is_amd() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "Auth" "enti" "cAMD"
#else
  return false;
#endif
}
}  // namespace

bool subnormal_inputs_slow() {
  int slow = g_subnormal_slow.load(std::memory_order_relaxed);
  if (slow != kSubnormalUnset) return slow != 0;
  slow = !cpu_vendor_is_amd();
  if (const char* env = std::getenv("DS41_SUBNORMAL_INPUTS"); env && *env) {
    const std::optional<bool> parsed = parse_subnormal_inputs(env);
    if (!parsed && std::string_view(env) != "auto")
      throw Error(std::string("DS41_SUBNORMAL_INPUTS=") + env + ": unknown value (use slow, fast or auto)");
    if (parsed) slow = *parsed;
  }
  g_subnormal_slow.store(slow, std::memory_order_relaxed);
  return slow != 0;
}

std::optional<bool> parse_subnormal_inputs(std::string_view name) {
  if (name == "slow") return true;
  if (name == "fast") return false;
  return std::nullopt;
}

void set_subnormal_inputs_slow(bool slow) { g_subnormal_slow.store(slow ? 1 : 0, std::memory_order_relaxed); }

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Scalar: return "scalar";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx2Vnni: return "avx2vnni";
    case SimdLevel::Avx512: return "avx512";
    case SimdLevel::Avx512Vbmi: return "avx512vbmi";
    case SimdLevel::Amx: return "amx";
  }
  return "?";
}

std::optional<SimdLevel> parse_simd_level(std::string_view name) {
  if (name == "scalar") return SimdLevel::Scalar;
  if (name == "avx2") return SimdLevel::Avx2;
  if (name == "avx2vnni") return SimdLevel::Avx2Vnni;
  if (name == "avx512") return SimdLevel::Avx512;
  if (name == "avx512vbmi") return SimdLevel::Avx512Vbmi;
  if (name == "amx") return SimdLevel::Amx;
  return std::nullopt;
}

}  // namespace ds41
