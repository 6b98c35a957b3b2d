//! Firecracker's `Uffd` hand-off message: a JSON array of guest memory
//! regions, sent once with the userfaultfd attached (`SCM_RIGHTS`).
//!
//! Every field variant of Firecracker's releases is accepted (see
//! `shared/docs/vm-snapshot-handoff.md`):
//! `base_host_virt_addr`, `size`, `offset`, and the page size as
//! `page_size` (bytes), `page_size_kib` (deprecated; holds bytes in current
//! releases, KiB in the oldest that had it: 4 and 2048 are read as KiB,
//! 4096 and 2097152 as bytes) or neither (4 KiB). Unknown fields
//! (`gpa_start`, `is_guest_memfd`, ...) are ignored.
//!
//! One optional field of faultline's own, per region: `"backing"`,
//! `"anonymous"` or `"shared"` (the region maps `faultline serve
//! --shared`'s snapshot `MAP_PRIVATE`). It declares what serve otherwise
//! reads in the peer's memory map, which a peer in another pid namespace
//! (its pid unknown to serve, `SO_PEERCRED` says 0) or under another user
//! cannot show; serve still checks the map when it can read it. Handlers
//! that do not know the field ignore it.

use serde::{Deserialize, Serialize};

use faultline::{ForeignRegionSpec, PeerBacking};

/// One region as sent on the wire.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct WireRegion {
    /// Start in the peer's address space.
    pub base_host_virt_addr: u64,
    /// Bytes.
    pub size: u64,
    /// Where the region's bytes start in the memory file.
    pub offset: u64,
    /// Page size in bytes (current releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u64>,
    /// Page size (older releases; see the module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size_kib: Option<u64>,
    /// faultline's own: `anonymous` or `shared` (see the module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing: Option<String>,
}

/// A parsed handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// The regions.
    pub regions: Vec<ForeignRegionSpec>,
    /// The backing every region declared (`None`: not declared).
    pub backing: Option<PeerBacking>,
}

/// Why a handshake was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandshakeError {
    /// Not valid JSON for the message.
    #[error("malformed handshake: {0}")]
    Json(String),
    /// The JSON ends before the message does (the rest may still be on
    /// its way).
    #[error("the handshake ends early: {0}")]
    Incomplete(String),
    /// No region at all.
    #[error("the handshake lists no region")]
    Empty,
    /// A region of zero bytes.
    #[error("region {0} has size 0")]
    ZeroSize(usize),
    /// The two page-size fields disagree.
    #[error("region {index}: page_size {page_size} and page_size_kib {kib} disagree")]
    PageSizeConflict {
        /// Region index.
        index: usize,
        /// `page_size`.
        page_size: u64,
        /// `page_size_kib`.
        kib: u64,
    },
    /// A `backing` that is not `anonymous` or `shared`.
    #[error("region {index}: backing {value:?} is not \"anonymous\" or \"shared\"")]
    Backing {
        /// Region index.
        index: usize,
        /// What it said.
        value: String,
    },
    /// Regions declaring different backings, or some none.
    #[error("the regions declare different backings (declare one for every region, or none)")]
    MixedBacking,
    /// A page size that is not served.
    #[error("region {index}: page size {bytes} bytes is not supported (4096 or 2097152)")]
    PageSize {
        /// Region index.
        index: usize,
        /// Bytes.
        bytes: u64,
    },
}

/// Parses the message into region specs. Never panics, whatever the bytes.
pub fn parse(bytes: &[u8]) -> Result<Vec<ForeignRegionSpec>, HandshakeError> {
    Ok(parse_handshake(bytes)?.regions)
}

