#!/usr/bin/env bash
# Quick start: install dependencies, build, then run the engine on the built-in demo model
# (a random-weight `tiny` checkpoint with a byte-level tokenizer, written to ~/.cache/ds41/tiny on
# first use), which answers a fixed text prompt unless -p/-f/--tokens is given.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
exec build/ds41 run "$@"
