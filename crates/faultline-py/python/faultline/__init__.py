"""faultline: NumPy arrays whose pages come from any store, on first touch.

A :class:`Region` is memory whose pages are fetched from a store when they
are first touched (a page fault resolved in user space with
``userfaultfd``), and which NumPy sees through the buffer protocol with no
copy::

    import numpy as np
    import faultline

    with faultline.Region(store=faultline.FileStore("data.f64"), budget="256MiB") as r:
        a = r.as_array(np.float64)     # a view of the paged memory
        total = a.sum()                # pages come from the file as the sum reaches them;
                                       # at most ~256 MiB of them stay resident

Stores: :class:`FileStore`, :class:`MemoryStore`, :class:`ZeroStore`,
:class:`RedisStore`, or any object with ``fill(offset, buffer)`` (and
``write_back(offset, data)``), served by a store process
(:class:`PythonStore`). :func:`info` says what the kernel offers.

Errors: ``OSError`` (with ``errno``) for failures of the system or a store,
``ValueError`` for bad arguments, ``BufferError`` for a view refused (a
read-only or closed region).
"""

from __future__ import annotations

import atexit
import errno as _errno
import sys as _sys

from . import _native
from ._host import PythonStore
from ._native import FileStore, MemoryStore, Region, Store, ZeroStore, __version__, info

try:
    from ._native import RedisStore
except ImportError:  # built without the `redis` cargo feature

    class RedisStore(Store):  # type: ignore[no-redef]
        """Unavailable: this build of faultline has no Redis support."""

        def __new__(cls, *args: object, **kwargs: object) -> "RedisStore":
            raise OSError(
                _errno.EOPNOTSUPP,
                "this build of faultline has no Redis support (build it with the `redis` cargo feature)",
            )


__all__ = [
    "Region",
    "Store",
    "FileStore",
    "MemoryStore",
    "ZeroStore",
    "RedisStore",
    "PythonStore",
    "info",
    "__version__",
]


@atexit.register
def _at_exit() -> None:
    # Regions first (their dirty pages go back to their stores), then the
    # store processes they may write back to.
    for err in _native._close_all():
        print(f"faultline: closing a region at exit: {err}", file=_sys.stderr)
    from . import _host

    _host._close_all()
