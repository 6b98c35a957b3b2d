"""Fixtures: data files, a real redis-server on a unix socket (started
here, stopped by its pid), and a helper that runs a script in a child
interpreter with a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from faultline.testing import RedisServer

HERE = Path(__file__).resolve().parent
#: Engines the Python tests run on (spin busy-polls a CPU: used where a
#: test is short).
ENGINES = ["signal", "poll", "workers", "per-cpu"]
#: Engines that can serve Redis and Python stores.
THREAD_ENGINES = ["poll", "workers", "per-cpu"]


def write_f64(path: Path, n: int, seed: int = 1) -> np.ndarray:
    """Writes n random float64s to `path` and returns them."""
    a = np.random.default_rng(seed).standard_normal(n)
    a.tofile(path)
    return a


@pytest.fixture
def f64_file(tmp_path: Path) -> Path:
    """A file of 3 MiB + 808 bytes of float64s (not a whole number of
    pages: the region's tail page is partly past the file)."""
    p = tmp_path / "data.f64"
    write_f64(p, (3 << 20) // 8 + 101)
    return p


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer()  # faultline.testing: started here, stopped by its pid
    try:
        yield server
    finally:
        server.stop()


def run_script(code: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a child interpreter (with faulthandler, the tests'
    directory on sys.path); a child still running after `timeout` seconds
    is killed by its pid and the test fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"the child did not finish within {timeout} s (a deadlock?)\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_threads(work, n: int = 4, timeout: float = 120.0) -> None:
    """Runs work(i) on n threads; each join is bounded, and a thread still
    alive after it fails the test."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), f"a thread outlived {timeout} s"
