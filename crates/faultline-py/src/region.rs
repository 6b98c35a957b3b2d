//! `faultline.Region`: a region as a Python object that exports its
//! memory through the buffer protocol.
//!
//! # Lifetime of the mapping
//!
//! `numpy.frombuffer(region)` and `memoryview(region)` point straight at
//! the region's pages, so the mapping must outlive every view:
//!
//! ```text
//!   Region(...)            life = { region: Some(r), closed: false, exports: 0 }
//!   memoryview(region)     exports += 1   (refused once closed)
//!   region.close()/exit    closed = true; dirty pages written back now;
//!                          exports == 0 ? unmap now : keep mapping
//!   last view released    exports -= 1; closed && exports == 0 ? unmap
//! ```
//!
//! A view that outlives `close()` (an array still referenced after the
//! `with` block) therefore keeps reading the region's pages, faults and
//! all, and the region is unmapped (its last dirty pages written back)
//! when the view goes. Methods other than the buffer export raise
//! `ValueError` once the region is closed.
//!
//! Dropping the Rust region (unmapping, writing dirty pages back, waiting
//! for handlers in flight) runs with the GIL released: nothing on the
//! fault path needs the GIL ([`crate::host`]).

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use faultline::policy::PolicyKind;
use faultline::{EngineKind, EvictionConfig, MemoryKind, PageState, RunAheadConfig};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyRange};

use crate::engine;
use crate::error::region_error;
use crate::store::Store;

/// How the region's memory may be written (numpy.memmap's modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `r`: views are read-only.
    Read,
    /// `r+`: writes go back to the store (flush, eviction, close).
    ReadWrite,
    /// `c`: writes stay in this process (copy on write), never written
    /// back.
    Copy,
}

impl Mode {
    fn parse(s: &str) -> PyResult<Mode> {
        match s {
            "r" => Ok(Mode::Read),
            "r+" => Ok(Mode::ReadWrite),
            "c" => Ok(Mode::Copy),
            _ => Err(PyValueError::new_err(format!(
                "mode must be \"r\" (read-only), \"r+\" (writes go back to the store) or \"c\" (private writes), not {s:?}"
            ))),
        }
    }
    fn name(self) -> &'static str {
        match self {
            Mode::Read => "r",
            Mode::ReadWrite => "r+",
            Mode::Copy => "c",
        }
    }
}

/// Whether the region is mapped, closed, and how many views it exports.
struct Life {
    region: Option<Arc<faultline::Region>>,
    closed: bool,
    exports: usize,
    /// The `PythonStore` the region made for a plain object (its store
    /// process, a whole interpreter): stopped once the region is gone.
    own_store: Option<Py<PyAny>>,
    /// The process that made it (a forked child's copy is its parent's).
    pid: u32,
}

impl Life {
    /// Takes the region (and the store it made) to drop, once closed and
    /// with no view left.
    fn take_if_done(&mut self) -> Option<(Arc<faultline::Region>, Option<Py<PyAny>>)> {
        match self.closed && self.exports == 0 {
            true => Some((self.region.take()?, self.own_store.take())),
            false => None,
        }
    }
}

/// Drops a region taken by [`Life::take_if_done`] (without the GIL: its
/// engine may be resolving a fault that needs it), then stops the store
/// process it made.
fn drop_region(py: Python<'_>, (region, own_store): (Arc<faultline::Region>, Option<Py<PyAny>>)) {
    py.detach(move || drop(region));
    if let Some(s) = own_store {
        if let Err(e) = s.call_method0(py, "close") {
            e.print(py);
        }
    }
}

type Shared = Arc<Mutex<Life>>;

fn lock(life: &Mutex<Life>) -> MutexGuard<'_, Life> {
    life.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every region not yet dropped, for `close_all` at interpreter exit.
static LIVE: Mutex<Vec<Weak<Mutex<Life>>>> = Mutex::new(Vec::new());

