"""faultline beside numpy.memmap on the same data: ``python -m faultline.bench``.

Each case maps the data afresh for every repetition (so every page is
touched for the first time), runs one NumPy computation over it, and
times mapping + computation + unmapping. The baseline and faultline
alternate within each repetition, and the table reports the median of
each and their ratio (faultline / baseline: above 1 is slower):

====================  ======================================================
case                  what is timed
====================  ======================================================
seq-sum warm          ``a.sum()`` over the whole array, the file's pages in
                      the page cache; beside it the floors of copying the
                      data in: the region with every page installed first
                      (``Region.prefetch``, no fault) and ``numpy.fromfile``
                      (``read(2)`` into fresh memory); the region without
                      its populator (``run_ahead=0``; not with
                      ``--engine signal``, which runs none); and, when the
                      system's huge page pool has room for the array, the
                      region over 2 MiB pages (``memory="hugetlb"``)
seq-sum resident      a second ``a.sum()`` on the same mapping (every page
                      already mapped)
gather warm           ``a[idx].sum()`` for random indices (one page in
                      ``--gather-every`` pages touched, in order: a strided
                      stream), page cache warm; with ``fault_around=1``,
                      and without the populator
seq-sum cold          as "seq-sum warm" after dropping the file's page cache
                      (``posix_fadvise(DONTNEED)``): the disk read is timed
gather cold           as "gather warm", page cache dropped
seq-sum tmpfs         the same file copied to ``--tmpfs-dir`` (/dev/shm):
                      faultline maps its page cache without a copy
                      (``UFFDIO_CONTINUE``)
redis seq-sum         a Redis-backed region (a ``redis-server`` started on a
                      unix socket) against the file-backed region
redis gather          the same, random gather
python seq-sum        a store written in Python (``os.pread``, in its store
                      process) against the file-backed region
====================  ======================================================

Targets: "seq-sum warm" within 1.3x of numpy.memmap, "redis seq-sum"
within 2x of the file-backed region. ``--json F`` writes every sample,
the medians, the load average before and after, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

import faultline
from faultline.testing import RedisServer, drop_page_cache, huge_pages_free

T = time.perf_counter


def parse_size(s: str) -> int:
    units = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
    t = s.strip().lower()
    j = 0
    while j < len(t) and (t[j].isdigit() or t[j] == "."):
        j += 1
    num, unit = t[:j], t[j:].strip()
    if not num or unit not in units:
        raise argparse.ArgumentTypeError(f"bad size {s!r}: expected e.g. 512MiB or 1GiB")
    n = int(float(num) * units[unit])
    if n < 1 << 20:
        raise argparse.ArgumentTypeError(f"size {s!r} is below 1 MiB")
    return n


class FileBacked:
    """A Python store reading a file with os.pread (opened in its store
    process)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "fd": None}

    def __len__(self) -> int:
        return os.path.getsize(self.path)

    def fill(self, offset: int, buf: memoryview) -> None:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self.fd, len(buf), offset)
        buf[: len(data)] = data


#: A timed run: returns (seconds, the value computed).
Run = Callable[[], "tuple[float, float]"]
#: The computation over an array: returns its value.
Work = Callable[[np.ndarray], float]


def timed(work: Work, second_pass: bool) -> Callable[[np.ndarray], "tuple[float, float]"]:
    """`work` timed alone, on its second pass when `second_pass` (every
    page then mapped)."""

    def run(a: np.ndarray) -> tuple[float, float]:
        if second_pass:
            work(a)
        t = T()
        v = work(a)
        return T() - t, v

    return run


def memmap_run(path: str, work: Work, second_pass: bool = False) -> Run:
    """numpy.memmap of `path`: map, compute, unmap (timed together), or
    the second pass alone."""

    def run() -> tuple[float, float]:
        t = T()
        a = np.memmap(path, np.float64, "r")
        dt, v = timed(work, second_pass)(a)
        del a
        return (dt if second_pass else T() - t), v

    return run


def region_run(store: Callable[[], Any], work: Work, engine: str | None, second_pass: bool = False, **kw: Any) -> Run:
    """A region over `store()` (more Region arguments in `kw`): map,
    compute, unmap (timed together), or the second pass alone."""

    def run() -> tuple[float, float]:
        t = T()
        with faultline.Region(store=store(), engine=engine, **kw) as r:
            a = r.as_array(np.float64)
            dt, v = timed(work, second_pass)(a)
            del a
        return (dt if second_pass else T() - t), v

    return run


def fromfile_run(path: str, work: Work) -> Run:
    """numpy.fromfile of `path` (read(2) into a fresh array: the kernel
    allocates and zeroes each page, then copies the page cache into it),
    compute, free: the floor for any design that copies the data into
    the process's own memory, as a region over a regular file must."""

    def run() -> tuple[float, float]:
        t = T()
        a = np.fromfile(path, np.float64)
        v = work(a)
        del a
        return T() - t, v

    return run


