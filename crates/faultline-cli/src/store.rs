//! `faultline store put|get|info|gc`: a file into a Redis store and back.
//!
//! `put FILE URL` uploads the file as a new generation of the store (a
//! progress bar on a terminal, a line per 10% otherwise), switches the
//! store's metadata to it in one step, removes the generation it
//! replaced and prints the checksum; until the switch, readers keep
//! the old store (`faultline_redis`, "Replacing a store"). SIGINT,
//! SIGTERM or SIGHUP stops it between two batches: it removes its
//! partial generation, leaves the old store as it was, says so, and ends
//! as the signal would (128 + the signal in a shell); a second signal
//! ends it at once (`gc` then removes what it left). `get URL FILE`
//! writes FILE by `faultline_cli_support::output`'s rules (checked
//! before any work: a temporary `.FILE.partial-PID` renamed over FILE
//! only once every chunk was read and the checksum matched; a symlink
//! followed; `/dev/null` written in place; devices, FIFOs and sockets
//! refused; a killed run's temporary removed by the next run in that
//! directory): on any failure or interruption FILE is untouched and the
//! temporary removed. `info URL` prints the metadata; `gc URL` removes
//! what no metadata names (interrupted uploads, replaced generations
//! not yet removed, stray chunk keys).
//! URLs: see `faultline_redis` (`redis://HOST:PORT#NAME`,
//! `redis+unix:///PATH#NAME`, `unix:///PATH#NAME`,
//! `redis-cluster://HOST:PORT,...#NAME`; NAME defaults to `faultline`).

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

use anyhow::{bail, Context};
use faultline_cli_support::{cleanup, OutputPath};
use faultline_redis::{RedisConfig, RedisStore, MAX_CHUNK, MAX_GROUP, MIN_CHUNK};
use faultline_sys::signal;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// `faultline store ...`.
#[derive(clap::Subcommand)]
pub enum StoreCmd {
    /// Upload FILE to the store at URL, replacing a store of that name in
    /// one step (readers keep the old one until the upload is complete).
    Put {
        /// The file (a snapshot, a graph).
        file: PathBuf,
        /// `redis://HOST:PORT#NAME`, `redis+unix:///PATH#NAME`, `unix:///PATH#NAME` or
        /// `redis-cluster://HOST:PORT,HOST:PORT,...#NAME` (NAME defaults to `faultline`).
        url: String,
        /// Bytes per key: a power of two from 512 to 536870912 (512 MiB,
        /// Redis's largest string). A fault-around window reads whole keys
        /// with GET and parts of keys with GETRANGE; write-backs of part
        /// of a key use SETRANGE. An upload holds about three copies of
        /// 4 MiB (or of one key, if larger) in memory.
        #[arg(long, default_value_t = faultline_redis::DEFAULT_CHUNK, value_parser = faultline_cli_support::flags::power_of_two(MIN_CHUNK, MAX_CHUNK))]
        chunk: usize,
        /// Chunks per hash tag (kept on one cluster shard), 1 to 1048576.
        /// Default: 1 MiB worth of chunks.
        #[arg(long, value_parser = faultline_cli_support::flags::range_u64(1, MAX_GROUP))]
        group: Option<u64>,
    },
    /// Download the store at URL into FILE, checking its checksum (FILE
    /// is replaced only if every byte arrived and matched).
    Get {
        /// The store (see `put`).
        url: String,
        /// Where to write.
        file: PathBuf,
    },
    /// Print the store's length, chunk size, generation and checksum.
    Info {
        /// The store (see `put`).
        url: String,
    },
    /// Remove what no metadata names under the store's name: uploads that
    /// were interrupted or killed, replaced generations not yet removed,
    /// chunk keys past the store's end. Uploads in progress are kept.
    Gc {
        /// The store (see `put`).
        url: String,
    },
}

/// The first SIGINT, SIGTERM or SIGHUP received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// From here on the first SIGINT, SIGTERM or SIGHUP stops the work at its
/// next read or write (see [`Stoppable`]) instead of ending the process
/// (`faultline_cli_support::cleanup`'s stop hook; a second one still ends
/// it at once, removing the temporaries).
fn catch_interrupts() -> anyhow::Result<()> {
    cleanup::install().context("taking SIGINT, SIGTERM and SIGHUP")?;
    cleanup::on_stop(|sig| SIGNAL.store(sig, Ordering::SeqCst));
    Ok(())
}

/// The signal that interrupted the work, if one did.
fn interrupted() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        s if s == signal::SIGINT => "SIGINT",
        s if s == signal::SIGTERM => "SIGTERM",
        s if s == signal::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// A reader or writer that fails once a signal arrived (not with
/// `ErrorKind::Interrupted`, which `read_exact`/`write_all` retry).
struct Stoppable<T>(T);

fn stopped(sig: i32) -> std::io::Error {
    std::io::Error::other(format!("interrupted by {}", signal_name(sig)))
}

impl<T: Read> Read for Stoppable<T> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match interrupted() {
            Some(sig) => Err(stopped(sig)),
            None => self.0.read(buf),
        }
    }
}

