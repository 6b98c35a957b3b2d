use super::{PageStore, StoreError};

/// Every page reads as zeros; writes are discarded (anonymous memory with
/// lazy allocation, as the kernel does it).
#[derive(Debug, Default, Clone, Copy)]
pub struct ZeroStore;

impl PageStore for ZeroStore {
    fn describe(&self) -> &str {
        "zero"
    }
    fn len(&self) -> Option<u64> {
        None
    }
    fn fill(&self, _offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        buf.fill(0);
        Ok(())
    }
    fn write_back(&self, _offset: u64, _data: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }
    fn is_zero(&self) -> bool {
        true
    }
    fn signal_safe(&self) -> bool {
        true
    }
}
