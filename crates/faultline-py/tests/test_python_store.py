"""Stores written in Python: served in a store process, so a fault taken
while holding the GIL cannot deadlock; an exception poisons only its page,
with its text; the signal engine is refused; timeouts are bounded."""

from __future__ import annotations

import errno
import os
import signal
import textwrap
import time

import numpy as np
import pytest

import faultline
from conftest import run_script
from stores_for_tests import Arange, Poisoned, Slow

N = 1 << 20  # float64 elements: 8 MiB


def test_numpy_over_a_python_store_while_holding_the_gil():
    # The exact scenario: the faulting thread holds the GIL (scalar
    # indexing, bytes() of a view and tolist() never release it; sum's
    # inner loop may), and the store is Python code. Run in a child with
    # a timeout: a deadlock fails the test instead of hanging it.
    out = run_script(textwrap.dedent(f"""
        import numpy as np, faultline
        from stores_for_tests import Arange
        n = {N}
        with faultline.Region(store=Arange(n)) as r:
            a = r.as_array(np.float64)
            print("index", a[n // 2 + 3], a[n - 1])
            print("bytes", np.frombuffer(bytes(memoryview(r)[8 * 1000:8 * 1002]), np.float64).tolist())
            print("tolist", sum(a[200000:200512].tolist()))
            print("sum", a.sum() == n * (n - 1) / 2)
            print("faults", r.stats()["faults"])
    """), timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(l.split(" ", 1) for l in out.stdout.splitlines())
    assert lines["index"] == f"{float(N // 2 + 3)} {float(N - 1)}"
    assert lines["bytes"] == "[1000.0, 1001.0]"
    assert float(lines["tolist"]) == sum(range(200000, 200512))
    assert lines["sum"] == "True"
    assert int(lines["faults"]) > 0


def test_an_exception_poisons_only_its_page_and_can_be_caught():
    with faultline.Region(store=Poisoned(N, bad=3)) as r:
        with pytest.raises(OSError) as e:
            r.prefetch(0, 8 * 4096)
        assert e.value.errno == errno.EIO
        msg = str(e.value)
        assert "ValueError: page 3 is corrupt" in msg
        assert "stores_for_tests.py" in msg and "in fill" in msg
        states = r.page_states(0, 8 * 4096)
        assert states[3] == 3, "page 3 is poisoned"
        assert all(s in (1, 2) for s in states[:3]), "pages before it were installed"
        a = r.as_array(np.float64)
        # Its neighbours read correctly, through faults of their own.
        assert a[4 * 512] == 4 * 512.0
        assert a[3 * 512 - 1] == 3 * 512 - 1.0
        assert np.array_equal(a[8 * 512:], np.arange(8 * 512, N, dtype=np.float64))
        assert r.stats()["poisoned"] == 1
        # Asking again tells the same story, never zeros.
        with pytest.raises(OSError, match="poisoned"):
            r.prefetch(3 * 4096, 1)


def test_touching_a_poisoned_page_is_sigbus_with_the_message():
    out = run_script(textwrap.dedent(f"""
        import numpy as np, faultline
        from stores_for_tests import Poisoned
        with faultline.Region(store=Poisoned({N}, bad=3)) as r:
            a = r.as_array(np.float64)
            print("neighbours", a[0], a[4 * 512], a[2 * 512 + 511], flush=True)
            print("touching", flush=True)
            print("read", a[3 * 512 + 7], flush=True)
    """), timeout=60)
    assert out.returncode == -signal.SIGBUS, (out.returncode, out.stdout, out.stderr)
    assert "neighbours 0.0 2048.0 1535.0" in out.stdout
    assert "touching" in out.stdout and "read" not in out.stdout
    assert "ValueError: page 3 is corrupt" in out.stderr
    assert "poisoned" in out.stderr
    assert "Bus error" in out.stderr  # faulthandler's report of the Python line


@pytest.mark.parametrize("store", ["python", "pread", "mmap"])
def test_a_failure_run_ahead_met_is_said_when_the_page_is_touched(store, tmp_path):
    # A sequential sum: the populator (on by default) reaches the bad page
    # before the sum does. It leaves the page for the sum's own fault,
    # which reports why; poisoned by the populator, it was a bare SIGBUS.
    # The file store's bad page: past the end of a file truncated since
    # (read with pread, or copied from the store's mapping of the file,
    # whose EFAULT ended the process with "resolving a fault failed").
    if store == "python":
        make, why = f"Poisoned({N}, bad=1500)", "ValueError: page 1500 is corrupt"
    else:
        path = tmp_path / "t.f64"
        np.arange(N, dtype=np.float64).tofile(path)
        make, why = f"faultline.FileStore({str(path)!r}, access={store!r})", "truncated since"
    out = run_script(textwrap.dedent(f"""
        import os, numpy as np, faultline
        from stores_for_tests import Poisoned
        with faultline.Region(store={make}) as r:
            assert r.stats().get("run_ahead") is not None
            if {store != "python"}:
                os.truncate({str(tmp_path / "t.f64")!r}, 1500 * 4096)
            print("summing", flush=True)
            print("sum", r.as_array(np.float64).sum(), flush=True)
    """), timeout=60)
    assert out.returncode == -signal.SIGBUS, (out.returncode, out.stdout, out.stderr)
    assert "summing" in out.stdout and "sum" not in out.stdout.replace("summing", "")
    assert why in out.stderr, out.stderr
    assert "poisoned" in out.stderr, out.stderr


def test_the_signal_engine_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="SIGBUS handler"):
        faultline.Region(store=Arange(1024), engine="signal")


