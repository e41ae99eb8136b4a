#include "text/stream_decoder.h"

#include "text/utf8.h"

namespace ds41 {

std::string StreamDecoder::push(int32_t id) {
  const std::string_view bytes = tokenizer_.token_bytes(id);  // validates the id
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Sequence seq = utf8_sequence_at(pending_, i);
    if (seq.kind == Utf8Sequence::kTruncated) break;  // may still complete: hold it back
    if (seq.kind == Utf8Sequence::kComplete) {
      out.append(pending_, i, size_t(seq.length));
    } else {
      out.append(kReplacementCharUtf8);
    }
    i += size_t(seq.length);
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace ds41