/// Region(length=None, store=None, *, page_size=None, budget=None,
/// policy="clock", fault_around=None, engine=None, mode=None, run_ahead=None,
/// memory=None)
///
/// Memory whose pages come from `store` on first touch, exported through
/// the buffer protocol: `numpy.frombuffer(region, dtype)`,
/// `memoryview(region)` and `region.as_array(dtype, shape)` are views of
/// the paged memory, not copies.
///
/// * `length`: bytes (default: the store's length); rounded up to whole
///   pages inside, the views are exactly `length` bytes.
/// * `store`: a `FileStore`, `MemoryStore`, `ZeroStore` (the default),
///   `RedisStore`, `PythonStore`, or any object with `fill(offset,
///   buffer)` (made a `PythonStore`: run in a store process).
/// * `budget`: keep at most this much resident (an int of bytes, or
///   "512MiB", "25%"): dirty pages are written back before they are
///   dropped, in batches; `policy` ("fifo", "clock", "refault") picks
///   victims. Larger pages (`page_size=65536`) mean fewer faults on
///   large scans.
/// * `fault_around`: pages installed per fault (default adaptive: 16,
///   doubling to 256 along a sequential stream; 1 suits random access).
/// * `engine`: "poll" (a handler thread; the default), "signal" (the
///   faulting thread resolves its own fault, no wake-up; a system call
///   given a page not yet loaded fails with EFAULT), "spin", "workers",
///   "per-cpu" (a handler thread on each CPU: the one on the faulting
///   thread's CPU answers without a wake-up across CPUs, 10x faster than
///   "poll" on random access here; every fault wakes them all, so on a
///   many-CPU host restrict the process's CPUs).
/// * `mode`: "r" (read-only views; the default), "r+" (writes go back to
///   the store on `flush()`, eviction and `close()`), "c" (private writes;
///   the default for a `ZeroStore`).
/// * `run_ahead`: a background thread installs up to this many pages
///   ahead of a sequential or strided stream (0: none). Default: 4 MiB
///   worth with a handler-thread engine and no budget, none otherwise.
/// * `memory`: what backs the region: "private-anon" (the default),
///   "shmem" (a memfd), or "hugetlb" (a memfd of 2 MiB pages from the
///   system's pool, `/proc/sys/vm/nr_hugepages`; `page_size` defaults to
///   2 MiB): one fault and one copy per 2 MiB, what a long sequential
///   scan of a file wants. Budgets and `mode="r+"` need private-anon.
///
/// A context manager. `close()` writes dirty pages back and unmaps once
/// no view is left: a view that outlives it keeps the memory mapped.
/// Errors: `OSError` (with `errno`) from the system or a store,
/// `ValueError` for bad arguments, `BufferError` for a refused view.
#[pyclass(frozen, weakref, module = "faultline")]
pub struct Region {
    life: Shared,
    addr: u64,
    /// Bytes exported (the length asked for).
    len: usize,
    page_size: usize,
    pages: usize,
    mode: Mode,
    engine: &'static str,
    budget_pages: Option<usize>,
    /// The store object given (or made): kept alive with the region.
    store: Py<PyAny>,
}

/// Bytes a region's populator runs ahead of a sequential stream by
/// default.
const RUN_AHEAD_BYTES: usize = 4 << 20;

/// Pages run ahead when `run_ahead` is not given: [`RUN_AHEAD_BYTES`]
/// where handler threads serve the faults of private anonymous memory and
/// there is no budget; none on the signal engine, under a budget, or over
/// shmem and hugetlb memory.
///
/// Measured (RESULTS.md, "Run-ahead by default"): a warm sequential sum
/// over 512 MiB took 1.8x less time with it on the poll engine, a sorted
/// gather 4.2x less (it is a strided stream); on the signal engine the
/// gather was slower with it (the populator competes with the faulting
/// thread, which pays no wake-up), and under a 64 MiB budget the sum was
/// slower (what the populator installs is evicted again before use).
/// Over shmem a user audit measured 22,009 faults with it against 516
/// without, 1.17x slower.
fn default_run_ahead(
    kind: EngineKind,
    memory: Option<MemoryKind>,
    budget_pages: Option<usize>,
    page_size: usize,
) -> usize {
    let private = memory.is_none_or(|m| m == MemoryKind::PrivateAnon);
    if kind == EngineKind::Signal || budget_pages.is_some() || !private {
        0
    } else {
        (RUN_AHEAD_BYTES / page_size).max(1)
    }
}

