// Runtime choice of the CPU kernels (issue #10). Every kernel has a portable scalar path (the
// twin the SIMD paths are tested against, bit for bit); on x86-64 the engine also carries AVX2
// and AVX-512 versions, compiled with per-function target attributes, and picks the best one the
// running CPU supports. The choice never changes a result — only the speed — so it can be forced
// lower for comparisons: environment variable DS41_SIMD=scalar|avx2|avx2vnni|avx512|avx512vbmi|amx
// (the default is the best supported), or set_simd_level() in tests and `ds41 bench`.
//
//   avx2    AVX2 + FMA + F16C (Haswell, Zen 1 and later)
//   avx2vnni  avx2 + AVX-VNNI, the VEX-encoded 256-bit 8-bit dot product (Alder Lake and later
//           Intel cores, whose AVX-512 is off; Sierra Forest; Sapphire Rapids; Zen 5): the avx2
//           kernels except the FP4 products, whose u8 x s8 dot products become one vpdpbusd
//           instead of vpmaddubsw + vpmaddwd + vpaddd. Not every AVX-512 CPU has it (Skylake-SP to
//           Ice Lake and Zen 4 do not), so it is the one level that is not implied by the ones above.
//   avx512  AVX-512 F/BW/DQ/VL + VNNI (Ice Lake, Cascade Lake, Zen 4 and later); the kernels use
//           256-bit vectors with the AVX-512 instructions (VNNI dot products, 32 registers),
//           512-bit ones where a kernel gained from them (FP8 paths, prefill dense tiles,
//           sparse attention)
//   avx512vbmi  avx512 + VBMI (Ice Lake, Zen 4 and later; not Cascade Lake): the same kernels
//           except the FP8 decode product, which becomes 8-bit integer dot products on weight
//           digits looked up with byte permutes (simd_fp8_decode.inc)
//   amx     avx512vbmi + AMX-INT8 tiles (Sapphire Rapids and later; Linux grants the tile state
//           per process): the same kernels except the FP8 and FP4 prefill products, which become
//           int8 tile products of the same digits (simd_amx.inc)
#pragma once

#include <optional>
#include <string_view>

namespace ds41 {

enum class SimdLevel : int { Scalar = 0, Avx2 = 1, Avx2Vnni = 2, Avx512 = 3, Avx512Vbmi = 4, Amx = 5 };

// The best level this CPU and this build can run.
SimdLevel simd_level_supported();
// Whether this CPU and build can run `level`: every level up to simd_level_supported(), except
// avx2vnni on AVX-512 CPUs without AVX-VNNI.
bool simd_level_available(SimdLevel level);
// The level kernels use now: DS41_SIMD or set_simd_level(), never one the CPU cannot run (a level
// above the supported one becomes that; avx2vnni where it is missing, avx2).
// An unknown DS41_SIMD value throws ds41::Error on first use.
SimdLevel simd_level();
// Sets the active level (lowered as simd_level() says); returns the level now in effect.
SimdLevel set_simd_level(SimdLevel level);

const char* simd_level_name(SimdLevel level);
std::optional<SimdLevel> parse_simd_level(std::string_view name);  // "scalar", "avx2", "avx2vnni", ..., "amx"

// Whether fp32 arithmetic with a subnormal operand is slow on this CPU: Intel cores take a
// microcode assist for every multiply or FMA with a subnormal input (measured on a Xeon at the
// avx2 level: the FP8 one-row decode over weights with 5 % subnormal E4M3 codes at 0.29 GB/s
// instead of 10.6); AMD's Zen cores do not. The AVX2 FP8 decode then keeps subnormal weight codes
// out of fp32 (simd_gemm_fp8.inc). The answer never changes a result, only which exact path runs.
// Default: true unless the CPU vendor is AMD; DS41_SUBNORMAL_INPUTS=slow|fast overrides it (an
// unknown value throws ds41::Error on first use, of this or of simd_level()),
// set_subnormal_inputs_slow() too (tests, bench).
bool subnormal_inputs_slow();
std::optional<bool> parse_subnormal_inputs(std::string_view name);  // "slow" -> true, "fast" -> false
void set_subnormal_inputs_slow(bool slow);

// Sets subnormal_inputs_slow() for a scope and restores the previous answer (tests).
class ScopedSubnormalInputs {
 public:
  explicit ScopedSubnormalInputs(bool slow) : previous_(subnormal_inputs_slow()) { set_subnormal_inputs_slow(slow); }
  ~ScopedSubnormalInputs() { set_subnormal_inputs_slow(previous_); }
  ScopedSubnormalInputs(const ScopedSubnormalInputs&) = delete;
  ScopedSubnormalInputs& operator=(const ScopedSubnormalInputs&) = delete;

 private:
  bool previous_;
};

// Sets a level for a scope and restores the previous one (tests, bench).
class ScopedSimdLevel {
 public:
  explicit ScopedSimdLevel(SimdLevel level) : previous_(simd_level()) { set_simd_level(level); }
  ~ScopedSimdLevel() { set_simd_level(previous_); }
  ScopedSimdLevel(const ScopedSimdLevel&) = delete;
  ScopedSimdLevel& operator=(const ScopedSimdLevel&) = delete;

 private:
  SimdLevel previous_;
};

}  // namespace ds41
