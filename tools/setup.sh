#!/usr/bin/env bash
# Quick start: install dependencies, build, then run the engine on the built-in demo model
# (a random-weight `tiny` checkpoint written to ~/.cache/ds41/tiny on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
exec build/ds41 run "$@"