/// The `Store` behind `obj`: a store, a `PythonStore` (its
/// `_faultline_store`), or any other object, made a `PythonStore`
/// (`true`: made here, the region's to stop).
fn resolve_store<'py>(
    py: Python<'py>,
    obj: Option<Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, Store>, bool)> {
    let obj = match obj {
        None => Bound::new(py, crate::store::ZeroStore::new_init())?.into_any(),
        Some(o) => o,
    };
    if let Ok(s) = obj.cast::<Store>() {
        return Ok((obj.clone(), s.clone(), false));
    }
    let (wrapper, made) = if obj.hasattr("_faultline_store")? {
        (obj, false)
    } else {
        let made = py
            .import("faultline._host")?
            .getattr("PythonStore")?
            .call1((obj,))?;
        (made, true)
    };
    let inner = wrapper.getattr("_faultline_store")?;
    let store = inner.cast::<Store>()?.clone();
    Ok((wrapper, store, made))
}

/// Parses a budget: an int of bytes, or a string: `"512MiB"`, `"1.5 GB"`,
/// `"25%"` (of the region). Returns whole pages.
fn parse_budget(b: &Bound<'_, PyAny>, region_bytes: usize, page_size: usize) -> PyResult<usize> {
    let bytes: f64 = if let Ok(n) = b.extract::<u64>() {
        n as f64
    } else if b.is_instance_of::<pyo3::types::PyInt>() {
        // Past u64 (a budget larger than any region: the whole region) or
        // negative.
        match b.lt(0)? {
            true => {
                return Err(PyValueError::new_err(format!(
                    "budget {b}: a number of bytes is at least 0"
                )))
            }
            false => f64::MAX,
        }
    } else if let Ok(s) = b.extract::<String>() {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num: f64 = num.parse().map_err(|_| {
            PyValueError::new_err(format!(
                "budget {s:?}: expected a number and a unit, e.g. \"512MiB\" or \"25%\""
            ))
        })?;
        let scale = match unit.trim().to_ascii_lowercase().as_str() {
            "%" => region_bytes as f64 / 100.0,
            "b" => 1.0,
            "k" | "kb" | "kib" => 1024.0,
            "m" | "mb" | "mib" => 1024.0 * 1024.0,
            "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
            "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            "" => {
                return Err(PyValueError::new_err(format!(
                    "budget {s:?} has no unit: give an int of bytes, or a string like \"512MiB\" or \"25%\""
                )))
            }
            u => return Err(PyValueError::new_err(format!("budget {s:?}: unknown unit {u:?} (B, KiB, MiB, GiB, TiB or %)"))),
        };
        num * scale
    } else {
        return Err(PyValueError::new_err(
            "budget must be an int of bytes or a string like \"512MiB\" or \"25%\"",
        ));
    };
    let pages = (bytes / page_size as f64).floor() as usize;
    if pages == 0 {
        return Err(PyValueError::new_err(format!(
            "budget of {bytes} bytes is less than one {page_size}-byte page"
        )));
    }
    // Fewer than faultline::MIN_BUDGET_PAGES: refused by the region.
    Ok(pages)
}

