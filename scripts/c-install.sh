#!/usr/bin/env bash
# Installs libfaultline and libumap (shared and static libraries, headers,
# pkg-config files) under PREFIX, the layout `cargo cinstall` produces.
#
#   scripts/c-install.sh PREFIX            # cargo build --release, then install
#   scripts/c-install.sh PREFIX BUILD_DIR  # install what is already built there
#                                          # (the tests use target/debug)
#
# Then: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs faultline
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 PREFIX [BUILD_DIR]" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$1
build=${2:-}
explicit=$build
if [ -z "$build" ]; then
    packages="-p faultline-capi"
    [ -d "$root/crates/umap" ] && packages="$packages -p umap"
    (cd "$root" && cargo build --release -q $packages)
    build="$root/target/release"
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
major=${version%%.*}
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include/faultline" "$prefix/include/umap/store"

# name in the build dir, installed name
install_lib() {
    local built=$1 name=$2
    if [ ! -e "$build/lib$built.so" ] && [ -n "$explicit" ]; then
        echo "c-install: $build/lib$built.so is not built; skipping lib$name" >&2
        return 0
    fi
    install -m 0755 "$build/lib$built.so" "$prefix/lib/lib$name.so.$version"
    ln -sf "lib$name.so.$version" "$prefix/lib/lib$name.so.$major"
    ln -sf "lib$name.so.$major" "$prefix/lib/lib$name.so"
    install -m 0644 "$build/lib$built.a" "$prefix/lib/lib$name.a"
}
install_lib faultline_capi faultline
install_lib umap umap
install -m 0644 "$root/crates/faultline-capi/include/faultline/faultline.h" "$prefix/include/faultline/"
if [ -e "$prefix/lib/libumap.so" ]; then
    install -m 0644 "$root/crates/umap/include/umap/umap.h" "$prefix/include/umap/"
    install -m 0644 "$root/crates/umap/include/umap/store/Store.hpp" \
        "$root/crates/umap/include/umap/store/SparseStore.h" "$prefix/include/umap/store/"
fi

# What a static link of a Rust library needs besides it.
private="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
pc() {
    local name=$1 desc=$2
    cat > "$prefix/lib/pkgconfig/$name.pc" <<PC
prefix=$prefix
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: $name
Description: $desc
Version: $version
Libs: -L\${libdir} -l$name
Libs.private: $private
Cflags: -I\${includedir}
PC
}
pc faultline "User-space page faults (userfaultfd): engines, regions, stores"
if [ -e "$prefix/lib/libumap.so" ]; then
    pc umap "UMap's API (umap, uunmap, umap_flush, Umap::Store) over faultline"
fi
