//! # faultline-watch: watchpoints on user-level page permissions
//!
//! Exact write watchpoints for the process's own memory (seed 002), built
//! on the kernel interface of `faultline` (userfaultfd write-protect,
//! signal contexts, perf breakpoints). A [`Watcher`] watches any number of
//! byte ranges and calls a function on every write that touches a watched
//! byte, with the address and size written, the bytes before and after,
//! the thread and the instruction pointer.
//!
//! ```no_run
//! use faultline_watch::Watcher;
//! // The callback runs in a signal handler on the writing thread: no
//! // allocation, no locks (see "Rules for the callback" below).
//! let w = Watcher::new(|hit| {
//!     let _ = (hit.addr, hit.before_u64(), hit.after_u64(), hit.tid, hit.ip);
//! })?;
//! let balance = Box::new(0u64);
//! w.watch_value(&*balance)?;
//! # Ok::<(), faultline_watch::WatchError>(())
//! ```
//!
//! # How a write is caught
//!
//! The page holding a watched byte is write-protected; a write to it faults
//! and the fault is delivered as a signal *on the writing thread*:
//!
//! | memory | armed with | delivered as | the store goes through |
//! |---|---|---|---|
//! | [`Watcher::alloc`] memory (memfd) | uffd write-protect | SIGBUS | a second, writable mapping of the same pages |
//! | anonymous: heap, `.bss`, `mmap` | uffd write-protect | SIGBUS | `/proc/self/mem` behind a transient `mprotect` fence |
//! | file-backed private (`.data`), or [`WatcherBuilder::exact`] | `mprotect` read-only | SIGSEGV | `/proc/self/mem` (the kernel's forced write; the page stays read-only) |
//! | up to 4 aligned 1/2/4/8-byte watches | a CPU debug register (`perf_event_open`) | SIGTRAP after the write | nothing: the write already happened |
//!
//! userfaultfd arming registers the *whole* mapping once (write-protect mode
//! only, so nothing else about the mapping changes) and then protects single
//! pages with `UFFDIO_WRITEPROTECT`: setting and clearing watches never
//! splits a VMA. `mprotect` arming splits VMAs and so is limited by
//! `vm.max_map_count`.
//!
//! The handler looks the faulting page up in a lock-free hash table
//! ([`table`]); a write that touches no watched byte is a *false positive*.
//! Either way the write must still happen: the handler decodes the faulting
//! instruction ([`emulate`], iced-x86) and performs it itself (the store, or
//! the read-modify-write with flags, atomically when the instruction is
//! locked), then advances the instruction pointer. Instructions the
//! emulator does not cover fall back to the trap flag: un-protect the page,
//! single-step the instruction, re-protect in the SIGTRAP handler (about 15x
//! dearer in this VM).
//!
//! A signal costs ~3 us here (the kernel's delivery and return alone), so a
//! loop writing a watched page would pay that per store. After the faulting
//! store the handler therefore keeps interpreting the following
//! instructions ([`emulate::run`]: register ALU ops, shifts, multiplies,
//! conditional moves, loads, branches, and every emulated store) while they
//! keep touching protected pages, and returns to native execution at the
//! first instruction it does not interpret or after 64 instructions that
//! touch no protected page. Every store still goes through the emulator and
//! is reported; register, flag and memory results are checked bit-exact
//! against the CPU in the tests. Memory that is not protected is read with
//! `process_vm_readv` (never a faulting load inside the handler) and never
//! written from the handler. [`WatcherBuilder::interpret`] turns this off
//! (one signal per store, the thesis's mechanism).
//!
//! # Writes from other threads
//!
//! No tier ever makes a protected page writable for another thread while
//! it performs an emulated store: on memfd memory the store goes through
//! the alias; on mprotect memory through `/proc/self/mem`; on anonymous
//! memory armed with uffd the page is first fenced read-only with
//! `mprotect` (another thread's write then faults and waits for the page
//! lock), the uffd protection lifted, the store made through
//! `/proc/self/mem`, and both protections restored. Every write by every
//! thread faults and is reported. The exception is the single-step
//! fallback (instructions the emulator does not cover), which opens the
//! page for one instruction on every tier.
//!
//! # Rules for the callback
//!
//! The callback runs inside a signal handler on the writing thread. It must
//! not block on locks the interrupted code may hold (including the
//! allocator's), and it must not call [`Watcher::watch`] /
//! [`Watcher::unwatch`] (they return [`WatchError::Reentrant`]). Writes it
//! makes to watched memory are performed but not reported
//! ([`Stats::suppressed`]).
//!
//! # Limits
//!
//! One watcher per process at a time. The main thread's stack cannot be
//! watched (the kernel writes signal frames there); other threads' stacks
//! can be, as long as the watched page is not where the thread's next
//! signal frame lands. Memory of faultline [`Region`](faultline::Region)s is
//! registered with another userfaultfd and is refused.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | `watcher` | [`Watcher`], [`WatcherBuilder`], [`WatchedMem`]: watch, unwatch, arming |
//! | `state` | the state the writer and the handlers share |
//! | `handler` | the signal handlers: runtime, fault entry, memory access, single step |
//! | [`emulate`] | x86-64 store emulation and continued interpretation |
//! | [`table`] | the page table and range sets the handlers read |
//! | [`hw`] | debug-register watchpoints |
//! | [`maps`] | `/proc/self/maps` |
//! | `hit`, `error` | [`Hit`], [`Stats`], [`WatchError`] |
//!
//! Everything that talks to the kernel goes through `faultline-sys`
//! (mappings, userfaultfd, perf breakpoints, signal contexts).

pub mod emulate;
mod error;
mod handler;
mod hit;
pub mod hw;
pub mod maps;
mod state;
pub mod table;
mod watcher;

pub use error::WatchError;
pub use hit::{Callback, Hit, HitPath, PageStat, Stats};
pub use watcher::{WatchedMem, Watcher, WatcherBuilder};