/// A dict of named counters.
fn counters<'py>(py: Python<'py>, pairs: &[(&str, u64)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in pairs {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// Closes a region (see the module docs): returns the write-back's error.
fn close(py: Python<'_>, life: &Mutex<Life>) -> PyResult<()> {
    let region = {
        let mut l = lock(life);
        if l.closed {
            return Ok(());
        }
        l.closed = true;
        l.region.clone()
    };
    let Some(region) = region else {
        return Ok(());
    };
    let flushed = py.detach(|| region.flush());
    drop(region);
    let last = lock(life).take_if_done();
    if let Some(last) = last {
        drop_region(py, last);
    }
    flushed.map(|_| ()).map_err(region_error)
}

/// Closes every live region this process made (at interpreter exit:
/// dirty pages of `r+` regions reach their stores even when nobody closed
/// them; a forked child leaves its parent's to the parent). Returns the
/// errors' texts.
#[pyfunction]
pub fn _close_all(py: Python<'_>) -> Vec<String> {
    let me = std::process::id();
    let live: Vec<Shared> = {
        let mut l = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        l.retain(|w| w.strong_count() > 0);
        l.iter()
            .filter_map(|w| w.upgrade())
            .filter(|life| lock(life).pid == me)
            .collect()
    };
    live.iter()
        .filter_map(|life| close(py, life).err().map(|e| e.to_string()))
        .collect()
}

impl Region {
    /// The region, or `ValueError` once closed.
    fn live(&self) -> PyResult<Arc<faultline::Region>> {
        let l = lock(&self.life);
        match (&l.region, l.closed) {
            (Some(r), false) => Ok(r.clone()),
            _ => Err(PyValueError::new_err("the region is closed")),
        }
    }

    /// A byte range given as `(offset, length)` or a `range` of bytes;
    /// from `offset` to the end by default.
    fn byte_range(
        &self,
        offset: Option<&Bound<'_, PyAny>>,
        length: Option<usize>,
    ) -> PyResult<(usize, usize)> {
        let Some(offset) = offset else {
            return Ok((0, length.unwrap_or(self.len)));
        };
        if let Ok(r) = offset.cast::<PyRange>() {
            if length.is_some() {
                return Err(PyValueError::new_err(
                    "give a range of bytes or (offset, length), not both",
                ));
            }
            let (start, stop, step): (isize, isize, isize) = (
                r.getattr("start")?.extract()?,
                r.getattr("stop")?.extract()?,
                r.getattr("step")?.extract()?,
            );
            if step != 1 || start < 0 || stop < start {
                return Err(PyValueError::new_err(
                    "the range must be ascending bytes with step 1",
                ));
            }
            return Ok((start as usize, (stop - start) as usize));
        }
        let start: usize = offset.extract()?;
        Ok((start, length.unwrap_or(self.len.saturating_sub(start))))
    }

    /// The pages overlapping `[start, start + len)`, which must lie in the
    /// region.
    fn pages_of(&self, start: usize, len: usize) -> PyResult<std::ops::Range<usize>> {
        match start.checked_add(len) {
            // No byte, no page (the empty range at `start`).
            Some(end) if end <= self.len && len == 0 => {
                Ok(start / self.page_size..start / self.page_size)
            }
            Some(end) if end <= self.len => {
                Ok(start / self.page_size..end.div_ceil(self.page_size))
            }
            _ => Err(PyValueError::new_err(format!(
                "bytes [{start}, {}) are outside the region's {} bytes",
                start as u128 + len as u128,
                self.len
            ))),
        }
    }

    /// One byte per page of `span`, from `f(state)`.
    fn per_page<'py>(
        &self,
        py: Python<'py>,
        span: std::ops::Range<usize>,
        dtype: &str,
        f: impl Fn(PageState) -> u8,
    ) -> PyResult<Bound<'py, PyAny>> {
        let region = self.live()?;
        let states: Vec<u8> = span.map(|p| f(region.page_state(p))).collect();
        let bytes = PyByteArray::new(py, &states);
        py.import("numpy")?
            .getattr("frombuffer")?
            .call1((bytes, dtype))
    }
}

