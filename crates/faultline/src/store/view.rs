//! [`StoreView`]: a store's bytes lent without a copy.

use std::marker::PhantomData;
use std::ptr::NonNull;

/// Bytes a store holds in memory that stays mapped while the store lives
/// (a file's mapping, an in-process buffer), lent without a copy.
///
/// An address and a length, not a `&[u8]`: the bytes may change while
/// they are lent (the store's own [`write_back`](super::PageStore::write_back),
/// another process writing the file under its mapping), and a shared
/// reference promises that they do not. The fault path hands
/// [`as_ptr`](Self::as_ptr) to the kernel (the source of a
/// `UFFDIO_COPY`); Rust code reads them with [`copy_to`](Self::copy_to),
/// or borrows them with the `unsafe` [`as_slice`](Self::as_slice) where
/// it knows nothing writes them meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct StoreView<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _store: PhantomData<&'a [u8]>,
}

// SAFETY: a view is an address and a length into memory its store keeps
// mapped for 'a; reading it from any thread is what the store's own
// `Sync` allows.
unsafe impl Send for StoreView<'_> {}
// SAFETY: as above; a view has no interior state.
unsafe impl Sync for StoreView<'_> {}

impl<'a> StoreView<'a> {
    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be readable memory that stays mapped for
    /// `'a` (the lifetime of the store lending it).
    pub unsafe fn new(ptr: *const u8, len: usize) -> Option<StoreView<'a>> {
        Some(StoreView {
            ptr: NonNull::new(ptr.cast_mut())?,
            len,
            _store: PhantomData,
        })
    }

    /// Its address (for the kernel to read).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the bytes into `dst`.
    ///
    /// # Panics
    /// If `dst` is not as long as the view.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(
            dst.len(),
            self.len,
            "a view copied into a buffer of another length"
        );
        // SAFETY: `len` readable bytes at `ptr` (`new`'s contract), into a
        // buffer of that length that is not the store's memory (a `&mut`).
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr(), dst.as_mut_ptr(), self.len) };
    }

    /// The bytes as a slice.
    ///
    /// # Safety
    /// Nothing may write them while the slice lives: no write-back to the
    /// store over them, no other writer of the file under its mapping.
    pub unsafe fn as_slice(&self) -> &'a [u8] {
        // SAFETY: readable for 'a (`new`'s contract); unchanged while
        // borrowed (the caller's).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}
