//! Tests of the emulator, against fakes and against the CPU itself: a
//! [`FakeCpu`] and a [`FakeMem`] stand in for the signal context and the
//! watched memory, and [`interp`]'s harness runs the same code natively to
//! compare registers and flags bit for bit.
//!
//! | file | what |
//! |---|---|
//! | `store.rs` | plain and vector stores, addressing, refusals, write targets |
//! | `string.rs` | `[REP] STOS`/`MOVS` |
//! | `rmw.rs` | read-modify-write, locked and exchange instructions vs native execution |
//! | `fuzz.rs` | random bytes: nothing written on a refusal, never a panic |
//! | `interp.rs` | continued interpretation vs native execution |

mod fuzz;
mod interp;
mod rmw;
mod store;
mod string;

use iced_x86::{Instruction, Mnemonic, OpKind, Register};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::alu::*;
use super::decode::*;
use super::interp::*;
use super::machine::*;
use super::store::*;
use super::target::*;

/// Page-aligned, below 2^31 (so 32-bit addressing can reach it).
const BASE: u64 = 0x1000_0000;
const MEM_LEN: usize = 0x4000;
const CODE: u64 = 0x40_0000;
const RBX: Gpr = 3;
const RDX: Gpr = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
struct FakeCpu {
    gpr: [u64; 16],
    rip: u64,
    rflags: u64,
    vec: [[u8; 32]; 16],
    vec_ok: bool,
    fs: Option<u64>,
    gs: Option<u64>,
}

impl FakeCpu {
    fn new() -> Self {
        FakeCpu {
            gpr: [0; 16],
            rip: CODE,
            rflags: 0x202,
            vec: [[0; 32]; 16],
            vec_ok: true,
            fs: None,
            gs: None,
        }
    }
}

impl Cpu for FakeCpu {
    fn gpr(&self, r: Gpr) -> u64 {
        self.gpr[r]
    }
    fn set_gpr(&mut self, r: Gpr, v: u64) {
        self.gpr[r] = v;
    }
    fn rip(&self) -> u64 {
        self.rip
    }
    fn set_rip(&mut self, v: u64) {
        self.rip = v;
    }
    fn rflags(&self) -> u64 {
        self.rflags
    }
    fn set_rflags(&mut self, v: u64) {
        self.rflags = v;
    }
    fn vec(&self, n: usize, out: &mut [u8]) -> bool {
        if !self.vec_ok || n >= 16 || out.len() > 32 {
            return false;
        }
        out.copy_from_slice(&self.vec[n][..out.len()]);
        true
    }
    fn fs_base(&self) -> Option<u64> {
        self.fs
    }
    fn gs_base(&self) -> Option<u64> {
        self.gs
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct FakeMem {
    base: u64,
    data: Vec<u8>,
    /// What [`Memory::hot`] answers for every address.
    hot: bool,
}

impl FakeMem {
    fn new() -> Self {
        FakeMem {
            base: BASE,
            data: vec![0; MEM_LEN],
            hot: false,
        }
    }
    fn range(&self, addr: u64, len: usize) -> Result<core::ops::Range<usize>, MemFault> {
        let off = addr.checked_sub(self.base).ok_or(MemFault)?;
        let off = usize::try_from(off).map_err(|_| MemFault)?;
        let end = off.checked_add(len).ok_or(MemFault)?;
        if end > self.data.len() {
            return Err(MemFault);
        }
        Ok(off..end)
    }
    fn at(&self, addr: u64, len: usize) -> &[u8] {
        &self.data[self.range(addr, len).unwrap()]
    }
    fn get(&self, addr: u64, size: usize) -> u64 {
        let mut b = [0u8; 8];
        b[..size].copy_from_slice(self.at(addr, size));
        u64::from_le_bytes(b)
    }
    fn put(&mut self, addr: u64, size: usize, v: u64) {
        let r = self.range(addr, size).unwrap();
        self.data[r].copy_from_slice(&v.to_le_bytes()[..size]);
    }
}

impl Memory for FakeMem {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemFault> {
        let r = self.range(addr, buf.len())?;
        buf.copy_from_slice(&self.data[r]);
        Ok(())
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemFault> {
        let r = self.range(addr, data.len())?;
        self.data[r].copy_from_slice(data);
        Ok(())
    }
    fn cas(&mut self, addr: u64, size: usize, expected: u64, new: u64) -> Result<u64, MemFault> {
        if !matches!(size, 1 | 2 | 4 | 8) {
            return Err(MemFault);
        }
        self.range(addr, size)?;
        let found = self.get(addr, size);
        if found == expected {
            self.put(addr, size, new);
        }
        Ok(found)
    }
    fn hot(&self, _addr: u64) -> bool {
        self.hot
    }
}

fn setup() -> (FakeCpu, FakeMem) {
    prepare();
    (FakeCpu::new(), FakeMem::new())
}

/// Emulates `code` and asserts it completed (RIP advanced past it).
#[track_caller]
fn ok(code: &[u8], cpu: &mut FakeCpu, mem: &mut FakeMem) {
    let rip = cpu.rip;
    assert_eq!(emulate(code, cpu, mem), Outcome::Emulated, "{code:02x?}");
    assert_eq!(cpu.rip, rip + code.len() as u64, "{code:02x?}");
}

/// Emulates `code`, asserts `NotEmulated(reason)` and no side effect.
#[track_caller]
fn refused(code: &[u8], cpu: &mut FakeCpu, mem: &mut FakeMem, reason: Reason) {
    let (c, m) = (cpu.clone(), mem.clone());
    assert_eq!(
        emulate(code, cpu, mem),
        Outcome::NotEmulated(reason),
        "{code:02x?}"
    );
    assert_eq!(*cpu, c);
    assert_eq!(*mem, m);
}

/// A value of `size` bytes near an edge (0, 1, all ones, the sign
/// boundary, small, almost all ones) or random.
fn interesting(rng: &mut SmallRng, size: usize) -> u64 {
    let m = mask(size);
    let half = m >> 1;
    match rng.gen_range(0..8) {
        0 => 0,
        1 => 1,
        2 => m,
        3 => half,
        4 => half + 1,
        5 => rng.gen_range(0..16),
        6 => m - rng.gen_range(0..16),
        _ => rng.gen::<u64>() & m,
    }
}
