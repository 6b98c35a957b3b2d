//! Where a store lives in Redis: key names, what the metadata hash and
//! the generation records say, and parsing chunk keys back (for `gc`).
//! No I/O here.
//!
//! ```text
//! fl:{NAME}:meta          hash: len, chunk, group, checksum, gen
//!                         (the store readers open; no gen: generation 0)
//! fl:{NAME}:gens          hash: next -> the last generation id handed out,
//!                         ID -> "put EXPIRY CHUNK GROUP UPTO OWNER" (an
//!                               upload in progress)
//!                            | "old CHUNK GROUP UPTO" (chunks to remove)
//! fl:{NAME:G}:gID:C       chunk C of generation ID (bytes C*chunk ..),
//!                         G = C / group
//! fl:{NAME:G}:C           chunk C of generation 0: a store written
//!                         before generations (still read, replaced and
//!                         removed the same way)
//! ```
//!
//! The hash tag (between the braces) is what a cluster hashes: `{NAME:G}`
//! keeps a group of chunks (1 MiB by default) on one shard, so a
//! read-ahead window is one request to one node, whatever the
//! generation; `{NAME}` keeps the metadata and the records in one slot,
//! so one script can read and write them together (see `generation.rs`).
//!
//! A key parses back to one store and one chunk only: a name contains no
//! `{` or `}`, so the tag ends at the first `}` and its last `:` parts
//! the name from the group; after the tag comes either `:C` or `:gID:C`,
//! never `:meta`/`:gens` (those have the tag `{NAME}`, which parses as
//! another store's name or not at all).

use std::collections::HashMap;

use crate::config::MAX_CHUNK;

/// What a store's metadata key says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreInfo {
    /// Bytes of data.
    pub len: u64,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// Chunks per hash tag.
    pub group_chunks: u64,
    /// FNV-1a 64 of the data ([`checksum`]).
    pub checksum: u64,
    /// The generation whose chunks hold the data (a number in the chunk
    /// keys, new with each `put`); 0 for a store written before
    /// generations (keys without one).
    pub generation: u64,
}

impl StoreInfo {
    /// Chunks (keys) of the data.
    pub fn chunks(&self) -> u64 {
        self.len.div_ceil(self.chunk_bytes.max(1) as u64)
    }
}

/// FNV-1a 64 of `data`, continuing from `h` (start with [`FNV_START`]).
pub fn checksum(mut h: u64, data: &[u8]) -> u64 {
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The FNV-1a 64 offset basis.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// The metadata hash of store `name`.
pub(crate) fn meta_key(name: &str) -> String {
    format!("fl:{{{name}}}:meta")
}

/// The generation records of store `name` (same slot as the metadata).
pub(crate) fn gens_key(name: &str) -> String {
    format!("fl:{{{name}}}:gens")
}

/// Appends the key of chunk `c` of generation `generation` to `k`.
pub(crate) fn write_chunk_key(k: &mut String, name: &str, group: u64, generation: u64, c: u64) {
    use std::fmt::Write as _;
    let g = c / group.max(1);
    let _ = if generation == 0 {
        write!(k, "fl:{{{name}:{g}}}:{c}")
    } else {
        write!(k, "fl:{{{name}:{g}}}:g{generation}:{c}")
    };
}

/// The key of chunk `c` of generation `generation`.
pub(crate) fn chunk_key(name: &str, group: u64, generation: u64, c: u64) -> String {
    let mut k = String::new();
    write_chunk_key(&mut k, name, group, generation, c);
    k
}

/// A `SCAN MATCH` pattern covering every chunk key of store `name` (and
/// of stores whose names start with `NAME:`, which
/// [`parse_chunk_key`] tells apart): the name's glob characters escaped.
pub(crate) fn scan_pattern(name: &str) -> String {
    let mut p = String::from("fl:{");
    for ch in name.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            p.push('\\');
        }
        p.push(ch);
    }
    p.push_str(":*");
    p
}

