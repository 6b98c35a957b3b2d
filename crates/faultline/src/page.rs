//! Page vocabulary: memory kinds, validated page sizes, and the one place
//! that maps an address to a page index.
//!
//! A region is cut into *region pages* of one [`PageSize`] (a power of
//! two, at least the machine's 4 KiB base page and at least what its
//! [`MemoryKind`] needs: 2 MiB for hugetlb). Every fault resolves at least
//! one whole region page. [`Pages`] holds a region's geometry and is the
//! only code that turns an address into a page index and back:
//!
//! ```text
//!   base                                              base + len
//!    |  page 0  |  page 1  |  ...  |  page i  |  ...  |
//!                                  ^ addr: index(addr) = (addr - base) >> shift
//!                                    addr(i) = base + (i << shift)
//! ```

use std::fmt;
use std::ops::Range;

use crate::error::{Error, Result};

/// What memory backs a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`: MISSING faults; COPY, ZEROPAGE, MOVE.
    PrivateAnon,
    /// A shared memfd (shmem): MISSING and MINOR faults; the runtime fills
    /// the page cache through a second, unregistered view and maps it with
    /// `UFFDIO_CONTINUE`.
    Shmem,
    /// A hugetlb memfd (2 MiB pages, needs a pool): like `Shmem`.
    Hugetlb,
}

impl MemoryKind {
    /// Every kind.
    pub const ALL: [MemoryKind; 3] = [
        MemoryKind::PrivateAnon,
        MemoryKind::Shmem,
        MemoryKind::Hugetlb,
    ];

    /// Name for reports and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::PrivateAnon => "private-anon",
            MemoryKind::Shmem => "shmem",
            MemoryKind::Hugetlb => "hugetlb",
        }
    }

    /// The smallest page size a region of this kind may use (and its
    /// default).
    pub fn min_page_size(self) -> PageSize {
        match self {
            MemoryKind::Hugetlb => PageSize::HUGE_2M,
            _ => PageSize::BASE,
        }
    }
}

/// How faults on a region are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResolveOp {
    /// Pick per memory kind and store: ZEROPAGE for read faults on a zero
    /// store (private anon), COPY for data, CONTINUE for shmem/hugetlb.
    Auto,
    /// `UFFDIO_COPY` (allocates a page and copies into it).
    Copy,
    /// `UFFDIO_MOVE` of pre-touched pages from a per-region pool (private
    /// anonymous only): the page is prepared off the fault path.
    Move,
    /// `UFFDIO_CONTINUE` after filling the page cache through the alias
    /// view (shmem, hugetlb).
    Continue,
}

impl ResolveOp {
    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            ResolveOp::Auto => "auto",
            ResolveOp::Copy => "COPY",
            ResolveOp::Move => "MOVE",
            ResolveOp::Continue => "CONTINUE",
        }
    }
}

/// A region page size: a power of two of at least 4 KiB. Constructing one
/// is the only validation; code holding a `PageSize` never checks again.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageSize {
    shift: u32,
}

impl PageSize {
    /// The machine's base page, 4 KiB.
    pub const BASE: PageSize = PageSize { shift: 12 };
    /// A 2 MiB huge page (hugetlb, transparent huge frames).
    pub const HUGE_2M: PageSize = PageSize { shift: 21 };
    /// The largest region page accepted, 1 GiB.
    pub const MAX: PageSize = PageSize { shift: 30 };

    /// `bytes` as a page size: a power of two from 4 KiB to 1 GiB.
    pub fn new(bytes: usize) -> Result<PageSize> {
        if !bytes.is_power_of_two() {
            return Err(Error::BadPageSize {
                page_size: bytes,
                reason: "must be a power of two",
            });
        }
        let p = PageSize {
            shift: bytes.trailing_zeros(),
        };
        if p < Self::BASE || p > Self::MAX {
            return Err(Error::BadPageSize {
                page_size: bytes,
                reason: "must be between 4 KiB and 1 GiB",
            });
        }
        Ok(p)
    }

    /// `bytes` as a page size usable by `kind` (at least
    /// [`MemoryKind::min_page_size`]).
    pub fn for_kind(bytes: usize, kind: MemoryKind) -> Result<PageSize> {
        let p = Self::new(bytes)?;
        if p < kind.min_page_size() {
            return Err(Error::BadPageSize {
                page_size: bytes,
                reason: match kind {
                    MemoryKind::Hugetlb => "hugetlb regions need at least 2 MiB pages",
                    _ => "smaller than the memory kind's page",
                },
            });
        }
        Ok(p)
    }

