"""A forked child and the regions of its parent (os.fork, multiprocessing's
"fork" start method): the child's regions work, the parent's are not
inherited (touching one is SIGSEGV, never zeros read in place of data),
and a child that exits normally leaves the parent's regions intact."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import write_f64

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import faultline

    path, engine = sys.argv[1], sys.argv[2]
    n = (2 << 20) // 8
    want = np.fromfile(path, dtype=np.float64, count=n)
    r = faultline.Region(2 << 20, store=faultline.FileStore(path), engine=engine, fault_around=1)
    a = np.frombuffer(r, dtype=np.float64)
    assert np.array_equal(a[:512], want[:512])

    # 1. A child maps a region of its own (where the parent's was, as
    #    likely as not) and reads it right, then exits normally.
    pid = os.fork()
    if pid == 0:
        with faultline.Region(2 << 20, store=faultline.FileStore(path), engine=engine) as c:
            b = np.frombuffer(c, dtype=np.float64)
            ok = np.array_equal(b, want)
            del b
        sys.exit(0 if ok else 3)
    print("own region", os.waitpid(pid, 0)[1], flush=True)

    # 2. The parent's region is intact: a page never touched before reads
    #    the file.
    print("parent after", np.array_equal(a[-512:], want[-512:]), flush=True)

    # 3. A child touching the parent's region is stopped (SIGSEGV), not
    #    handed zeros.
    pid = os.fork()
    if pid == 0:
        s = float(a[n // 2 : n // 2 + 512].sum())
        os._exit(4 if s == 0.0 else 5)
    st = os.waitpid(pid, 0)[1]
    print("touch", os.WIFSIGNALED(st) and os.WTERMSIG(st), flush=True)
    """
)


@pytest.mark.parametrize("engine", ["signal", "poll", "per-cpu"])
def test_a_forked_child_never_reads_its_parents_region(tmp_path, engine):
    p = tmp_path / "d.f64"
    write_f64(p, (2 << 20) // 8)
    script = tmp_path / "fork_child.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, "-W", "ignore", str(script), str(p), engine],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "own region 0" in lines, out
    assert "parent after True" in lines, out
    assert "touch 11" in lines, out  # SIGSEGV


CHILD_EXIT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import faultline

    r = faultline.Region(store=faultline.FileStore(sys.argv[1]), mode="r+")
    a = r.as_array(np.float64)
    a[0] = 42.0
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # atexit runs in the child: the parent's region is not its
    os.waitpid(pid, 0)
    del a
    r.close()
    print("first", np.fromfile(sys.argv[1], np.float64)[0], flush=True)
    """
)


def test_a_forked_child_that_exits_leaves_its_parents_regions_alone(tmp_path):
    p = tmp_path / "w.f64"
    write_f64(p, 1 << 12)
    script = tmp_path / "child_exit.py"
    script.write_text(CHILD_EXIT)
    out = subprocess.run(
        [sys.executable, str(script), str(p)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "first 42.0" in out.stdout, out
    assert "closing a region at exit" not in out.stderr, out.stderr
