"""Helpers for tests, benchmarks and examples: a real ``redis-server`` on a
unix socket in a temporary directory (stopped by its pid), and dropping a
file's page cache."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


class RedisServer:
    """One ``redis-server`` on a unix socket in a temporary directory, no
    persistence. Started by the constructor (which waits, at most
    ``start_timeout`` seconds, until it answers ``PING``), stopped by
    ``stop()`` or the ``with`` block: SIGTERM to its pid, SIGKILL after 5
    seconds, then the directory is removed. A missing ``redis-server`` is
    an error (``bash scripts/setup.sh`` installs it)."""

    def __init__(self, start_timeout: float = 10.0) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise FileNotFoundError("redis-server is missing: install it (bash scripts/setup.sh)")
        self.dir = tempfile.mkdtemp(prefix="faultline-redis-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.proc = subprocess.Popen(
            [exe, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + start_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
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
        raise RuntimeError(f"redis-server did not answer within {start_timeout} s: {last}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def url(self, name: str) -> str:
        """The URL of the store ``name`` on this server."""
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

    def __enter__(self) -> "RedisServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def drop_page_cache(path: str | os.PathLike[str]) -> None:
    """Drops ``path``'s clean pages from the page cache
    (``posix_fadvise(POSIX_FADV_DONTNEED)`` after an ``fsync``), so the
    next read of it comes from the disk. Pages mapped by a process stay."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def huge_pages_free() -> int:
    """HugePages_Free of /proc/meminfo (0 when absent)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("HugePages_Free:"):
                return int(line.split()[1])
    return 0
