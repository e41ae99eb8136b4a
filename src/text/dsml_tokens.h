// The fixed strings of the DeepSeek-V4.1 chat format (spec D.3/D.4), shared by the prompt encoder
// and the reply parser. `｜` is U+FF5C and `▁` U+2581: these are the released special tokens.
#pragma once

#include <string_view>

namespace ds41::dsml {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kImage = "<｜deepseek_image｜>";

// Tool-call markup. The tag names carry a leading space (" calls", " invoke", " parameter").
inline constexpr std::string_view kCallsOpen = "<｜DSML｜ calls>";
inline constexpr std::string_view kCallsClose = "</｜DSML｜ calls>";
inline constexpr std::string_view kInvokeOpen = "<｜DSML｜ invoke";    // + ` name="N">`
inline constexpr std::string_view kInvokeClose = "</｜DSML｜ invoke";  // + `>`
inline constexpr std::string_view kParamOpen = "<｜DSML｜ parameter";  // + ` name="K" string="B">`
inline constexpr std::string_view kParamClose = "</｜DSML｜ parameter>";
// What the reply parser looks for: a tool-call block starts after a blank line.
inline constexpr std::string_view kCallsStart = "\n\n<｜DSML｜ calls";

}  // namespace ds41::dsml
