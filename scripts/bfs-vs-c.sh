#!/usr/bin/env bash
# The CLI's BFS loop against the C example's, in one run: REPS rounds, each
# running `faultline bfs --mode mmap` and `bfs_umap --compare --reps 1`
# (the C loop over mmap, then through libumap's umap()), alternating so
# that load changes hit every column alike. Prints every round, then the
# medians and the ratios CLI/C (both over mmap) and umap/mmap (both C).
#
#   scripts/bfs-vs-c.sh GRAPH [REPS=5] [THREADS=2]
#
# Builds target/release/faultline and installs libumap with
# `scripts/c-install.sh` into a temporary prefix (release builds), unless
# FAULTLINE (a faultline binary) and C_PREFIX (an installed prefix) are
# given; compiles the example with `cc -O3`. On a shared machine, build
# first and run the measurement under `flock -x /work/cpu.lock`; where
# other work ignores that lock, `chrt -f 10` (as root) keeps it from
# varying the runs by up to 2x (issue 16's round-3 numbers were taken so).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 3 ]; then
    echo "usage: $0 GRAPH [REPS] [THREADS]" >&2
    exit 2
fi
graph=$1
reps=${2:-5}
threads=${3:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

faultline=${FAULTLINE:-}
if [ -z "$faultline" ]; then
    (cd "$root" && cargo build --release -q -p faultline-cli)
    faultline="$root/target/release/faultline"
fi
prefix=${C_PREFIX:-}
if [ -z "$prefix" ]; then
    prefix="$work/prefix"
    bash "$root/scripts/c-install.sh" "$prefix" >/dev/null
fi
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -O3 -o "$work/bfs_umap" "$root/examples/c/bfs_umap.c" $(pkg-config --cflags --libs umap) -lpthread \
    -Wl,-rpath,"$prefix/lib"

median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
: > "$work/cli" ; : > "$work/cmmap" ; : > "$work/cumap"
for r in $(seq 1 "$reps"); do
    "$faultline" bfs "$graph" --mode mmap --threads "$threads" --reps 1 \
        --json "$work/run.json" >/dev/null
    cli=$(sed -n 's/.*"seconds":\([0-9.e+-]*\).*/\1/p' "$work/run.json" | head -1)
    out=$("$work/bfs_umap" "$graph" --compare --reps 1 --threads "$threads")
    cm=$(sed -n 's/^rep 0: mmap \([0-9.]*\) s, umap \([0-9.]*\) s$/\1/p' <<<"$out")
    cu=$(sed -n 's/^rep 0: mmap \([0-9.]*\) s, umap \([0-9.]*\) s$/\2/p' <<<"$out")
    echo "round $r: faultline bfs (mmap) $cli s, C (mmap) $cm s, C (umap) $cu s"
    echo "$cli" >> "$work/cli"; echo "$cm" >> "$work/cmmap"; echo "$cu" >> "$work/cumap"
done
cli=$(median < "$work/cli"); cm=$(median < "$work/cmmap"); cu=$(median < "$work/cumap")
echo "medians over $reps rounds, $threads threads: faultline bfs (mmap) $cli s, C (mmap) $cm s, C (umap) $cu s"
awk -v a="$cli" -v b="$cm" -v c="$cu" 'BEGIN {printf "CLI/C over mmap %.3fx; C umap/mmap %.3fx\n", a / b, c / b}'
