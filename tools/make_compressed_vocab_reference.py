#!/usr/bin/env python3
"""Builds the reference Engram compressed token map with the HF `tokenizers` library.

This is a data-generation script, not part of the engine: the C++ derivation in
src/text/compressed_vocab.cpp re-implements the procedure of spec engram_dspark_vision.md §A.2
with ICU, and tests/compressed_vocab_test.cpp compares it entry by entry against the file this
script writes. The oracle is the Rust `tokenizers` backend itself (decoder, id_to_token and the
normalizer sequence the reference model uses), so any disagreement in Unicode tables or decoding
rules shows up as a test failure rather than as a silently re-keyed Engram table.

Usage (needs `pip install tokenizers`):
    tools/make_compressed_vocab_reference.py TOKENIZER_JSON OUTPUT.bin
    tools/make_compressed_vocab_reference.py --codepoints OUTPUT.txt

The second form writes the normalizer's output for every Unicode scalar value c, alone and after
"A" (lines "<hex utf-8 input> <hex utf-8 output>", ~60 MB); the C++ test
CompressedVocab.NormalizerMatchesHfOnEveryCodePoint reads it when DS41_CODEPOINT_TABLE names it.
That comparison is how the Unicode-version differences between ICU and the Rust crates were
found (see src/text/compressed_vocab.cpp).

The output uses the engine's compressed-map file format (documented in
src/text/compressed_vocab.h): 8-byte magic "DS41CVM\\0", uint32 version 1, uint32 reserved 0,
int64 entry count, int64 compressed size, int32 ids (all little-endian), then the FNV-1a 64 hash
of every preceding byte.
"""

import json
import struct
import sys

from tokenizers import Regex, Tokenizer, normalizers

MAGIC = b"DS41CVM\0"
VERSION = 1
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h ^= b
        h = (h * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def build_normalizer():
    # Exactly the sequence the reference applies (spec §A.2 "normalize").
    return normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex("[ \t\r\n]+"), " "),
        normalizers.Replace(Regex("^ $"), "\ue000"),
        normalizers.Strip(),
        normalizers.Replace("\ue000", " "),
    ])


def tokenizer_length(path: str) -> int:
    # len(tokenizer) = max id + 1 over the model vocabulary and the added tokens.
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    ids = list(j["model"]["vocab"].values()) + [t["id"] for t in j.get("added_tokens", [])]
    return max(ids) + 1


def compressed_map(path: str):
    tok = Tokenizer.from_file(path)
    norm = build_normalizer()
    keys = {}
    out = []
    for i in range(tokenizer_length(path)):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = norm.normalize_str(text)
            if key == "":
                key = text
        out.append(keys.setdefault(key, len(keys)))
    return out, len(keys)


def write_codepoint_table(path: str):
    norm = build_normalizer()
    with open(path, "w", encoding="ascii") as f:
        for cp in range(0x110000):
            if 0xD800 <= cp < 0xE000:
                continue  # surrogates are not scalar values
            for s in (chr(cp), "A" + chr(cp)):
                f.write(s.encode("utf-8").hex() + " " + norm.normalize_str(s).encode("utf-8").hex() + "\n")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    if sys.argv[1] == "--codepoints":
        write_codepoint_table(sys.argv[2])
        return
    ids, distinct = compressed_map(sys.argv[1])
    body = MAGIC + struct.pack("<IIqq", VERSION, 0, len(ids), distinct)
    body += struct.pack("<%di" % len(ids), *ids)
    with open(sys.argv[2], "wb") as f:
        f.write(body + struct.pack("<Q", fnv1a64(body)))
    print(f"{sys.argv[1]}: {len(ids)} tokens, {distinct} distinct keys -> {sys.argv[2]}")


if __name__ == "__main__":
    main()
