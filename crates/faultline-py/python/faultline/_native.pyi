"""Type stubs of the extension module (``crates/faultline-py/src``)."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__version__: str
_SIGNAL_REFUSAL: str

EngineName = Literal["signal", "poll", "spin", "workers", "per-cpu"]
PolicyName = Literal["fifo", "clock", "refault"]
Mode = Literal["r", "r+", "c"]
MemoryName = Literal["private-anon", "shmem", "hugetlb"]

class Store:
    """Where a region's pages come from (the base class of every store)."""

    @property
    def description(self) -> str:
        """What the store is, as faultline's messages name it."""
    @property
    def length(self) -> int | None:
        """Bytes of data (``None``: no end, as for zeros)."""
    @property
    def signal_safe(self) -> bool:
        """Whether the store may be read inside a SIGBUS handler."""

class FileStore(Store):
    """A file: pages are read from it on first touch and, for a
    ``mode="r+"`` region, written back. ``access="mmap"`` copies from a
    mapping of the file (the default; on tmpfs the region maps the page
    cache itself, no copy), ``"pread"`` reads with ``pread(2)``."""

    def __init__(self, path: str | os.PathLike[str], *, access: Literal["mmap", "pread"] = "mmap") -> None: ...
    @property
    def path(self) -> pathlib.Path: ...

class MemoryStore(Store):
    """A copy of a bytes-like object (bytes, bytearray, a contiguous NumPy
    array); write-backs change the copy."""

    def __init__(self, data: Any) -> None: ...
    def snapshot(self) -> bytes:
        """The store's bytes now (a copy)."""

class ZeroStore(Store):
    """Every page reads as zeros; nothing is written back."""

    def __init__(self) -> None: ...

class RedisStore(Store):
    """A store in Redis, Redis Cluster or Valkey (``redis://HOST:PORT#NAME``,
    ``unix:///PATH#NAME``, ``redis-cluster://HOST:PORT,...#NAME``)."""

    def __init__(self, url: str) -> None: ...
    @staticmethod
    def put(url: str, data: Any, *, chunk_bytes: int = 65536) -> RedisStore:
        """Uploads ``data`` (bytes-like, or a file's path) as the store at
        ``url`` and opens it."""
    @property
    def name(self) -> str: ...
    @property
    def chunk_bytes(self) -> int: ...

class _HostStore(Store):
    def __init__(
        self,
        sockets: list[int],
        shm_fd: int,
        slot_bytes: int,
        length: int | None,
        writable: bool,
        timeout: float,
        what: str,
    ) -> None: ...
    def shutdown(self) -> None: ...
    @property
    def connections(self) -> int: ...
    @property
    def users(self) -> int: ...

class Region:
    """Memory whose pages come from ``store`` on first touch, exported
    through the buffer protocol (``numpy.frombuffer(region, dtype)``,
    ``memoryview(region)``: no copy).

    ``length`` defaults to the store's; ``store`` to a ``ZeroStore``; any
    object with ``fill(offset, buffer)`` is a Python store. ``budget``
    (bytes, or ``"512MiB"``, ``"25%"``) keeps about that much resident
    (dirty pages written back before they go; ``policy`` picks victims);
    ``fault_around`` fixes the pages installed per fault (default:
    adaptive); ``engine`` picks how faults are delivered (default
    ``poll``; ``signal`` resolves each fault on the faulting thread, about
    1.35x faster, but a system call on a page not yet loaded, such as
    ``ndarray.tofile`` or ``numpy.save`` of the array, then fails with
    ``EFAULT`` or writes short; it is refused for Redis and Python stores);
    ``mode`` is ``"r"`` (read-only views; the default), ``"r+"`` (writes go
    back to the store: ``flush()``, eviction, ``close()``) or ``"c"``
    (private writes; the default for a ``ZeroStore``); ``run_ahead`` pages
    are installed ahead of a sequential or strided stream by a background
    thread (0: none; default 4 MiB worth when a handler thread serves the
    faults and there is no budget, none otherwise);
    ``memory`` is ``"private-anon"`` (the default), ``"shmem"`` or
    ``"hugetlb"`` (2 MiB pages from the system's pool: one fault and one
    copy per 2 MiB; budgets and ``"r+"`` need private-anon).

    A context manager: ``close()`` writes dirty pages back and unmaps once
    no view of the region is left (a view that outlives it keeps the
    memory mapped)."""

    def __init__(
        self,
        length: int | None = None,
        store: Store | Any | None = None,
        *,
        page_size: int | None = None,
        budget: int | str | None = None,
        policy: PolicyName = "clock",
        fault_around: int | None = None,
        engine: EngineName | None = None,
        mode: Mode | None = None,
        run_ahead: int | None = None,
        memory: MemoryName | None = None,
    ) -> None: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __enter__(self) -> Region: ...
    def __exit__(self, *exc: object) -> bool: ...
    def close(self) -> None:
        """Writes dirty pages back, then unmaps once no view is left."""
    def flush(self) -> int:
        """Writes every dirty page back to the store; returns how many."""
    def prefetch(self, offset: int = 0, length: int | None = None) -> None:
        """Installs the pages overlapping ``[offset, offset + length)`` now
        (``OSError`` with the store's message if it fails)."""
    def resident(self, offset: int | range | None = None, length: int | None = None) -> npt.NDArray[np.bool_]:
        """Per page overlapping the byte range: whether it is resident."""
    def page_states(self, offset: int | range | None = None, length: int | None = None) -> npt.NDArray[np.uint8]:
        """Per page: 0 absent, 1 clean, 2 writable (dirty where writes are
        tracked: with a budget or ``mode="r+"``; without, every installed
        page is writable), 3 poisoned."""
    def as_array(
        self, dtype: npt.DTypeLike = None, shape: int | tuple[int, ...] | None = None, offset: int = 0
    ) -> np.ndarray[Any, Any]:
        """A NumPy array over the region (no copy)."""
    def stats(self) -> dict[str, Any]:
        """Counters (faults, installed, store fills, poisoned, ...),
        residency, settings, and ``eviction``/``run_ahead`` dicts."""
    @property
    def store(self) -> Any: ...
    @property
    def length(self) -> int: ...
    @property
    def address(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def pages(self) -> int: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def engine(self) -> EngineName: ...
    @property
    def budget_pages(self) -> int | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def mapped(self) -> bool: ...
    @property
    def exports(self) -> int: ...
    @property
    def resident_pages(self) -> int: ...

def info() -> dict[str, Any]:
    """The kernel, the userfaultfd creation paths, features, engines (usable?
    where they resolve? can they serve Python stores?), memory kinds, stores
    and the default engine."""

def _close_all() -> list[str]: ...