impl<T: Write> Write for Stoppable<T> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match interrupted() {
            Some(sig) => Err(stopped(sig)),
            None => self.0.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// If a signal stopped the work: prints `e` and ends the process as the
/// signal would have (after the caller cleaned up). Otherwise returns `e`.
fn exit_if_interrupted(e: anyhow::Error) -> anyhow::Error {
    if let Some(sig) = interrupted() {
        faultline_cli_support::print_error(&e);
        signal::die_by(sig);
    }
    e
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
        } => put(&file, &url, chunk, group),
        StoreCmd::Get { url, file } => get(&url, &file),
        StoreCmd::Info { url } => {
            let store = RedisStore::open(&url)?;
            let i = store.info();
            let generation = match i.generation {
                0 => "generation 0 (written before generations)".to_string(),
                g => format!("generation {g}"),
            };
            println!(
                "{url}: {} bytes, {} keys of {} bytes, {} chunks per hash tag, {generation}, checksum fnv1a64:{:016x}, first key {}",
                i.len,
                i.chunks(),
                i.chunk_bytes,
                i.group_chunks,
                i.checksum,
                store.chunk_key(0)
            );
            Ok(())
        }
        StoreCmd::Gc { url } => gc(&url),
    }
}

fn put(file: &Path, url: &str, chunk: usize, group: Option<u64>) -> anyhow::Result<()> {
    let mut cfg = RedisConfig::with_chunk(chunk);
    if let Some(g) = group {
        cfg.group_chunks = g;
    }
    cfg.check_put().map_err(anyhow::Error::msg)?;
    let need = cfg.put_memory();
    if let Some(avail) = faultline_cli_support::mem_available() {
        anyhow::ensure!(
            need <= avail,
            "--chunk {chunk}: an upload holds about {} MiB (three copies of one batch of keys), MemAvailable is {} MiB: use a smaller --chunk",
            need >> 20,
            avail >> 20
        );
    }
    let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let len = f
        .metadata()
        .with_context(|| format!("reading the size of {}", file.display()))?
        .len();
    catch_interrupts()?;
    let t = Instant::now();
    let mut progress = Bytes::new(len, "put");
    let src = Stoppable(BufReader::new(f));
    let res = RedisStore::replace(url, cfg, src, len, |d| progress.at(d));
    progress.finish();
    let r = res.map_err(|e| exit_if_interrupted(e.into()))?;
    let secs = t.elapsed().as_secs_f64();
    let replaced = match r.previous {
        Some(p) => format!(", replacing generation {p}"),
        None => String::new(),
    };
    println!(
        "put {} -> {url}: {len} bytes in {:.2} s ({:.0} MiB/s), {} keys of {chunk} bytes, generation {}{replaced}, checksum fnv1a64:{:016x}",
        file.display(),
        secs,
        len as f64 / (1 << 20) as f64 / secs.max(1e-9),
        r.info.chunks(),
        r.info.generation,
        r.info.checksum
    );
    for rm in &r.removed {
        println!(
            "removed generation {} ({}): {} keys",
            rm.generation, rm.reason, rm.keys
        );
    }
    for l in &r.left {
        eprintln!("warning: {l}");
    }
    Ok(())
}

fn gc(url: &str) -> anyhow::Result<()> {
    let r = RedisStore::gc(url, RedisConfig::default())?;
    let keys: u64 = r.removed.iter().map(|rm| rm.keys).sum();
    for rm in &r.removed {
        println!(
            "removed generation {} ({}): {} keys",
            rm.generation, rm.reason, rm.keys
        );
    }
    for (g, who) in &r.uploading {
        println!("kept generation {g}: an upload in progress by {who}");
    }
    let current = match r.current {
        Some(g) => format!("the store is generation {g}"),
        None => "there is no store of this name".into(),
    };
    println!(
        "gc {url}: removed {keys} keys of {} generations; {current}",
        r.removed.len()
    );
    if !r.left.is_empty() {
        bail!("gc {url} left: {}", r.left.join("; "));
    }
    Ok(())
}

fn get(url: &str, file: &Path) -> anyhow::Result<()> {
    // Checked before any work (faultline_cli_support::output).
    let out = OutputPath::check(file, "get")?;
    let store = RedisStore::open(url)?;
    let len = store.info().len;
    if !out.is_null() {
        if let Some(free) = faultline_cli_support::disk_free(out.target()) {
            anyhow::ensure!(
                free >= len,
                "get {}: the store holds {len} bytes, its file system has {free} free",
                file.display()
            );
        }
    }
    catch_interrupts()?;
    let mut pending = out.begin()?;
    let mut progress = Bytes::new(len, "get");
    let mut w = Stoppable(BufWriter::new(pending.file()));
    let res = store.get(&mut w, |d| progress.at(d));
    progress.finish();
    let res = res.map_err(anyhow::Error::from).and_then(|sum| {
        w.flush()
            .with_context(|| format!("writing {}", file.display()))?;
        Ok(sum)
    });
    drop(w);
    let sum = match res {
        Ok(sum) if interrupted().is_none() => sum,
        res => {
            // The temporary goes before any exit.
            drop(pending);
            let e = match res {
                Err(e) => e,
                Ok(_) => anyhow::anyhow!("interrupted"),
            };
            let e = e.context(format!("get {url}: {} is unchanged", file.display()));
            return Err(exit_if_interrupted(e));
        }
    };
    pending.commit()?;
    println!(
        "get {url} -> {}: {len} bytes, checksum fnv1a64:{sum:016x} verified",
        file.display()
    );
    Ok(())
}
