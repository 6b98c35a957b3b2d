//! The on-disk graph format: headerless binary CSR, as read by UMap's BFS
//! benchmark.
//!
//! ```text
//!   offset 0                 8 (n+1)                         8 (n+1+m)
//!   │ index[0] .. index[n]   │ edges[0] .. edges[m-1]         │
//!   └ u64 LE, index[0] = 0,  └ u64 LE, neighbours of v are
//!     non-decreasing,          edges[index[v] .. index[v+1]],
//!     index[n] = m             each < n
//! ```
//!
//! There is no header, so `n` is inferred: it is the only `k` with
//! `index[k] == words - k - 1` inside the non-decreasing prefix (for `k < n`,
//! `index[k] <= m < words - k - 1`), found by one sequential scan of the
//! index.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Size of the read buffer used when scanning files.
const READ_BUF: usize = 1 << 20;

/// Shape of a CSR file: `n` vertices, `m` stored (directed) edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsrLayout {
    /// Number of vertices, `n`.
    pub vertices: u64,
    /// Number of stored edges, `m = index[n]`.
    pub edges: u64,
}

impl CsrLayout {
    /// Total file size in bytes: `8 (n + 1) + 8 m`.
    pub fn file_bytes(&self) -> u64 {
        8 * (self.vertices + 1 + self.edges)
    }
}

/// What is wrong with a CSR file.
#[derive(Debug)]
pub enum CsrError {
    /// Opening or reading failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Length is zero or not a multiple of 8.
    BadLength {
        /// File length in bytes.
        len: u64,
    },
    /// `index[0]` is not 0.
    IndexStart {
        /// The value found.
        value: u64,
    },
    /// `index[vertex + 1] < index[vertex]`.
    NotMonotone {
        /// The vertex whose end offset is smaller than its start.
        vertex: u64,
        /// `index[vertex]`.
        start: u64,
        /// `index[vertex + 1]`.
        end: u64,
    },
    /// No `n` makes the size consistent: `index[vertex]` already exceeds the
    /// number of words left for edges.
    SizeMismatch {
        /// First vertex whose offset exceeds the file.
        vertex: u64,
        /// `index[vertex]`.
        value: u64,
        /// Edge words available after an index of `vertex + 1` entries.
        available: u64,
    },
    /// An edge target is not a vertex.
    EdgeOutOfRange {
        /// Position in the edge array.
        position: u64,
        /// The target found.
        target: u64,
        /// Number of vertices.
        vertices: u64,
    },
}

impl fmt::Display for CsrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CsrError::Io { path, source } => write!(f, "reading {}: {source}", path.display()),
            CsrError::BadLength { len } => {
                write!(
                    f,
                    "not a CSR file: length {len} is not a positive multiple of 8"
                )
            }
            CsrError::IndexStart { value } => {
                write!(f, "not a CSR file: index[0] is {value}, expected 0")
            }
            CsrError::NotMonotone { vertex, start, end } => write!(
                f,
                "corrupt CSR file: index[{}] = {end} < index[{vertex}] = {start} \
                 (before the size became consistent)",
                vertex + 1
            ),
            CsrError::SizeMismatch {
                vertex,
                value,
                available,
            } => write!(
                f,
                "corrupt CSR file: size inconsistent with the index: index[{vertex}] = {value} \
                 but only {available} edge words follow an index of {} entries",
                vertex + 1
            ),
            CsrError::EdgeOutOfRange {
                position,
                target,
                vertices,
            } => write!(
                f,
                "corrupt CSR file: edges[{position}] = {target} is not a vertex (n = {vertices})"
            ),
        }
    }
}

impl std::error::Error for CsrError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CsrError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A CSR graph held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrGraph {
    /// `index[v] .. index[v + 1]` is the adjacency of `v`; length `n + 1`.
    pub index: Vec<u64>,
    /// Concatenated adjacency lists; length `m`.
    pub edges: Vec<u64>,
}

impl CsrGraph {
    /// Number of vertices.
    pub fn vertices(&self) -> u64 {
        self.index.len() as u64 - 1
    }

    /// The layout of this graph's file.
    pub fn layout(&self) -> CsrLayout {
        CsrLayout {
            vertices: self.vertices(),
            edges: self.edges.len() as u64,
        }
    }

    /// Degree of `v` (`v` must be a vertex).
    pub fn degree(&self, v: u64) -> u64 {
        self.index[v as usize + 1] - self.index[v as usize]
    }
}

