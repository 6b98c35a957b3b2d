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
# C++ compiler and pkg-config. The tests install both libraries with the
# project's own scripts/c-install.sh (no tool built from source).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    missing=""
    command -v gcc >/dev/null 2>&1 || missing="$missing gcc"
    command -v g++ >/dev/null 2>&1 || missing="$missing g++"
    command -v pkg-config >/dev/null 2>&1 || missing="$missing pkgconf"
    if [ -n "$missing" ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null 2>&1 \
            || echo "setup: could not install:$missing (the C tests skip without gcc/g++/pkg-config)" >&2
    fi
fi

# cargo-c (`cargo cinstall`) is the packaging path for distributors, not
# needed here: it is never built from source by this script (it embeds its
# own Cargo, which must read Cargo.lock v4, so Debian's 0.9.14 cannot; a
# cargo-c >= 0.10 built with `cargo install --locked cargo-c` took 53-72
# min wall on the busy 2-vCPU machine). Where one is installed, the two
# `cargo cinstall` tests (faultline-capi's c_abi, umap's umap_c) run; where
# not, they print `skipping: no cargo-c >= 0.10` and pass.
cargo_c_version=$(cargo cinstall --version 2>/dev/null | sed -n 's/^cargo-c[^0-9]*\([0-9][0-9.]*\).*/\1/p' | head -1 || true)
case "$cargo_c_version" in
    0.[0-9].*|"")
        echo "setup: no cargo-c >= 0.10 (found: ${cargo_c_version:-none}); the cargo cinstall tests will be skipped (optional: cargo install --locked cargo-c)" >&2
        ;;
    *)
        echo "setup: cargo-c $cargo_c_version found; the cargo cinstall tests will run" >&2
        ;;
esac

# The Python package (crates/faultline-py): a project-local virtual
# environment, .venv/ (git-ignored), with maturin (builds the wheel),
# NumPy and pytest from PyPI. Needs Python 3.11+ (`python3`, or $PYTHON);
# Debian's python3 needs python3-venv for `-m venv`. Skipped when .venv
# already has them. Measured on the 2-vCPU machine (load 7): 43-61 s
# into a new .venv, 1.6 s when it is there.
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
if ! "$venv/bin/python" -c 'import numpy, pytest' >/dev/null 2>&1 || ! "$venv/bin/maturin" --version >/dev/null 2>&1; then
    if ! command -v "$py" >/dev/null 2>&1 || ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "setup: the Python package needs Python 3.11 or later as $py (set PYTHON to another)" >&2
        exit 1
    fi
    if ! "$py" -m venv "$venv" >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv) >/dev/null 2>&1 || true
        fi
        "$py" -m venv "$venv" || { echo "setup: could not create $venv (python3 -m venv)" >&2; exit 1; }
    fi
    "$venv/bin/python" -m pip install -q --upgrade pip \
        && "$venv/bin/python" -m pip install -q "maturin>=1.9.4,<2" "numpy>=1.24" "pytest>=7" \
        || { echo "setup: could not install maturin, numpy and pytest into $venv" >&2; exit 1; }
fi
