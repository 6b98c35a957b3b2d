//! A crew: threads that help install one fault's window, piece by piece.
//!
//! A peer's window copied from the store goes in pieces, a hold of the
//! peer's copy gate each (`CopyGate`). With a crew, the thread resolving
//! the fault posts the pieces after its own as a [`Batch`] and installs
//! them beside the crew's idle members (the foreign engine's prefetch
//! helpers), each taking the next piece, and wakes the faulting thread
//! once every piece is in: two CPUs copy one sweeping vCPU's window.
//!
//! ```text
//!   resolve ── its piece ── Batch [p1 p2 p3 p4 ...] ── takes p1, p3, ... ─┐
//!                              └─ crew member takes p2, p4, ...           ├─ all done ─► WAKE
//!                                                                          ┘
//! ```
//!
//! The poster waits for the pieces others took before it returns, so a
//! batch never outlives the region it points at; a member that finds a
//! batch drained touches nothing of it. Small windows (one piece) never
//! reach the crew, so scattered faults cost nothing more. The crew knows
//! nothing of regions: a batch carries the poster's context and the
//! function that installs a piece of it (`resolve.rs`).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex};

/// How a batch's pieces are installed: `run(ctx, piece, scratch, member)`
/// installs `piece` of the poster's `ctx` with the caller's `scratch`
/// (`member`: a crew member's call, not the poster's) and returns the
/// pages installed.
///
/// # Safety
///
/// `ctx` must be what the poster passed to [`Crew::install`]; it is valid
/// only while that call runs (a run is never made after it returns).
pub(crate) type Run = unsafe fn(*const (), Range<usize>, &mut [u8], bool) -> usize;

/// The pieces of one window, taken one at a time by index.
struct Batch {
    /// The poster's context (its region), valid while the batch has
    /// pieces not yet done: the poster waits for them.
    ctx: *const (),
    run: Run,
    pieces: Vec<Range<usize>>,
    next: AtomicUsize,
    done: AtomicUsize,
    installed: AtomicUsize,
}

// SAFETY: `ctx` is only passed to `run` for a piece taken before `done`
// reaches the piece count, while the poster (which borrows what it points
// at, a `RegionState` shared by the fault path's threads already) waits in
// `Crew::install`; every other field is an atomic or immutable.
unsafe impl Send for Batch {}
// SAFETY: as for `Send`.
unsafe impl Sync for Batch {}

impl Batch {
    /// Whether a piece is left to take.
    fn open(&self) -> bool {
        self.next.load(Relaxed) < self.pieces.len()
    }

    /// Takes and installs the next piece, if one is left; whether it did.
    fn take(&self, scratch: &mut [u8], member: bool) -> bool {
        let i = self.next.fetch_add(1, Relaxed);
        let Some(piece) = self.pieces.get(i) else {
            return false;
        };
        // SAFETY: piece `i` is not done yet, so the poster is still in
        // `Crew::install` and `ctx` is valid (see `Run`).
        let n = unsafe { (self.run)(self.ctx, piece.clone(), scratch, member) };
        self.installed.fetch_add(n, Relaxed);
        self.done.fetch_add(1, Release);
        true
    }
}

/// The windows being installed that crew members may help with, and how
/// to call idle members.
pub(crate) struct Crew {
    batches: Mutex<Vec<Arc<Batch>>>,
    call: Box<dyn Fn() + Send + Sync>,
}

impl Crew {
    /// A crew whose idle members `call` wakes.
    pub(crate) fn new(call: impl Fn() + Send + Sync + 'static) -> Crew {
        Crew {
            batches: Mutex::new(Vec::new()),
            call: Box::new(call),
        }
    }

    /// Installs `pieces` of `ctx` by `run` (see [`Run`]) with the crew's
    /// help; returns the pages installed. Every piece is done, and no
    /// member calls `run` for this batch any more, when it returns. Worth
    /// it for several pieces only (a batch is allocated and posted).
    pub(crate) fn install(
        &self,
        ctx: *const (),
        run: Run,
        pieces: Vec<Range<usize>>,
        scratch: &mut [u8],
    ) -> usize {
        let count = pieces.len();
        let batch = Arc::new(Batch {
            ctx,
            run,
            pieces,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            installed: AtomicUsize::new(0),
        });
        self.batches.lock().expect("crew").push(batch.clone());
        (self.call)();
        while batch.take(scratch, false) {}
        self.batches
            .lock()
            .expect("crew")
            .retain(|b| !Arc::ptr_eq(b, &batch));
        // The pieces members took: at most one each, a piece's copy.
        while batch.done.load(Acquire) < count {
            std::thread::yield_now();
        }
        batch.installed.load(Relaxed)
    }

    /// A member's turn: installs one piece of a posted window, if any;
    /// whether it did.
    pub(crate) fn help(&self, scratch: &mut [u8]) -> bool {
        let open = self
            .batches
            .lock()
            .expect("crew")
            .iter()
            .find(|b| b.open())
            .cloned();
        open.is_some_and(|b| b.take(scratch, true))
    }
}
