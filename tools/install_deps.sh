#!/usr/bin/env bash
# Installs the Debian packages ds41 builds and tests with (chromium and its driver: the chat page's
# browser test). Safe to re-run; does nothing when
# everything is already present. Needs root (or sudo) only when something is missing.
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libicu-dev libpcre2-dev zlib1g-dev libpng-dev libjpeg-dev libwebp-dev libgtest-dev clang libclang-rt-14-dev libboost-dev libedit-dev libsleef-dev openmpi-bin libopenmpi-dev
  chromium chromium-driver)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install_deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
