#!/usr/bin/env python3
"""What dirty tracking (`faultline-serve --track-dirty`) costs a restore:
the same restores served untracked, tracked (synchronous write-protect
faults) and tracked with a `WP_ASYNC` peer (`faultline-peer --wp-async`:
the kernel un-protects written pages, serve reads them with PAGEMAP_SCAN
on SIGUSR1 while the peer holds), interleaved, in one run.

Each repetition starts `faultline-serve` (on demand, fault-around on) and
one `faultline-peer` (2 vCPU threads) that reads a seeded working set, then
writes a seeded set of pages (`--write-set`, inside and outside the working
set) from its threads, timing each first write as the vCPU sees it. Per
configuration, the medians over the repetitions of:

  restore ms     handshake sent -> last working-set page read (every page is
                 installed write-protected when tracked)
  write ns       median first write to a page of the working set (present:
                 no fault untracked; a write-protect fault round trip when
                 tracked: message, UFFDIO_WRITEPROTECT, wake)
  write-any ns   median first write over all pages written (missing pages
                 take a missing-page fault either way)

and the ratios to untracked; every tracked run's dirty set is checked to
equal the pages written.

  scripts/dirty-cost.py [--bin target/debug] [--reps 9] [--mib 256]
                        [--working-set 10] [--write-set 2] [--json FILE]
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, time


def until(ready, what, limit=30.0):
    """Polls `ready()` every 2 ms; exits saying `what()` after `limit` s."""
    end = time.monotonic() + limit
    while not ready():
        if time.monotonic() > end:
            sys.exit(f"timed out: {what()}")
        time.sleep(0.002)


def says(path, needle):
    """Whether file `path` holds `needle` (not yet there: no)."""
    try:
        return needle in open(path).read()
    except FileNotFoundError:
        return False


def wait_for(path, needle):
    until(lambda: says(path, needle), lambda: f"{path} never said {needle!r}:\n" + open(path).read())


def one(a, d, i, cfg):
    mem, sock = os.path.join(d, "mem"), os.path.join(d, f"s{i}")
    dirty = os.path.join(d, f"dirty{i}.txt")
    cmd = [os.path.join(a.bin, "faultline-serve"), "--socket", sock, "--mem", mem,
           "--peers", "1", "--timeout", "30"]
    if cfg != "untracked":
        cmd += ["--track-dirty", dirty]
    err = os.path.join(d, f"serve{i}.err")
    s = subprocess.Popen(cmd, stderr=open(err, "w"), stdout=subprocess.DEVNULL)
    wait_for(err, "listening on")
    pj = os.path.join(d, f"p{i}.json")
    perr = os.path.join(d, f"peer{i}.err")
    pcmd = [os.path.join(a.bin, "faultline-peer"), "--socket", sock, "--mem", mem,
            "--threads", "2", "--working-set", str(a.working_set),
            "--write-set", str(a.write_set), "--write-seed", str(i), "--json", pj]
    if cfg == "async":
        # WP_ASYNC: the set lives in the peer's page tables, read on request
        # while it runs.
        pcmd += ["--wp-async", "--hold-ms", "60000"]
    p = subprocess.Popen(pcmd, stderr=open(perr, "w"), stdout=subprocess.DEVNULL)
    if cfg == "async":
        wait_for(perr, "holding for")
        os.kill(s.pid, signal.SIGUSR1)
        wait_for(err, "asked:")
        p.kill()
        p.wait(timeout=60)
    elif p.wait(timeout=120) != 0:
        sys.exit("the peer failed:\n" + open(perr).read() + open(err).read())
    if s.wait(timeout=60) != 0:
        sys.exit("serve failed:\n" + open(err).read())
    r = json.load(open(pj))
    if cfg != "untracked":
        got = [int(l, 16) for l in open(dirty) if l.startswith("0x")]
        if sorted(got) != sorted(set(r["written_offsets"]) | set(r["dropped_offsets"])):
            sys.exit(f"run {i} ({cfg}): the dirty set is not the pages written")
        os.remove(dirty)
    return {"restore_ms": r["seconds"] * 1e3, "write_ns": r["write_present_median_ns"],
            "write_any_ns": r["write_median_ns"], "pages_written": len(r["written_offsets"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--working-set", type=float, default=10)
    ap.add_argument("--write-set", type=float, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    cfgs = ["untracked", "tracked", "async"]
    rows = {c: [] for c in cfgs}
    with tempfile.TemporaryDirectory(prefix="faultline-dirty-cost-") as d:
        with open(os.path.join(d, "mem"), "wb") as f:
            for _ in range(a.mib):
                f.write(os.urandom(1 << 20))
        for i in range(a.reps):
            # Interleaved, the order rotating: no configuration always
            # runs first.
            order = cfgs[i % 3:] + cfgs[:i % 3]
            for k, cfg in enumerate(order):
                rows[cfg].append(one(a, d, 3 * i + k, cfg))
    med = {cfg: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for cfg, rs in rows.items()}
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{a.mib} MiB, working set {a.working_set}%, write set {a.write_set}% "
          f"({med['tracked']['pages_written']:.0f} pages), {a.reps} reps, medians; load {' '.join(load)}")
    print(f"{'':12}{'restore ms':>12}{'write ns':>12}{'write-any ns':>14}")
    u = med["untracked"]
    for cfg in cfgs:
        m = med[cfg]
        print(f"{cfg:12}{m['restore_ms']:12.2f}{m['write_ns']:12.0f}{m['write_any_ns']:14.0f}"
              + ("" if cfg == "untracked" else
                 f"   ratio {m['restore_ms'] / u['restore_ms']:.2f}x {m['write_ns'] / max(u['write_ns'], 1):.1f}x"
                 f" {m['write_any_ns'] / max(u['write_any_ns'], 1):.2f}x"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "load": load, "medians": med, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