/// Reads little-endian u64 words from `r` into `out` until `count` words
/// were read or `stop` returns true for a word (which is kept).
fn read_words<R: Read>(
    r: &mut R,
    count: Option<u64>,
    out: &mut Vec<u64>,
    mut stop: impl FnMut(u64, u64) -> Result<bool, CsrError>,
    path: &Path,
) -> Result<(), CsrError> {
    let io_err = |source| CsrError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut buf = vec![0u8; READ_BUF];
    let mut done = 0u64;
    loop {
        let want = match count {
            Some(c) => ((c - done) * 8).min(READ_BUF as u64) as usize,
            None => READ_BUF,
        };
        if want == 0 {
            return Ok(());
        }
        let mut filled = 0;
        while filled < want {
            match r.read(&mut buf[filled..want]) {
                Ok(0) => break,
                Ok(k) => filled += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(e)),
            }
        }
        if filled & 7 != 0 || (filled < want && count.is_some()) {
            return Err(io_err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shorter than its layout",
            )));
        }
        for chunk in buf[..filled].chunks_exact(8) {
            let w = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk"));
            out.push(w);
            done += 1;
            if stop(done - 1, w)? {
                return Ok(());
            }
        }
        if filled < want {
            return Ok(());
        }
    }
}

fn open(path: &Path) -> Result<(File, u64), CsrError> {
    let io_err = |source| CsrError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    if len == 0 || len & 7 != 0 {
        return Err(CsrError::BadLength { len });
    }
    Ok((file, len))
}

/// Scans the index prefix of `reader` (a file of `words` words) and returns
/// the index array (`n + 1` entries), checking it as it goes.
fn scan_index<R: Read>(reader: &mut R, words: u64, path: &Path) -> Result<Vec<u64>, CsrError> {
    let mut index = Vec::new();
    let mut prev = 0u64;
    let mut found = false;
    read_words(
        reader,
        None,
        &mut index,
        |k, w| {
            if k == 0 && w != 0 {
                return Err(CsrError::IndexStart { value: w });
            }
            if w < prev {
                return Err(CsrError::NotMonotone {
                    vertex: k - 1,
                    start: prev,
                    end: w,
                });
            }
            prev = w;
            let available = words - k - 1;
            if w == available {
                found = true;
                return Ok(true);
            }
            if w > available {
                return Err(CsrError::SizeMismatch {
                    vertex: k,
                    value: w,
                    available,
                });
            }
            Ok(false)
        },
        path,
    )?;
    // `w > available` must trigger before the words run out, since
    // `available` reaches 0 at the last word.
    debug_assert!(found);
    Ok(index)
}

/// Infers and checks the layout of the CSR file at `path`, reading only its
/// index (for `bench store`, which maps the file without loading it; `bfs`
/// loads the whole file to validate it anyway).
pub fn read_layout(path: &Path) -> Result<CsrLayout, CsrError> {
    let (file, len) = open(path)?;
    let mut reader = BufReader::with_capacity(READ_BUF, file);
    let index = scan_index(&mut reader, len / 8, path)?;
    let vertices = index.len() as u64 - 1;
    Ok(CsrLayout {
        vertices,
        edges: index[index.len() - 1],
    })
}

/// Reads and fully validates the CSR file at `path` into memory.
pub fn load(path: &Path) -> Result<CsrGraph, CsrError> {
    let (file, len) = open(path)?;
    let mut reader = BufReader::with_capacity(READ_BUF, file);
    let index = scan_index(&mut reader, len / 8, path)?;
    let m = index[index.len() - 1];
    // The scan may have buffered words past the index: restart at edges[0].
    let mut file = reader.into_inner();
    file.seek(SeekFrom::Start(8 * index.len() as u64))
        .map_err(|source| CsrError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let mut reader = BufReader::with_capacity(READ_BUF, file);
    let mut edges = Vec::with_capacity(m as usize);
    read_words(&mut reader, Some(m), &mut edges, |_, _| Ok(false), path)?;
    let graph = CsrGraph { index, edges };
    validate(&graph)?;
    Ok(graph)
}

/// Checks the CSR invariants of an in-memory graph.
pub fn validate(g: &CsrGraph) -> Result<(), CsrError> {
    let Some(&first) = g.index.first() else {
        return Err(CsrError::BadLength { len: 0 });
    };
    if first != 0 {
        return Err(CsrError::IndexStart { value: first });
    }
    for (v, w) in g.index.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(CsrError::NotMonotone {
                vertex: v as u64,
                start: w[0],
                end: w[1],
            });
        }
    }
    let n = g.vertices();
    let m = g.edges.len() as u64;
    if g.index[n as usize] != m {
        return Err(CsrError::SizeMismatch {
            vertex: n,
            value: g.index[n as usize],
            available: m,
        });
    }
    if let Some(position) = g.edges.iter().position(|&t| t >= n) {
        return Err(CsrError::EdgeOutOfRange {
            position: position as u64,
            target: g.edges[position],
            vertices: n,
        });
    }
    Ok(())
}

