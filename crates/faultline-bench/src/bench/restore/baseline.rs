//! The `baseline` configuration's handler: written like Firecracker's
//! example handler: one thread in this
//! process, one 4 KiB page per fault, `UFFDIO_COPY` from a mapping of the
//! memory file.
//!
//! 1. accept the peer's connection, receive the hand-off (JSON regions and
//!    the userfaultfd, `SCM_RIGHTS`);
//! 2. poll the userfaultfd and the connection (the peer's exit ends it);
//! 3. per fault: find the region, `UFFDIO_COPY` the page from the file
//!    mapping (again on `Retry`).

use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::Path;

use anyhow::Context;
use faultline_sys::mem::Mapping;
use faultline_sys::poll::{self, events, PollFd};
use faultline_sys::sock;
use faultline_sys::uffd::{Msg, Outcome, Uffd, UffdMsg};

/// A handler as Firecracker's example writes it: one thread, one page per
/// fault, `UFFDIO_COPY` from a mapping of the file. Returns the faults
/// served.
pub fn handler(listener: UnixListener, mem: &Path) -> anyhow::Result<u64> {
    listener.set_nonblocking(false)?;
    let (conn, _) = listener.accept()?;
    let mut buf = vec![0u8; 1 << 16];
    let got = sock::recv_with_fds(conn.as_fd(), &mut buf, false)?;
    let regions = faultline_serve::handshake::parse(&buf[..got.bytes])?;
    let fd = got
        .fds
        .into_iter()
        .next()
        .context("no userfaultfd attached")?;
    let uffd = Uffd::adopt(fd);
    let file = std::fs::File::open(mem)?;
    let len = file.metadata()?.len() as usize;
    let map = Mapping::file_readonly(&file, len, 0)?;
    let mut msgs = [UffdMsg::ZERO; 1];
    let mut faults = 0u64;
    loop {
        let mut fds = [
            PollFd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&uffd),
                events: events::IN,
                revents: 0,
            },
            PollFd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&conn),
                events: events::RDHUP,
                revents: 0,
            },
        ];
        poll::poll(&mut fds, 1000)?;
        if fds[1].revents != 0 {
            return Ok(faults);
        }
        if uffd.read_msgs(&mut msgs)? == 0 {
            continue;
        }
        if let Msg::PageFault { addr, .. } = msgs[0].decode() {
            faults += 1;
            let page = addr & !4095;
            let r = regions
                .iter()
                .find(|r| page >= r.base && page < r.base + r.len as u64)
                .context("fault outside the regions")?;
            let off = r.store_offset + (page - r.base);
            loop {
                // SAFETY: `off + 4096` lies inside the file mapping (the
                // regions were laid out from it).
                let out = unsafe { uffd.copy(page, map.as_ptr().add(off as usize), 4096, 0) }?;
                if out != Outcome::Retry {
                    break;
                }
            }
        }
    }
}
