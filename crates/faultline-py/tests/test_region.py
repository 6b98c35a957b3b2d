"""The Region object: views and the mapping's lifetime, residency,
prefetch, statistics, errors, info()."""

from __future__ import annotations

import errno
import gc
import subprocess
import sys

import numpy as np
import pytest

import faultline
from conftest import write_f64
from faultline.testing import huge_pages_free


def mapped(addr: int) -> bool:
    """Whether `addr` is inside a mapping of this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


def test_a_view_that_outlives_close_keeps_the_mapping(f64_file):
    want = np.fromfile(f64_file, np.float64)
    with faultline.Region(store=faultline.FileStore(f64_file)) as r:
        a = r.as_array(np.float64)
        addr = r.address
        assert r.exports == 1
    # Closed, but the array still reads the region's pages: never a
    # dangling pointer. Nothing was touched before close, so every page
    # faults now.
    assert r.closed and r.mapped and mapped(addr)
    assert np.array_equal(a, want)
    with pytest.raises(ValueError, match="closed"):
        r.stats()
    with pytest.raises(BufferError, match="closed"):
        memoryview(r)
    del a
    gc.collect()
    assert r.exports == 0
    assert not r.mapped, "the last view released unmaps"
    assert not mapped(addr)


def test_close_with_no_views_unmaps_at_once(f64_file):
    r = faultline.Region(store=faultline.FileStore(f64_file))
    addr = r.address
    m = memoryview(r)
    assert m[0] == np.fromfile(f64_file, np.uint8, count=1)[0]
    m.release()
    r.close()
    assert not r.mapped and not mapped(addr)
    r.close()  # closing twice is fine


def test_views_are_zero_copy(f64_file):
    with faultline.Region(store=faultline.FileStore(f64_file), mode="c") as r:
        a = r.as_array(np.float64)
        b = np.frombuffer(r, np.float64)
        m = memoryview(r)
        assert a.ctypes.data == b.ctypes.data == r.address
        a[3] = 123.0
        assert b[3] == 123.0
        assert m[24:32].cast("d")[0] == 123.0
        m.release()


def test_as_array_shape_dtype_offset(f64_file):
    want = np.fromfile(f64_file, np.float64)
    with faultline.Region(store=faultline.FileStore(f64_file)) as r:
        a = r.as_array("f8", shape=(100, 30), offset=8 * 7)
        assert a.shape == (100, 30)
        assert np.array_equal(a.ravel(), want[7:7 + 3000])
        assert r.as_array(np.int32, 5)[0] == want[:1].view(np.int32)[0]


def test_resident_prefetch_and_page_states(f64_file):
    with faultline.Region(store=faultline.FileStore(f64_file), engine="poll", fault_around=1) as r:
        assert not r.resident().any()
        assert r.resident_pages == 0
        r.prefetch(5 * 4096 + 100, 3 * 4096)  # pages 5..8 overlap it
        res = r.resident()
        assert list(np.flatnonzero(res)) == [5, 6, 7, 8]
        assert r.resident(range(5 * 4096, 6 * 4096)).tolist() == [True]
        assert r.resident(4 * 4096, 8192).tolist() == [False, True]
        a = r.as_array(np.uint8)
        _ = a[20 * 4096]
        assert r.resident()[20]
        states = r.page_states()
        # Without a budget nothing tracks writes: installed pages are writable.
        assert states[5] == 2 and states[20] == 2 and states[0] == 0
        st = r.stats()
        assert st["resident_pages"] == 5
        assert st["installed"] == 5
        assert st["faults"] == 1
        with pytest.raises(ValueError, match="outside the region"):
            r.resident(0, len(r) + 1)
        with pytest.raises(ValueError, match="outside the region"):
            r.prefetch(len(r), 1)


def test_stats_of_a_budget_region(f64_file):
    # A fixed window of 16 pages: the slack past the budget is then
    # max(64 / 4, 4 * 16) pages, well under the array's 769.
    with faultline.Region(
        store=faultline.FileStore(f64_file), budget=64 * 4096, policy="fifo", fault_around=16
    ) as r:
        r.as_array(np.float64).sum()
        st = r.stats()
        assert st["budget_pages"] == 64
        ev = st["eviction"]
        assert ev["evicted"] > 0
        assert ev["max_resident"] >= 64


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(length=0), "positive"),
        (dict(length=4096, page_size=5000), "power of two"),
        (dict(length=4096, engine="turbo"), "unknown engine"),
        (dict(length=4096, mode="w"), "mode must be"),
        (dict(length=4096, mode="r+"), "discards writes"),
        (dict(length=4096, budget=100, mode="r"), "less than one"),
        (dict(length=1 << 20, budget=3 * 4096, mode="r"), "less than 4"),
        (dict(length=4096, budget="12 parsecs", mode="r"), "unknown unit"),
        (dict(length=4096, budget="12", mode="r"), "no unit"),
        (dict(length=4096, budget=1 << 20), 'mode="c"'),
        (dict(length=4096, policy="lru", budget=8192, mode="r"), "unknown policy"),
        (dict(length=4096, fault_around=0), "at least 1"),
        (dict(length=4096, memory="ram"), "unknown memory"),
        (dict(length=4096, memory="hugetlb", page_size=4096), "at least 2 MiB"),
        (dict(store=faultline.MemoryStore(bytes(4096)), memory="hugetlb", mode="r+"), "private anonymous"),
        (dict(store=faultline.MemoryStore(bytes(4096)), memory="shmem", budget=4096), "private anonymous"),
    ],
)
def test_bad_arguments_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        faultline.Region(**kwargs)


@pytest.mark.parametrize("engine", ["signal", "poll"])
def test_a_hugetlb_region_pages_a_file_2mib_a_fault(f64_file, engine):
    # 3 MiB + 808 bytes: two 2 MiB pages, the second partly past the file.
    if huge_pages_free() < 2:
        pytest.skip("needs 2 free huge pages (/proc/sys/vm/nr_hugepages; CI reserves 48)")
    want = np.fromfile(f64_file, np.float64)
    with faultline.Region(store=faultline.FileStore(f64_file), memory="hugetlb", engine=engine) as r:
        assert r.page_size == 2 << 20
        a = r.as_array(np.float64)
        assert np.array_equal(a, want)
        st = r.stats()
        # Two 2 MiB pages installed (one fault, or two without fault-around).
        assert st["installed"] == 2 and 1 <= st["faults"] <= 2, st
        del a


def test_budget_units(f64_file):
    size = 3 << 20
    for budget, pages in [("1MiB", 256), ("10%", int(0.1 * (size + 4096)) // 4096), (16384, 4), ("0.5 MB", 128)]:
        with faultline.Region(store=faultline.FileStore(f64_file), budget=budget) as r:
            assert r.budget_pages == pages, budget


def test_not_a_store_is_a_type_error():
    with pytest.raises(TypeError, match="fill"):
        faultline.Region(4096, store=object())


def test_info_names_engines_and_capabilities():
    i = faultline.info()
    assert set(i["engines"]) == {"signal", "poll", "spin", "workers", "per-cpu"}
    assert i["engines"]["signal"]["python_stores"] is False
    assert i["engines"]["poll"]["python_stores"] is True
    assert i["userfaultfd"] is not None
    assert "SIGBUS" in i["features"]
    assert "redis" in i["stores"] and "python" in i["stores"]
    assert i["default_engine"] == "poll"
    assert i["version"] == faultline.__version__


def test_errno_of_a_kernel_refusal():
    # A region at a fixed... no such knob here: the errno path is the store's.
    with pytest.raises(OSError) as e:
        faultline.FileStore("/proc/self/mem/nope")
    assert e.value.errno in (errno.ENOTDIR, errno.ENOENT)


def test_spin_engine_serves_and_stops(f64_file):
    want = np.fromfile(f64_file, np.float64)
    with faultline.Region(store=faultline.FileStore(f64_file), engine="spin") as r:
        assert np.array_equal(r.as_array(np.float64), want)


def test_as_array_takes_numpy_shapes(tmp_path):
    f64_file = tmp_path / "t.f64"
    want = write_f64(f64_file, 1 << 16)
    with faultline.Region(store=faultline.FileStore(f64_file)) as r:
        a = r.as_array(np.float64, shape=(-1, 128))
        assert a.shape == (len(want) // 128, 128)
        assert np.array_equal(a.ravel(), want)
        assert r.as_array(np.float64, shape=-1).shape == want.shape
        with pytest.raises(ValueError, match="more elements than a buffer"):
            r.as_array(np.float64, shape=(2**32, 2**32))
        with pytest.raises(ValueError, match="at most one may be -1"):
            r.as_array(np.float64, shape=(-1, -1))
        with pytest.raises(TypeError, match="shape must be"):
            r.as_array(np.float64, shape="x")
        # An empty range has no page, however it is given.
        assert len(r.resident(range(10, 10))) == 0
        assert len(r.resident(0, 0)) == 0


def test_sizes_past_the_address_space_are_said_so(f64_file):
    with pytest.raises(ValueError, match="longer than an address space"):
        faultline.Region(2**64 - 1)
    # A budget larger than any region is the whole region.
    with faultline.Region(store=faultline.FileStore(f64_file), budget=2**70) as r:
        assert r.stats()["budget_pages"] == r.pages


def test_an_os_error_keeps_the_kernels_errno(tmp_path):
    with pytest.raises(IsADirectoryError) as e:
        faultline.FileStore(tmp_path)  # a directory (mmap would say ENODEV)
    assert e.value.errno == errno.EISDIR, e.value
    with pytest.raises(FileNotFoundError) as e:
        faultline.FileStore(tmp_path / "absent")
    assert e.value.errno == errno.ENOENT, e.value


def test_a_store_class_of_an_interactive_main_is_refused_with_what_to_do():
    code = (
        "import faultline\n"
        "class Sq:\n"
        "    def __len__(self): return 4096\n"
        "    def fill(self, off, buf): buf[:] = b'x' * len(buf)\n"
        "try:\n"
        "    faultline.Region(store=Sq())\n"
        "except TypeError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "define it in a module" in out.stdout, (out.stdout, out.stderr)