/// Writes `words` as little-endian u64 through a reusable byte buffer.
pub fn write_words<W: Write>(w: &mut W, words: &[u64], scratch: &mut Vec<u8>) -> io::Result<()> {
    const CHUNK: usize = 1 << 16;
    for chunk in words.chunks(CHUNK) {
        scratch.clear();
        for &x in chunk {
            scratch.extend_from_slice(&x.to_le_bytes());
        }
        w.write_all(scratch)?;
    }
    Ok(())
}

/// Writes an in-memory graph in the CSR file format.
pub fn write_csr<W: Write>(w: &mut W, g: &CsrGraph) -> io::Result<()> {
    let mut scratch = Vec::new();
    write_words(w, &g.index, &mut scratch)?;
    write_words(w, &g.edges, &mut scratch)
}

/// Builds a CSR graph from directed edges `(src, dst)` on `n` vertices:
/// self-loops and duplicates are dropped, each adjacency list is sorted.
pub fn from_edges(n: u64, edges: &[(u64, u64)]) -> CsrGraph {
    let mut deg = vec![0u64; n as usize + 1];
    for &(s, d) in edges {
        if s != d {
            deg[s as usize + 1] += 1;
        }
    }
    for v in 0..n as usize {
        deg[v + 1] += deg[v];
    }
    let mut cursor = deg.clone();
    let mut adj = vec![0u64; deg[n as usize] as usize];
    for &(s, d) in edges {
        if s != d {
            adj[cursor[s as usize] as usize] = d;
            cursor[s as usize] += 1;
        }
    }
    let mut index = Vec::with_capacity(n as usize + 1);
    index.push(0);
    let mut out = Vec::with_capacity(adj.len());
    for v in 0..n as usize {
        let list = &mut adj[deg[v] as usize..deg[v + 1] as usize];
        list.sort_unstable();
        let before = out.len();
        for &t in list.iter() {
            if out.len() == before || out.last() != Some(&t) {
                out.push(t);
            }
        }
        index.push(out.len() as u64);
    }
    CsrGraph { index, edges: out }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_tmp(name: &str, words: &[u64]) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("faultline-csr-{}-{name}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        write_words(&mut f, words, &mut Vec::new()).unwrap();
        path
    }

    #[test]
    fn roundtrip_and_layout() {
        let g = from_edges(4, &[(0, 1), (1, 0), (0, 2), (2, 0), (0, 1), (3, 3)]);
        assert_eq!(g.index, vec![0, 2, 3, 4, 4]);
        assert_eq!(g.edges, vec![1, 2, 0, 0]);
        let mut words = g.index.clone();
        words.extend(&g.edges);
        let path = write_tmp("ok", &words);
        assert_eq!(read_layout(&path).unwrap(), g.layout());
        assert_eq!(load(&path).unwrap(), g);
        assert_eq!(
            g.layout().file_bytes(),
            std::fs::metadata(&path).unwrap().len()
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn empty_graphs() {
        let path = write_tmp("n0", &[0]);
        assert_eq!(
            read_layout(&path).unwrap(),
            CsrLayout {
                vertices: 0,
                edges: 0
            }
        );
        std::fs::remove_file(path).unwrap();
        let path = write_tmp("n3", &[0, 0, 0, 0]);
        assert_eq!(load(&path).unwrap().vertices(), 3);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn bad_files() {
        let cases: [(&str, Vec<u64>); 4] = [
            ("start", vec![1, 1, 0]),
            ("mono", vec![0, 2, 1, 9, 9, 9]),
            ("size", vec![0, 5, 0]),
            ("range", vec![0, 1, 2, 1, 7]),
        ];
        for (name, words) in cases {
            let path = write_tmp(name, &words);
            let err = load(&path).unwrap_err();
            let ok = match name {
                "start" => matches!(err, CsrError::IndexStart { value: 1 }),
                "mono" => matches!(err, CsrError::NotMonotone { vertex: 1, .. }),
                "size" => matches!(err, CsrError::SizeMismatch { vertex: 1, .. }),
                _ => matches!(err, CsrError::EdgeOutOfRange { target: 7, .. }),
            };
            assert!(ok, "{name}: {err}");
            std::fs::remove_file(path).unwrap();
        }
        let path = std::env::temp_dir().join(format!("faultline-csr-{}-odd", std::process::id()));
        std::fs::write(&path, [0u8; 12]).unwrap();
        assert!(matches!(load(&path), Err(CsrError::BadLength { len: 12 })));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(load(&path), Err(CsrError::Io { .. })));
    }
}
