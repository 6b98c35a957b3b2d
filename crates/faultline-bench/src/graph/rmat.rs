//! R-MAT graph generator (Chakrabarti, Zhan and Faloutsos, 2004) writing the
//! CSR file format without ever holding the edge list.
//!
//! Each edge picks one quadrant of the adjacency matrix per level, `scale`
//! times, with probabilities a = 0.57, b = 0.19, c = 0.19, d = 0.05 (the
//! Graph500 parameters, without Graph500's per-level noise). Vertex numbers
//! are then scrambled by a seed-dependent bijection of `0..2^scale` that
//! keeps vertex 0 (the R-MAT hub) at 0, so hubs are spread over the file
//! while the default BFS source stays in the giant component.
//!
//! How it works (the edge stream is never stored: it is regenerated):
//!
//! 1. The `edge_factor * 2^scale` generated edges are cut into blocks of
//!    2^16; block `b` draws from its own xoshiro256** stream `(seed, b)`, so
//!    the stream is identical for every thread count and every pass.
//! 2. Count pass: each thread counts degrees of its blocks (both directions,
//!    self-loops dropped) into its own array; prefix sums give each (vertex,
//!    thread) a private slot range, so the fill needs no contended atomics.
//! 3. The vertex range is cut into chunks whose adjacency fits the memory
//!    limit. Per chunk, a fill pass regenerates the stream and stores the
//!    targets of edges whose source is in the chunk, each list is sorted and
//!    deduplicated in parallel, and the chunk's edges are appended to the
//!    file after the space reserved for the index.
//! 4. The index, known only after deduplication, is written last at the
//!    start of the file.
//!
//! Stored graph: undirected (both directions), no self-loops, no duplicate
//! edges, sorted adjacency lists; so `m <= 2 * edge_factor * 2^scale`.

use std::io::{self, Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::ProgressBar;

use super::csr::write_words;
use super::rng::{splitmix64, Xoshiro256};

/// Edges per generator block (the unit of determinism and of work sharing).
const BLOCK: u64 = 1 << 16;
/// Quadrant thresholds out of 2^16: a, a + b, a + b + c.
const T_A: u32 = 37_356; // 0.57
const T_AB: u32 = 49_807; // 0.76
const T_ABC: u32 = 62_259; // 0.95

/// Largest supported scale (vertex numbers must fit the memory of the
/// machine long before this).
pub const MAX_SCALE: u32 = 40;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmatParams {
    /// `n = 2^scale` vertices.
    pub scale: u32,
    /// `edge_factor * n` edges are generated (before symmetrising).
    pub edge_factor: u64,
    /// PRNG seed: same parameters and seed, same bytes.
    pub seed: u64,
    /// Scramble vertex numbers (keeping 0 fixed).
    pub scramble: bool,
}

/// How to generate it (none of this changes the output).
#[derive(Debug, Clone, Copy)]
pub struct GenOptions {
    /// Worker threads.
    pub threads: usize,
    /// Largest adjacency buffer per chunk, in bytes.
    pub mem_limit: u64,
}

/// What was generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenSummary {
    /// Vertices.
    pub vertices: u64,
    /// Stored directed edges.
    pub edges: u64,
    /// Generated edges that were self-loops.
    pub self_loops: u64,
    /// Directed edges dropped as duplicates.
    pub duplicates: u64,
    /// Vertex chunks (fill passes).
    pub chunks: usize,
    /// File size in bytes.
    pub bytes: u64,
}

/// Seed-dependent bijection on `0..2^scale` with `f(0) = 0`: odd multipliers
/// and xor-shifts are each invertible modulo `2^scale` and fix 0.
#[derive(Debug, Clone, Copy)]
struct Scrambler {
    mask: u64,
    shift: u32,
    k1: u64,
    k2: u64,
    enabled: bool,
}