def installed_run(store: Callable[[], Any], work: Work, engine: str | None) -> Run:
    """A region over `store()` with every page installed up front
    (`Region.prefetch`: the same copies in large batches, no fault),
    then computed over, unmapped: the region's own copy floor."""

    def run() -> tuple[float, float]:
        t = T()
        with faultline.Region(store=store(), engine=engine) as r:
            r.prefetch()
            a = r.as_array(np.float64)
            v = work(a)
            del a
        return T() - t, v

    return run


def free_page_reporting() -> bool | None:
    """Whether this guest reports freed memory to its host (a virtio-balloon
    device with VIRTIO_BALLOON_F_REPORTING, feature bit 5): the host drops
    it, and a run that allocates what an earlier one freed pays a host
    fault per page, as system time. None without a balloon device."""
    base = "/sys/bus/virtio/drivers/virtio_balloon"
    found = None
    try:
        devices = [d for d in os.listdir(base) if d.startswith("virtio")]
    except OSError:
        return None
    for d in devices:
        try:
            with open(os.path.join(base, d, "features")) as f:
                bits = f.read()
        except OSError:
            continue
        found = bool(found) or bits[5:6] == "1"
    return found


def measure(name: str, runs: dict[str, Run], reps: int, before: Callable[[], None] | None) -> dict[str, Any]:
    """Alternates the runs `reps` times (`before` ahead of each); returns
    the samples (seconds) and the value each computed."""
    samples: dict[str, list[float]] = {k: [] for k in runs}
    values: dict[str, float] = {}
    for _ in range(reps):
        for k, run in runs.items():
            if before is not None:
                before()
            dt, v = run()
            samples[k].append(dt)
            values.setdefault(k, v)
    return {"case": name, "samples": samples, "values": values}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m faultline.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("512MiB"), help="bytes of float64 data (default 512MiB)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each case (median reported; default 5)")
    ap.add_argument("--dir", default=None, help="where the data file goes (default: a temporary directory in /var/tmp)")
    ap.add_argument("--tmpfs-dir", default="/dev/shm", help="tmpfs directory for the tmpfs case ('' to skip)")
    ap.add_argument("--gather-every", type=int, default=16, help="gather: one random element per this many pages (default 16)")
    ap.add_argument("--engine", default=None, help="faultline engine (default: the store's default)")
    ap.add_argument("--no-redis", action="store_true", help="skip the Redis cases")
    ap.add_argument("--no-python", action="store_true", help="skip the Python-store case")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache cases")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.json:
        # Fail now, not after the run.
        with open(args.json, "a"):
            pass

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    n = args.size // 8
    workdir = tempfile.mkdtemp(prefix="faultline-bench-", dir=args.dir or "/var/tmp")
    path = os.path.join(workdir, "data.f64")
    cleanup = [lambda: shutil.rmtree(workdir, ignore_errors=True)]
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    try:
        say(f"writing {args.size >> 20} MiB of float64 to {path}")
        rng = np.random.default_rng(1)
        with open(path, "wb") as f:
            step = 1 << 24
            for i in range(0, n, step):
                rng.standard_normal(min(step, n - i)).tofile(f)
            f.flush()
            os.fsync(f.fileno())
        pages = args.size // 4096
        idx = np.sort(rng.choice(n, size=max(1, pages // args.gather_every), replace=False))
        seq = lambda a: float(a.sum())  # noqa: E731
        gather = lambda a: float(a[idx].sum())  # noqa: E731
        file_store = lambda: faultline.FileStore(path)  # noqa: E731
        eng = args.engine

        def case(name: str, runs: dict[str, Run], before: Callable[[], None] | None = None, **meta: Any) -> None:
            r = measure(name, runs, args.reps, before)
            r.update(meta)
            vals = list(r["values"].values())
            if not all(np.isclose(v, vals[0]) for v in vals):
                raise AssertionError(f"{name}: the runs computed different values: {r['values']}")
            med = {k: statistics.median(v) for k, v in r["samples"].items()}
            base, *others = list(med)
            r["median"] = med
            r["ratio"] = {k: med[k] / med[base] for k in others}
            results.append(r)
            for k in others:
                say(f"{name:<18} {base} {med[base] * 1e3:8.1f} ms   {k} {med[k] * 1e3:8.1f} ms   ratio {r['ratio'][k]:.2f}")

        # Beside the target, the floors of copying the data in: the region
        # with every page installed before the sum (no fault), and
        # numpy.fromfile (the kernel's read(2) into fresh memory).
        warm_runs = {"memmap": memmap_run(path, seq), "faultline": region_run(file_store, seq, eng),
                     "installed first": installed_run(file_store, seq, eng),
                     "numpy.fromfile": fromfile_run(path, seq)}
        if eng != "signal":
            # The default runs a populator ahead of a stream (run_ahead):
            # the same region without it.
            warm_runs["run_ahead=0"] = region_run(file_store, seq, eng, run_ahead=0)
        huge_needed = -(-args.size // (2 << 20))
        if huge_pages_free() >= huge_needed:
            warm_runs["hugetlb"] = region_run(file_store, seq, eng, memory="hugetlb")
        else:
            say(f"no hugetlb row: it needs {huge_needed} free 2 MiB pages (/proc/sys/vm/nr_hugepages), {huge_pages_free()} are")
        case("seq-sum warm", warm_runs, target=1.3)
        case("seq-sum resident", {"memmap": memmap_run(path, seq, second_pass=True),
                                  "faultline": region_run(file_store, seq, eng, second_pass=True)})
        # Random access with the default fault-around (16 pages copied per
        # fault) and with one page per fault.
        gather_runs = {"memmap": memmap_run(path, gather), "faultline": region_run(file_store, gather, eng),
                       "fault_around=1": region_run(file_store, gather, eng, fault_around=1)}
        if eng != "signal":
            gather_runs["run_ahead=0"] = region_run(file_store, gather, eng, run_ahead=0)
        case("gather warm", gather_runs)
        if not args.no_cold:
            drop = lambda: drop_page_cache(path)  # noqa: E731
            case("seq-sum cold", {"memmap": memmap_run(path, seq), "faultline": region_run(file_store, seq, eng)}, before=drop)
            case("gather cold", {"memmap": memmap_run(path, gather), "faultline": region_run(file_store, gather, eng),
                                 "fault_around=1": region_run(file_store, gather, eng, fault_around=1)}, before=drop)
        if args.tmpfs_dir:
            free = shutil.disk_usage(args.tmpfs_dir).free
            if free < 2 * args.size:
                say(f"skipping the tmpfs case: {args.tmpfs_dir} has {free >> 20} MiB free")
            else:
                shm = os.path.join(args.tmpfs_dir, f"faultline-bench-{os.getpid()}.f64")
                shutil.copyfile(path, shm)
                cleanup.append(lambda: os.path.exists(shm) and os.unlink(shm))
                case("seq-sum tmpfs", {"memmap": memmap_run(shm, seq),
                                       "faultline": region_run(lambda: faultline.FileStore(shm), seq, eng)})
        if not args.no_redis:
            server = RedisServer()
            cleanup.append(server.stop)
            say(f"putting the data in redis-server (pid {server.pid})")
            url = server.url("bench")
            faultline.RedisStore.put(url, path)
            redis_store = lambda: faultline.RedisStore(url)  # noqa: E731
            redis_eng = eng if eng != "signal" else None
            case("redis seq-sum", {"file region": region_run(file_store, seq, redis_eng),
                                   "redis region": region_run(redis_store, seq, redis_eng)}, target=2.0)
            case("redis gather", {"file region": region_run(file_store, gather, redis_eng),
                                  "redis region": region_run(redis_store, gather, redis_eng)})
        if not args.no_python:
            py_store = faultline.PythonStore(FileBacked(path))
            cleanup.append(lambda: py_store._stop(False))
            py_eng = eng if eng != "signal" else None
            case("python seq-sum", {"file region": region_run(file_store, seq, py_eng),
                                    "python region": region_run(lambda: py_store, seq, py_eng)})
    finally:
        for c in reversed(cleanup):
            c()
    load_after = os.getloadavg()

    print(f"\nfaultline {faultline.__version__} beside numpy.memmap: {args.size >> 20} MiB of float64, "
          f"{args.reps} repetitions, medians; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    if free_page_reporting():
        print("this guest reports freed memory to its host (virtio-balloon free page reporting): a run that allocates "
              "what an earlier one freed may pay a host fault per page (RESULTS.md, the Redis rows)")
    print(f"{'case':<18} {'baseline':<12} {'median':>10} {'against':<15} {'median':>10} {'ratio':>7} {'target':>7}")
    for r in results:
        base = next(iter(r["median"]))
        for k, ratio in r["ratio"].items():
            target = f"<= {r['target']}" if "target" in r and k == next(iter(r["ratio"])) else ""
            print(f"{r['case']:<18} {base:<12} {r['median'][base] * 1e3:8.1f}ms {k:<15} {r['median'][k] * 1e3:8.1f}ms "
                  f"{ratio:6.2f}x {target:>7}")
    if args.json:
        doc = {
            "command": " ".join([sys.executable, "-m", "faultline.bench", *(argv if argv is not None else sys.argv[1:])]),
            "faultline": faultline.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "size_bytes": args.size,
            "reps": args.reps,
            "engine": args.engine,
            "load_before": load_before,
            "load_after": load_after,
            "free_page_reporting": free_page_reporting(),
            "cases": results,
        }
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
