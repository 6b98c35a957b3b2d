//! Breadth-first search over CSR slices.
//!
//! [`bfs_parallel`] is the benchmark kernel, shaped like UMap's BFS:
//! level-synchronous and top-down, each level scans *all* vertices and
//! expands those on the current level, so every level streams through the
//! whole index and jumps around in the edge array. How it works:
//!
//! 1. `level[source] = 0`; all other entries are unreached. Levels are
//!    16-bit cells (as in UMap's BFS: half the cache footprint of the
//!    randomly accessed array), 32-bit when a search is deeper. The array
//!    lives in ordinary memory and is fully written before the search, so
//!    its page faults are not part of the measurement.
//! 2. For level `l`, `threads` workers take chunks of 4096 vertices from a
//!    shared counter; for each `v` with `level[v] == l` they set every
//!    unreached neighbour to `l + 1` with a plain (relaxed) store: racing
//!    writers store the same value, and no compare-and-swap sits in the
//!    inner loop. Level `l`'s discoveries are counted as level `l + 1`'s
//!    frontier, which each vertex joins exactly once; the edge loop
//!    (`expand_chunk`) only raises a flag, as the C example's does.
//! 3. A barrier ends the level; the search stops when a level discovers no
//!    vertex.
//!
//! [`bfs_reference`] is a plain queue BFS used to validate the result: BFS
//! levels are unique, so both must agree on every vertex.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Instant;

/// Level of a vertex the search did not reach.
pub const UNREACHED: u32 = u32::MAX;

/// Vertices per work chunk.
const CHUNK: usize = 4096;

/// Edges per iteration of the unrolled edge loop (see `expand_chunk`).
const UNROLL: usize = 4;

/// Counters for one BFS level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LevelStats {
    /// The level (distance from the source).
    pub level: u32,
    /// Vertices on this level (expanded).
    pub frontier: u64,
    /// Adjacency entries scanned.
    pub edges_scanned: u64,
    /// Vertices discovered for the next level.
    pub discovered: u64,
    /// Wall time of the level.
    pub seconds: f64,
}

/// Outcome of [`bfs_parallel`].
#[derive(Debug, Clone)]
pub struct BfsResult {
    /// Level of every vertex, [`UNREACHED`] if not reached.
    pub levels: Vec<u32>,
    /// One entry per expanded level.
    pub per_level: Vec<LevelStats>,
    /// Wall time of the search (excluding allocation of `levels`).
    pub seconds: f64,
}

impl BfsResult {
    /// Number of vertices reached (including the source).
    pub fn reached(&self) -> u64 {
        self.levels.iter().filter(|&&l| l != UNREACHED).count() as u64
    }
}

/// The input does not describe a graph the search can walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BfsError {
    /// The source is not a vertex.
    SourceOutOfRange {
        /// The requested source.
        source: u64,
        /// Number of vertices.
        vertices: u64,
    },
    /// An index entry or edge target points outside the arrays.
    Malformed,
}

impl fmt::Display for BfsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BfsError::SourceOutOfRange { source, vertices } => {
                write!(
                    f,
                    "source vertex {source} out of range (graph has {vertices} vertices)"
                )
            }
            BfsError::Malformed => f.write_str("malformed graph: index or edge out of range"),
        }
    }
}

impl std::error::Error for BfsError {}

fn check_source(index: &[u64], source: u64) -> Result<usize, BfsError> {
    let n = index.len().saturating_sub(1) as u64;
    if source >= n {
        return Err(BfsError::SourceOutOfRange {
            source,
            vertices: n,
        });
    }
    Ok(source as usize)
}

/// Simple queue BFS over in-memory slices (the validation reference).
pub fn bfs_reference(index: &[u64], edges: &[u64], source: u64) -> Result<Vec<u32>, BfsError> {
    let s = check_source(index, source)?;
    let n = index.len() - 1;
    let mut levels = vec![UNREACHED; n];
    levels[s] = 0;
    let mut queue = VecDeque::from([s]);
    while let Some(v) = queue.pop_front() {
        let next = levels[v] + 1;
        let adj = edges
            .get(index[v] as usize..index[v + 1] as usize)
            .ok_or(BfsError::Malformed)?;
        for &w in adj {
            let slot = levels.get_mut(w as usize).ok_or(BfsError::Malformed)?;
            if *slot == UNREACHED {
                *slot = next;
                queue.push_back(w as usize);
            }
        }
    }
    Ok(levels)
}

