//! A store written in Python, served by a store process.
//!
//! # Why a process
//!
//! A thread that touches a missing page of a region is stopped inside the
//! kernel until the page is installed, and it stops holding whatever it
//! held: NumPy summing an array holds the GIL (a reduction drops it for
//! its inner loop, but indexing, `bytes(view)`, `tolist()` and most other
//! calls keep it). If the store's `fill` ran in this interpreter, the
//! handler thread would need that GIL and wait for ever for a thread that
//! waits for it. Python 3.11 has one GIL per process, so no thread of
//! this process can run Python while the faulter holds it, and the
//! faulter itself cannot run Python either (under the signal engine it
//! is inside a SIGBUS handler, possibly in the middle of the
//! interpreter's own bookkeeping).
//!
//! So the Python object runs in a store process: a second interpreter,
//! started by `faultline._host` with the object pickled across, which
//! takes *its* GIL inside the callback only. The handler threads here
//! never take the GIL; they pass the request over a socket and wait
//! (bounded) for the reply:
//!
//! ```text
//!  this process                                   store process (python -m faultline._host)
//!  ────────────                                   ─────────────
//!  numpy.sum ──#PF──► kernel ─► handler thread
//!     (holds the GIL,            take a free slot (socket + shm area)
//!      stopped in the kernel)    zero the area; send {FILL, seq, offset, len} ─► slot thread: recv
//!                                                                                 GIL: store.fill(offset, area)
//!                                wait for the reply (timeout) ◄─ {seq, status, error text} ─ GIL released
//!                                copy area ─► scratch ─► UFFDIO_COPY, wake the faulter
//! ```
//!
//! 1. Each slot is a socket pair and one `slot_bytes` area of a memfd
//!    both processes map shared; a slot serves one request at a time, and
//!    the store process runs one thread per slot (its threads share its
//!    GIL; a `fill` that waits on I/O lets the others run).
//! 2. A caller (a handler thread, `Region.prefetch`, a flush or the
//!    evictor's write-back) takes a free slot, waiting up to the timeout
//!    for one; requests longer than a slot are split.
//! 3. `fill` is handed the zeroed area: bytes it does not write read as
//!    zeros. `write_back` is handed a read-only view of the copied data.
//! 4. A Python exception is sent back as its text
//!    (`ValueError: page 3 is corrupt`) and becomes
//!    [`StoreError::Failed`]: the page is poisoned with that text, never
//!    installed as zeros. The slot stays usable.
//! 5. No reply within the timeout, or a closed socket (the process
//!    died), retires the slot (a late reply would answer the next
//!    request) and fails the request the same way; with every slot
//!    retired, requests fail at once, naming the last cause.
//!
//! Each request is 32 bytes: `op: u32, seq: u32, offset: u64, len: u64`
//! and 8 zero bytes (little-endian); each reply 16 bytes: `seq: u32,
//! status: u32` (0 done, 1 a Python exception), `text_len: u32` and 4
//! zero bytes, then the text. `python/faultline/_host.py` is the other
//! side.

use std::borrow::Cow;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use faultline::{PageStore, StoreError};
use faultline_sys::mem::Mapping;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::store::Store;

/// A request to fill an area.
const OP_FILL: u32 = 1;
/// A request to write an area back.
const OP_WRITE_BACK: u32 = 2;
/// Bytes of a request.
const REQUEST_BYTES: usize = 32;
/// Bytes of a reply's header.
const REPLY_BYTES: usize = 16;
/// Longest error text kept (the fault path's report line is 1 KiB).
const MAX_TEXT: usize = 400;

/// Why the signal engine refuses a Python store.
pub const SIGNAL_REFUSAL: &str = "a Python store cannot be served by the signal engine: it \
     resolves faults inside a SIGBUS handler on the faulting thread, and a Python callback \
     cannot run in a signal handler (the thread may be anywhere inside the interpreter, \
     holding the GIL); use engine=\"poll\", \"spin\" or \"workers\" (the default for Python \
     stores is \"poll\")";

