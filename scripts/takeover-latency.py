#!/usr/bin/env python3
"""Takeover latency of `faultline-serve --takeover`: N times, a test VMM
(`faultline-peer`, 4 vCPUs, one paused mid-restore while three fault) is
served, serve is killed with SIGKILL, and the same command is started again.
Prints, over the N kills, the median and p99 of the time from the kill to
the first fault the new serve read (CLOCK_MONOTONIC in both processes), and
from the new serve's start to it. Every peer verifies every byte.

  scripts/takeover-latency.py [--bin target/release] [--kills 20]
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, time


def wait_for(path, needle, limit=30.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            if needle in open(path).read():
                return
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    sys.exit(f"{path} never said {needle!r}:\n" + open(path).read())


def one(bin_dir, d, i):
    mem, sock = os.path.join(d, "mem"), os.path.join(d, f"s{i}")
    cmd = [os.path.join(bin_dir, "faultline-serve"), "--socket", sock, "--mem", mem,
           "--takeover", "--peers", "1", "--timeout", "20", "--json", os.path.join(d, f"j{i}")]
    err1 = os.path.join(d, f"serve{i}.err")
    s1 = subprocess.Popen(cmd, stderr=open(err1, "w"), stdout=subprocess.DEVNULL)
    wait_for(err1, "listening on")
    perr = os.path.join(d, f"peer{i}.err")
    p = subprocess.Popen([os.path.join(bin_dir, "faultline-peer"), "--socket", sock, "--mem", mem,
                          "--threads", "4", "--working-set", "30", "--verify-all",
                          "--pause-at", "40", "--pause-ms", "300"],
                         stderr=open(perr, "w"), stdout=subprocess.DEVNULL)
    wait_for(perr, "paused")
    s1.kill()
    killed = time.monotonic_ns()
    s1.wait()
    wait_for(err1, "holding 1 peer(s)")
    started = time.monotonic_ns()
    s2 = subprocess.run(cmd, stderr=open(os.path.join(d, f"again{i}.err"), "w"), timeout=60)
    if p.wait(timeout=60) != 0 or s2.returncode != 0:
        sys.exit("a peer or serve failed:\n" + open(perr).read() + open(os.path.join(d, f"again{i}.err")).read())
    first = json.load(open(os.path.join(d, f"j{i}")))[0]["handoff"]["first_fault_ns"]
    wait_for(err1, "no peer and no serve: exiting")
    return (first - killed) / 1e6, (first - started) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug")
    ap.add_argument("--kills", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="faultline-takeover-") as d:
        with open(os.path.join(d, "mem"), "wb") as f:
            f.write(os.urandom(16 << 20))
        rows = [one(a.bin, d, i) for i in range(a.kills)]
    for k, name in enumerate(["kill -> first fault read by the new serve",
                              "new serve started -> its first fault"]):
        v = sorted(r[k] for r in rows)
        p99 = v[min(len(v) - 1, int(0.99 * len(v)))]
        print(f"{name}: median {statistics.median(v):.1f} ms, p99 {p99:.1f} ms ({len(v)} kills)")
    print("load:", open("/proc/loadavg").read().split()[:3])


main()
