"""Arrays over each store read back equal to numpy.fromfile; writes reach
the store."""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np
import pytest

import faultline
from conftest import ENGINES, THREAD_ENGINES, write_f64
from stores_for_tests import FileBacked, NoLength


@pytest.mark.parametrize("engine", ENGINES)
def test_file_store_reads_back_equal_to_fromfile(f64_file, engine):
    want = np.fromfile(f64_file, np.float64)
    with faultline.Region(store=faultline.FileStore(f64_file), engine=engine) as r:
        assert len(r) == os.path.getsize(f64_file)
        assert r.engine == engine
        a = r.as_array(np.float64)
        assert a.shape == want.shape
        assert not a.flags.writeable  # mode "r"
        # Touch the pages in a scattered order first, then compare all.
        idx = np.random.default_rng(7).permutation(len(want))[:2000]
        assert np.array_equal(a[idx], want[idx])
        assert np.array_equal(a, want)
        st = r.stats()
        assert st["resident_pages"] == r.pages
        assert st["faults"] > 0


def test_file_store_read_with_pread(f64_file):
    want = np.fromfile(f64_file, np.float64)
    with faultline.Region(store=faultline.FileStore(f64_file, access="pread")) as r:
        assert np.array_equal(r.as_array(np.float64), want)
    with pytest.raises(ValueError, match="access must be"):
        faultline.FileStore(f64_file, access="aio")