/// One connection to the store process: its socket and its area.
struct Slot {
    index: usize,
    sock: UnixStream,
    seq: u32,
}

/// The free slots.
struct Pool {
    free: Vec<Slot>,
    /// Slots not retired (free or in use).
    alive: usize,
    closed: bool,
    /// Why the last slot was retired.
    last_failure: String,
}

/// How a request failed.
enum Failure {
    /// The store raised: the slot is fine.
    Raised(String),
    /// The connection is unusable: retire the slot.
    Broken(String),
}

/// The parent side of a Python store (module docs).
pub struct HostStore {
    what: Arc<str>,
    len: Option<u64>,
    writable: bool,
    shm: Mapping,
    slot_bytes: usize,
    timeout: Duration,
    pool: Mutex<Pool>,
    freed: Condvar,
}

impl HostStore {
    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self, offset: u64, text: &str) -> StoreError {
        StoreError::Failed {
            offset,
            reason: Cow::Owned(format!("{}: {text}", self.what)),
        }
    }

    /// Takes a free slot, waiting up to the timeout.
    fn take(&self, offset: u64) -> Result<Slot, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let mut pool = self.pool();
        loop {
            if pool.closed {
                return Err(self.failed(offset, "the store is closed"));
            }
            if let Some(slot) = pool.free.pop() {
                return Ok(slot);
            }
            if pool.alive == 0 {
                let why = format!(
                    "no connection to the store process is left ({})",
                    pool.last_failure
                );
                return Err(self.failed(offset, &why));
            }
            let now = Instant::now();
            if now >= deadline {
                let why = format!(
                    "no free connection to the store process within {:?} (every one is busy)",
                    self.timeout
                );
                return Err(self.failed(offset, &why));
            }
            pool = self
                .freed
                .wait_timeout(pool, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Gives a slot back, or retires it.
    fn put(&self, slot: Slot, broken: Option<&str>) {
        let mut pool = self.pool();
        match broken {
            Some(why) => {
                pool.alive -= 1;
                pool.last_failure = why.to_string();
            }
            None if !pool.closed => pool.free.push(slot),
            None => pool.alive -= 1,
        }
        drop(pool);
        self.freed.notify_one();
    }

    /// The area of slot `index`, `len` bytes.
    ///
    /// # Safety
    /// The caller holds slot `index` (so no other thread of this process
    /// uses the area) and does not read it while a request of the slot is
    /// outstanding (the store process writes it only then).
    #[allow(
        clippy::mut_from_ref,
        reason = "each slot's area belongs to the thread holding the slot"
    )]
    unsafe fn area(&self, index: usize, len: usize) -> &mut [u8] {
        assert!(len <= self.slot_bytes);
        // SAFETY: in bounds of the shared mapping (`index` < slots, `len`
        // <= slot_bytes); exclusive by the caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.shm.as_ptr().add(index * self.slot_bytes), len)
        }
    }

    /// Sends one request of `slot` and reads its reply.
    fn request(&self, slot: &mut Slot, op: u32, offset: u64, len: usize) -> Result<(), Failure> {
        slot.seq = slot.seq.wrapping_add(1);
        let mut req = [0u8; REQUEST_BYTES];
        req[0..4].copy_from_slice(&op.to_le_bytes());
        req[4..8].copy_from_slice(&slot.seq.to_le_bytes());
        req[8..16].copy_from_slice(&offset.to_le_bytes());
        req[16..24].copy_from_slice(&(len as u64).to_le_bytes());
        let call = if op == OP_FILL { "fill" } else { "write_back" };
        let broken = |e: std::io::Error, step: &str| {
            Failure::Broken(match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
                    "no reply to {call}({offset:#x}, {len}) within {:?}; that connection is retired",
                    self.timeout
                ),
                ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe | ErrorKind::ConnectionReset => {
                    "the store process exited".to_string()
                }
                _ => format!("{step} the store process: {e}"),
            })
        };
        slot.sock
            .write_all(&req)
            .map_err(|e| broken(e, "writing to"))?;
        let mut reply = [0u8; REPLY_BYTES];
        slot.sock
            .read_exact(&mut reply)
            .map_err(|e| broken(e, "reading from"))?;
        let word = |i: usize| u32::from_le_bytes(reply[i..i + 4].try_into().expect("4 bytes"));
        let (seq, status, text_len) = (word(0), word(4), word(8) as usize);
        let mut text = vec![0u8; text_len];
        slot.sock
            .read_exact(&mut text)
            .map_err(|e| broken(e, "reading from"))?;
        if seq != slot.seq {
            return Err(Failure::Broken(format!(
                "the store process answered request {seq}, expected {}",
                slot.seq
            )));
        }
        match status {
            0 => Ok(()),
            1 => {
                let mut text = String::from_utf8_lossy(&text).into_owned();
                if text.len() > MAX_TEXT {
                    let mut end = MAX_TEXT;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.truncate(end);
                    text.push_str("...");
                }
                Err(Failure::Raised(format!("{call} raised {text}")))
            }
            s => Err(Failure::Broken(format!(
                "the store process sent status {s}"
            ))),
        }
    }

    /// Runs `op` over `len` bytes at `offset` in slot-sized pieces;
    /// `piece(i, area)` moves piece `i`'s bytes in (before, write-back) or
    /// out (after, fill).
    fn run(
        &self,
        op: u32,
        offset: u64,
        len: usize,
        mut before: impl FnMut(usize, &mut [u8]),
        mut after: impl FnMut(usize, &[u8]),
    ) -> Result<(), StoreError> {
        let mut slot = self.take(offset)?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(self.slot_bytes);
            let at = offset + done as u64;
            {
                // SAFETY: we hold the slot; no request is outstanding.
                let area = unsafe { self.area(slot.index, n) };
                before(done, area);
            }
            match self.request(&mut slot, op, at, n) {
                Ok(()) => {
                    // SAFETY: we hold the slot; its request was answered.
                    let area = unsafe { self.area(slot.index, n) };
                    after(done, area);
                }
                Err(Failure::Raised(text)) => {
                    self.put(slot, None);
                    return Err(self.failed(at, &text));
                }
                Err(Failure::Broken(why)) => {
                    self.put(slot, Some(&why));
                    return Err(self.failed(at, &why));
                }
            }
            done += n;
        }
        self.put(slot, None);
        Ok(())
    }

    /// Closes every connection: the store process sees them end and exits
    /// once its calls in flight return. Later requests fail.
    pub fn shutdown(&self) {
        let mut pool = self.pool();
        pool.closed = true;
        let n = pool.free.len();
        pool.free.clear();
        pool.alive -= n;
        drop(pool);
        self.freed.notify_all();
    }
}