def test_a_slow_fill_times_out_and_retires_its_connection():
    store = faultline.PythonStore(Slow(N, delay=5.0), timeout=0.3, connections=3)
    with faultline.Region(store=store, engine="poll") as r:
        # The window (16 pages) times out, then the page alone: two
        # connections retired, the page poisoned.
        with pytest.raises(OSError, match=r"no reply to fill\(0x0, 4096\) within 300ms"):
            r.prefetch(0, 16 * 4096)
        assert store.connections == 1
        assert r.page_states(0, 4096)[0] == 3
        with pytest.raises(OSError, match="no reply"):
            r.prefetch(5 * 4096, 1)
        assert store.connections == 0
        # With none left, a request fails at once, naming the last cause.
        with pytest.raises(OSError, match="no connection to the store process is left"):
            r.prefetch(9 * 4096, 1)
    store._stop(force=True)


def test_the_store_process_is_stopped_by_close():
    store = faultline.PythonStore(Arange(1024))
    pid = store.pid
    os.kill(pid, 0)  # alive
    r = faultline.Region(store=store)
    with pytest.raises(RuntimeError, match="still read from this store"):
        store.close()
    r.close()
    del r
    store.close()
    assert store.closed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_store_process_a_region_made_stops_with_the_region():
    """Given a plain object, a region makes its PythonStore (a store
    process) and stops it when it is closed (after its last view), not
    when the Region object is collected."""
    r = faultline.Region(store=Arange(1024))
    store = r.store
    pid = store.pid
    a = r.as_array(np.float64)
    assert a[5] == 5.0
    r.close()
    os.kill(pid, 0)  # a view is left: still served
    assert a[700] == 700.0
    del a
    assert store.closed
    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the store process outlived its region"
        time.sleep(0.01)


def test_an_unpicklable_store_is_refused():
    class Local(Arange):  # a class local to a function cannot be pickled
        pass

    with pytest.raises(TypeError, match="cannot be pickled"):
        faultline.Region(store=Local(16))


#: A main script's store class (the store process re-runs the script to
#: find it).
ONES = """
import faultline
class Ones:
    def fill(self, offset, buf):
        buf[:] = b"\\x01" * len(buf)
"""


def test_a_store_class_in_an_unguarded_main_script_is_explained(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(ONES + textwrap.dedent("""
        r = faultline.Region(4096, store=Ones())
        print("sum", sum(memoryview(r)))
    """))
    out = run_script(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", timeout=60)
    assert out.returncode != 0
    assert "guard the script's work" in out.stderr


def test_a_store_class_in_a_guarded_main_script_works(tmp_path):
    script = tmp_path / "guarded.py"
    script.write_text(ONES + textwrap.dedent("""
        if __name__ == "__main__":
            with faultline.Region(3 * 4096, store=Ones()) as r:
                print("sum", sum(memoryview(r)))
    """))
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"sum {3 * 4096}"