impl Scrambler {
    fn new(p: &RmatParams) -> Self {
        let mut s = p.seed ^ 0x5eed_5c7a_3b1e_0000;
        Self {
            mask: (1u64 << p.scale) - 1,
            shift: p.scale.div_ceil(2).max(1),
            k1: splitmix64(&mut s) | 1,
            k2: splitmix64(&mut s) | 1,
            enabled: p.scramble,
        }
    }

    #[inline]
    fn apply(&self, x: u64) -> u64 {
        if !self.enabled {
            return x;
        }
        let mut x = x.wrapping_mul(self.k1) & self.mask;
        x ^= x >> self.shift;
        x = x.wrapping_mul(self.k2) & self.mask;
        x ^ (x >> self.shift)
    }
}

/// A vector of `len` values made by `make`, whose memory is advised as
/// transparent-huge-page eligible first: the fill pass scatters writes over
/// the whole buffer, and 2 MiB pages cut its TLB misses.
fn huge_vec<T>(len: usize, make: impl FnMut() -> T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    let bytes = len * std::mem::size_of::<T>();
    if bytes >= 4 << 20 {
        let start = v.as_mut_ptr() as usize;
        let huge = 2 << 20;
        let aligned = start.next_multiple_of(huge);
        let end = (start + bytes) & !(huge - 1);
        if end > aligned {
            // [aligned, end) lies inside the allocation just made for `v`
            // and holds no initialised values yet; MADV_HUGEPAGE only
            // changes how the kernel backs the range, never its contents.
            // Failure (THP disabled) is harmless and ignored.
            let _ = faultline_sys::mem::madvise(
                aligned as u64,
                end - aligned,
                faultline_sys::mem::Advice::HugePage,
            );
        }
    }
    v.extend(std::iter::repeat_with(make).take(len));
    v
}

/// Source-range buckets per block in the fill pass (2^BUCKET_BITS).
const BUCKET_BITS: u32 = 8;

/// Per-thread state of the fill pass.
struct FillState {
    /// Next absolute slot of each vertex for this thread.
    slots: Vec<u64>,
    /// This block's directed edges with a source in the chunk.
    pairs: Vec<(u64, u64)>,
    /// `pairs` grouped by source bucket.
    sorted: Vec<(u64, u64)>,
    hist: Vec<usize>,
}

impl FillState {
    fn new(slots: Vec<u64>) -> Self {
        Self {
            slots,
            pairs: Vec::with_capacity(2 * BLOCK as usize),
            sorted: Vec::with_capacity(2 * BLOCK as usize),
            hist: vec![0; 1 << BUCKET_BITS],
        }
    }

    /// Counting sort of `pairs` into `sorted` by `(source - lo) >> shift`.
    fn bucket(&mut self, lo: u64, shift: u32) {
        self.hist.fill(0);
        for &(s, _) in &self.pairs {
            self.hist[((s - lo) >> shift) as usize] += 1;
        }
        let mut acc = 0;
        for h in self.hist.iter_mut() {
            let c = *h;
            *h = acc;
            acc += c;
        }
        self.sorted.clear();
        self.sorted.resize(self.pairs.len(), (0, 0));
        for &pair in &self.pairs {
            let h = &mut self.hist[((pair.0 - lo) >> shift) as usize];
            self.sorted[*h] = pair;
            *h += 1;
        }
    }
}

/// Number of generated edges and blocks.
fn counts(p: &RmatParams) -> io::Result<(u64, u64)> {
    if p.scale == 0 || p.scale > MAX_SCALE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("scale must be in 1..={MAX_SCALE}"),
        ));
    }
    let total = p
        .edge_factor
        .checked_mul(1u64 << p.scale)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "edge count overflows"))?;
    Ok((total, total.div_ceil(BLOCK)))
}