/// A vertex's level cell: 16 bits while levels fit (half the cache
/// footprint of the randomly accessed level array, as in UMap's BFS), 32
/// bits for deeper searches.
trait LevelCell: Sync + Sized {
    /// The "unreached" value of the cell.
    const NONE: u32;
    fn unreached() -> Self;
    fn get(&self) -> u32;
    fn set(&self, level: u32);
    fn into_level(self) -> u32 {
        match self.get() {
            l if l == Self::NONE => UNREACHED,
            l => l,
        }
    }
}

macro_rules! level_cell {
    ($atomic:ty, $int:ty) => {
        impl LevelCell for $atomic {
            const NONE: u32 = <$int>::MAX as u32;
            fn unreached() -> Self {
                <$atomic>::new(<$int>::MAX)
            }
            #[inline(always)]
            fn get(&self) -> u32 {
                self.load(Ordering::Relaxed) as u32
            }
            #[inline(always)]
            fn set(&self, level: u32) {
                self.store(level as $int, Ordering::Relaxed)
            }
        }
    };
}
level_cell!(AtomicU16, u16);
level_cell!(AtomicU32, u32);
#[cfg(test)]
level_cell!(std::sync::atomic::AtomicU8, u8);

/// State shared by the coordinator and the workers of one search.
struct Shared<'a, L> {
    index: &'a [u64],
    edges: &'a [u64],
    levels: &'a [L],
    current: AtomicU32,
    next_chunk: AtomicUsize,
    frontier: AtomicU64,
    scanned: AtomicU64,
    found: AtomicBool,
    done: AtomicBool,
    malformed: AtomicBool,
}

impl<L: LevelCell> Shared<'_, L> {
    /// Expands the current level over the chunks this worker claims.
    fn work_level(&self) {
        let n = self.levels.len();
        let cur = self.current.load(Ordering::Relaxed);
        let mut sum = Expanded::default();
        loop {
            let start = self.next_chunk.fetch_add(CHUNK, Ordering::Relaxed);
            if start >= n {
                break;
            }
            let chunk = start..(start + CHUNK).min(n);
            sum.add(expand_chunk(
                self.levels,
                chunk,
                self.index,
                self.edges,
                cur,
            ));
        }
        if sum.malformed {
            self.malformed.store(true, Ordering::Relaxed);
        }
        if sum.found {
            self.found.store(true, Ordering::Relaxed);
        }
        self.frontier.fetch_add(sum.frontier, Ordering::Relaxed);
        self.scanned.fetch_add(sum.scanned, Ordering::Relaxed);
    }
}

/// What expanding part of a level did.
#[derive(Debug, Default, Clone, Copy)]
struct Expanded {
    /// Vertices on the level.
    frontier: u64,
    /// Adjacency entries scanned.
    scanned: u64,
    /// Whether an unreached vertex was reached.
    found: bool,
    /// Whether an index entry or edge pointed outside the arrays.
    malformed: bool,
}

impl Expanded {
    fn add(&mut self, other: Expanded) {
        self.frontier += other.frontier;
        self.scanned += other.scanned;
        self.found |= other.found;
        self.malformed |= other.malformed;
    }
}

/// Expands the vertices of `chunk` that are on level `cur`.
///
/// A function of its own, over plain slices, so that the edge loop keeps
/// in registers what the C loop keeps (cursor, level array, next level, a
/// flag): inlined into the worker next to `Shared`'s atomics, LLVM spilled
/// the level array's address and reloaded it at every edge. The counters
/// are locals, stored once at the end.
///
/// Per edge it does what the C loop does plus one compare against
/// `levels.len()`: the graph lives in a mapped file that may change under
/// the search, so a bad edge is reported (`malformed`), never trusted. The
/// edge loop is unrolled by [`UNROLL`], which pays for that compare: the
/// loop is bound by how many edges the core keeps in flight, i.e. by
/// instructions per edge, and unrolling drops the counter's increment and
/// compare from three edges in four. Branch-free forms (an index clamped
/// to a sentinel cell, or masked into a power-of-two array with the edges
/// OR-ed to detect strays) were slower than the compare: they add work to
/// every edge's address. The numbers: DESIGN.md, "What the numbers say".
/// A malformed edge is skipped; the search runs to its end and returns
/// [`BfsError::Malformed`], never levels.
#[inline(never)]
fn expand_chunk<L: LevelCell>(
    levels: &[L],
    chunk: Range<usize>,
    index: &[u64],
    edges: &[u64],
    cur: u32,
) -> Expanded {
    let (mut frontier, mut scanned) = (0u64, 0u64);
    let (mut found, mut malformed) = (false, false);
    let next = cur + 1;
    // `index` has one entry more than `levels` (`search` checks), so one
    // bounds check per chunk covers every vertex's `index[v]..index[v + 1]`.
    let bounds = index[chunk.start..=chunk.end].windows(2);
    for (cell, range) in levels[chunk].iter().zip(bounds) {
        if cell.get() != cur {
            continue;
        }
        frontier += 1;
        let Some(adj) = edges.get(range[0] as usize..range[1] as usize) else {
            malformed = true;
            continue;
        };
        scanned += adj.len() as u64;
        let mut groups = adj.chunks_exact(UNROLL);
        for group in &mut groups {
            for &w in group {
                visit(levels, w, next, &mut found, &mut malformed);
            }
        }
        for &w in groups.remainder() {
            visit(levels, w, next, &mut found, &mut malformed);
        }
    }
    Expanded {
        frontier,
        scanned,
        found,
        malformed,
    }
}