    /// Bytes per page.
    #[inline]
    pub const fn bytes(self) -> usize {
        1 << self.shift
    }

    /// log2 of [`bytes`](Self::bytes).
    #[inline]
    pub const fn shift(self) -> u32 {
        self.shift
    }

    /// `x` (an address or a byte offset) rounded down to a page boundary.
    #[inline]
    pub const fn align_down(self, x: u64) -> u64 {
        x & !((1u64 << self.shift) - 1)
    }

    /// `x` (an address or a byte offset) rounded up to a page boundary.
    #[inline]
    pub const fn align_up(self, x: u64) -> u64 {
        x.next_multiple_of(1u64 << self.shift)
    }

    /// Whether `x` (an address or a byte offset) is on a page boundary.
    #[inline]
    pub const fn is_aligned(self, x: u64) -> bool {
        x & ((1u64 << self.shift) - 1) == 0
    }

    /// The index of the page holding byte `x` of a range that starts on a
    /// page boundary (`x >> shift`).
    #[inline]
    pub const fn index_of(self, x: u64) -> u64 {
        x >> self.shift
    }

    /// The byte offset of page `index` of a range that starts on a page
    /// boundary (`index << shift`).
    #[inline]
    pub const fn offset_of(self, index: u64) -> u64 {
        index << self.shift
    }

    /// How many whole pages `bytes` bytes hold.
    #[inline]
    pub const fn pages_in(self, bytes: usize) -> usize {
        bytes >> self.shift
    }

    /// How many base (4 KiB) pages one page spans.
    #[inline]
    pub const fn base_pages(self) -> usize {
        1 << (self.shift - Self::BASE.shift)
    }
}

impl fmt::Debug for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageSize({})", self)
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.shift {
            s if s >= 30 => write!(f, "{}G", 1u64 << (s - 30)),
            s if s >= 20 => write!(f, "{}M", 1u64 << (s - 20)),
            s => write!(f, "{}K", 1u64 << (s - 10)),
        }
    }
}

/// The geometry of a region's pages: the one place that maps an address
/// to a page index and a page index to an address or store offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pages {
    base: u64,
    count: usize,
    size: PageSize,
}

impl Pages {
    /// `len` bytes from `base` cut into pages of `size`. `len` must be a
    /// positive multiple of the page size and `base` aligned to the base
    /// page (region pages are counted from `base`; hugetlb mappings are
    /// aligned to their page by the kernel).
    pub fn new(base: u64, len: usize, size: PageSize) -> Result<Pages> {
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        if !len.is_multiple_of(size.bytes()) {
            return Err(Error::LengthNotPageMultiple {
                len,
                page_size: size.bytes(),
            });
        }
        if !base.is_multiple_of(PageSize::BASE.bytes() as u64) {
            return Err(Error::Unaligned {
                addr: base,
                align: PageSize::BASE.bytes(),
            });
        }
        Ok(Pages {
            base,
            count: len >> size.shift(),
            size,
        })
    }

