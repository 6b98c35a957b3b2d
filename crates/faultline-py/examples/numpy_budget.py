"""Column means of a float64 table larger than this process's memory
budget, paged from a file and from Redis, beside numpy.memmap on the same
data.

    python crates/faultline-py/examples/numpy_budget.py [--size 1GiB] [--budget 64MiB] [--no-redis]

The table (``--size`` bytes, 128 columns) is written to a temporary file
and, for the Redis run, put in a ``redis-server`` the script starts on a
unix socket (and stops). Each run computes ``table.mean(axis=0)`` and
reports the time and how much of the table was resident at most: for
faultline the region's own count (``stats()["eviction"]["max_resident"]``),
which the budget bounds; for numpy.memmap the peak of the process's
resident file pages, which only the kernel's reclaim bounds.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time

import numpy as np

import faultline
from faultline.testing import RedisServer

COLS = 128


def size_arg(s: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(|k|m|g)i?b?\s*", s.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r}: expected e.g. 64MiB or 1GiB")
    return int(float(m[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m[2]])


def rss_file_kib() -> int:
    """Resident file-backed pages of this process (what numpy.memmap maps)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    return 0


def peak_while(fn, sample):
    """Runs fn() while a thread samples `sample()` every millisecond
    (NumPy releases the GIL inside its reduction loops); returns fn's
    value and the largest sample."""
    peak = [sample()]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak.append(sample())
            time.sleep(0.001)

    t = threading.Thread(target=watch)
    t.start()
    try:
        value = fn()
    finally:
        done.set()
        t.join(timeout=10)
    return value, max(peak)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=size_arg, default=size_arg("1GiB"), help="bytes of the table (default 1GiB)")
    ap.add_argument("--budget", type=size_arg, default=size_arg("64MiB"), help="faultline's resident budget (default 64MiB)")
    ap.add_argument("--no-redis", action="store_true", help="skip the Redis run")
    args = ap.parse_args()
    rows = args.size // (8 * COLS)
    if rows < 1 or args.budget < 64 << 10:
        ap.error("the table needs at least one row and the budget one 64 KiB page")

    with tempfile.TemporaryDirectory(prefix="faultline-example-", dir="/var/tmp") as d:
        path = os.path.join(d, "table.f64")
        print(f"writing a {rows} x {COLS} float64 table ({rows * COLS * 8 >> 20} MiB) to {path}")
        rng = np.random.default_rng(0)
        with open(path, "wb") as f:
            for i in range(0, rows, 1 << 14):
                (rng.standard_normal((min(1 << 14, rows - i), COLS)) + np.arange(COLS)).tofile(f)
        results = []

        # numpy.memmap: the kernel's page cache, no budget of its own.
        t = time.perf_counter()
        table = np.memmap(path, np.float64, "r", shape=(rows, COLS))
        before = rss_file_kib()
        means, peak = peak_while(lambda: table.mean(axis=0), rss_file_kib)
        del table
        results.append(("numpy.memmap (file)", time.perf_counter() - t, (peak - before) << 10, means))

        # faultline over the file, at most about `budget` resident.
        def region_run(name: str, store: faultline.Store) -> None:
            t = time.perf_counter()
            # 64 KiB pages: under a budget each page is evicted on its own
            # (a zap and, for a handler-thread engine, a round trip with
            # it), so fewer, larger pages evict far faster than 4 KiB ones.
            with faultline.Region(store=store, budget=args.budget, page_size=64 << 10) as r:
                table = r.as_array(np.float64, shape=(rows, COLS))
                means = table.mean(axis=0)
                del table
                st = r.stats()
            results.append((name, time.perf_counter() - t, st["eviction"]["max_resident"] * st["page_size"], means))

        region_run("faultline FileStore", faultline.FileStore(path))

        if not args.no_redis:
            with RedisServer() as server:
                url = server.url("table")
                t = time.perf_counter()
                faultline.RedisStore.put(url, path)
                print(f"put the table in redis-server (pid {server.pid}) in {time.perf_counter() - t:.1f} s")
                region_run("faultline RedisStore", faultline.RedisStore(url))

    print(f"\ncolumn means of {rows * COLS * 8 >> 20} MiB, faultline budget {args.budget >> 20} MiB")
    print(f"{'':<22} {'seconds':>8} {'peak resident':>14}  first means")
    for name, secs, resident, means in results:
        print(f"{name:<22} {secs:8.2f} {resident / (1 << 20):11.1f} MiB  {np.round(means[:4], 3)}")
    ref = results[0][3]
    for name, _, _, means in results[1:]:
        if not np.allclose(means, ref):
            print(f"{name}: the means differ from numpy.memmap's", file=sys.stderr)
            return 1
    print("every run computed the same means")
    return 0


if __name__ == "__main__":
    sys.exit(main())
