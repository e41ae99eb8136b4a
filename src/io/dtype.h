// Element types of safetensors files. The names are the safetensors spellings ("F8_E4M3", ...);
// the checkpoint uses BF16, F32, F8_E4M3, F8_E8M0 and I8 (= two packed FP4 E2M1 values per byte),
// the other standard names are accepted so that any well-formed file can be opened.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ds41 {

enum class DType : uint8_t {
  BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64,
};

inline constexpr DType kAllDTypes[] = {
    DType::BOOL, DType::U8,  DType::I8,   DType::F8_E5M2, DType::F8_E4M3, DType::F8_E8M0,
    DType::I16,  DType::U16, DType::F16,  DType::BF16,    DType::I32,     DType::U32,
    DType::F32,  DType::F64, DType::I64,  DType::U64};

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::BOOL: return "BOOL";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::F8_E5M2: return "F8_E5M2";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E8M0: return "F8_E8M0";
    case DType::I16: return "I16";
    case DType::U16: return "U16";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::U32: return "U32";
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::U64: return "U64";
  }
  return "?";
}

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::BOOL: case DType::U8: case DType::I8: case DType::F8_E5M2: case DType::F8_E4M3:
    case DType::F8_E8M0: return 1;
    case DType::I16: case DType::U16: case DType::F16: case DType::BF16: return 2;
    case DType::I32: case DType::U32: case DType::F32: return 4;
    case DType::F64: case DType::I64: case DType::U64: return 8;
  }
  return 0;
}

constexpr std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

}  // namespace ds41