/// Calls `f(u, v)` for every generated edge of block `b` (self-loops
/// included).
#[inline]
fn for_block(p: &RmatParams, sc: &Scrambler, total: u64, b: u64, mut f: impl FnMut(u64, u64)) {
    let mut rng = Xoshiro256::new(p.seed, b);
    let end = ((b + 1) * BLOCK).min(total);
    for _ in b * BLOCK..end {
        let (mut u, mut v) = (0u64, 0u64);
        let mut bits = 0u64;
        let mut left = 0;
        for _ in 0..p.scale {
            if left == 0 {
                bits = rng.next_u64();
                left = 4;
            }
            let x = (bits & 0xffff) as u32;
            bits >>= 16;
            left -= 1;
            // Branch-free quadrant choice (the branches would mispredict
            // about half the time): a = (0,0), b = (0,1), c = (1,0), d = (1,1).
            let ge_a = u64::from(x >= T_A);
            let ge_ab = u64::from(x >= T_AB);
            let ge_abc = u64::from(x >= T_ABC);
            u = (u << 1) | ge_ab;
            v = (v << 1) | ((ge_a ^ ge_ab) | ge_abc);
        }
        f(sc.apply(u), sc.apply(v));
    }
}

/// Runs `work(thread, block)` for every block, block `b` on thread
/// `b % threads` (a fixed assignment, so per-thread slot ranges computed in
/// the count pass match the fill pass).
fn for_blocks<S: Send>(
    blocks: u64,
    states: &mut [S],
    progress: &ProgressBar,
    total: u64,
    work: impl Fn(&mut S, u64) + Sync,
) {
    let threads = states.len() as u64;
    std::thread::scope(|s| {
        for (t, state) in states.iter_mut().enumerate() {
            let work = &work;
            s.spawn(move || {
                let mut b = t as u64;
                while b < blocks {
                    work(state, b);
                    let done = ((b + 1) * BLOCK).min(total) - b * BLOCK;
                    progress.inc(done);
                    b += threads;
                }
            });
        }
    });
}

/// Sorts and deduplicates each list of `lists` (adjacency of consecutive
/// vertices, `starts[i]..starts[i+1]` relative to the slice) in place and
/// returns their new lengths.
fn sort_dedup(lists: &mut [u64], starts: &[u64], out_deg: &mut [u64]) {
    let base = starts[0];
    for (i, d) in out_deg.iter_mut().enumerate() {
        let list = &mut lists[(starts[i] - base) as usize..(starts[i + 1] - base) as usize];
        list.sort_unstable();
        let mut k = 0;
        for j in 0..list.len() {
            if k == 0 || list[j] != list[k - 1] {
                list[k] = list[j];
                k += 1;
            }
        }
        *d = k as u64;
    }
}

/// Shows `msg` on the bar, or as a line on stderr when it is hidden (not
/// a terminal).
fn note(progress: &ProgressBar, msg: String) {
    if progress.is_hidden() {
        faultline_cli_support::step("graph gen", &msg);
    }
    progress.set_message(msg);
}

