#!/usr/bin/env bash
# Installs what the project needs beyond the Rust toolchain the machine
# ships with. Safe to run repeatedly; does nothing that is already done.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found; install Rust (rustup) first" >&2
    exit 1
fi

# Fonts for the benchmark plots' text (the plots are written without text
# when no font is found, so this is best effort).
if [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq fonts-dejavu-core) >/dev/null 2>&1 \
        || echo "setup: could not install fonts-dejavu-core; plots will have no text" >&2
fi