/// One edge to `w`: an unreached `w` joins level `next`. Racing workers may
/// both see the cell unreached; both store the same level.
#[inline(always)]
fn visit<L: LevelCell>(levels: &[L], w: u64, next: u32, found: &mut bool, malformed: &mut bool) {
    match levels.get(w as usize) {
        Some(slot) if slot.get() == L::NONE => {
            slot.set(next);
            *found = true;
        }
        Some(_) => {}
        None => *malformed = true,
    }
}

/// Level-synchronous top-down BFS with `threads` workers (see the module
/// docs). `index` has `n + 1` entries, `edges` `index[n]`. Levels are kept
/// in 16 bits; a search deeper than that runs again with 32.
pub fn bfs_parallel(
    index: &[u64],
    edges: &[u64],
    source: u64,
    threads: usize,
) -> Result<BfsResult, BfsError> {
    narrow_first::<AtomicU16>(index, edges, source, threads)
}

/// A search with `N` cells, again with 32-bit cells if the levels outgrow
/// `N`.
fn narrow_first<N: LevelCell>(
    index: &[u64],
    edges: &[u64],
    source: u64,
    threads: usize,
) -> Result<BfsResult, BfsError> {
    match search::<N>(index, edges, source, threads)? {
        Some(r) => Ok(r),
        None => Ok(search::<AtomicU32>(index, edges, source, threads)?
            .expect("32-bit levels hold any BFS depth")),
    }
}

/// One search with level cells `L`; `None` if the levels outgrew them.
fn search<L: LevelCell>(
    index: &[u64],
    edges: &[u64],
    source: u64,
    threads: usize,
) -> Result<Option<BfsResult>, BfsError> {
    let s = check_source(index, source)?;
    let n = index.len() - 1;
    let threads = threads.max(1);
    // Writing every entry here pre-faults the array before the clock starts.
    let levels: Vec<L> = (0..n).map(|_| L::unreached()).collect();
    levels[s].set(0);
    let shared = Shared {
        index,
        edges,
        levels: &levels,
        current: AtomicU32::new(0),
        next_chunk: AtomicUsize::new(0),
        frontier: AtomicU64::new(0),
        scanned: AtomicU64::new(0),
        found: AtomicBool::new(false),
        done: AtomicBool::new(false),
        malformed: AtomicBool::new(false),
    };
    // Start and end of each level: workers plus the coordinator.
    let barrier = Barrier::new(threads + 1);
    let mut per_level = Vec::new();
    let mut overflow = false;
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                barrier.wait();
                if shared.done.load(Ordering::Acquire) {
                    break;
                }
                shared.work_level();
                barrier.wait();
            });
        }
        for level in 0u32.. {
            let lt = Instant::now();
            shared.current.store(level, Ordering::Relaxed);
            shared.next_chunk.store(0, Ordering::Relaxed);
            barrier.wait();
            barrier.wait();
            let stats = LevelStats {
                level,
                frontier: shared.frontier.swap(0, Ordering::Relaxed),
                edges_scanned: shared.scanned.swap(0, Ordering::Relaxed),
                // Set from the next level's frontier below.
                discovered: 0,
                seconds: lt.elapsed().as_secs_f64(),
            };
            per_level.push(stats);
            let found = shared.found.swap(false, Ordering::Relaxed);
            if !found || level + 2 >= L::NONE {
                overflow = found;
                shared.done.store(true, Ordering::Release);
                barrier.wait();
                break;
            }
        }
    });
    let seconds = t0.elapsed().as_secs_f64();
    if shared.malformed.load(Ordering::Relaxed) {
        return Err(BfsError::Malformed);
    }
    if overflow {
        return Ok(None);
    }
    // Each vertex is expanded once, so the next level's frontier is the
    // exact count of what a level discovered.
    for l in 0..per_level.len() {
        per_level[l].discovered = per_level.get(l + 1).map_or(0, |next| next.frontier);
    }
    Ok(Some(BfsResult {
        levels: levels.into_iter().map(L::into_level).collect(),
        per_level,
        seconds,
    }))
}