/// Generates the graph into `out` (written at increasing offsets, then the
/// index at offset 0). `progress` counts generated edges over all passes.
pub fn generate<W: Write + Seek>(
    p: &RmatParams,
    opts: &GenOptions,
    out: &mut W,
    progress: &ProgressBar,
) -> io::Result<GenSummary> {
    let (total, blocks) = counts(p)?;
    let n = 1u64 << p.scale;
    let nu = usize::try_from(n).map_err(|_| io::Error::other("graph too large"))?;
    let threads = opts.threads.max(1);
    let sc = Scrambler::new(p);
    progress.set_length(total * 2);
    note(progress, "counting degrees".into());

    // Pass 1: per-thread degree counts (both directions, no self-loops).
    let self_loops = AtomicU64::new(0);
    let mut counts_t: Vec<Vec<u64>> = (0..threads).map(|_| huge_vec(nu, || 0u64)).collect();
    for_blocks(blocks, &mut counts_t, progress, total, |deg, b| {
        let mut loops = 0;
        for_block(p, &sc, total, b, |u, v| {
            if u == v {
                loops += 1;
            } else {
                deg[u as usize] += 1;
                deg[v as usize] += 1;
            }
        });
        self_loops.fetch_add(loops, Ordering::Relaxed);
    });

    // Turn the counts into absolute slots: offsets[v] is where v's list
    // starts (before dedup); counts_t[t][v] becomes thread t's next slot.
    let mut offsets = vec![0u64; nu + 1];
    let mut acc = 0u64;
    for v in 0..nu {
        offsets[v] = acc;
        for c in counts_t.iter_mut() {
            let d = c[v];
            c[v] = acc;
            acc += d;
        }
    }
    offsets[nu] = acc;

    // Chunks of vertices whose lists fit the memory limit (a single vertex
    // larger than the limit gets a chunk of its own).
    let cap = (opts.mem_limit / 8).max(1);
    let mut bounds = vec![0usize];
    for v in 0..nu {
        let lo = *bounds.last().expect("non-empty");
        if v > lo && offsets[v + 1] - offsets[lo] > cap {
            bounds.push(v);
        }
    }
    bounds.push(nu);
    let chunks = bounds.len() - 1;
    progress.set_length(total * (1 + chunks as u64));

    let mut fill: Vec<FillState> = counts_t.into_iter().map(FillState::new).collect();
    let mut scratch = Vec::new();
    let mut new_deg = vec![0u64; nu];
    out.seek(SeekFrom::Start(8 * (n + 1)))?;
    for (ci, w) in bounds.windows(2).enumerate() {
        let (lo, hi) = (w[0], w[1]);
        note(progress, format!("filling chunk {}/{chunks}", ci + 1));
        let base = offsets[lo];
        let len = (offsets[hi] - base) as usize;
        let buf: Vec<AtomicU64> = huge_vec(len, || AtomicU64::new(0));
        let (lo64, hi64) = (lo as u64, hi as u64);
        // Bucket each block's edges by source range before scattering them,
        // so the scattered writes of a bucket stay within a cache-sized
        // part of the buffer.
        let span_bits = 64 - (hi64 - lo64).leading_zeros();
        let shift = span_bits.saturating_sub(BUCKET_BITS);
        for_blocks(blocks, &mut fill, progress, total, |st, b| {
            st.pairs.clear();
            for_block(p, &sc, total, b, |u, v| {
                if u != v {
                    if (lo64..hi64).contains(&u) {
                        st.pairs.push((u, v));
                    }
                    if (lo64..hi64).contains(&v) {
                        st.pairs.push((v, u));
                    }
                }
            });
            st.bucket(lo64, shift);
            for &(s, d) in &st.sorted {
                let i = &mut st.slots[s as usize];
                buf[(*i - base) as usize].store(d, Ordering::Relaxed);
                *i += 1;
            }
        });
        let mut lists: Vec<u64> = buf.into_iter().map(AtomicU64::into_inner).collect();

        // Sort and dedup in parallel: split [lo, hi) into pieces of similar
        // edge counts, one per thread.
        note(progress, format!("sorting chunk {}/{chunks}", ci + 1));
        let per = (len as u64).div_ceil(threads as u64).max(1);
        let mut cuts = vec![lo];
        for v in lo..hi {
            if offsets[v] - offsets[*cuts.last().expect("non-empty")] >= per {
                cuts.push(v);
            }
        }
        cuts.push(hi);
        std::thread::scope(|s| {
            let mut rest_lists: &mut [u64] = &mut lists;
            let mut rest_deg: &mut [u64] = &mut new_deg[lo..hi];
            for c in cuts.windows(2) {
                let (a, z) = (c[0], c[1]);
                let (l, rl) = rest_lists.split_at_mut((offsets[z] - offsets[a]) as usize);
                let (d, rd) = rest_deg.split_at_mut(z - a);
                rest_lists = rl;
                rest_deg = rd;
                let starts = &offsets[a..=z];
                s.spawn(move || sort_dedup(l, starts, d));
            }
        });

        note(progress, format!("writing chunk {}/{chunks}", ci + 1));
        for v in lo..hi {
            let start = (offsets[v] - base) as usize;
            write_words(
                out,
                &lists[start..start + new_deg[v] as usize],
                &mut scratch,
            )?;
        }
    }

    // The index, now that deduplicated degrees are known.
    let mut index = new_deg;
    let mut acc = 0u64;
    for d in index.iter_mut() {
        let deg = *d;
        *d = acc;
        acc += deg;
    }
    index.push(acc);
    out.seek(SeekFrom::Start(0))?;
    write_words(out, &index, &mut scratch)?;
    out.flush()?;
    let generated_directed = 2 * (total - self_loops.load(Ordering::Relaxed));
    Ok(GenSummary {
        vertices: n,
        edges: acc,
        self_loops: self_loops.into_inner(),
        duplicates: generated_directed - acc,
        chunks,
        bytes: 8 * (n + 1 + acc),
    })
}

