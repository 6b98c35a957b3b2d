//! Text edge lists to CSR: one `src dst` pair of decimal vertex numbers per
//! line, separated by spaces, tabs or a comma. Blank lines and lines
//! starting with `#` or `%` are skipped; further columns (weights,
//! timestamps) are ignored. The vertex count is the largest id + 1. As for
//! generated graphs, self-loops and duplicate edges are dropped and each
//! adjacency list is sorted.

use std::fmt;
use std::io::{self, BufRead};

use super::csr::{from_edges, CsrGraph};

/// A malformed edge list.
#[derive(Debug)]
pub enum ImportError {
    /// Reading failed.
    Io(io::Error),
    /// A line is not `src dst`.
    Parse {
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::Io(e) => write!(f, "reading edge list: {e}"),
            ImportError::Parse { line, reason } => write!(f, "line {line}: {reason}"),
        }
    }
}

impl std::error::Error for ImportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ImportError::Io(e) => Some(e),
            ImportError::Parse { .. } => None,
        }
    }
}

/// Largest accepted vertex id (keeps `n` allocatable and `n + 1` finite).
const MAX_ID: u64 = 1 << 40;

fn parse_id(field: Option<&str>, what: &str, line: u64) -> Result<u64, ImportError> {
    let field = field.ok_or_else(|| ImportError::Parse {
        line,
        reason: format!("missing {what} vertex (expected `src dst`)"),
    })?;
    let id: u64 = field.parse().map_err(|e| ImportError::Parse {
        line,
        reason: format!("{what} vertex {field:?}: {e}"),
    })?;
    if id >= MAX_ID {
        return Err(ImportError::Parse {
            line,
            reason: format!("{what} vertex {id} exceeds the limit {MAX_ID}"),
        });
    }
    Ok(id)
}

/// Reads an edge list; with `undirected`, stores both directions.
pub fn read_edge_list<R: BufRead>(r: R, undirected: bool) -> Result<CsrGraph, ImportError> {
    let mut edges = Vec::new();
    let mut n = 0u64;
    for (i, line) in r.lines().enumerate() {
        let line_no = i as u64 + 1;
        let line = line.map_err(ImportError::Io)?;
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with('%') {
            continue;
        }
        let mut fields = t
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|f| !f.is_empty());
        let s = parse_id(fields.next(), "source", line_no)?;
        let d = parse_id(fields.next(), "target", line_no)?;
        n = n.max(s + 1).max(d + 1);
        edges.push((s, d));
        if undirected {
            edges.push((d, s));
        }
    }
    Ok(from_edges(n, &edges))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_edge_list() {
        let text = "# a comment\n0 1\n1\t2 0.5\n\n% another\n2,0\n2 2\n0 1\n";
        let g = read_edge_list(text.as_bytes(), true).unwrap();
        assert_eq!(g.index, vec![0, 2, 4, 6]);
        assert_eq!(g.edges, vec![1, 2, 0, 2, 0, 1]);
        let d = read_edge_list(text.as_bytes(), false).unwrap();
        assert_eq!(d.index, vec![0, 1, 2, 3]);
        assert_eq!(d.edges, vec![1, 2, 0]);
    }

    #[test]
    fn errors_have_line_numbers() {
        let err = read_edge_list("0 1\n1 x\n".as_bytes(), true).unwrap_err();
        assert!(
            err.to_string().starts_with("line 2: target vertex \"x\""),
            "{err}"
        );
        let err = read_edge_list("# c\n\n7\n".as_bytes(), true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 3: missing target vertex (expected `src dst`)"
        );
        let err = read_edge_list("-1 2\n".as_bytes(), true).unwrap_err();
        assert!(
            err.to_string().starts_with("line 1: source vertex"),
            "{err}"
        );
    }

    #[test]
    fn empty_list_is_empty_graph() {
        let g = read_edge_list("# nothing\n".as_bytes(), true).unwrap();
        assert_eq!(g.index, vec![0]);
        assert!(g.edges.is_empty());
    }
}
