//! The stores Python sees: `Store` (the base class every store derives
//! from, holding the Rust [`PageStore`]) and the built-in ones
//! (`FileStore`, `MemoryStore`, `ZeroStore`, `RedisStore` with the `redis`
//! feature). A store written in Python is [`crate::host`]'s.

use std::path::PathBuf;
use std::sync::Arc;

use faultline::store::{FillRange, PageCacheFile, Tail, WriteRange};
use faultline::{PageStore, StoreError};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::io_error;

/// Where a region's pages come from. Not constructed directly: use
/// `FileStore`, `MemoryStore`, `ZeroStore`, `RedisStore`, or pass any
/// object with a `fill(offset, buffer)` method to `Region` (a Python
/// store).
#[pyclass(subclass, frozen, module = "faultline")]
pub struct Store {
    pub(crate) inner: Arc<dyn PageStore>,
    /// Why the signal engine cannot serve this store, when the reason is
    /// ours to give (a Python store); `None` leaves the check to the
    /// library.
    pub(crate) signal_refusal: Option<&'static str>,
}

impl Store {
    pub(crate) fn new(inner: Arc<dyn PageStore>) -> Store {
        Store {
            inner,
            signal_refusal: None,
        }
    }
}

#[pymethods]
impl Store {
    /// What the store is, as faultline's messages name it.
    #[getter]
    fn description(&self) -> String {
        self.inner.describe().to_string()
    }

    /// Bytes of data the store holds (`None`: no end, as for zeros).
    #[getter]
    fn length(&self) -> Option<u64> {
        self.inner.len()
    }

    /// Whether the store may be read inside a SIGBUS handler (the
    /// `signal` engine's requirement).
    #[getter]
    fn signal_safe(&self) -> bool {
        self.inner.signal_safe() && self.signal_refusal.is_none()
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let name = slf.get_type().name()?;
        let s = slf.get();
        Ok(match s.inner.len() {
            Some(n) => format!("<faultline.{name} {} ({n} bytes)>", s.inner.describe()),
            None => format!("<faultline.{name} {}>", s.inner.describe()),
        })
    }
}

/// FileStore(path, *, access="mmap")
///
/// A file: pages are read from it on first touch and, for a region opened
/// with `mode="r+"`, written back to it. The file is opened read-write
/// when permitted, else read-only. A region longer than the file reads
/// zeros past its end. `access="mmap"` copies pages from a mapping of
/// the file (on tmpfs, e.g. /dev/shm, a region maps the file's page cache
/// itself and copies nothing); `"pread"` reads them with `pread(2)`.
#[pyclass(extends = Store, frozen, module = "faultline")]
pub struct FileStore {
    path: PathBuf,
}

#[pymethods]
impl FileStore {
    #[new]
    #[pyo3(signature = (path, *, access = "mmap"))]
    fn new(path: PathBuf, access: &str) -> PyResult<PyClassInitializer<Self>> {
        let access = match access {
            "mmap" => faultline::FileAccess::Mmap,
            "pread" => faultline::FileAccess::Pread,
            a => {
                return Err(PyValueError::new_err(format!(
                "access must be \"mmap\" (copy from a mapping of the file) or \"pread\", not {a:?}"
            )))
            }
        };
        let store =
            faultline::FileStore::open_with(&path, 0, access).map_err(|e| io_error(e, &path))?;
        Ok(PyClassInitializer::from(Store::new(Arc::new(store))).add_subclass(FileStore { path }))
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }
}

/// A copy of a bytes-like object (bytes, bytearray, a contiguous NumPy
/// array) in memory. A region may not be longer than it; write-backs of a
/// `mode="r+"` region change the copy (`snapshot()` reads it).
#[pyclass(extends = Store, frozen, module = "faultline")]
pub struct MemoryStore {
    store: Arc<faultline::MemoryStore>,
}

#[pymethods]
impl MemoryStore {
    #[new]
    fn new(data: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let bytes = contiguous_bytes(data)?;
        let store = Arc::new(faultline::MemoryStore::new(bytes));
        let inner: Arc<dyn PageStore> = store.clone();
        Ok(PyClassInitializer::from(Store::new(inner)).add_subclass(MemoryStore { store }))
    }

    /// The store's bytes now (a copy).
    fn snapshot<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.store.snapshot())
    }
}

/// Copies the bytes of a C-contiguous buffer.
pub fn contiguous_bytes(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let buf = pyo3::buffer::PyUntypedBuffer::get(data)?;
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err(
            "the data must be C-contiguous (numpy.ascontiguousarray makes it so)",
        ));
    }
    // SAFETY: the buffer export keeps `len_bytes` bytes at `buf_ptr`
    // alive and unchanged in place until `buf` is dropped, after the copy.
    let bytes = unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) };
    Ok(bytes.to_vec())
}

