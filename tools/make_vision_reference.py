#!/usr/bin/env python3
"""Writes the image decoding / preprocessing parity data of tests/vision_preprocess_test.cpp.

A data-generation script, not part of the engine. The oracle is Pillow itself, at the version the
official reference was run with for the golden cases (9.4.0; shared/goldens/vision-a/case.json ->
reference.pillow): the C++ decoders (src/vision/*_decode.cpp) must give what
`Image.open(f).convert("RGB")` gives, and the C++ letterbox (src/vision/image_preprocess.cpp,
pillow_resize.cpp) what `ImageOps.pad(img, size, color=(127, 127, 127))` gives, byte for byte.
The resize plan (target size and grids) is recomputed here from spec engram_dspark_vision.md
§C.2 in Python floats, like the reference does; the C++ plan is also checked against the spec's
worked examples and against the golden vision-a, which is where that plan is independently pinned.

Usage (Pillow 9.4.0 and numpy from PyPI, e.g. in a venv):
    pip install pillow==9.4.0 numpy safetensors
    tools/make_vision_reference.py tests/data/vision

Writes, under the output folder:
  images/*.png|jpg|webp          the test inputs (many sizes, aspect ratios, modes and encodings)
  preprocess_reference.json      per image: its mode in Pillow, size, FNV-1a 64 of the decoded RGB
                                 bytes; per (image, config): the plan and the FNV-1a 64 of the
                                 letterboxed RGB bytes; the 256-entry bf16 normalisation table;
                                 plan-only cases (sizes the tests plan without pixels)
  preprocess_reference.safetensors
                                 U8 tensors: decoded.<image> [H, W, 3] for images of at most 4096
                                 pixels, letterbox.<image>.<config> [H, W, 3] for a few images at
                                 config "A", so a mismatch can be located, not only detected (the
                                 FNV-1a 64 digests in the JSON cover every image and config).
"""

import io
import json
import math
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image, ImageOps, features

PILLOW_VERSION = "9.4.0"