/// A chunk key of a store, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkKey {
    pub(crate) generation: u64,
    pub(crate) group: u64,
    pub(crate) chunk: u64,
}

/// Plain decimal digits (no sign, no spaces) as a `u64`.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `key` as a chunk key of store `name`, or `None` if it is anything
/// else (another store's key, the metadata, a key of another program).
pub(crate) fn parse_chunk_key(key: &str, name: &str) -> Option<ChunkKey> {
    let rest = key.strip_prefix("fl:{")?;
    let (tag, tail) = rest.split_once('}')?;
    let (n, g) = tag.rsplit_once(':')?;
    if n != name {
        return None;
    }
    let group = digits(g)?;
    let tail = tail.strip_prefix(':')?;
    let (generation, c) = match tail.strip_prefix('g') {
        Some(t) => {
            let (id, c) = t.split_once(':')?;
            (digits(id).filter(|&i| i > 0)?, c)
        }
        None => (0, tail),
    };
    Some(ChunkKey {
        generation,
        group,
        chunk: digits(c)?,
    })
}

impl ChunkKey {
    /// Whether this key holds a chunk of `info`'s data (its generation,
    /// inside its length, under the right group).
    pub(crate) fn belongs_to(&self, info: &StoreInfo) -> bool {
        self.generation == info.generation
            && self.chunk < info.chunks()
            && self.group == self.chunk / info.group_chunks.max(1)
    }
}

/// The store's info from its metadata hash, or why it does not parse.
pub(crate) fn info_from_meta(map: &HashMap<String, String>) -> Result<StoreInfo, String> {
    let field = |k: &str| -> Result<u64, String> {
        map.get(k)
            .and_then(|v| digits(v))
            .ok_or_else(|| format!("field {k} missing or not a number"))
    };
    let checksum = map
        .get("checksum")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .ok_or_else(|| "field checksum missing or not hex".to_string())?;
    let generation = match map.get("gen") {
        Some(v) => digits(v).ok_or_else(|| format!("field gen {v:?} is not a number"))?,
        None => 0,
    };
    let chunk = field("chunk")?;
    let info = StoreInfo {
        len: field("len")?,
        chunk_bytes: chunk as usize,
        group_chunks: field("group")?,
        checksum,
        generation,
    };
    if chunk == 0 || chunk > MAX_CHUNK as u64 {
        return Err(format!("chunk size {chunk} is outside 1..={MAX_CHUNK}"));
    }
    if info.group_chunks == 0 {
        return Err("zero chunks per hash tag".into());
    }
    Ok(info)
}

/// A generation record (`fl:{NAME}:gens` field `ID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// An upload in progress: its lease ends at `expiry_ms` (server
    /// time, ms since the epoch) unless renewed; chunks `0..upto` may
    /// exist; `owner` is the uploading process (`owner.rs`).
    Put {
        expiry_ms: u64,
        chunk: u64,
        group: u64,
        upto: u64,
        owner: String,
    },
    /// A generation no metadata names any more (replaced, or an upload
    /// that stopped): chunks `0..upto` are to be removed.
    Old { chunk: u64, group: u64, upto: u64 },
}

impl Record {
    /// Parses a record's value (as the scripts in `generation.rs` write
    /// it).
    pub(crate) fn parse(v: &str) -> Option<Record> {
        let mut it = v.splitn(6, ' ');
        match it.next()? {
            "put" => {
                let expiry_ms = digits(it.next()?)?;
                let chunk = digits(it.next()?)?;
                let group = digits(it.next()?)?;
                let upto = digits(it.next()?)?;
                let owner = it.next()?.to_string();
                Some(Record::Put {
                    expiry_ms,
                    chunk,
                    group,
                    upto,
                    owner,
                })
            }
            "old" => {
                let r = Record::Old {
                    chunk: digits(it.next()?)?,
                    group: digits(it.next()?)?,
                    upto: digits(it.next()?)?,
                };
                it.next().is_none().then_some(r)
            }
            _ => None,
        }
    }