/// First vertex whose level differs, as `(vertex, got, expected)`.
pub fn first_mismatch(got: &[u32], expected: &[u32]) -> Option<(usize, u32, u32)> {
    if got.len() != expected.len() {
        return Some((got.len().min(expected.len()), UNREACHED, UNREACHED));
    }
    got.iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .map(|v| (v, got[v], expected[v]))
}

#[cfg(test)]
mod tests {
    use super::super::csr::from_edges;
    use super::super::rmat::{generate, GenOptions, RmatParams};
    use super::*;
    use indicatif::ProgressBar;
    use std::io::Cursor;

    #[test]
    fn path_and_isolated() {
        // 0 - 1 - 2 - 3, 4 isolated.
        let g = from_edges(5, &[(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)]);
        let want = vec![0, 1, 2, 3, UNREACHED];
        assert_eq!(bfs_reference(&g.index, &g.edges, 0).unwrap(), want);
        let r = bfs_parallel(&g.index, &g.edges, 0, 2).unwrap();
        assert_eq!(r.levels, want);
        assert_eq!(r.reached(), 4);
        assert_eq!(r.per_level.len(), 4);
        assert_eq!(r.per_level.iter().map(|l| l.frontier).sum::<u64>(), 4);
        assert_eq!(r.per_level.iter().map(|l| l.edges_scanned).sum::<u64>(), 6);
        assert_eq!(
            bfs_parallel(&g.index, &g.edges, 5, 1).unwrap_err(),
            BfsError::SourceOutOfRange {
                source: 5,
                vertices: 5
            }
        );
    }

    #[test]
    fn levels_deeper_than_the_narrow_cells_fall_back_to_32_bits() {
        use std::sync::atomic::AtomicU8;
        // A path of 600 vertices: 599 levels, more than 8-bit cells hold
        // (the same logic moves 16-bit searches deeper than 65,533 to 32).
        let n = 600u64;
        let e: Vec<(u64, u64)> = (0..n - 1).flat_map(|v| [(v, v + 1), (v + 1, v)]).collect();
        let g = from_edges(n, &e);
        assert!(search::<AtomicU8>(&g.index, &g.edges, 0, 2)
            .unwrap()
            .is_none());
        let r = narrow_first::<AtomicU8>(&g.index, &g.edges, 0, 2).unwrap();
        let want = bfs_reference(&g.index, &g.edges, 0).unwrap();
        assert_eq!(first_mismatch(&r.levels, &want), None);
        assert_eq!(r.levels[n as usize - 1], n as u32 - 1);
        // From the middle: 300 levels, again past 8 bits.
        let r = narrow_first::<AtomicU8>(&g.index, &g.edges, 300, 2).unwrap();
        assert_eq!(
            first_mismatch(&r.levels, &bfs_reference(&g.index, &g.edges, 300).unwrap()),
            None
        );
    }

    #[test]
    fn malformed_is_an_error_not_a_panic() {
        let index = [0u64, 1, 1];
        let edges = [9u64];
        assert_eq!(
            bfs_parallel(&index, &edges, 0, 2).unwrap_err(),
            BfsError::Malformed
        );
        assert_eq!(
            bfs_reference(&index, &edges, 0).unwrap_err(),
            BfsError::Malformed
        );
    }

    #[test]
    fn matches_reference_on_rmat() {
        for (scale, seed) in [(8, 1), (11, 2), (12, 3)] {
            let p = RmatParams {
                scale,
                edge_factor: 8,
                seed,
                scramble: true,
            };
            let mut out = Cursor::new(Vec::new());
            let opts = GenOptions {
                threads: 2,
                mem_limit: 1 << 30,
            };
            generate(&p, &opts, &mut out, &ProgressBar::hidden()).unwrap();
            let words: Vec<u64> = out
                .into_inner()
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let n = 1usize << scale;
            let (index, edges) = words.split_at(n + 1);
            for source in [0, 5] {
                let want = bfs_reference(index, edges, source).unwrap();
                for threads in [1, 4] {
                    let got = bfs_parallel(index, edges, source, threads).unwrap();
                    assert_eq!(first_mismatch(&got.levels, &want), None);
                }
            }
        }
    }
}
