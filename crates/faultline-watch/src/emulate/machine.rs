//! What the emulator works on: the interrupted thread's registers
//! ([`Cpu`]) and memory ([`Memory`]), both implemented by the caller (the
//! signal context and the watcher's page tiers in production, plain
//! structs in the tests), and why an instruction is refused ([`Reason`]).
//!
//! The emulator touches registers and memory only through these two
//! traits, so it can be checked bit for bit against fakes and against the
//! CPU itself.

/// A general-purpose register number in x86 encoding order: 0=RAX, 1=RCX,
/// 2=RDX, 3=RBX, 4=RSP, 5=RBP, 6=RSI, 7=RDI, 8..15=R8..R15.
pub type Gpr = usize;

/// The interrupted thread's registers (backed by the signal ucontext in
/// production, a plain struct in tests).
pub trait Cpu {
    /// Reads the full 64-bit value of general-purpose register `r` (0..16).
    fn gpr(&self, r: Gpr) -> u64;
    /// Writes the full 64-bit value of general-purpose register `r` (0..16).
    fn set_gpr(&mut self, r: Gpr, v: u64);
    /// The instruction pointer (address of the faulting instruction).
    fn rip(&self) -> u64;
    /// Sets the instruction pointer the thread resumes at.
    fn set_rip(&mut self, v: u64);
    /// The saved `RFLAGS`.
    fn rflags(&self) -> u64;
    /// Sets the `RFLAGS` the thread resumes with.
    fn set_rflags(&mut self, v: u64);
    /// Copies the low `out.len()` bytes (16 for XMM, 32 for YMM) of vector
    /// register `n` (0..16) into `out`; false if that state is unavailable
    /// (then the instruction is not emulated).
    fn vec(&self, n: usize, out: &mut [u8]) -> bool;
    /// FS base for segment-prefixed accesses; `None` = not emulated.
    fn fs_base(&self) -> Option<u64> {
        None
    }
    /// GS base for segment-prefixed accesses; `None` = not emulated.
    fn gs_base(&self) -> Option<u64> {
        None
    }
}

/// Where emulated accesses go. Addresses are the program's virtual
/// addresses.
///
/// Each call should be all-or-nothing: a failing `write` or `cas` must not
/// have modified memory, otherwise the "nothing written on `NotEmulated`"
/// guarantee of [`emulate`](super::emulate) cannot hold.
pub trait Memory {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemFault>;
    /// Writes `data` at `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemFault>;
    /// Atomic compare-and-swap of `size` (1, 2, 4, 8) bytes at `addr` (used
    /// for LOCK-prefixed / implicitly locked instructions); returns the value
    /// found (== `expected` on success). Values are little-endian, zero
    /// extended to 64 bits.
    fn cas(&mut self, addr: u64, size: usize, expected: u64, new: u64) -> Result<u64, MemFault>;
    /// Whether `addr` is on a page whose writes fault (worth interpreting
    /// for, see [`run`](super::run)). Default: false.
    fn hot(&self, addr: u64) -> bool {
        let _ = addr;
        false
    }
}

/// A [`Memory`] access failed (address not backed by the emulation target).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemFault;

/// Why an instruction was not emulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The bytes do not decode to a valid instruction (invalid encoding, or
    /// truncated).
    Undecodable,
    /// A valid instruction this emulator does not handle.
    Unsupported,
    /// No explicit memory store to emulate: a handled instruction family
    /// with a register destination, a common load (`MOV r, m`, `ADD r, m`,
    /// `LEA`, ...) or a compare (`CMP`, `TEST`, `BT`).
    NoMemoryWrite,
    /// The source vector register state is unavailable ([`Cpu::vec`]
    /// returned false).
    VectorState,
    /// The access uses an FS/GS override whose base is unknown.
    Segment,
    /// A [`Memory`] access failed, the real instruction would fault
    /// (misaligned `MOVAPS`-style access), or a locked update did not
    /// succeed after many compare-and-swap retries.
    MemoryFault,
}