    /// First byte.
    #[inline]
    pub fn base(&self) -> u64 {
        self.base
    }
    /// One past the last byte.
    #[inline]
    pub fn end(&self) -> u64 {
        self.base + self.len() as u64
    }
    /// Bytes covered.
    #[inline]
    pub fn len(&self) -> usize {
        self.count << self.size.shift()
    }
    /// Never empty (construction refuses zero pages).
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Number of pages.
    #[inline]
    pub fn count(&self) -> usize {
        self.count
    }
    /// The page size.
    #[inline]
    pub fn size(&self) -> PageSize {
        self.size
    }
    /// Whether `addr` lies in the region.
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.end()
    }
    /// The index of the page holding `addr` (which must lie in the region).
    #[inline]
    pub fn index(&self, addr: u64) -> usize {
        debug_assert!(self.contains(addr), "{addr:#x} outside {self:?}");
        ((addr - self.base) >> self.size.shift()) as usize
    }
    /// The address of page `page`.
    #[inline]
    pub fn addr(&self, page: usize) -> u64 {
        self.base + ((page as u64) << self.size.shift())
    }
    /// The byte offset of page `page` from the start of the region (and of
    /// the store).
    #[inline]
    pub fn offset(&self, page: usize) -> u64 {
        (page as u64) << self.size.shift()
    }
    /// Bytes spanned by `n` pages.
    #[inline]
    pub fn bytes(&self, n: usize) -> usize {
        n << self.size.shift()
    }
    /// The pages overlapping the byte range `[offset, offset + len)` of
    /// the region; `None` if it is empty or runs past the end.
    pub fn covering(&self, offset: usize, len: usize) -> Option<Range<usize>> {
        let end = offset.checked_add(len)?;
        if len == 0 || end > self.len() {
            return None;
        }
        let shift = self.size.shift();
        Some(offset >> shift..((end - 1) >> shift) + 1)
    }
    /// The pages lying wholly inside `[start, end)` (addresses, clipped to
    /// the region): what an event dropping that range took away.
    pub fn within(&self, start: u64, end: u64) -> Range<usize> {
        let (s, e) = (start.max(self.base), end.min(self.end()));
        if s >= e {
            return 0..0;
        }
        let ps = self.size.bytes() as u64;
        let first = ((s - self.base).div_ceil(ps)) as usize;
        let last = ((e - self.base) / ps) as usize;
        first..last.max(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn page_sizes_are_validated_once() {
        assert_eq!(PageSize::new(4096).unwrap(), PageSize::BASE);
        assert_eq!(PageSize::new(2 << 20).unwrap(), PageSize::HUGE_2M);
        assert!(PageSize::new(0).is_err());
        assert!(PageSize::new(12 << 10).is_err(), "not a power of two");
        assert!(PageSize::new(2048).is_err(), "below 4 KiB");
        assert!(PageSize::for_kind(4096, MemoryKind::Hugetlb).is_err());
        assert!(PageSize::for_kind(4 << 20, MemoryKind::Hugetlb).is_ok());
        assert_eq!(PageSize::new(64 << 10).unwrap().to_string(), "64K");
        assert_eq!(PageSize::HUGE_2M.base_pages(), 512);
        let p = PageSize::BASE;
        assert_eq!((p.align_down(0x1fff), p.align_up(0x1001)), (0x1000, 0x2000));
        assert_eq!((p.align_down(0x2000), p.align_up(0x2000)), (0x2000, 0x2000));
        assert!(p.is_aligned(0x3000) && !p.is_aligned(0x3001));
        assert_eq!((p.index_of(0x2fff), p.offset_of(3)), (2, 0x3000));
        assert_eq!(PageSize::HUGE_2M.pages_in((5 << 20) + 1), 2);
    }

    #[test]
    fn geometry_is_checked() {
        let ps = PageSize::new(16 << 10).unwrap();
        assert!(Pages::new(0x10000, 0, ps).is_err());
        assert!(Pages::new(0x10000, 4096, ps).is_err());
        assert!(Pages::new(0x11800, 16 << 10, ps).is_err());
        assert_eq!(Pages::new(0x11000, 32 << 10, ps).unwrap().addr(1), 0x15000);
        let p = Pages::new(0x10000, 64 << 10, ps).unwrap();
        assert_eq!(p.count(), 4);
        assert_eq!(p.within(0x10000 + 1, 0x10000 + (48 << 10)), 1..3);
        assert_eq!(p.within(0, 0x10000), 0..0);
        assert_eq!(p.covering(0, 1), Some(0..1));
        assert_eq!(p.covering((16 << 10) - 1, 2), Some(0..2));
        assert_eq!(p.covering(0, 0), None);
        assert_eq!(p.covering(1, 64 << 10), None);
    }

    proptest! {
        #[test]
        fn index_and_addr_are_inverse(shift in 12u32..22, count in 1usize..4096, off in 0usize..usize::MAX) {
            let ps = PageSize::new(1 << shift).unwrap();
            let base = 0x7f00_0000_0000u64;
            let p = Pages::new(base, count << shift, ps).unwrap();
            let addr = base + (off % p.len()) as u64;
            let i = p.index(addr);
            prop_assert!(i < p.count());
            prop_assert!(p.addr(i) <= addr && addr < p.addr(i) + ps.bytes() as u64);
            prop_assert_eq!(p.index(p.addr(i)), i);
            prop_assert_eq!(p.offset(i), p.addr(i) - base);
        }

        #[test]
        fn covering_spans_exactly_the_touched_pages(shift in 12u32..17, count in 1usize..64, a in 0usize..1 << 22, b in 0usize..1 << 22) {
            let ps = PageSize::new(1 << shift).unwrap();
            let p = Pages::new(1 << 30, count << shift, ps).unwrap();
            let (off, len) = (a % p.len(), b % p.len());
            match p.covering(off, len) {
                None => prop_assert!(len == 0 || off + len > p.len()),
                Some(r) => {
                    prop_assert_eq!(r.start, off / ps.bytes());
                    prop_assert_eq!(r.end, (off + len).div_ceil(ps.bytes()));
                }
            }
        }
    }
}