/// Every page reads as zeros (anonymous memory, allocated on first
/// touch); nothing is written back. The default store of a region.
#[pyclass(extends = Store, frozen, module = "faultline")]
pub struct ZeroStore;

#[pymethods]
impl ZeroStore {
    #[new]
    fn new() -> PyClassInitializer<Self> {
        Self::new_init()
    }
}

impl ZeroStore {
    /// A new `ZeroStore`'s initializer (the default store of a region).
    pub fn new_init() -> PyClassInitializer<Self> {
        PyClassInitializer::from(Store::new(Arc::new(faultline::ZeroStore))).add_subclass(ZeroStore)
    }
}

/// A store kept in Redis, Redis Cluster or Valkey: fixed-size chunks
/// under `fl:{NAME:G}:C` keys, written by `RedisStore.put`. URLs:
/// `redis://HOST:PORT[/DB]#NAME`, `unix:///PATH#NAME`,
/// `redis-cluster://HOST:PORT,...#NAME`. Served by the thread engines
/// (a network client cannot run inside a SIGBUS handler).
#[cfg(feature = "redis")]
#[pyclass(extends = Store, frozen, module = "faultline")]
pub struct RedisStore {
    store: Arc<faultline_redis::RedisStore>,
}

#[cfg(feature = "redis")]
#[pymethods]
impl RedisStore {
    #[new]
    fn new(py: Python<'_>, url: &str) -> PyResult<PyClassInitializer<Self>> {
        let url = url.to_string();
        let store = py
            .detach(move || faultline_redis::RedisStore::open(&url))
            .map_err(redis_error)?;
        Ok(Self::init(store))
    }

    /// Uploads `data` (a bytes-like object, or the path of a file) as the
    /// store at `url`, replacing one of the same name, and opens it.
    /// `chunk_bytes` is the bytes per key (default 64 KiB).
    #[staticmethod]
    #[pyo3(signature = (url, data, *, chunk_bytes = faultline_redis::DEFAULT_CHUNK))]
    fn put(
        py: Python<'_>,
        url: &str,
        data: &Bound<'_, PyAny>,
        chunk_bytes: usize,
    ) -> PyResult<Py<RedisStore>> {
        use faultline_redis::RedisConfig;
        if chunk_bytes == 0 {
            return Err(PyValueError::new_err("chunk_bytes must be positive"));
        }
        let cfg = RedisConfig::with_chunk(chunk_bytes);
        let url = url.to_string();
        let put = if let Ok(path) = data.extract::<PathBuf>() {
            let file = std::fs::File::open(&path).map_err(|e| io_error(e, &path))?;
            let len = file.metadata().map_err(|e| io_error(e, &path))?.len();
            let reader = std::io::BufReader::with_capacity(1 << 20, file);
            py.detach(|| faultline_redis::RedisStore::put(&url, cfg, reader, len, |_| ()))
        } else {
            let bytes = contiguous_bytes(data)?;
            let len = bytes.len() as u64;
            py.detach(|| faultline_redis::RedisStore::put(&url, cfg, &bytes[..], len, |_| ()))
        };
        put.map_err(redis_error)?;
        let store = py
            .detach(|| faultline_redis::RedisStore::open(&url))
            .map_err(redis_error)?;
        Py::new(py, Self::init(store))
    }

    /// The store's name (after `#` in the URL).
    #[getter]
    fn name(&self) -> String {
        self.store.name().to_string()
    }

    /// Bytes per key.
    #[getter]
    fn chunk_bytes(&self) -> usize {
        self.store.info().chunk_bytes
    }
}

#[cfg(feature = "redis")]
impl RedisStore {
    fn init(store: faultline_redis::RedisStore) -> PyClassInitializer<Self> {
        let store = Arc::new(store);
        let inner: Arc<dyn PageStore> = store.clone();
        PyClassInitializer::from(Store::new(inner)).add_subclass(RedisStore { store })
    }
}

#[cfg(feature = "redis")]
fn redis_error(e: faultline_redis::RedisStoreError) -> PyErr {
    let errno = match &e {
        // Arguments: the caller's to mend.
        faultline_redis::RedisStoreError::Url { .. }
        | faultline_redis::RedisStoreError::Config { .. } => {
            return PyValueError::new_err(e.to_string());
        }
        faultline_redis::RedisStoreError::Request {
            errno: Some(errno), ..
        } => *errno,
        faultline_redis::RedisStoreError::NoStore { .. } => faultline::error::Errno::ENOENT.0,
        faultline_redis::RedisStoreError::Io { source, .. } => source
            .raw_os_error()
            .unwrap_or(faultline::error::Errno::EIO.0),
        _ => faultline::error::Errno::EIO.0,
    };
    crate::error::os_error(errno, e.to_string())
}

