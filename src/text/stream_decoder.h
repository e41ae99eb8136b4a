// Incremental decoding for streaming generation: feed ids one at a time, get back the text they
// complete. A UTF-8 character split across tokens (common for CJK and emoji, whose bytes are
// separate byte-level tokens) is held back until its last byte arrives, so no push ever returns
// half a character.
//
// The concatenation of every push() and the final flush() equals Tokenizer::decode of all the ids
// (HF's result): bytes that can no longer become a valid character are emitted as U+FFFD as soon
// as that is certain, and flush() turns a character still incomplete at the end into one U+FFFD
// (the maximal-subpart rule of Rust's from_utf8_lossy, which HF's decode uses).
#pragma once

#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace ds41 {

class StreamDecoder {
 public:
  // The tokenizer must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

  // Adds one id (ds41::Error when it is outside the vocabulary); returns the newly complete text,
  // possibly empty.
  std::string push(int32_t id);
  // Ends the stream: returns what is still held back (U+FFFD for an incomplete character) and
  // resets the decoder for a new stream.
  std::string flush();
  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace ds41