    /// The record's chunk size, chunks per tag and chunk count.
    pub(crate) fn extent(&self) -> (u64, u64, u64) {
        match *self {
            Record::Put {
                chunk, group, upto, ..
            }
            | Record::Old { chunk, group, upto } => (chunk, group, upto),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_keys_parse_back_to_their_store_and_chunk() {
        for name in ["snap", "a:b", "x:1", "we*ird?[n]\\", "g1", "a b"] {
            for generation in [0, 1, 7, u64::MAX] {
                for (group, c) in [(16, 0), (16, 15), (16, 16), (1, 12345), (3, u64::MAX)] {
                    let k = chunk_key(name, group, generation, c);
                    let p = parse_chunk_key(&k, name).unwrap_or_else(|| panic!("{k}"));
                    assert_eq!(
                        p,
                        ChunkKey {
                            generation,
                            group: c / group,
                            chunk: c
                        },
                        "{k}"
                    );
                    // Never another store's key, whatever the names.
                    for other in ["sna", "snap:0", "a", "x", "g", ""] {
                        if other != name {
                            assert_eq!(parse_chunk_key(&k, other), None, "{k} as {other}");
                        }
                    }
                }
            }
            // The metadata and the records are not chunks, not even of a
            // store whose name is this one's prefix.
            for k in [meta_key(name), gens_key(name)] {
                assert_eq!(parse_chunk_key(&k, name), None, "{k}");
                if let Some((pre, _)) = name.rsplit_once(':') {
                    assert_eq!(parse_chunk_key(&k, pre), None, "{k} as {pre}");
                }
            }
        }
        for bad in [
            "fl:{snap:0}:",
            "fl:{snap:0}:g:1",
            "fl:{snap:0}:g0:1",
            "fl:{snap:0}:+1",
            "fl:{snap:x}:1",
            "fl:{snap:0}:gens",
            "fl:{snap:0}:g1:1:2",
            "xx:{snap:0}:1",
        ] {
            assert_eq!(parse_chunk_key(bad, "snap"), None, "{bad}");
        }
    }

    #[test]
    fn the_scan_pattern_escapes_glob_characters() {
        assert_eq!(scan_pattern("snap"), "fl:{snap:*");
        assert_eq!(scan_pattern("a*b?[c]\\"), "fl:{a\\*b\\?\\[c\\]\\\\:*");
    }

    #[test]
    fn metadata_with_and_without_a_generation() {
        let mut m: HashMap<String, String> = [
            ("len", "100000"),
            ("chunk", "65536"),
            ("group", "16"),
            ("checksum", "00000000000000ff"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let old = info_from_meta(&m).unwrap();
        assert_eq!((old.generation, old.chunks(), old.checksum), (0, 2, 255));
        m.insert("gen".into(), "12".into());
        assert_eq!(info_from_meta(&m).unwrap().generation, 12);
        m.insert("chunk".into(), (MAX_CHUNK as u64 + 1).to_string());
        assert!(info_from_meta(&m).unwrap_err().contains("outside"));
        m.insert("chunk".into(), "-1".into());
        assert!(info_from_meta(&m).unwrap_err().contains("chunk"));
    }

    #[test]
    fn records_parse() {
        assert_eq!(
            Record::parse("put 1700000000000 65536 16 128 host/boot/12/34"),
            Some(Record::Put {
                expiry_ms: 1_700_000_000_000,
                chunk: 65536,
                group: 16,
                upto: 128,
                owner: "host/boot/12/34".into()
            })
        );
        assert_eq!(
            Record::parse("old 4096 256 7"),
            Some(Record::Old {
                chunk: 4096,
                group: 256,
                upto: 7
            })
        );
        for bad in ["", "old 1 2", "old 1 2 3 4", "put 1 2 3 4", "new 1 2 3"] {
            assert_eq!(Record::parse(bad), None, "{bad:?}");
        }
    }
}
