"""Python stores the tests use. A module of their own: a Python store is
pickled into a store process, which imports its class by module name."""

from __future__ import annotations

import os
import time

import numpy as np


class FileBacked:
    """Reads (and writes back to) a file with os.pread/os.pwrite; the file
    is opened lazily, in the store process."""

    def __init__(self, path: str, writable: bool = False) -> None:
        self.path = path
        self.writable = writable
        self.fd: int | None = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "writable": self.writable, "fd": None}

    def __len__(self) -> int:
        return os.path.getsize(self.path)

    def _fd(self) -> int:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR if self.writable else os.O_RDONLY)
        return self.fd

    def fill(self, offset: int, buf: memoryview) -> None:
        data = os.pread(self._fd(), len(buf), offset)
        buf[: len(data)] = data

    def write_back(self, offset: int, data: memoryview) -> None:
        if not self.writable:
            raise PermissionError(f"{self.path} is opened read-only")
        os.pwrite(self._fd(), data, offset)


class Arange:
    """float64 element i holds i."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n * 8

    def fill(self, offset: int, buf: memoryview) -> None:
        a = np.frombuffer(buf, np.float64)
        start = offset // 8
        a[:] = np.arange(start, start + len(a), dtype=np.float64)


class Poisoned(Arange):
    """Arange whose page `bad` (4 KiB pages) raises."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def fill(self, offset: int, buf: memoryview) -> None:
        if offset <= self.bad * 4096 < offset + len(buf):
            raise ValueError(f"page {self.bad} is corrupt")
        super().fill(offset, buf)


class Slow(Arange):
    """Arange whose fill sleeps `delay` seconds."""

    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n)
        self.delay = delay

    def fill(self, offset: int, buf: memoryview) -> None:
        time.sleep(self.delay)
        super().fill(offset, buf)


class NoLength:
    """A store without __len__ whose every byte is 7."""

    def fill(self, offset: int, buf: memoryview) -> None:
        buf[:] = b"\x07" * len(buf)


class Bounded:
    """`n` bytes of value 7 that refuse any request past their end, as a
    store checking its bounds does."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def fill(self, offset: int, buf: memoryview) -> None:
        if offset + len(buf) > self.n:
            raise ValueError(f"read past the end: {offset}+{len(buf)} > {self.n}")
        buf[:] = b"\x07" * len(buf)

    def write_back(self, offset: int, data: memoryview) -> None:
        if offset + len(data) > self.n:
            raise ValueError(f"write past the end: {offset}+{len(data)} > {self.n}")
