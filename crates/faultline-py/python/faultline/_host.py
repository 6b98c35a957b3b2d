"""Stores written in Python, served by a store process.

A store written in Python is any object with a ``fill(offset, buffer)``
method (and, to take writes, ``write_back(offset, data)``). faultline does
not call it in this interpreter: a thread that touches a missing page is
stopped in the kernel until the page is installed, still holding the GIL
if it held it (NumPy indexing an array does), so a ``fill`` that needed
this interpreter's GIL would wait for ever. The object is pickled into a
*store process* (``python -m faultline._store_process``, a second interpreter with
a GIL of its own) and faultline's handler threads talk to it over sockets
and shared memory, never taking this interpreter's GIL.

What follows for the object:

* it must be picklable, and its class importable by the store process:
  defined in a module, or in the main script (the store process then
  re-runs the main script as ``__mp_main__``, as ``multiprocessing``'s
  "spawn" does, so guard the script's work with
  ``if __name__ == "__main__":``; a script that does not is told so);
* its state lives in the store process: open files, connections and
  caches there (e.g. lazily, on the first ``fill``), and expect changes
  to the object made here after the region starts not to reach it;
* ``fill`` is given a writable ``memoryview`` of the requested bytes,
  zeroed (bytes it does not write read as zeros); ``write_back`` a
  read-only one. Several calls may run at once, on the store process's
  threads (one per connection).
* an exception in ``fill`` poisons the page with the exception's text
  (``ValueError: page 3 is corrupt (store.py:12 in fill)``): a thread
  that touches it gets SIGBUS and the message is printed, and
  ``Region.prefetch`` of it raises ``OSError`` with the message; the page
  is never read as zeros.

The wire format is described in ``src/host.rs``.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
import weakref
from typing import Any

from . import _native

OP_FILL = 1
OP_WRITE_BACK = 2
REQUEST = struct.Struct("<IIQQ8x")
REPLY = struct.Struct("<III4x")
FRAME = struct.Struct("<Q")

#: Python stores not closed yet (closed at interpreter exit, after the
#: regions that may write back to them).
_live: "weakref.WeakSet[PythonStore]" = weakref.WeakSet()

#: Set while a store process loads its store (and, with it, the main
#: script): a PythonStore made then would start store processes without end.
_loading = False


def _preparation(with_main: bool) -> dict[str, Any]:
    """What the store process needs to unpickle objects defined here: the
    same as ``multiprocessing.spawn.get_preparation_data``, without the
    start method (asking for it would fix this process's default), and
    with the main script only when ``with_main``."""
    from multiprocessing import process

    orig = process.ORIGINAL_DIR
    sys_path = [orig if p == "" and orig else p for p in sys.path]
    d: dict[str, Any] = dict(
        sys_path=sys_path, sys_argv=sys.argv, orig_dir=orig, dir=os.getcwd()
    )
    if not with_main:
        return d
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        d["init_main_from_name"] = name
    else:
        path = getattr(main, "__file__", None)
        if path is not None:
            if not os.path.isabs(path) and orig is not None:
                path = os.path.join(orig, path)
            d["init_main_from_path"] = os.path.normpath(path)
    return d


def _check_importable(cls: type) -> None:
    """Refuses, with what to do, a store class the store process could not
    import: one defined in the ``__main__`` of ``python -c``, of a script
    read from stdin, of the interactive interpreter or of a notebook (it
    has no file to run again)."""
    if cls.__module__ != "__main__":
        return
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if spec_name is None and (path is None or not os.path.isfile(path)):
        raise TypeError(
            f"the store class {cls.__qualname__} is defined in an interactive __main__ "
            "(python -c, a script on stdin, the REPL or a notebook), which the store process "
            "cannot import: define it in a module (a .py file on sys.path) and import it from there"
        )


def _recv_frame(sock: socket.socket) -> bytes:
    (n,) = FRAME.unpack(_recv_exact(sock, FRAME.size))
    return _recv_exact(sock, n)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the store process closed its connection")
        got += k
    return bytes(buf)


class PythonStore:
    """A store written in Python, served by a store process.

    ``PythonStore(obj)`` starts the store process and loads ``obj`` there;
    ``Region(length, store=obj)`` does so itself for any object with a
    ``fill`` method. Give the store explicitly to share one store process
    between regions, or to set:

    * ``length``: bytes of data (default ``len(obj)`` when it has one;
      ``None``: no end, the region's length decides);
    * ``connections``: concurrent calls (default: CPUs + 2, at least 4);
    * ``slot_bytes``: bytes one call may fill (longer requests are split;
      default 4 MiB);
    * ``timeout``: seconds a call may take before its page is poisoned
      and the connection retired (default 30);
    * ``start_timeout``: seconds to start the process and load the object.

    The regions served by the signal engine are refused (a Python callback
    cannot run inside a SIGBUS handler); the default engine for a Python
    store is ``poll``. ``close()`` (or the ``with`` block, or garbage
    collection, or interpreter exit) stops the store process.
    """

    def __init__(
        self,
        obj: Any,
        *,
        length: int | None = None,
        connections: int | None = None,
        slot_bytes: int = 4 << 20,
        timeout: float = 30.0,
        start_timeout: float = 60.0,
    ) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        if _loading:
            raise RuntimeError(
                "a PythonStore was created while a store process was loading the main script: "
                "guard the script's work with `if __name__ == \"__main__\":` (the store process "
                "re-runs the script's top level to find the store's class, as multiprocessing does)"
            )
        if not callable(getattr(obj, "fill", None)):
            raise TypeError(
                f"{type(obj).__name__} is not a store: it needs a fill(offset, buffer) method "
                "(and write_back(offset, data) to take writes)"
            )
        _check_importable(type(obj))
        writable = callable(getattr(obj, "write_back", None))
        if length is None:
            try:
                length = len(obj)
            except TypeError:
                length = None
        if length is not None and length < 0:
            raise ValueError(f"length must not be negative, not {length}")
        if slot_bytes <= 0 or slot_bytes % 4096:
            raise ValueError(f"slot_bytes must be a positive multiple of 4096, not {slot_bytes}")
        n = connections if connections is not None else max(4, (os.cpu_count() or 1) + 2)
        if n < 1:
            raise ValueError(f"connections must be at least 1, not {n}")
        try:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            # Re-run the main script in the store process only when the
            # object refers to it (its class is defined there).
            prep = pickle.dumps(
                _preparation(with_main=b"__main__" in payload), protocol=pickle.HIGHEST_PROTOCOL
            )
        except Exception as e:
            raise TypeError(
                f"the store object cannot be pickled into its store process ({type(e).__name__}: {e}); "
                "Python stores run in a separate interpreter: define the class in a module or the "
                "main script, and open files or connections lazily in fill()"
            ) from e
        self.name = type(obj).__qualname__
        self.length = length
        self.writable = writable
        shm = os.memfd_create("faultline-python-store", os.MFD_CLOEXEC)
        pairs: list[tuple[socket.socket, socket.socket]] = []
        try:
            os.ftruncate(shm, n * slot_bytes)
            pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(n)]
            theirs = [b.fileno() for _, b in pairs]
            cmd = [
                sys.executable, "-m", "faultline._store_process",
                "--shm", str(shm),
                "--slot-bytes", str(slot_bytes),
                "--sockets", ",".join(map(str, theirs)),
            ]
            self._proc = subprocess.Popen(cmd, pass_fds=[*theirs, shm], stdin=subprocess.DEVNULL)
            for _, b in pairs:
                b.close()
            self.pid = self._proc.pid
            first = pairs[0][0]
            first.settimeout(start_timeout)
            try:
                first.sendall(FRAME.pack(len(prep)) + prep + FRAME.pack(len(payload)) + payload)
                ok, text = pickle.loads(_recv_frame(first))
            except (OSError, EOFError) as e:
                code = self._proc.poll()
                why = f"it exited with status {code}" if code is not None else f"{type(e).__name__}: {e}"
                raise RuntimeError(f"the store process for {self.name} did not start ({why})") from None
            finally:
                first.settimeout(None)
            if not ok:
                raise RuntimeError(f"the store process could not load the {self.name} store: {text}")
            what = f"python store {self.name} (process {self.pid})"
            self._faultline_store = _native._HostStore(
                [a.fileno() for a, _ in pairs], shm, slot_bytes, length, writable, timeout, what
            )
        except BaseException:
            self._stop(force=True)
            raise
        finally:
            for a, b in pairs:
                a.close()
                b.close()
            os.close(shm)
        _live.add(self)

    @property
    def connections(self) -> int:
        """Connections to the store process not retired."""
        return self._faultline_store.connections

    @property
    def closed(self) -> bool:
        """Whether the store process was stopped."""
        return self._proc is None

    def _stop(self, force: bool) -> None:
        store = getattr(self, "_faultline_store", None)
        if store is not None:
            store.shutdown()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # The process exits when its connections close, once the calls in
        # flight return: give those a moment, then kill it by its pid.
        try:
            proc.wait(timeout=0.5 if force else 5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5.0)

    def close(self) -> None:
        """Stops the store process. Close the regions that read from the
        store first: their pages can no longer be filled after this."""
        if self._proc is None:
            return
        users = self._faultline_store.users
        if users:
            raise RuntimeError(
                f"{users} region(s) still read from this store: close them first "
                "(their dirty pages are written back to it on close)"
            )
        self._stop(force=False)

    def __enter__(self) -> "PythonStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None:
            self._stop(force=False)

    def __repr__(self) -> str:
        state = "closed" if self._proc is None else f"process {self.pid}"
        return f"<faultline.PythonStore {self.name} ({state})>"


def _close_all() -> None:
    """Stops every store process (at interpreter exit, after the regions)."""
    for store in list(_live):
        store._stop(force=False)


# ---------------------------------------------------------------------------
# The store process.


def _describe(e: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    tb = traceback.extract_tb(e.__traceback__)
    if tb:
        last = tb[-1]
        text += f" ({os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    return text


def _serve_connection(store: Any, sock: socket.socket, area: memoryview) -> None:
    """Answers one connection's requests until it closes."""
    fill = store.fill
    write_back = getattr(store, "write_back", None)
    while True:
        try:
            op, seq, offset, length = REQUEST.unpack(_recv_exact(sock, REQUEST.size))
        except (EOFError, OSError):
            return
        piece = area[:length]
        try:
            if op == OP_FILL:
                fill(offset, piece)
            elif op == OP_WRITE_BACK and write_back is not None:
                ro = piece.toreadonly()
                try:
                    write_back(offset, ro)
                finally:
                    try:
                        ro.release()
                    except BufferError:
                        pass
            else:
                raise ValueError(f"unknown request {op}")
            status, text = 0, b""
        except BaseException as e:  # the page gets the text, whatever it was
            status, text = 1, _describe(e).encode("utf-8", "replace")
        finally:
            try:
                piece.release()
            except BufferError:
                pass
        try:
            sock.sendall(REPLY.pack(seq, status, len(text)) + text)
        except OSError:
            return


def _main(argv: list[str]) -> int:
    import mmap
    from multiprocessing import spawn

    global _loading
    # The parent handles Ctrl-C; this process ends when its connections do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = dict(zip(argv[0::2], argv[1::2]))
    fds = [int(f) for f in args["--sockets"].split(",")]
    slot_bytes = int(args["--slot-bytes"])
    shm = int(args["--shm"])
    socks = [socket.socket(fileno=f) for f in fds]
    first = socks[0]
    try:
        prep = _recv_frame(first)
        payload = _recv_frame(first)
    except (EOFError, OSError):
        return 1
    # The preparation (sys.path, the main script re-run as __mp_main__)
    # comes first, so the store's class can be found when it is unpickled.
    store = None
    _loading = True
    try:
        spawn.prepare(pickle.loads(prep))
        store = pickle.loads(payload)
        reply = (True, "")
    except BaseException as e:
        reply = (False, _describe(e))
    finally:
        _loading = False
    body = pickle.dumps(reply)
    first.sendall(FRAME.pack(len(body)) + body)
    if store is None:
        return 1
    mm = mmap.mmap(shm, len(socks) * slot_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(shm)
    view = memoryview(mm)
    threads = [
        threading.Thread(
            target=_serve_connection,
            args=(store, s, view[i * slot_bytes:(i + 1) * slot_bytes]),
            name=f"faultline-store-{i}",
            daemon=True,
        )
        for i, s in enumerate(socks)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0

