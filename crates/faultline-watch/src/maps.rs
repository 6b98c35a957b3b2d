//! `/proc/self/maps`: which mapping holds an address, and what it allows.

use std::io;

use faultline_sys::mem::Prot;

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
    pub inode: u64,
    pub path: String,
}

impl Vma {
    /// The protection of the mapping.
    pub fn prot(&self) -> Prot {
        let mut p = Prot::NONE;
        if self.read {
            p = p | Prot::READ;
        }
        if self.write {
            p = p | Prot::WRITE;
        }
        if self.exec {
            p = p | Prot::EXEC;
        }
        p
    }

    /// Parses one maps line.
    pub fn parse(line: &str) -> Option<Vma> {
        let mut it = line.split_ascii_whitespace();
        let range = it.next()?;
        let perms = it.next()?.as_bytes();
        let _offset = it.next()?;
        let _dev = it.next()?;
        let inode = it.next()?.parse().ok()?;
        let path = it.collect::<Vec<_>>().join(" ");
        let (s, e) = range.split_once('-')?;
        if perms.len() < 4 {
            return None;
        }
        Some(Vma {
            start: u64::from_str_radix(s, 16).ok()?,
            end: u64::from_str_radix(e, 16).ok()?,
            read: perms[0] == b'r',
            write: perms[1] == b'w',
            exec: perms[2] == b'x',
            shared: perms[3] == b's',
            inode,
            path,
        })
    }
}

/// Every mapping of the calling process.
pub fn read_maps() -> io::Result<Vec<Vma>> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    Ok(text.lines().filter_map(Vma::parse).collect())
}

/// The mapping holding `addr`, if any.
pub fn find(maps: &[Vma], addr: u64) -> Option<&Vma> {
    let i = maps.partition_point(|v| v.end <= addr);
    maps.get(i).filter(|v| v.start <= addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let v = Vma::parse("7f3a1c000000-7f3a1c021000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((v.start, v.end), (0x7f3a1c000000, 0x7f3a1c021000));
        assert!(v.read && v.write && !v.exec && !v.shared);
        assert_eq!(v.path, "");
        let v = Vma::parse("55d0c0a00000-55d0c0a21000 r-xs 00001000 08:01 1234 /usr/bin/my prog")
            .unwrap();
        assert!(v.shared && v.exec && !v.write);
        assert_eq!(v.inode, 1234);
        assert_eq!(v.path, "/usr/bin/my prog");
    }

    #[test]
    fn finds_the_heap() {
        let b = Box::new([0u8; 64]);
        let maps = read_maps().unwrap();
        let v = find(&maps, b.as_ptr() as u64).unwrap();
        assert!(v.write);
        assert!(find(&maps, 0).is_none());
    }
}
