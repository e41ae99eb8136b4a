#!/usr/bin/env bash
# Where the CPU time of a decode goes: perf (or, without perf, callgrind) over `ds41 run` with a
# short prompt and many generated tokens, so that the decode steps dominate the profile.
#   tools/profile_decode.sh MODEL_DIR [TOKENS_TO_GENERATE] [THREADS]
# DS41_SIMD=scalar|avx2|avx512 selects the kernel level (default: the best supported).
set -euo pipefail
model=${1:?usage: tools/profile_decode.sh MODEL_DIR [TOKENS] [THREADS]}
tokens=${2:-12}
threads=${3:-1}
bin=$(dirname "$0")/../build/ds41
out=$(mktemp -d)
if command -v perf >/dev/null; then
  perf record -q -o "$out/perf.data" "$bin" run -m "$model" --tokens 1,2,3 --max-tokens "$tokens" --threads "$threads" >/dev/null
  perf report -i "$out/perf.data" --no-children --percent-limit 0.5 --stdio 2>/dev/null | grep -E '^ +[0-9]' | cut -c1-160
else
  valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out" "$bin" run -m "$model" --tokens 1,2,3 \
    --max-tokens "$tokens" --threads "$threads" >/dev/null
  callgrind_annotate "$out/callgrind.out" | head -40
fi
rm -rf "$out"
