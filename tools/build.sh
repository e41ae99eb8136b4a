#!/usr/bin/env bash
# Configure and build ds41 (Release) into build/. Usage: tools/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
