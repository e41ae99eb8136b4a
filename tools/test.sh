#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. Release build + every CTest test (unit tests, golden conformance, CLI tests);
#   2. ASan+UBSan build (clang) of the same tests and of the libFuzzer targets, which then run for a
#      bounded time each: safetensors header parser, reply parser, image decoders.
# Environment: DS41_FUZZ_SECONDS (header fuzzer, default 30), DS41_REPLY_FUZZ_SECONDS (default 15),
# DS41_IMAGE_FUZZ_SECONDS (default 15), DS41_SKIP_SANITIZE=1 to skip step 2.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
# Test oracles from PyPI: the official openai client drives `ds41 serve`.
python3 -c "import openai" 2>/dev/null || python3 -m pip install --quiet openai ||
  echo "warning: could not install the openai package; its server test will be skipped" >&2
# ... jsonschema validates its structured-output answers; selenium drives chromium over the chat page.
python3 -c "import jsonschema" 2>/dev/null || python3 -m pip install --quiet jsonschema ||
  echo "warning: could not install the jsonschema package; the server test will fail" >&2
python3 -c "import selenium" 2>/dev/null || python3 -m pip install --quiet selenium ||
  echo "warning: could not install the selenium package; the chat page test will be skipped" >&2
jobs=$(nproc)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

echo "== release build + tests"
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

if [[ "${DS41_SKIP_SANITIZE:-0}" != 1 ]]; then
  # One sanitizer build serves the tests and the fuzzers: clang compiles it (a third less time
  # than GCC with the same sanitizers, and libFuzzer needs clang), so the engine is compiled twice
  # in CI, not three times. -O1 -g1 (line tables): the level the sanitizers recommend. Without
  # clang the tests still run under GCC's sanitizers and the fuzzers are skipped.
  sanitizer_compilers=() fuzz=OFF fuzz_label="" cxx=c++
  if command -v clang++ >/dev/null; then
    cxx=$(command -v clang++)
    sanitizer_compilers=(-DCMAKE_C_COMPILER="$(command -v clang)" -DCMAKE_CXX_COMPILER="$cxx") fuzz=ON fuzz_label=" + fuzzers"
  else
    echo "warning: clang++ not found: sanitizer build with the default compiler, fuzzers skipped" >&2
  fi
  # A build-asan configured with another compiler (older versions of this script used GCC) starts
  # afresh: CMake would drop the options given here along with its cache.
  cached_cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build-asan/CMakeCache.txt 2>/dev/null || true)
  if [[ -n $cached_cxx && $cached_cxx != "$cxx" && ${#sanitizer_compilers[@]} -gt 0 ]]; then
    echo "build-asan was configured with $cached_cxx: removing it for $cxx" >&2
    rm -rf build-asan
  fi
  echo "== ASan+UBSan build + tests$fuzz_label"
  cmake -S . -B build-asan "${generator[@]}" "${sanitizer_compilers[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDS41_SANITIZE=ON -DDS41_FUZZ="$fuzz" -DDS41_BUILD_SLOW_TESTS=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow

  if [[ $fuzz == ON ]]; then
    # target, seconds: the header parser guards untrusted files, the reply parser untrusted model
    # output, the image decoders untrusted images.
    for run in "safetensors_header ${DS41_FUZZ_SECONDS:-30}" "reply_parser ${DS41_REPLY_FUZZ_SECONDS:-15}" \
               "image_decode ${DS41_IMAGE_FUZZ_SECONDS:-15}"; do
      read -r target seconds <<<"$run"
      echo "== fuzz: $target (${seconds}s)"
      corpus=$(mktemp -d)
      cp fuzz/corpus/"$target"/* "$corpus"/
      dict=()
      [[ -f fuzz/$target.dict ]] && dict=(-dict="fuzz/$target.dict")
      build-asan/"${target}_fuzz" "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 "$corpus" 2>&1 | tail -n 5
      rm -rf "$corpus"
    done
  fi
fi
echo "== all tests passed"
