//! `faultline store put|get|info`: a file into a Redis store and back.
//!
//! `put FILE URL` uploads the file as chunks (a progress bar on a
//! terminal, a line per 10% otherwise), then writes the metadata key with
//! its length and checksum and prints the checksum; `get URL FILE`
//! downloads it and checks the checksum; `info URL` prints the metadata.
//! URLs: see `faultline_redis` (`redis://HOST:PORT#NAME`,
//! `redis+unix:///PATH#NAME`, `unix:///PATH#NAME`,
//! `redis-cluster://HOST:PORT,...#NAME`; NAME defaults to `faultline`).

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use faultline_redis::{RedisConfig, RedisStore};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// `faultline store ...`.
#[derive(clap::Subcommand)]
pub enum StoreCmd {
    /// Upload FILE to the store at URL (replacing a store of that name).
    Put {
        /// The file (a snapshot, a graph).
        file: PathBuf,
        /// `redis://HOST:PORT#NAME`, `redis+unix:///PATH#NAME`, `unix:///PATH#NAME` or
        /// `redis-cluster://HOST:PORT,HOST:PORT,...#NAME` (NAME defaults to `faultline`).
        url: String,
        /// Bytes per key (a power of two of at least 512). A fault-around
        /// window reads whole keys with GET and parts of keys with
        /// GETRANGE; write-backs of part of a key use SETRANGE.
        #[arg(long, default_value_t = faultline_redis::DEFAULT_CHUNK)]
        chunk: usize,
        /// Chunks per hash tag (kept on one cluster shard). Default: 1 MiB
        /// worth of chunks.
        #[arg(long)]
        group: Option<u64>,
    },
    /// Download the store at URL into FILE, checking its checksum.
    Get {
        /// The store (see `put`).
        url: String,
        /// Where to write.
        file: PathBuf,
    },
    /// Print the store's length, chunk size and checksum.
    Info {
        /// The store (see `put`).
        url: String,
    },
}

/// Progress over `total` bytes: a bar on a terminal, otherwise a line per
/// 10%.
struct Bytes {
    bar: Option<ProgressBar>,
    total: u64,
    next_line: u64,
    what: &'static str,
}

impl Bytes {
    fn new(total: u64, what: &'static str) -> Bytes {
        let bar = std::io::stderr().is_terminal().then(|| {
            let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(st) = ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} (eta {eta})",
            ) {
                pb.set_style(st.progress_chars("=> "));
            }
            pb.set_message(what);
            pb
        });
        Bytes {
            bar,
            total,
            next_line: 0,
            what,
        }
    }

    fn at(&mut self, done: u64) {
        match &self.bar {
            Some(pb) => pb.set_position(done),
            None if done >= self.next_line || done == self.total => {
                eprintln!(
                    "{}: {} of {} bytes ({:.0}%)",
                    self.what,
                    done,
                    self.total,
                    done as f64 * 100.0 / self.total.max(1) as f64
                );
                self.next_line = done + self.total.div_ceil(10).max(1);
            }
            None => {}
        }
    }

    fn finish(self) {
        if let Some(pb) = self.bar {
            pb.finish_and_clear();
        }
    }
}

/// Runs `faultline store ...`.
pub fn run(cmd: StoreCmd) -> anyhow::Result<()> {
    match cmd {
        StoreCmd::Put {
            file,
            url,
            chunk,
            group,
        } => {
            anyhow::ensure!(
                chunk.is_power_of_two() && chunk >= 512,
                "--chunk {chunk} must be a power of two of at least 512"
            );
            anyhow::ensure!(group != Some(0), "--group must be positive");
            let f = File::open(&file).with_context(|| format!("opening {}", file.display()))?;
            let len = f.metadata()?.len();
            let mut cfg = RedisConfig::with_chunk(chunk);
            if let Some(g) = group {
                cfg.group_chunks = g;
            }
            let t = Instant::now();
            let mut progress = Bytes::new(len, "put");
            let info = RedisStore::put(&url, cfg, BufReader::new(f), len, |d| progress.at(d))?;
            progress.finish();
            let secs = t.elapsed().as_secs_f64();
            println!(
                "put {} -> {url}: {len} bytes in {:.2} s ({:.0} MiB/s), {} keys of {chunk} bytes, checksum fnv1a64:{:016x}",
                file.display(),
                secs,
                len as f64 / (1 << 20) as f64 / secs.max(1e-9),
                len.div_ceil(chunk as u64),
                info.checksum
            );
        }
        StoreCmd::Get { url, file } => {
            let store = RedisStore::open(&url)?;
            let len = store.info().len;
            let out =
                File::create(&file).with_context(|| format!("creating {}", file.display()))?;
            let mut w = BufWriter::new(out);
            let mut progress = Bytes::new(len, "get");
            let sum = store.get(&mut w, |d| progress.at(d))?;
            progress.finish();
            w.flush()
                .with_context(|| format!("writing {}", file.display()))?;
            println!(
                "get {url} -> {}: {len} bytes, checksum fnv1a64:{sum:016x} verified",
                file.display()
            );
        }
        StoreCmd::Info { url } => {
            let store = RedisStore::open(&url)?;
            let i = store.info();
            println!(
                "{url}: {} bytes, {} keys of {} bytes, {} chunks per hash tag, checksum fnv1a64:{:016x}, first key {}",
                i.len,
                i.len.div_ceil(i.chunk_bytes as u64),
                i.chunk_bytes,
                i.group_chunks,
                i.checksum,
                store.chunk_key(0)
            );
        }
    }
    Ok(())
}
