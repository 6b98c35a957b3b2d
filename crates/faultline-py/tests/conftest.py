"""Fixtures: data files, a real redis-server on a unix socket (started
here, stopped by its pid), and a helper that runs a script in a child
interpreter with a timeout."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
#: Engines the Python tests run on (spin busy-polls a CPU: used where a
#: test is short).
ENGINES = ["signal", "poll", "workers"]
#: Engines that can serve Redis and Python stores.
THREAD_ENGINES = ["poll", "workers"]


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


class RedisServer:
    """One redis-server on a unix socket in a temporary directory."""

    START_TIMEOUT = 10.0

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is missing: run `bash scripts/setup.sh`")
        self.dir = tempfile.mkdtemp(prefix="faultline-py-redis-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.proc = subprocess.Popen(
            [exe, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self.START_TIMEOUT
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with status {self.proc.returncode}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(1.0)
                    s.connect(self.socket)
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError as e:
                last = str(e)
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {self.START_TIMEOUT} s: {last}")

    def url(self, name: str) -> str:
        return f"unix://{self.socket}#{name}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer()
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