impl PageStore for HostStore {
    fn describe(&self) -> &str {
        &self.what
    }

    fn len(&self) -> Option<u64> {
        self.len
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        // Never past `len(store)`: a region's `ZeroTail` clips its requests.
        let len = buf.len();
        self.run(
            OP_FILL,
            offset,
            len,
            |_, area| area.fill(0),
            |at, area| buf[at..at + area.len()].copy_from_slice(area),
        )
    }

    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        if !self.writable {
            return Err(StoreError::ReadOnly {
                what: self.what.clone(),
                offset,
            });
        }
        self.run(
            OP_WRITE_BACK,
            offset,
            data.len(),
            |at, area| {
                let n = area.len();
                area.copy_from_slice(&data[at..at + n]);
            },
            |_, _| (),
        )
    }
}

/// The Rust side of `faultline.PythonStore` (which starts the store
/// process and hands its connections over). Private: use
/// `PythonStore`, or pass the object to `Region` directly.
#[pyclass(extends = Store, frozen, module = "faultline._native", name = "_HostStore")]
pub struct HostStorePy {
    store: Arc<HostStore>,
}

/// Duplicates a file descriptor Python owns.
fn dup_fd(fd: i32, what: &str) -> PyResult<OwnedFd> {
    if fd < 0 {
        return Err(PyValueError::new_err(format!(
            "{what}: bad file descriptor {fd}"
        )));
    }
    // SAFETY: Python holds `fd` open for the duration of this call (the
    // caller keeps the socket or file object alive); we only dup it.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned().map_err(|e| {
        crate::error::os_error(e.raw_os_error().unwrap_or(0), format!("dup of {what}: {e}"))
    })
}