def test_run_ahead_installs_pages_ahead_of_a_stream(tmp_path):
    p = tmp_path / "stream.f64"
    want = write_f64(p, (64 << 20) // 8)
    with faultline.Region(store=faultline.FileStore(p), engine="poll", fault_around=16, run_ahead=1024) as r:
        assert np.array_equal(r.as_array(np.float64), want)
        assert r.stats()["run_ahead"]["pages_populated"] > 0


def test_run_ahead_is_on_by_default_only_where_it_pays(tmp_path):
    # On by default with a handler thread and no budget (4 MiB ahead); off
    # on the signal engine, under a budget, and with run_ahead=0.
    p = tmp_path / "stream.f64"
    want = write_f64(p, (64 << 20) // 8)
    for kwargs, on in [
        (dict(), True),
        (dict(engine="per-cpu"), True),
        (dict(engine="signal"), False),
        (dict(budget="16MiB"), False),
        (dict(run_ahead=0), False),
    ]:
        with faultline.Region(store=faultline.FileStore(p), **kwargs) as r:
            assert np.array_equal(r.as_array(np.float64), want), kwargs
            ra = r.stats().get("run_ahead")
            if on:
                assert ra is not None and ra["pages_populated"] > 0, (kwargs, ra)
            else:
                assert ra is None, (kwargs, ra)


def test_run_ahead_follows_strides_and_large_pages(tmp_path):
    p = tmp_path / "stride.f64"
    want = write_f64(p, (64 << 20) // 8)
    # a[::k], k 32 pages: the populator installs the stride points' windows,
    # not every page between them (it did, judging the stride by its
    # 256-page read-ahead window: twice the memory of run_ahead=0).
    k = 32 * 4096 // 8
    resident = {}
    for ra in (None, 0):
        with faultline.Region(store=faultline.FileStore(p), run_ahead=ra) as r:
            assert np.isclose(r.as_array(np.float64)[::k].sum(), want[::k].sum())
            resident[ra] = r.resident_pages
    assert resident[None] <= resident[0] * 5 // 4, resident
    # 64 KiB pages: 4 MiB ahead is 64 pages, fewer than a read-ahead window
    # of 256: it still predicts (it predicted nothing).
    with faultline.Region(store=faultline.FileStore(p), page_size=65536) as r:
        assert np.array_equal(r.as_array(np.float64), want)
        assert r.stats()["run_ahead"]["pages_populated"] > 0, r.stats()["run_ahead"]


@pytest.mark.parametrize("page_size", [8192, 65536])
def test_file_store_with_larger_pages(f64_file, page_size):
    want = np.fromfile(f64_file, np.float64)
    with faultline.Region(store=faultline.FileStore(f64_file), page_size=page_size) as r:
        assert r.page_size == page_size
        assert r.pages == -(-len(r) // page_size)
        assert np.array_equal(r.as_array(np.float64), want)


@pytest.mark.parametrize("engine", ENGINES)
def test_memory_store_reads_back_equal_to_fromfile(f64_file, engine):
    want = np.fromfile(f64_file, np.float64)
    store = faultline.MemoryStore(want)  # a NumPy array is bytes-like
    with faultline.Region(store=store, engine=engine) as r:
        assert np.array_equal(r.as_array(np.float64), want)


def test_memory_store_refuses_a_longer_region():
    with pytest.raises(ValueError, match="fewer than the region"):
        faultline.Region(1 << 20, store=faultline.MemoryStore(b"x" * 4096))


def test_memory_store_takes_writes_back(tmp_path):
    data = np.arange(1 << 16, dtype=np.int64)
    store = faultline.MemoryStore(data)
    with faultline.Region(store=store, mode="r+") as r:
        a = r.as_array(np.int64)
        a[::1000] = -1
        assert r.flush() > 0
        del a
    got = np.frombuffer(store.snapshot(), np.int64)
    want = data.copy()
    want[::1000] = -1
    assert np.array_equal(got, want)


@pytest.mark.parametrize("engine", ENGINES)
def test_zero_store_reads_zeros_and_keeps_writes_private(engine):
    with faultline.Region(1 << 20, engine=engine) as r:  # ZeroStore, mode "c"
        assert r.mode == "c"
        a = r.as_array(np.uint32)
        assert not a.any()
        a[::7] = 5
        assert int(a.sum()) == 5 * len(a[::7])


@pytest.mark.parametrize("engine", THREAD_ENGINES)
def test_python_store_reads_back_equal_to_fromfile(f64_file, engine):
    want = np.fromfile(f64_file, np.float64)
    with faultline.Region(store=FileBacked(str(f64_file)), engine=engine) as r:
        assert isinstance(r.store, faultline.PythonStore)
        assert "python store FileBacked" in r.stats()["store"]
        assert np.array_equal(r.as_array(np.float64), want)


def test_python_store_without_length_needs_one():
    with pytest.raises(ValueError, match="no length"):
        faultline.Region(store=NoLength())
    with faultline.Region(3 * 4096 + 5, store=NoLength()) as r:
        assert bytes(memoryview(r)) == b"\x07" * (3 * 4096 + 5)


@pytest.mark.parametrize("engine", THREAD_ENGINES)
def test_redis_store_reads_back_equal_to_fromfile(f64_file, redis_server, engine):
    want = np.fromfile(f64_file, np.float64)
    store = faultline.RedisStore.put(redis_server.url(f"rb-{engine}"), str(f64_file))
    assert store.length == os.path.getsize(f64_file)
    with faultline.Region(store=store, engine=engine) as r:
        assert r.engine == engine
        assert np.array_equal(r.as_array(np.float64), want)
    # Opening by URL finds the same bytes.
    again = faultline.RedisStore(redis_server.url(f"rb-{engine}"))
    with faultline.Region(store=again) as r:
        assert r.engine == "poll"  # the default for a store that is not signal-safe
        assert np.array_equal(r.as_array(np.float64), want)


def test_writes_reach_a_redis_store(redis_server):
    data = np.arange(1 << 16, dtype=np.int64)
    url = redis_server.url("rw")
    store = faultline.RedisStore.put(url, data, chunk_bytes=16384)
    assert store.chunk_bytes == 16384
    with faultline.Region(store=store, mode="r+", engine="workers") as r:
        a = r.as_array(np.int64)
        a[::777] = -5
        del a
    want = data.copy()
    want[::777] = -5
    with faultline.Region(store=faultline.RedisStore(url)) as r:
        assert np.array_equal(r.as_array(np.int64), want)


def test_redis_store_refuses_the_signal_engine_and_missing_names(redis_server, tmp_path):
    store = faultline.RedisStore.put(redis_server.url("small"), b"\x01" * 8192)
    with pytest.raises(ValueError, match="not signal-safe"):
        faultline.Region(store=store, engine="signal")
    with pytest.raises(FileNotFoundError, match="no store named"):
        faultline.RedisStore(redis_server.url("nothing-here"))


@pytest.mark.parametrize("engine", ENGINES)
def test_writes_are_flushed_to_a_file_store(tmp_path, engine):
    p = tmp_path / "w.f64"
    want = write_f64(p, 1 << 18)
    with faultline.Region(store=faultline.FileStore(p), mode="r+", engine=engine) as r:
        a = r.as_array(np.float64)
        assert a.flags.writeable
        a[::513] = 42.0
        want[::513] = 42.0
        # Not on disk before the flush (dirty pages are in the region)...
        assert not np.array_equal(np.fromfile(p, np.float64), want)
        written = r.flush()
        assert written == len(range(0, len(want), 513)), "one dirty page per write"
        assert np.array_equal(np.fromfile(p, np.float64), want)
        assert r.flush() == 0, "nothing dirty after a flush"
        # ...and a write after the flush reaches the file at close.
        a[-1] = -1.0
        want[-1] = -1.0
        del a
    assert np.array_equal(np.fromfile(p, np.float64), want)


def test_writes_to_a_python_store_reach_it(tmp_path):
    p = tmp_path / "pw.f64"
    want = write_f64(p, 1 << 16)
    with faultline.Region(store=FileBacked(str(p), writable=True), mode="r+") as r:
        a = r.as_array(np.float64)
        a[100:200] = 3.5
        want[100:200] = 3.5
        assert r.flush() >= 1
        del a
    assert np.array_equal(np.fromfile(p, np.float64), want)


def test_a_store_that_refuses_writes_fails_the_flush(tmp_path):
    p = tmp_path / "ro.f64"
    write_f64(p, 1 << 12)
    with faultline.Region(store=FileBacked(str(p), writable=False), mode="r+") as r:
        a = r.as_array(np.float64)
        a[0] = 1.0
        del a
        with pytest.raises(OSError, match="PermissionError: .* read-only") as e:
            r.flush()
        assert e.value.errno == errno.EIO
        # The dirty page is kept, not dropped: close reports the same.
        with pytest.raises(OSError, match="PermissionError"):
            r.close()


def test_mode_r_views_are_read_only(f64_file):
    with faultline.Region(store=faultline.FileStore(f64_file)) as r:
        m = memoryview(r)
        assert m.readonly and m.nbytes == len(r)
        a = r.as_array(np.float64)
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 1.0
        with pytest.raises(TypeError, match="read-only"):
            m[0:1] = b"x"
        # Consumers that ask for a writable buffer are refused.
        with pytest.raises(TypeError, match="not writable"):
            ctypes.c_char.from_buffer(r)
        m.release()


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        faultline.FileStore(tmp_path / "absent.bin")
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(tmp_path / "absent.bin")


def test_arrays_go_to_the_kernel_with_the_default_engine(f64_file, tmp_path):
    """numpy.save, tofile, file.write and os.write of an array whose pages
    are not loaded yet: the kernel's own access is served (with the signal
    engine it would fail with EFAULT or write short)."""
    want = np.fromfile(f64_file, np.float64)
    out = tmp_path / "out"
    for write in (
        lambda a, r: a.tofile(out),
        lambda a, r: np.save(out, a),
        lambda a, r: open(out, "wb").write(memoryview(r)),
        lambda a, r: os.write(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), memoryview(r)),
    ):
        with faultline.Region(store=faultline.FileStore(f64_file)) as r:
            assert r.engine == "poll"
            a = r.as_array(np.float64)
            n = write(a, r)
            assert n in (None, len(r)), n
            del a
        if out.with_suffix(".npy").exists():
            got = np.load(out.with_suffix(".npy"))
            out.with_suffix(".npy").unlink()
        else:
            got = np.fromfile(out, np.float64)
        assert np.array_equal(got, want)
    # read(2) into a region's pages.
    with faultline.Region(len(want) * 8, mode="c") as r, open(f64_file, "rb") as f:
        assert f.readinto(memoryview(r)) == len(r)
        assert np.array_equal(r.as_array(np.float64), want)


def test_r_plus_never_grows_the_file_nor_writes_past_the_region(tmp_path):
    """A file of 5000 bytes: its last page is written back up to its end
    only; a region of 100 bytes over a page of a file writes back those
    100 bytes, not what another writer put past them."""
    p = tmp_path / "w.bin"
    np.arange(5000, dtype=np.uint8).tofile(p)
    with faultline.Region(store=faultline.FileStore(p), mode="r+") as r:
        a = r.as_array(np.uint8)
        a[4999] = 77
        r.flush()
        del a
    got = np.fromfile(p, np.uint8)
    assert len(got) == 5000
    assert got[4999] == 77 and got[4998] == 4998 % 256
    q = tmp_path / "share.bin"
    np.zeros(8192, np.uint8).tofile(q)
    with faultline.Region(100, store=faultline.FileStore(q), mode="r+") as r:
        a = r.as_array(np.uint8)
        a[0] = 1
        with open(q, "r+b") as f:
            f.seek(200)
            f.write(b"\x07")
        r.flush()
        del a
    got = np.fromfile(q, np.uint8)
    assert (got[0], got[200], len(got)) == (1, 7, 8192)


def test_r_plus_is_refused_where_writes_could_not_go_back(tmp_path):
    p = tmp_path / "short.bin"
    np.zeros(5000, np.uint8).tofile(p)
    with pytest.raises(ValueError, match="holds 5000 bytes and the region is 10000"):
        faultline.Region(10000, store=faultline.FileStore(p), mode="r+")
    assert os.path.getsize(p) == 5000
    from stores_for_tests import Arange

    with pytest.raises(ValueError, match="takes no writes"):
        faultline.Region(store=Arange(1024), mode="r+")


def test_a_python_store_is_never_asked_past_its_length(tmp_path):
    from stores_for_tests import Bounded

    with faultline.Region(store=Bounded(5000), mode="r+", fault_around=4) as r:
        a = r.as_array(np.uint8)
        assert len(a) == 5000 and (a == 7).all()
        a[4999] = 1
        assert r.flush() == 1
        del a
