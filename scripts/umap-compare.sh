#!/usr/bin/env bash
# UMap's own pfbenchmark, unchanged, against a UMap build and against our
# libumap, in one run: write then read of 256 MiB (MIB), shuffled and
# sequential, 4 KiB and 64 KiB pages, UMAP_BUFSIZE at 10% and 50% of the
# data, and the kernel's mmap (pfbenchmark --usemmap) beside them. Runs
# alternate UMap / ours / mmap within each repetition; prints the median
# wall time per page (pfbenchmark's own figure) and ours against UMap's.
#
#   scripts/umap-compare.sh UMAP_SRC UMAP_PREFIX [REPS]
#
#   UMAP_SRC     a UMap source tree (tests/pfbenchmark/pfbenchmark.cpp and
#                tests/utility/*.hpp are compiled from it; nothing of it is
#                in this repository)
#   UMAP_PREFIX  where that UMap is installed (lib/libumap.so,
#                include/umap/umap.h)
#   REPS         repetitions per configuration (default 3)
#
# Environment: DIR (data file directory, default /tmp: its file system is
# the one measured), MIB (data size, default 256), THREADS (default 2),
# PSIZES (UMap page sizes, default "4096 65536"), BASE (an install prefix
# of another build of ours, e.g. main's: run in the same repetitions,
# with its own columns: base and base/ours),
# LOCK (a file to flock around the
# timed runs, e.g. /work/cpu.lock), OURS (an install prefix of ours to use
# instead of building one with scripts/c-install.sh).
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    sed -n '2,20p' "$0" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
src=$1
real=$2
reps=${3:-3}
dir=${DIR:-/tmp}
threads=${THREADS:-2}
mib=${MIB:-256}
work=$(mktemp -d "${TMPDIR:-/tmp}/umap-compare.XXXXXX")
trap 'rm -rf "$work"' EXIT

bench=$src/tests/pfbenchmark/pfbenchmark.cpp
[ -f "$bench" ] || { echo "no $bench" >&2; exit 2; }
[ -f "$real/include/umap/umap.h" ] || { echo "no $real/include/umap/umap.h" >&2; exit 2; }

ours=${OURS:-}
if [ -z "$ours" ]; then
    ours=$work/ours
    bash "$root/scripts/c-install.sh" "$ours" >/dev/null
fi

# pfbenchmark-write and -read of one build: the program decides its mode
# from its name.
build() {
    local prefix=$1 out=$2
    mkdir -p "$out"
    for mode in read write; do
        g++ -O2 -fopenmp -std=c++14 -I"$prefix/include" "$bench" -o "$out/pfbenchmark-$mode" \
            -L"$prefix/lib" -lumap -Wl,-rpath,"$prefix/lib" -lpthread
    done
}
build "$real" "$work/umap"
build "$ours" "$work/faultline"
base=${BASE:-}
[ -n "$base" ] && build "$base" "$work/base"

file=$dir/umap-compare-$$.bin
trap 'rm -rf "$work" "$file"' EXIT

# One write + read pair: prints "WRITE_NS READ_NS". The data file's file
# system is synced first, so what the previous run left it to do is not
# charged to this one: unsynced, our 4 KiB sequential write at 50% ran
# 0.62-0.85x as fast right after UMap's pair as right after mmap's (same
# build, 5 of 5 repetitions), and with the builds in a fixed order that
# read as a regression of ours (always after UMap) against the base
# build (always after mmap).
pair() {
    local bin=$1 pages=$2 buf=$3 psize=$4 shuffle=$5 extra=${6:-}
    local w r
    sync -f "${file%/*}"
    # A run that fails (crashes, checks fail) counts as "fail".
    w=$(UMAP_BUFSIZE=$buf UMAP_PAGESIZE=$psize timeout 900 "$bin/pfbenchmark-write" -p "$pages" \
        -t "$threads" -f "$file" $shuffle $extra 2>/dev/null | awk -F, '/,write,/ {print $6}') || true
    r=$(UMAP_BUFSIZE=$buf UMAP_PAGESIZE=$psize timeout 900 "$bin/pfbenchmark-read" -p "$pages" \
        -t "$threads" -f "$file" --noinit $shuffle $extra 2>/dev/null | awk -F, '/,read,/ {print $6}') || true
    echo "${w:-fail} ${r:-fail}"
}

# The median of the numbers read (failed runs left out), or "fail".
median() { grep -v fail | sort -n | awk '{a[NR]=$1} END {print NR ? a[int((NR+1)/2)] : "fail"}'; }
ratio() { if [ "$1" = fail ] || [ "$2" = fail ]; then echo "-"; else echo "scale=2; $1 / $2" | bc -l; fi; }

locked() {
    if [ -n "${LOCK:-}" ]; then flock -x "$LOCK" "$@"; else "$@"; fi
}

echo "load: $(cut -d' ' -f1-3 /proc/loadavg); data in $dir ($(stat -f -c %T "$dir")); $threads threads; $reps reps"
printf '%-6s %-8s %-6s %-6s %10s %10s %10s %8s' page order buffer phase umap ours mmap "umap/ours"
[ -n "$base" ] && printf ' %10s %9s' base "base/ours"
echo
for psize in ${PSIZES:-4096 65536}; do
    pages=$(( (mib << 20) / psize ))
    for shuffle in --shuffle ""; do
        order=${shuffle:+shuffled}; order=${order:-seq}
        for pct in 10 50; do
            buf=$(( pages * pct / 100 ))
            : > "$work/u"; : > "$work/o"; : > "$work/m"; : > "$work/b"
            # Each repetition starts one build later, so no build always
            # runs after the same other one.
            runs=("pair $work/umap $pages $buf $psize '$shuffle' >> $work/u"
                "pair $work/faultline $pages $buf $psize '$shuffle' >> $work/o"
                "pair $work/faultline $pages $buf $psize '$shuffle' --usemmap >> $work/m")
            [ -n "$base" ] && runs+=("pair $work/base $pages $buf $psize '$shuffle' >> $work/b")
            for rep in $(seq "$reps"); do
                cmd=
                for i in "${!runs[@]}"; do
                    cmd+="${runs[$(( (i + rep - 1) % ${#runs[@]} ))]}; "
                done
                locked bash -c "$(declare -f pair); file=$file threads=$threads; $cmd"
            done
            for k in 1 2; do
                phase=$([ $k = 1 ] && echo write || echo read)
                u=$(cut -d' ' -f$k "$work/u" | median)
                o=$(cut -d' ' -f$k "$work/o" | median)
                m=$(cut -d' ' -f$k "$work/m" | median)
                printf '%-6s %-8s %-6s %-6s %10s %10s %10s %8s' "$((psize >> 10))K" "$order" \
                    "$pct%" "$phase" "$u" "$o" "$m" "$(ratio "$u" "$o")"
                if [ -n "$base" ]; then
                    b=$(cut -d' ' -f$k "$work/b" | median)
                    printf ' %10s %9s' "$b" "$(ratio "$b" "$o")"
                fi
                echo
            done
        done
    done
done
echo "(ns per page, medians; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