#[pymethods]
impl HostStorePy {
    /// `sockets`: the file descriptors of this side's socket of each slot
    /// (duplicated here; the caller closes its own); `shm_fd`: the memfd
    /// of `len(sockets) * slot_bytes` bytes both processes map.
    #[new]
    #[pyo3(signature = (sockets, shm_fd, slot_bytes, length, writable, timeout, what))]
    fn new(
        sockets: Vec<i32>,
        shm_fd: i32,
        slot_bytes: usize,
        length: Option<u64>,
        writable: bool,
        timeout: f64,
        what: String,
    ) -> PyResult<PyClassInitializer<Self>> {
        if sockets.is_empty() || slot_bytes == 0 || !slot_bytes.is_multiple_of(4096) {
            return Err(PyValueError::new_err(
                "a Python store needs at least one slot of a positive multiple of 4096 bytes",
            ));
        }
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout must be a positive number of seconds, not {timeout}"
            )));
        }
        let timeout = Duration::from_secs_f64(timeout);
        let mut free = Vec::with_capacity(sockets.len());
        for (index, &fd) in sockets.iter().enumerate() {
            let sock = UnixStream::from(dup_fd(fd, "a store socket")?);
            let io = |e: std::io::Error| {
                crate::error::os_error(e.raw_os_error().unwrap_or(0), format!("store socket: {e}"))
            };
            sock.set_read_timeout(Some(timeout)).map_err(io)?;
            sock.set_write_timeout(Some(timeout)).map_err(io)?;
            free.push(Slot {
                index,
                sock,
                seq: 0,
            });
        }
        // Most recently returned first: the areas that are already touched.
        free.reverse();
        let shm_fd = dup_fd(shm_fd, "the store's shared memory")?;
        let shm = Mapping::shared(&shm_fd, sockets.len() * slot_bytes, 0).map_err(|e| {
            crate::error::os_error(
                e.source.raw_os_error().unwrap_or(0),
                format!(
                    "mapping the store's shared memory (fd {}): {e}",
                    shm_fd.as_raw_fd()
                ),
            )
        })?;
        let alive = free.len();
        let store = Arc::new(HostStore {
            what: what.into(),
            len: length,
            writable,
            shm,
            slot_bytes,
            timeout,
            pool: Mutex::new(Pool {
                free,
                alive,
                closed: false,
                last_failure: String::new(),
            }),
            freed: Condvar::new(),
        });
        let inner: Arc<dyn PageStore> = store.clone();
        let base = Store {
            inner,
            signal_refusal: Some(SIGNAL_REFUSAL),
        };
        Ok(PyClassInitializer::from(base).add_subclass(HostStorePy { store }))
    }

    /// Closes the connections (see [`HostStore::shutdown`]).
    fn shutdown(&self) {
        self.store.shutdown();
    }

    /// Connections not retired.
    #[getter]
    fn connections(&self) -> usize {
        self.store.pool().alive
    }

    /// Regions that hold the store (each holds a reference to it; this
    /// object and its `Store` base hold the other two).
    #[getter]
    fn users(&self) -> usize {
        Arc::strong_count(&self.store).saturating_sub(2)
    }
}