# Vision geometry of the test configs (patch 14, downsample 3 throughout).
CONFIGS = {
    "A": {"min_pixels": 8000, "max_n_token": 12, "max_wh_ratio": None},      # vision-a's numbers
    "B": {"min_pixels": 20000, "max_n_token": 40, "max_wh_ratio": None},
    "C": {"min_pixels": 8000, "max_n_token": 30, "max_wh_ratio": 2.0},       # the stretch path
    "R": {"min_pixels": 295936, "max_n_token": 1024, "max_wh_ratio": None},  # released
}
PATCH, DOWNSAMPLE = 14, 3
FULL_TENSOR_CONFIG = "A"
FULL_LETTERBOX_IMAGES = {"rgb_100x60.png", "rgb_wide_1000x8.png", "rgb_tall_7x900.png", "photo_2000x1500.jpg"}
FULL_DECODED_MAX_PIXELS = 4096


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# ---- the plan (spec §C.2), in Python floats as the reference evaluates it -----------------------
def llm_grid(bh, bw):
    return math.ceil((bh // PATCH) / DOWNSAMPLE), math.ceil((bw // PATCH) / DOWNSAMPLE)


def plan(width, height, cfg):
    ratio_cap = cfg["max_wh_ratio"]
    if ratio_cap is not None and width > height * ratio_cap:
        width = height * ratio_cap
    if 0 < width * height < cfg["min_pixels"]:
        ratio = (cfg["min_pixels"] / (width * height)) ** 0.5
        width, height = int(width * ratio), int(height * ratio)
    bw, bh = math.ceil(width / PATCH) * PATCH, math.ceil(height / PATCH) * PATCH
    nh, nw = llm_grid(bh, bw)
    limit = cfg["max_n_token"]
    if nh * (nw + 1) + 2 > limit:
        r = height / width
        wf = math.sqrt((limit - 2) / r + 0.25) - 0.5
        hf = wf * r
        cell = PATCH * DOWNSAMPLE
        if wf < 1.0:
            bh, bw = (limit - 2) // 2 * cell, cell
        elif hf < 1.0:
            bh, bw = cell, (limit - 3) * cell
        else:
            beta = min(math.floor(wf) * cell / width, math.floor(hf) * cell / height)
            bh, bw = math.floor(height * beta / PATCH) * PATCH, math.floor(width * beta / PATCH) * PATCH
        nh, nw = llm_grid(bh, bw)
        assert nh * (nw + 1) + 2 <= limit
    return {"best_width": bw, "best_height": bh, "n_vit_h": bh // PATCH, "n_vit_w": bw // PATCH,
            "n_llm_h": nh, "n_llm_w": nw}


def sized_for_grid(rgb, p, cfg):
    size = (p["best_width"], p["best_height"])
    if cfg["max_wh_ratio"] is not None and rgb.width >= cfg["max_wh_ratio"] * rgb.height:
        return rgb.resize(size)  # the reference's stretch path (default BICUBIC for RGB)
    return ImageOps.pad(rgb, size, color=(127, 127, 127))


# ---- test content ---------------------------------------------------------------------------------
def content(w, h, seed, channels=3, noise=24):
    """Gradients, hard-edged shapes (bicubic overshoot gets clipped) and some noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    out = np.empty((h, w, channels), np.float64)
    for c in range(channels):
        fx, fy = rng.uniform(0.5, 3.0, 2)
        out[..., c] = 127.5 + 100 * np.sin(fx * 2 * np.pi * x / max(w, 1) + c) * np.cos(fy * 2 * np.pi * y / max(h, 1))
    for _ in range(4):  # hard rectangles
        x0, x1 = sorted(rng.integers(0, w + 1, 2))
        y0, y1 = sorted(rng.integers(0, h + 1, 2))
        out[y0:y1, x0:x1, :] = rng.choice([0.0, 255.0], channels)
    out += rng.normal(0, noise, out.shape)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


# ---- hand-written PNGs for modes Pillow does not write ------------------------------------------
def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def pack_row(samples, bit_depth):
    """samples: 1-D uint array of one row (all channels interleaved)."""
    if bit_depth == 16:
        return samples.astype(">u2").tobytes()
    if bit_depth == 8:
        return samples.astype(np.uint8).tobytes()
    per_byte = 8 // bit_depth
    padded = np.zeros(-(-len(samples) // per_byte) * per_byte, np.uint8)
    padded[: len(samples)] = samples
    padded = padded.reshape(-1, per_byte)
    out = np.zeros(len(padded), np.uint8)
    for i in range(per_byte):
        out |= (padded[:, i] << (8 - bit_depth * (i + 1))).astype(np.uint8)
    return out.tobytes()


def write_png(width, height, bit_depth, color_type, pixels, plte=None, trns=None, interlace=False):
    """pixels: [H, W, C] array of sample values."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    raw = b""
    passes = ADAM7 if interlace else [(0, 0, 1, 1)]
    for x0, y0, dx, dy in passes:
        sub = pixels[y0::dy, x0::dx]
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue
        for row in sub:
            raw += b"\x00" + pack_row(row.reshape(-1), bit_depth)
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
    if plte is not None:
        out += png_chunk(b"PLTE", plte)
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    return out + png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")


def save(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def exif_rotated_jpeg(arr):
    img = Image.fromarray(arr, "RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": the reference does not apply it
    return save(img, "JPEG", quality=90, exif=exif.tobytes())


def test_images():
    """(file name, bytes, what it exercises)."""
    g = []
    rng = np.random.default_rng(7)
    g.append(("rgb_100x60.png", save(Image.fromarray(content(100, 60, 1)), "PNG"), "vision-a's first size"))
    g.append(("rgb_1x1.png", save(Image.fromarray(content(1, 1, 2)), "PNG"), "tiny: 1 pixel"))
    g.append(("rgb_3x2.png", save(Image.fromarray(content(3, 2, 3)), "PNG"), "tiny"))
    g.append(("rgb_wide_1000x8.png", save(Image.fromarray(content(1000, 8, 4)), "PNG"), "extreme aspect (wide)"))
    g.append(("rgb_tall_7x900.png", save(Image.fromarray(content(7, 900, 5)), "PNG"), "extreme aspect (tall)"))
    g.append(("rgb_79x132.png", save(Image.fromarray(content(79, 132, 6)), "PNG"), "vision-a's second size"))
    g.append(("gray8_37x53.png", save(Image.fromarray(content(37, 53, 8, 1)[..., 0], "L"), "PNG"), "gray 8-bit"))
    g16 = (rng.integers(0, 65536, (30, 40)) * (rng.random((30, 40)) < 0.5) + rng.integers(0, 300, (30, 40))) % 65536
    g.append(("gray16_40x30.png", write_png(40, 30, 16, 0, g16[..., None]), "gray 16-bit (Pillow clips to 255)"))
    for bits in (1, 2, 4):
        v = rng.integers(0, 1 << bits, (17, 29, 1))
        g.append((f"gray{bits}_29x17.png", write_png(29, 17, bits, 0, v), f"gray {bits}-bit"))
    pal = rng.integers(0, 256, 5 * 3).astype(np.uint8).tobytes()
    idx = rng.integers(0, 8, (40, 50, 1))  # indices 5..7 are past the 5-entry palette
    g.append(("palette8_oob_50x40.png", write_png(50, 40, 8, 3, idx, plte=pal, trns=bytes([0, 128])),
              "palette + tRNS, indices past the palette"))
    idx4 = rng.integers(0, 16, (21, 33, 1))
    pal16 = rng.integers(0, 256, 16 * 3).astype(np.uint8).tobytes()
    g.append(("palette4_33x21.png", write_png(33, 21, 4, 3, idx4, plte=pal16), "palette 4-bit"))
    rgba = np.concatenate([content(64, 48, 9), rng.integers(0, 256, (48, 64, 1)).astype(np.uint8)], 2)
    g.append(("rgba8_64x48.png", save(Image.fromarray(rgba, "RGBA"), "PNG"), "RGBA: alpha dropped, not composited"))
    la = np.concatenate([content(23, 19, 10, 1), rng.integers(0, 256, (19, 23, 1)).astype(np.uint8)], 2)
    g.append(("la8_23x19.png", save(Image.fromarray(la, "LA"), "PNG"), "gray + alpha"))
    rgb16 = rng.integers(0, 65536, (35, 45, 3))
    g.append(("rgb16_45x35.png", write_png(45, 35, 16, 2, rgb16), "RGB 16-bit: high byte"))
    rgba16 = rng.integers(0, 65536, (26, 31, 4))
    g.append(("rgba16_31x26.png", write_png(31, 26, 16, 6, rgba16), "RGBA 16-bit"))
    la16 = rng.integers(0, 65536, (13, 11, 2))
    g.append(("la16_11x13.png", write_png(11, 13, 16, 4, la16), "gray + alpha 16-bit"))
    g.append(("interlaced_rgb_31x27.png", write_png(31, 27, 8, 2, content(31, 27, 11), interlace=True), "Adam7"))
    g.append(("interlaced_gray2_19x23.png", write_png(19, 23, 2, 0, rng.integers(0, 4, (23, 19, 1)), interlace=True),
              "Adam7 with sub-byte samples"))
    big = content(2000, 1500, 12, noise=3)
    g.append(("photo_2000x1500.jpg", save(Image.fromarray(big), "JPEG", quality=70), "huge: downscaled a lot"))
    g.append(("photo_444_90x70.jpg", save(Image.fromarray(content(90, 70, 13)), "JPEG", quality=92, subsampling=0),
              "JPEG 4:4:4"))
    g.append(("photo_422_83x61.jpg", save(Image.fromarray(content(83, 61, 14)), "JPEG", quality=85, subsampling=1),
              "JPEG 4:2:2, odd size"))
    g.append(("progressive_120x90.jpg", save(Image.fromarray(content(120, 90, 15)), "JPEG", quality=80, progressive=True),
              "progressive JPEG"))
    g.append(("gray_57x43.jpg", save(Image.fromarray(content(57, 43, 16, 1)[..., 0], "L"), "JPEG", quality=88),
              "grayscale JPEG"))
    cmyk = Image.fromarray(content(48, 40, 17, 4), "CMYK")
    g.append(("cmyk_48x40.jpg", save(cmyk, "JPEG", quality=90), "CMYK JPEG (Adobe)"))
    g.append(("exif_rotate_64x40.jpg", exif_rotated_jpeg(content(64, 40, 18)), "EXIF orientation 6: not applied"))
    g.append(("lossy_120x80.webp", save(Image.fromarray(content(120, 80, 19)), "WEBP", quality=80), "WebP lossy"))
    rgba_w = np.concatenate([content(70, 50, 20), rng.integers(0, 256, (50, 70, 1)).astype(np.uint8)], 2)
    g.append(("lossless_rgba_70x50.webp", save(Image.fromarray(rgba_w, "RGBA"), "WEBP", lossless=True, exact=True),
              "WebP lossless with alpha"))
    g.append(("lossy_alpha_66x44.webp", save(Image.fromarray(rgba_w[:44, :66].copy(), "RGBA"), "WEBP", quality=75),
              "WebP lossy with alpha"))
    return g


# Sizes planned without pixels: the spec's worked examples and the double-precision edge are
# in the C++ test as literals; these add breadth (random and extreme sizes) for every config.
def plan_only_sizes():
    rng = np.random.default_rng(3)
    sizes = [(1, 1), (1, 100000), (100000, 1), (1151, 2302), (2302, 1151), (544, 544), (543, 545),
             (14, 14), (42, 42), (43, 41), (4000, 3000), (1344, 1344), (640, 480), (300, 200)]
    sizes += [tuple(int(v) for v in rng.integers(1, 5000, 2)) for _ in range(300)]
    sizes += [(int(a), int(b)) for a, b in zip(rng.integers(1, 40, 40), rng.integers(1000, 20000, 40))]
    sizes += [(int(b), int(a)) for a, b in zip(rng.integers(1, 40, 40), rng.integers(1000, 20000, 40))]
    return sizes


def main():
    if Image.__version__ != PILLOW_VERSION:
        sys.exit(f"needs Pillow {PILLOW_VERSION} (the reference's version), found {Image.__version__}")
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/data/vision"
    os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
    tensors = {}
    manifest = {"generator": "tools/make_vision_reference.py", "pillow": Image.__version__,
                "libjpeg_turbo": features.version("libjpeg_turbo"), "libwebp": features.version("webp"),
                "patch": PATCH, "downsample": DOWNSAMPLE, "configs": CONFIGS, "letterbox_fill": 127,
                "images": []}
    for name, data, what in test_images():
        with open(os.path.join(out_dir, "images", name), "wb") as f:
            f.write(data)
        with Image.open(io.BytesIO(data)) as src:
            mode = src.mode
            rgb = src.convert("RGB")
        arr = np.asarray(rgb, dtype=np.uint8)
        entry = {"file": "images/" + name, "what": what, "pillow_mode": mode, "width": rgb.width,
                 "height": rgb.height, "decoded_fnv1a64": fnv1a64(arr.tobytes()), "configs": {}}
        key = name.replace(".", "_")
        if rgb.width * rgb.height <= FULL_DECODED_MAX_PIXELS:
            tensors["decoded." + key] = arr
        for cname, cfg in CONFIGS.items():
            p = plan(rgb.width, rgb.height, cfg)
            sized = np.asarray(sized_for_grid(rgb, p, cfg), dtype=np.uint8)
            assert sized.shape == (p["best_height"], p["best_width"], 3)
            p["letterbox_fnv1a64"] = fnv1a64(sized.tobytes())
            entry["configs"][cname] = p
            if cname == FULL_TENSOR_CONFIG and name in FULL_LETTERBOX_IMAGES:
                tensors[f"letterbox.{key}.{cname}"] = sized
        manifest["images"].append(entry)
        print(f"{name}: {mode} {rgb.width}x{rgb.height}", file=sys.stderr)
    # One compact row per size: width, height, then per config (in CONFIGS order) best_width,
    # best_height, n_llm_h, n_llm_w (the ViT grid is best / patch).
    manifest["plans"] = []
    manifest["plan_columns"] = ["width", "height"] + [f"{c}.{k}" for c in CONFIGS
                                                      for k in ("best_width", "best_height", "n_llm_h", "n_llm_w")]
    for w, h in plan_only_sizes():
        row = [w, h]
        for cfg in CONFIGS.values():
            p = plan(w, h, cfg)
            row += [p["best_width"], p["best_height"], p["n_llm_h"], p["n_llm_w"]]
        manifest["plans"].append(row)
    # ((v / 255) - 0.5) / 0.5 in fp32, then bf16 round-to-nearest-even, for v = 0..255.
    x = (np.arange(256, dtype=np.float32) / np.float32(255) - np.float32(0.5)) / np.float32(0.5)
    u = x.view(np.uint32).astype(np.uint64)
    manifest["normalized_bf16"] = [int(v) for v in ((u + 0x7FFF + ((u >> 16) & 1)) >> 16)]
    plans = manifest.pop("plans")
    lut = manifest.pop("normalized_bf16")
    text = json.dumps(manifest, indent=1)
    text = text[: text.rfind("}")].rstrip() + ',\n "normalized_bf16": ' + json.dumps(lut) + ',\n "plans": [\n'
    text += ",\n".join("  " + json.dumps(r) for r in plans) + "\n ]\n}\n"
    with open(os.path.join(out_dir, "preprocess_reference.json"), "w") as f:
        f.write(text)
    from safetensors.numpy import save_file

    save_file(tensors, os.path.join(out_dir, "preprocess_reference.safetensors"))


if __name__ == "__main__":
    main()
