use std::cell::UnsafeCell;

use super::{PageStore, StoreError, StoreView, Tail};

/// An in-process byte buffer, e.g. a snapshot. A region longer than the
/// buffer is refused ([`Tail::Refuse`]).
///
/// Reads and write-backs of *different* pages may run concurrently; the
/// runtime never fills and writes back the same page at once (the page's
/// claim bit serialises them).
pub struct MemoryStore {
    data: Box<UnsafeCell<[u8]>>,
    len: usize,
}

// SAFETY: concurrent access is to disjoint pages (see the type docs); the
// buffer itself never moves or changes size.
unsafe impl Sync for MemoryStore {}
// SAFETY: owns its buffer.
unsafe impl Send for MemoryStore {}

impl MemoryStore {
    /// Takes ownership of `data`.
    pub fn new(data: Vec<u8>) -> MemoryStore {
        let len = data.len();
        let boxed: Box<[u8]> = data.into_boxed_slice();
        // SAFETY: UnsafeCell<[u8]> has the same layout as [u8].
        let data = unsafe { Box::from_raw(Box::into_raw(boxed) as *mut UnsafeCell<[u8]>) };
        MemoryStore { data, len }
    }

    /// A copy of the current contents (for tests and checks).
    pub fn snapshot(&self) -> Vec<u8> {
        // SAFETY: reading the buffer; concurrent page writes would be a
        // caller bug documented on the type.
        unsafe { (*self.data.get()).to_vec() }
    }

    fn bytes(&self) -> *mut u8 {
        self.data.get() as *mut u8
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len)
            .finish()
    }
}

impl PageStore for MemoryStore {
    fn describe(&self) -> &str {
        "memory"
    }
    fn len(&self) -> Option<u64> {
        Some(self.len as u64)
    }
    fn tail(&self) -> Tail {
        Tail::Refuse
    }
    fn fill(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let off = usize::try_from(offset).unwrap_or(usize::MAX);
        let avail = self.len.saturating_sub(off).min(buf.len());
        // SAFETY: `off + avail <= len`; the source is our buffer and does
        // not overlap `buf` (a caller's scratch buffer).
        unsafe { std::ptr::copy_nonoverlapping(self.bytes().add(off), buf.as_mut_ptr(), avail) };
        buf[avail..].fill(0);
        Ok(())
    }
    fn write_back(&self, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let end = usize::try_from(offset)
            .ok()
            .and_then(|off| off.checked_add(data.len()));
        if end.is_none_or(|end| end > self.len) {
            return Err(StoreError::Failed {
                offset,
                reason: "write-back past the end of the memory store".into(),
            });
        }
        // SAFETY: in bounds (checked: `offset + data.len() <= len`, without
        // overflow); pages are written back by one thread at a time (type
        // docs).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.bytes().add(offset as usize),
                data.len(),
            )
        };
        Ok(())
    }
    fn view(&self, offset: u64, len: usize) -> Option<StoreView<'_>> {
        let off = usize::try_from(offset).ok()?;
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds of the buffer, which lives (unmoved) as long
        // as `self`; a write-back may change the bytes, which a view
        // allows.
        unsafe { StoreView::new(self.bytes().add(off), len) }
    }
    fn signal_safe(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_back_whose_end_overflows_is_refused() {
        let s = MemoryStore::new(vec![1; 8192]);
        // offset + len wraps around: it was accepted, and wrote before
        // the buffer in a release build.
        assert!(s.write_back(u64::MAX - 63, &[0xee; 128]).is_err());
        assert!(s.write_back(8192 - 64, &[0xee; 128]).is_err());
        assert!(s.write_back(8192 - 128, &[0xee; 128]).is_ok());
        assert!(s.view(u64::MAX - 63, 128).is_none());
        let mut buf = [7u8; 16];
        s.fill(u64::MAX - 8, &mut buf).unwrap();
        assert_eq!(buf, [0; 16]);
    }

    #[test]
    fn a_view_lends_an_address_that_a_write_back_may_change() {
        let s = MemoryStore::new(vec![1; 8192]);
        let v = s.view(4096, 8).unwrap();
        assert_eq!(v.len(), 8);
        // No `&[u8]` is held across the write-back (it was: a shared
        // reference to bytes that changed).
        s.write_back(4096, &[9; 8]).unwrap();
        let mut out = [0u8; 8];
        v.copy_to(&mut out);
        assert_eq!(out, [9; 8]);
    }
}
