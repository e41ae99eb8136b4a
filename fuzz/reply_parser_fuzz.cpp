// libFuzzer target: the streaming reply parser on arbitrary bytes cut into arbitrary pieces.
// The first input byte picks the mode, whether the reply was cut off by a limit, and the split
// pattern; the rest is the model output. Any
// crash, sanitizer report or escaped exception is a bug, and so is a stream whose coalesced
// result differs from parsing the same text in one piece.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/reply_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t control = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  ds41::ReplyParserOptions options;
  options.thinking_mode = control & 1 ? ds41::ThinkingMode::thinking : ds41::ThinkingMode::chat;

  ds41::ReplyParser parser(options);
  ds41::ParsedReply streamed;
  // Piece lengths from a small generator seeded by the control byte: 1..16 bytes.
  uint32_t state = control | 0x100u;
  size_t pos = 0;
  while (pos < text.size()) {
    state = state * 1103515245u + 12345u;
    const size_t n = 1 + (state >> 16) % 16;
    ds41::collect_reply_events(streamed, parser.feed(text.substr(pos, n)));
    pos += n;
  }
  const bool cut_off = control & 2;  // the reply stopped by a limit instead of ended by the model
  ds41::collect_reply_events(streamed, parser.finish(cut_off));

  ds41::ParsedReply whole;
  ds41::ReplyParser one_piece(options);
  ds41::collect_reply_events(whole, one_piece.feed(text));
  ds41::collect_reply_events(whole, one_piece.finish(cut_off));
  if (streamed.reasoning != whole.reasoning || streamed.content != whole.content ||
      streamed.warnings != whole.warnings || streamed.tool_calls.size() != whole.tool_calls.size())
    std::abort();
  for (size_t i = 0; i < whole.tool_calls.size(); ++i)
    if (streamed.tool_calls[i].arguments != whole.tool_calls[i].arguments ||
        streamed.tool_calls[i].name != whole.tool_calls[i].name)
      std::abort();
  return 0;
}