/// A store as a region of `len` bytes mapped as whole pages sees it,
/// where the last page passes an end:
///
/// * the store's end: the bytes past it read as zeros and are not written
///   back, so a store is never asked for bytes it does not hold (a
///   `MemoryStore`, which refuses regions longer than its data, when the
///   region's length fits in it; a Python store that checks its bounds);
/// * the region's end, for a region that writes back (`mode="r+"`): the
///   bytes of its last page past its length are not written back (they
///   are the file's, as `numpy.memmap` leaves them; written back they
///   would overwrite what another writer put there).
///
/// Everything else is the store's, batches included.
pub struct ZeroTail {
    store: Arc<dyn PageStore>,
    /// Bytes read from the store (zeros past).
    data: u64,
    /// Bytes written back.
    writes: u64,
}

impl ZeroTail {
    /// `store` for a region of `len` bytes mapped as `mapped` bytes that
    /// `writes` back: wrapped when its last page passes an end, else
    /// unchanged.
    pub fn wrap(
        store: Arc<dyn PageStore>,
        len: usize,
        mapped: usize,
        writes: bool,
    ) -> Arc<dyn PageStore> {
        // (A store that refuses a region longer than its data is refused
        // by the region, not wrapped.)
        let data = match store.len() {
            Some(n) if n < mapped as u64 && (store.tail() != Tail::Refuse || len as u64 <= n) => n,
            _ => u64::MAX,
        };
        let writes = match writes && len < mapped {
            true => len as u64,
            false => u64::MAX,
        };
        match (data, writes) {
            (u64::MAX, u64::MAX) => store,
            _ => Arc::new(ZeroTail {
                store,
                data,
                writes: writes.min(data),
            }),
        }
    }
}

/// How many of `want` bytes at `offset` lie before `end`.
fn inside(end: u64, offset: u64, want: usize) -> usize {
    end.saturating_sub(offset).min(want as u64) as usize
}

impl PageStore for ZeroTail {
    fn describe(&self) -> &str {
        self.store.describe()
    }
    fn len(&self) -> Option<u64> {
        self.store.len()
    }
    fn tail(&self) -> Tail {
        // Past the data it gives zeros itself.
        match self.data {
            u64::MAX => self.store.tail(),
            _ => Tail::ZeroFill,
        }
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let n = inside(self.data, offset, buf.len());
        let (data, tail) = buf.split_at_mut(n);
        tail.fill(0);
        if n > 0 {
            self.store.fill(offset, data)?;
        }
        Ok(())
    }
    fn fill_batch(&self, ranges: &mut [FillRange<'_>], out: &mut [Result<(), StoreError>]) {
        let whole = |r: &FillRange<'_>| inside(self.data, r.offset, r.buf.len()) == r.buf.len();
        if ranges.iter().all(whole) {
            return self.store.fill_batch(ranges, out);
        }
        for (r, res) in ranges.iter_mut().zip(out.iter_mut()) {
            *res = self.fill(r.offset, r.buf);
        }
    }
    fn batched(&self) -> bool {
        self.store.batched()
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        match inside(self.writes, offset, data.len()) {
            0 => Ok(()),
            n => self.store.write_back(offset, &data[..n]),
        }
    }
    fn write_back_batch(&self, ranges: &[WriteRange<'_>], out: &mut [Result<(), StoreError>]) {
        let clipped: Vec<WriteRange<'_>> = ranges
            .iter()
            .map(|r| WriteRange {
                offset: r.offset,
                data: &r.data[..inside(self.writes, r.offset, r.data.len())],
            })
            .collect();
        self.store.write_back_batch(&clipped, out);
    }
    fn writable(&self) -> bool {
        self.store.writable()
    }
    fn view(&self, offset: u64, len: usize) -> Option<faultline::StoreView<'_>> {
        self.store.view(offset, len)
    }
    fn page_cache(&self) -> Option<PageCacheFile<'_>> {
        self.store.page_cache()
    }
    fn will_need(&self, offset: u64, len: usize) {
        self.store.will_need(offset, len)
    }
    fn populate(&self, offset: u64, len: usize) {
        self.store.populate(offset, len)
    }
    fn is_zero(&self) -> bool {
        self.store.is_zero()
    }
    fn signal_safe(&self) -> bool {
        self.store.signal_safe()
    }
}