/// Parses the message: the regions and their declared backing. Never
/// panics, whatever the bytes.
pub fn parse_handshake(bytes: &[u8]) -> Result<Handshake, HandshakeError> {
    let wire: Vec<WireRegion> = serde_json::from_slice(bytes).map_err(|e| match e.is_eof() {
        true => HandshakeError::Incomplete(e.to_string()),
        false => HandshakeError::Json(e.to_string()),
    })?;
    if wire.is_empty() {
        return Err(HandshakeError::Empty);
    }
    let mut declared = Vec::with_capacity(wire.len());
    for (index, w) in wire.iter().enumerate() {
        declared.push(match w.backing.as_deref() {
            None => None,
            Some("anonymous") => Some(PeerBacking::Anonymous),
            Some("shared") => Some(PeerBacking::Shared),
            Some(other) => {
                return Err(HandshakeError::Backing {
                    index,
                    value: other.into(),
                })
            }
        });
    }
    if declared.iter().any(|d| d != &declared[0]) {
        return Err(HandshakeError::MixedBacking);
    }
    let regions = wire
        .iter()
        .enumerate()
        .map(|(index, w)| {
            if w.size == 0 {
                return Err(HandshakeError::ZeroSize(index));
            }
            let kib = w.page_size_kib.map(|k| match k {
                4 | 2048 => k * 1024,
                other => other,
            });
            let page_size = match (w.page_size, kib) {
                (Some(a), Some(b)) if a != b => {
                    return Err(HandshakeError::PageSizeConflict {
                        index,
                        page_size: a,
                        kib: w.page_size_kib.unwrap_or(0),
                    })
                }
                (Some(a), _) | (None, Some(a)) => a,
                (None, None) => 4096,
            };
            if page_size != 4096 && page_size != 2 << 20 {
                return Err(HandshakeError::PageSize {
                    index,
                    bytes: page_size,
                });
            }
            Ok(ForeignRegionSpec {
                base: w.base_host_virt_addr,
                len: usize::try_from(w.size).map_err(|_| HandshakeError::ZeroSize(index))?,
                page_size,
                store_offset: w.offset,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Handshake {
        regions,
        backing: declared[0].clone(),
    })
}

/// `message` (an [`encode`]d handshake) with every region declaring
/// `backing`.
pub fn declare_backing(message: &str, backing: &PeerBacking) -> String {
    let value = match backing {
        PeerBacking::Anonymous => "anonymous",
        PeerBacking::Shared => "shared",
    };
    let mut v: serde_json::Value = serde_json::from_str(message).unwrap_or_default();
    if let Some(items) = v.as_array_mut() {
        for item in items.iter_mut().filter_map(|i| i.as_object_mut()) {
            item.insert("backing".into(), value.into());
        }
    }
    v.to_string()
}

/// The field variants a peer may send (for the test peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Variant {
    /// `page_size` in bytes (current releases).
    PageSize,
    /// `page_size_kib` holding bytes (current releases keep it, deprecated).
    KibBytes,
    /// `page_size_kib` holding KiB.
    Kib,
    /// No page-size field (oldest releases: 4 KiB).
    None,
    /// `page_size` plus fields of a development branch (`gpa_start`,
    /// `is_guest_memfd`), which a handler must ignore.
    Extra,
}

/// The message a peer of `variant` sends for `regions`
/// (`(base, size, offset, page_size)`).
pub fn encode(variant: Variant, regions: &[(u64, u64, u64, u64)]) -> String {
    let items: Vec<serde_json::Value> = regions
        .iter()
        .map(|&(base, size, offset, ps)| {
            let mut v = serde_json::json!({
                "base_host_virt_addr": base,
                "size": size,
                "offset": offset,
            });
            let m = v.as_object_mut().expect("object");
            match variant {
                Variant::PageSize => {
                    m.insert("page_size".into(), ps.into());
                }
                Variant::KibBytes => {
                    m.insert("page_size_kib".into(), ps.into());
                }
                Variant::Kib => {
                    m.insert("page_size_kib".into(), (ps / 1024).into());
                }
                Variant::None => {}
                Variant::Extra => {
                    m.insert("page_size".into(), ps.into());
                    m.insert("page_size_kib".into(), ps.into());
                    let gpa = offset.wrapping_add(0x1_0000_0000);
                    m.insert("gpa_start".into(), gpa.into());
                    m.insert("is_guest_memfd".into(), false.into());
                }
            }
            v
        })
        .collect();
    serde_json::Value::Array(items).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_declared_backing_is_read_and_checked() {
        let msg = encode(
            Variant::PageSize,
            &[
                (0x1000_0000, 4096, 0, 4096),
                (0x2000_0000, 4096, 4096, 4096),
            ],
        );
        assert_eq!(parse_handshake(msg.as_bytes()).unwrap().backing, None);
        let shared = declare_backing(&msg, &PeerBacking::Shared);
        let hs = parse_handshake(shared.as_bytes()).unwrap();
        assert_eq!(hs.backing, Some(PeerBacking::Shared));
        assert_eq!(hs.regions, parse(msg.as_bytes()).unwrap());
        let anon = declare_backing(&msg, &PeerBacking::Anonymous);
        assert_eq!(
            parse_handshake(anon.as_bytes()).unwrap().backing,
            Some(PeerBacking::Anonymous)
        );
        let mixed = shared.replacen("\"shared\"", "\"anonymous\"", 1);
        assert_eq!(
            parse_handshake(mixed.as_bytes()),
            Err(HandshakeError::MixedBacking)
        );
        let mut one: serde_json::Value = serde_json::from_str(&shared).unwrap();
        one[0].as_object_mut().unwrap().remove("backing").unwrap();
        assert_eq!(
            parse_handshake(one.to_string().as_bytes()),
            Err(HandshakeError::MixedBacking)
        );
        let bad = shared.replace("\"shared\"", "\"memfd\"");
        assert!(matches!(
            parse_handshake(bad.as_bytes()),
            Err(HandshakeError::Backing { index: 0, .. })
        ));
    }

    #[test]
    fn every_variant_parses_to_the_same_regions() {
        let regions = [
            (0x7f00_0000_0000, 8 << 20, 0, 4096),
            (0x7f00_0100_0000, 4 << 20, 8 << 20, 4096),
        ];
        let huge = [(0x7f00_0000_0000, 4 << 20, 0, 2 << 20)];
        for set in [&regions[..], &huge[..]] {
            for v in [
                Variant::PageSize,
                Variant::KibBytes,
                Variant::Kib,
                Variant::Extra,
            ] {
                let got = parse(encode(v, set).as_bytes()).unwrap();
                assert_eq!(got.len(), set.len());
                for (g, w) in got.iter().zip(set) {
                    assert_eq!(
                        (g.base, g.len as u64, g.store_offset, g.page_size),
                        *w,
                        "{v:?}"
                    );
                }
            }
        }
        let none = parse(encode(Variant::None, &regions).as_bytes()).unwrap();
        assert!(none.iter().all(|r| r.page_size == 4096));
    }

    #[test]
    fn bad_messages_say_why() {
        assert!(matches!(parse(b"{not json"), Err(HandshakeError::Json(_))));
        assert_eq!(parse(b"[]"), Err(HandshakeError::Empty));
        assert!(matches!(
            parse(br#"[{"base_host_virt_addr":4096,"size":4096,"offset":0,"page_size":65536}]"#),
            Err(HandshakeError::PageSize {
                index: 0,
                bytes: 65536
            })
        ));
        assert_eq!(
            parse(br#"[{"base_host_virt_addr":4096,"size":0,"offset":0}]"#),
            Err(HandshakeError::ZeroSize(0))
        );
        assert!(matches!(
            parse(br#"[{"base_host_virt_addr":4096,"size":4096,"offset":0,"page_size":4096,"page_size_kib":2097152}]"#),
            Err(HandshakeError::PageSizeConflict { .. })
        ));
        // A missing required field.
        assert!(matches!(
            parse(br#"[{"size":4096,"offset":0}]"#),
            Err(HandshakeError::Json(_))
        ));
    }

    /// Every variant that can carry `page_size` (all but [`Variant::None`],
    /// which says 4 KiB by leaving it out).
    const SIZED: [Variant; 4] = [
        Variant::PageSize,
        Variant::KibBytes,
        Variant::Kib,
        Variant::Extra,
    ];

    /// Regions as [`encode`] takes them: any base and offset, a size of at
    /// least one byte, a served page size.
    fn regions(page_sizes: &'static [u64]) -> impl Strategy<Value = Vec<(u64, u64, u64, u64)>> {
        prop::collection::vec(
            (
                any::<u64>(),
                1..=u64::from(u32::MAX) << 8,
                any::<u64>(),
                prop::sample::select(page_sizes),
            ),
            1..6,
        )
    }

    /// The regions [`parse`] gives, as `(base, size, offset, page_size)`.
    fn parsed(message: &str) -> Result<Vec<(u64, u64, u64, u64)>, HandshakeError> {
        Ok(parse(message.as_bytes())?
            .iter()
            .map(|r| (r.base, r.len as u64, r.store_offset, r.page_size))
            .collect())
    }

    proptest! {
        #[test]
        fn parse_of_encode_is_identity_for_every_sized_variant(
            set in regions(&[4096, 2 << 20]),
            variant in prop::sample::select(&SIZED[..]),
        ) {
            prop_assert_eq!(parsed(&encode(variant, &set)), Ok(set));
        }

        #[test]
        fn parse_of_encode_is_identity_without_a_page_size(set in regions(&[4096])) {
            prop_assert_eq!(parsed(&encode(Variant::None, &set)), Ok(set));
        }

        #[test]
        fn a_declared_backing_survives_the_round_trip(
            set in regions(&[4096, 2 << 20]),
            variant in prop::sample::select(&SIZED[..]),
            shared in any::<bool>(),
        ) {
            let backing = if shared { PeerBacking::Shared } else { PeerBacking::Anonymous };
            let message = declare_backing(&encode(variant, &set), &backing);
            let hs = parse_handshake(message.as_bytes()).unwrap();
            prop_assert_eq!(hs.backing, Some(backing));
            prop_assert_eq!(parsed(&message), Ok(set));
        }

        #[test]
        fn arbitrary_json_values_never_panic(
            fields in prop::collection::vec(
                (
                    prop::sample::select(&[
                        "base_host_virt_addr", "size", "offset", "page_size",
                        "page_size_kib", "backing", "gpa_start",
                    ][..]),
                    prop_oneof![
                        any::<u64>().prop_map(serde_json::Value::from),
                        any::<i64>().prop_map(serde_json::Value::from),
                        any::<f64>().prop_map(serde_json::Value::from),
                        "[a-z]{0,8}".prop_map(serde_json::Value::from),
                        Just(serde_json::Value::Null),
                    ],
                ),
                0..8,
            ),
            copies in 0usize..4,
        ) {
            let region: serde_json::Map<String, serde_json::Value> =
                fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let message = serde_json::Value::Array(vec![region.into(); copies]).to_string();
            let _ = parse_handshake(message.as_bytes());
        }

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
            let _ = parse_handshake(&bytes);
        }

        #[test]
        fn mutated_messages_never_panic(
            cut in 0usize..200,
            flip in prop::collection::vec((0usize..200, any::<u8>()), 0..8),
        ) {
            let mut m = encode(Variant::Extra, &[(0x7f00_0000_0000, 8 << 20, 0, 4096)]).into_bytes();
            for (i, b) in flip {
                if let Some(x) = m.get_mut(i) {
                    *x = b;
                }
            }
            m.truncate(cut.max(1).min(m.len()));
            let _ = parse(&m);
        }
    }
}
