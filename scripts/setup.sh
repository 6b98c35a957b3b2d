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

# redis-server and redis-cli: the Redis store's tests and `faultline bench
# store` start their own servers (a unix socket in a temporary directory, a
# 3-master cluster on loopback). Required: the tests fail without it.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null \
            || { echo "setup: could not install redis-server" >&2; exit 1; }
        # The Debian package starts a system service; the tests start their
        # own servers and do not need it.
        if command -v systemctl >/dev/null 2>&1; then
            systemctl disable --now redis-server >/dev/null 2>&1 || true
        fi
    else
        echo "setup: redis-server is missing; install it (apt-get install redis-server)" >&2
        exit 1
    fi
fi

# The C side (libfaultline, libumap, their C/C++ tests and examples): a C and
# C++ compiler, pkg-config, and cargo-c for `cargo cinstall`.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    missing=""
    command -v gcc >/dev/null 2>&1 || missing="$missing gcc"
    command -v g++ >/dev/null 2>&1 || missing="$missing g++"
    command -v pkg-config >/dev/null 2>&1 || missing="$missing pkgconf"
    command -v cargo-cbuild >/dev/null 2>&1 || missing="$missing cargo-c"
    if [ -n "$missing" ]; then
        (apt-get update -qq && apt-get install -y -qq $missing) >/dev/null 2>&1 \
            || echo "setup: could not install:$missing (the C tests skip without gcc/g++/pkg-config)" >&2
    fi
fi
# cargo-c embeds its own copy of Cargo. Debian's (0.9.14, Cargo 0.66) cannot
# read this workspace's Cargo.lock (version 4, Cargo >= 1.78), so the C tests
# and `scripts/c-install.sh` build with plain `cargo build` and install the
# same layout (measured: `cargo cbuild` fails with "lock file version `4`
# was found, but this version of Cargo does not understand this lock
# file"); a newer cargo-c (`cargo install cargo-c`) runs
# `cargo cinstall -p faultline-capi` directly.
