#!/usr/bin/env python3
"""Writes tests/data/torch_numerics.bin, the oracle data of tests/torch_numerics_test.cpp.

A data-generation script, not part of the engine. The golden cases were produced by PyTorch's CPU
kernels at the AVX2 capability level, and two of their element-level choices decide last bits
that downstream FP8/FP4 quantizers grow into visible differences:
  * fp32 reductions over a contiguous last dim (x.square().mean(-1), (...).sum(-1)): summed in
    PyTorch's order, reproduced by src/kernels/torch_sum.cpp;
  * torch.sigmoid's vectorized exp (SLEEF expf_u10), called by src/kernels/vector_exp.cpp.
This script records what torch itself computes, so the C++ can be checked bit for bit.

Usage (PyPI torch + numpy, e.g. in a venv):
    pip install torch numpy
    tools/make_torch_numerics_reference.py tests/data/torch_numerics.bin

Format (little endian): magic "DS41TNUM", u32 version 1, then
  u32 sum_cases; per case: u32 n, f32 x[n], f32 torch.sum(x), f32 torch.square(x).sum()
  u32 bf16_cases; per case: u32 n, u16 bf16 x[n], f32 x.float().square().sum()
  u32 sigmoid_n, f32 x[sigmoid_n], f32 torch.sigmoid(x)[sigmoid_n]   (sigmoid_n % 16 == 0, so
      every element takes the vectorized path)
"""

import os
import struct
import sys

os.environ["ATEN_CPU_CAPABILITY"] = "avx2"  # the level the golden generator ran at; set before import

import numpy as np  # noqa: E402
import torch  # noqa: E402

LENGTHS = list(range(1, 41)) + [63, 64, 100, 127, 128, 130, 255, 256, 512, 1000, 1024, 2048, 4096, 5000, 16384]


def main(out_path: str) -> None:
    torch.set_num_threads(1)  # one thread: no parallel split of a long row
    gen = torch.Generator().manual_seed(4141)
    out = bytearray(b"DS41TNUM") + struct.pack("<I", 1)

    def rows():
        for n in LENGTHS:
            for variant in range(2 if n <= 1024 else 1):
                # wide dynamic range, so partial sums round often
                x = torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * (1 + 2 * variant))
                yield n, x.float()

    cases = list(rows())
    out += struct.pack("<I", len(cases))
    for n, x in cases:
        out += struct.pack("<I", n) + x.numpy().astype("<f4").tobytes()
        out += struct.pack("<ff", x.sum(-1).item(), x.square().sum(-1).item())

    bf16_cases = list(rows())
    out += struct.pack("<I", len(bf16_cases))
    for n, x in bf16_cases:
        xb = x.bfloat16()
        bits = xb.view(torch.int16).numpy().astype("<i2").tobytes()
        out += struct.pack("<I", n) + bits + struct.pack("<f", xb.float().square().sum(-1).item())

    m = 1 << 14
    s = torch.cat([torch.randn(m // 2, generator=gen) * 4, (torch.rand(m // 2, generator=gen) * 220 - 110)]).float()
    out += struct.pack("<I", m) + s.numpy().astype("<f4").tobytes() + torch.sigmoid(s).numpy().astype("<f4").tobytes()

    with open(out_path, "wb") as f:
        f.write(out)
    print(f"{out_path}: {len(cases)} fp32 rows, {len(bf16_cases)} bf16 rows, {m} sigmoid inputs, "
          f"{len(out)} bytes (torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