#[pymethods]
impl Region {
    #[new]
    #[pyo3(signature = (length = None, store = None, *, page_size = None, budget = None,
                        policy = "clock", fault_around = None, engine = None, mode = None,
                        run_ahead = None, memory = None))]
    #[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn new(
        py: Python<'_>,
        length: Option<usize>,
        store: Option<Bound<'_, PyAny>>,
        page_size: Option<usize>,
        budget: Option<Bound<'_, PyAny>>,
        policy: &str,
        fault_around: Option<usize>,
        engine: Option<&str>,
        mode: Option<&str>,
        run_ahead: Option<usize>,
        memory: Option<&str>,
    ) -> PyResult<Region> {
        let kind_of_memory = memory
            .map(|m| {
                MemoryKind::ALL
                    .into_iter()
                    .find(|k| k.name() == m)
                    .ok_or_else(|| {
                        let names: Vec<_> = MemoryKind::ALL.iter().map(|k| k.name()).collect();
                        PyValueError::new_err(format!(
                            "unknown memory {m:?}: expected one of {names:?}"
                        ))
                    })
            })
            .transpose()?;
        let (store_obj, store, made_store) = resolve_store(py, store)?;
        let store = store.get();
        let inner = store.inner.clone();
        let mode = match mode {
            Some(m) => Mode::parse(m)?,
            None if inner.is_zero() => Mode::Copy,
            None => Mode::Read,
        };
        if mode == Mode::ReadWrite && inner.is_zero() {
            return Err(PyValueError::new_err(
                "mode=\"r+\" writes back to the store, and a ZeroStore discards writes: use mode=\"c\"",
            ));
        }
        let len = match (length, inner.len()) {
            (Some(n), _) => n,
            (None, Some(n)) => usize::try_from(n)
                .map_err(|_| PyValueError::new_err("the store is too long for this process"))?,
            (None, None) => {
                return Err(PyValueError::new_err(format!(
                    "the store {} has no length: give the region's length",
                    inner.describe()
                )))
            }
        };
        if len == 0 {
            return Err(PyValueError::new_err("a region's length must be positive"));
        }
        if let Some(k) = kind_of_memory.filter(|&k| k != MemoryKind::PrivateAnon) {
            // Dirty tracking (r+) is the budget's machinery.
            if budget.is_some() || mode == Mode::ReadWrite {
                return Err(PyValueError::new_err(format!(
                    "a budget and mode=\"r+\" (which tracks dirty pages as a budget does) need private anonymous memory, not memory={:?}: leave memory at \"private-anon\"",
                    k.name()
                )));
            }
        }
        // Default: the memory's own page (4 KiB; 2 MiB for hugetlb).
        let page_size = page_size.unwrap_or_else(|| {
            kind_of_memory
                .unwrap_or(MemoryKind::PrivateAnon)
                .min_page_size()
                .bytes()
        });
        if page_size == 0 || !page_size.is_power_of_two() || page_size < 4096 {
            return Err(PyValueError::new_err(format!(
                "page_size must be a power of two of at least 4096 bytes, not {page_size}"
            )));
        }
        let mapped = len
            .div_ceil(page_size)
            .checked_mul(page_size)
            .filter(|&m| m <= isize::MAX as usize)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "a region of {len} bytes is longer than an address space holds"
                ))
            })?;
        let pages = mapped / page_size;
        if mode == Mode::ReadWrite {
            // Refused now, as numpy.memmap does, rather than at a flush.
            if !inner.writable() {
                return Err(PyValueError::new_err(format!(
                    "mode=\"r+\" writes back to the store, and {} takes no writes (opened read-only, or a Python store without write_back): use mode=\"r\" or \"c\"",
                    inner.describe()
                )));
            }
            if let Some(n) = inner.len().filter(|&n| n < len as u64) {
                return Err(PyValueError::new_err(format!(
                    "mode=\"r+\": {} holds {n} bytes and the region is {len}: what is written past its end could not be written back (a file is never grown); extend it first (os.truncate) or make the region at most {n} bytes",
                    inner.describe()
                )));
            }
        }
        let inner = crate::store::ZeroTail::wrap(inner, len, mapped, mode == Mode::ReadWrite);
        let policy: PolicyKind = policy.parse().map_err(|_| {
            PyValueError::new_err(format!(
                "unknown policy {policy:?}: expected \"fifo\", \"clock\" or \"refault\""
            ))
        })?;
        let budget_pages = match (&budget, mode) {
            (Some(_), Mode::Copy) => {
                return Err(PyValueError::new_err(
                    "a budget evicts pages by writing dirty ones back to the store, which mode=\"c\" never does: use mode=\"r\" or \"r+\"",
                ))
            }
            (Some(b), _) => Some(parse_budget(b, mapped, page_size)?.min(pages)),
            // Writes reach the store only from a region that tracks dirty
            // pages, which is what a budget does: one that evicts nothing.
            (None, Mode::ReadWrite) => Some(pages),
            (None, _) => None,
        };
        if fault_around == Some(0) {
            return Err(PyValueError::new_err(
                "fault_around must be at least 1 page",
            ));
        }
        let kind = engine::choose(engine)?;
        if kind == EngineKind::Signal {
            if let Some(why) = store.signal_refusal {
                return Err(PyValueError::new_err(why));
            }
        }
        let engine = engine::shared_py(kind)?;
        let mut builder = faultline::Region::builder(mapped)
            .shared_store(inner)
            .page_size(page_size);
        if let Some(k) = kind_of_memory {
            builder = builder.kind(k);
        }
        if let Some(n) = fault_around {
            builder = builder.fault_around(n);
        }
        let run_ahead = run_ahead
            .unwrap_or_else(|| default_run_ahead(kind, kind_of_memory, budget_pages, page_size));
        if run_ahead > 0 {
            builder = builder.run_ahead(RunAheadConfig {
                budget_pages: run_ahead,
            });
        }
        if let Some(b) = budget_pages {
            builder = builder.budget(EvictionConfig {
                budget_pages: b,
                policy,
            });
        }
        let region = py
            .detach(move || builder.build_dyn(engine))
            .map_err(region_error)?;
        let addr = region.addr();
        let life = Arc::new(Mutex::new(Life {
            region: Some(Arc::new(region)),
            closed: false,
            exports: 0,
            own_store: made_store.then(|| store_obj.clone().unbind()),
            pid: std::process::id(),
        }));
        {
            let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&life));
        }
        Ok(Region {
            life,
            addr,
            len,
            page_size,
            pages,
            mode,
            engine: kind.name(),
            budget_pages: budget.is_some().then_some(budget_pages).flatten(),
            store: store_obj.unbind(),
        })
    }

    /// # Safety
    /// Called by Python with a valid `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let writable = flags & ffi::PyBUF_WRITABLE != 0;
        if writable && this.mode == Mode::Read {
            return Err(PyBufferError::new_err(
                "the region is read-only (mode=\"r\"): open it with mode=\"r+\" (writes go back to the store) or \"c\" (private writes)",
            ));
        }
        {
            let mut l = lock(&this.life);
            if l.closed || l.region.is_none() {
                return Err(PyBufferError::new_err("the region is closed"));
            }
            l.exports += 1;
        }
        // SAFETY: `view` is Python's; the memory is the region's mapping,
        // `len` bytes from `addr`, which stays mapped until the export is
        // released (the count just taken; module docs). FillInfo sets
        // `view.obj` to a new reference to the region.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                this.addr as *mut c_void,
                this.len as ffi::Py_ssize_t,
                c_int::from(this.mode == Mode::Read),
                flags,
            )
        };
        if rc != 0 {
            lock(&this.life).exports -= 1;
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    /// Called by Python with a view this region exported.
    unsafe fn __releasebuffer__(&self, py: Python<'_>, _view: *mut ffi::Py_buffer) {
        let last = {
            let mut l = lock(&self.life);
            l.exports -= 1;
            l.take_if_done()
        };
        if let Some(last) = last {
            drop_region(py, last);
        }
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        close(py, &self.life)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let l = lock(&self.life);
        let state = if !l.closed {
            "open".to_string()
        } else if l.region.is_some() {
            format!("closed, mapped for {} view(s)", l.exports)
        } else {
            "closed".to_string()
        };
        format!(
            "<faultline.Region {} bytes at {:#x}, {} pages of {}, mode {:?}, engine {}, {state}>",
            self.len,
            self.addr,
            self.pages,
            self.page_size,
            self.mode.name(),
            self.engine
        )
    }

    /// Writes dirty pages back, then unmaps once no view is left.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        close(py, &self.life)
    }

    /// Writes every dirty page back to the store; returns how many.
    fn flush(&self, py: Python<'_>) -> PyResult<usize> {
        let region = self.live()?;
        py.detach(move || region.flush()).map_err(region_error)
    }

    /// Installs the pages overlapping `[offset, offset + length)` now.
    #[pyo3(signature = (offset = 0, length = None))]
    fn prefetch(&self, py: Python<'_>, offset: usize, length: Option<usize>) -> PyResult<()> {
        let region = self.live()?;
        let len = length.unwrap_or(self.len.saturating_sub(offset));
        let span = self.pages_of(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let (start, bytes) = (span.start * self.page_size, span.len() * self.page_size);
        let region2 = region.clone();
        py.detach(move || region2.populate(start, bytes))
            .map_err(region_error)?;
        // `populate` passes over pages an earlier store error poisoned: a
        // prefetch that cannot make its range readable says so.
        if let Some(p) = span
            .clone()
            .find(|&p| region.page_state(p) == PageState::Poisoned)
        {
            return Err(crate::error::os_error(
                faultline::error::Errno::EIO.0,
                format!(
                    "page {p} (offset {:#x}) is poisoned by an earlier store error; reading it raises SIGBUS",
                    p * self.page_size
                ),
            ));
        }
        Ok(())
    }

    /// Which pages overlapping the byte range are resident.
    #[pyo3(signature = (offset = None, length = None))]
    fn resident<'py>(
        &self,
        py: Python<'py>,
        offset: Option<Bound<'py, PyAny>>,
        length: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (start, len) = self.byte_range(offset.as_ref(), length)?;
        let span = self.pages_of(start, len)?;
        self.per_page(py, span, "bool", |s| {
            u8::from(matches!(s, PageState::ReadOnly | PageState::Writable))
        })
    }

    /// Each page's state: 0 absent, 1 clean, 2 writable (dirty where writes
    /// are tracked: with a budget or `mode="r+"`; without, every installed
    /// page is writable), 3 poisoned.
    #[pyo3(signature = (offset = None, length = None))]
    fn page_states<'py>(
        &self,
        py: Python<'py>,
        offset: Option<Bound<'py, PyAny>>,
        length: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (start, len) = self.byte_range(offset.as_ref(), length)?;
        let span = self.pages_of(start, len)?;
        self.per_page(py, span, "uint8", |s| match s {
            PageState::Absent => 0,
            PageState::ReadOnly => 1,
            PageState::Writable => 2,
            PageState::Poisoned => 3,
        })
    }

    /// A NumPy array over the region (no copy).
    #[pyo3(signature = (dtype = None, shape = None, offset = 0))]
    fn as_array<'py>(
        slf: Bound<'py, Self>,
        dtype: Option<Bound<'py, PyAny>>,
        shape: Option<Bound<'py, PyAny>>,
        offset: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let np = py.import("numpy")?;
        let dtype = np.getattr("dtype")?.call1((match dtype {
            Some(d) => d,
            None => "uint8".into_pyobject(py)?.into_any(),
        },))?;
        // As numpy's reshape: one dimension may be -1 (the rest of the
        // buffer), and then every element from `offset` on is taken.
        let count: isize = match &shape {
            None => -1,
            Some(s) => {
                let dims: Vec<isize> = match s.extract::<isize>() {
                    Ok(n) => vec![n],
                    Err(_) => s.extract().map_err(|_| {
                        PyTypeError::new_err("shape must be an int or a sequence of ints")
                    })?,
                };
                match dims.iter().filter(|&&d| d == -1).count() {
                    0 if dims.iter().all(|&d| d >= 0) => dims
                        .iter()
                        .try_fold(1isize, |p, &d| p.checked_mul(d))
                        .ok_or_else(|| {
                            PyValueError::new_err(format!(
                                "shape {dims:?}: more elements than a buffer can hold"
                            ))
                        })?,
                    1 if dims.iter().all(|&d| d >= -1) => -1,
                    _ => {
                        return Err(PyValueError::new_err(format!(
                            "shape {dims:?}: dimensions are sizes of at least 0, and at most one may be -1"
                        )))
                    }
                }
            }
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", &dtype)?;
        kwargs.set_item("count", count)?;
        kwargs.set_item("offset", offset)?;
        let arr = np.getattr("frombuffer")?.call((slf,), Some(&kwargs))?;
        match shape {
            Some(s) => arr.call_method1("reshape", (s,)),
            None => Ok(arr),
        }
    }

    /// Counters, residency and settings, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let region = self.live()?;
        let s = region.stats();
        let d = counters(
            py,
            &[
                ("faults", s.faults),
                ("installed", s.installed),
                ("ioctls", s.ioctls),
                ("store_fills", s.store_fills),
                ("zero_copy_fills", s.zero_copy_fills),
                ("exists", s.exists),
                ("retries", s.retries),
                ("busy", s.busy),
                ("poisoned", s.poisoned),
            ],
        )?;
        d.set_item("resident_pages", region.resident_pages())?;
        d.set_item("pages", self.pages)?;
        d.set_item("page_size", self.page_size)?;
        d.set_item("length", self.len)?;
        d.set_item("engine", self.engine)?;
        d.set_item("mode", self.mode.name())?;
        d.set_item("store", region.store().describe())?;
        d.set_item("zero_copy", region.is_zero_copy())?;
        d.set_item("budget_pages", self.budget_pages)?;
        if let Some(e) = region.eviction_stats() {
            let pairs = [
                ("evicted", e.evicted),
                ("written_back", e.written_back),
                ("write_back_errors", e.write_back_errors),
                ("unwritable", e.unwritable),
                ("resident", e.resident),
                ("max_resident", e.max_resident),
            ];
            d.set_item("eviction", counters(py, &pairs)?)?;
        }
        if let Some(ra) = region.run_ahead_stats() {
            let pairs = [
                ("faults_seen", ra.faults_seen),
                ("windows_predicted", ra.windows_predicted),
                ("pages_populated", ra.pages_populated),
            ];
            d.set_item("run_ahead", counters(py, &pairs)?)?;
        }
        Ok(d)
    }

    /// The store object the region reads from.
    #[getter]
    fn store(&self, py: Python<'_>) -> Py<PyAny> {
        self.store.clone_ref(py)
    }

    /// Bytes of the region.
    #[getter]
    fn length(&self) -> usize {
        self.len
    }

    /// Address of the first byte.
    #[getter]
    fn address(&self) -> u64 {
        self.addr
    }

    /// Bytes per page.
    #[getter]
    fn page_size(&self) -> usize {
        self.page_size
    }

    /// Number of pages.
    #[getter]
    fn pages(&self) -> usize {
        self.pages
    }

    /// `"r"`, `"r+"` or `"c"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode.name()
    }

    /// The engine's name.
    #[getter]
    fn engine(&self) -> &'static str {
        self.engine
    }

    /// The budget asked for, in pages (`None`: no budget).
    #[getter]
    fn budget_pages(&self) -> Option<usize> {
        self.budget_pages
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.life).closed
    }

    /// Whether the memory is still mapped (a closed region stays mapped
    /// while views of it exist).
    #[getter]
    fn mapped(&self) -> bool {
        lock(&self.life).region.is_some()
    }

    /// Buffer views (memoryviews, arrays) of the region alive now.
    #[getter]
    fn exports(&self) -> usize {
        lock(&self.life).exports
    }

    /// Pages resident now.
    #[getter]
    fn resident_pages(&self) -> PyResult<usize> {
        Ok(self.live()?.resident_pages())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Views hold references to the region, so none is left here: the
        // region (if not unmapped yet) goes now, without the GIL.
        let last = {
            let mut l = lock(&self.life);
            l.region.take().map(|r| (r, l.own_store.take()))
        };
        if let Some(last) = last {
            Python::attach(|py| drop_region(py, last));
        }
    }
}