#[cfg(test)]
mod tests {
    use super::super::csr;
    use super::*;
    use std::io::Cursor;

    fn gen(p: RmatParams, threads: usize, mem_limit: u64) -> (Vec<u8>, GenSummary) {
        let mut out = Cursor::new(Vec::new());
        let opts = GenOptions { threads, mem_limit };
        let s = generate(&p, &opts, &mut out, &ProgressBar::hidden()).unwrap();
        (out.into_inner(), s)
    }

    fn params(scale: u32, seed: u64) -> RmatParams {
        RmatParams {
            scale,
            edge_factor: 8,
            seed,
            scramble: true,
        }
    }

    fn parse(bytes: &[u8]) -> csr::CsrGraph {
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let n = (1..words.len())
            .find(|&k| words[k] == (words.len() - k - 1) as u64)
            .unwrap();
        csr::CsrGraph {
            index: words[..=n].to_vec(),
            edges: words[n + 1..].to_vec(),
        }
    }

    #[test]
    fn deterministic_across_seeds_threads_and_chunks() {
        let (a, sa) = gen(params(10, 7), 1, 1 << 30);
        let (b, _) = gen(params(10, 7), 3, 1 << 30);
        let (c, sc) = gen(params(10, 7), 2, 4096);
        let (d, _) = gen(params(10, 8), 2, 1 << 30);
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_ne!(a, d);
        assert_eq!(sa.chunks, 1);
        assert!(sc.chunks > 1);
        assert_eq!(a.len() as u64, sa.bytes);
    }

    #[test]
    fn csr_invariants_scale_10() {
        let (bytes, s) = gen(params(10, 1), 2, 1 << 30);
        let g = parse(&bytes);
        csr::validate(&g).unwrap();
        assert_eq!(g.vertices(), 1024);
        assert_eq!(g.edges.len() as u64, s.edges);
        assert_eq!(s.edges + s.duplicates + 2 * s.self_loops, 2 * 8 * 1024);
        let has = |u: u64, v: u64| {
            let adj = &g.edges[g.index[u as usize] as usize..g.index[u as usize + 1] as usize];
            adj.binary_search(&v).is_ok()
        };
        for u in 0..g.vertices() {
            let adj = &g.edges[g.index[u as usize] as usize..g.index[u as usize + 1] as usize];
            assert!(adj.windows(2).all(|w| w[0] < w[1]), "sorted, no duplicates");
            for &v in adj {
                assert_ne!(u, v, "no self-loops");
                assert!(has(v, u), "symmetric");
            }
        }
        // Vertex 0 stays the hub.
        let max = (0..g.vertices()).map(|v| g.degree(v)).max().unwrap();
        assert_eq!(g.degree(0), max);
    }

    #[test]
    fn scrambler_is_a_bijection_fixing_zero() {
        for scale in [1, 2, 5, 10] {
            let sc = Scrambler::new(&params(scale, 3));
            let mut seen = vec![false; 1 << scale];
            for x in 0..1u64 << scale {
                let y = sc.apply(x) as usize;
                assert!(!seen[y]);
                seen[y] = true;
            }
            assert_eq!(sc.apply(0), 0);
        }
    }
}
